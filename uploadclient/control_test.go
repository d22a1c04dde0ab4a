package uploadclient

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

const (
	testToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	testID    = "0123456789abcdef01234567"
)

// fakeControl is a control plane answering every request with answer,
// after checking what every request of this client must carry.
func fakeControl(t *testing.T, wantPath string, answer func(w http.ResponseWriter, body []byte)) Control {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != wantPath || r.Header.Get("Authorization") != "Bearer "+testToken ||
			r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s with Authorization %q, Content-Type %q; want POST %s with the bearer token and JSON",
				r.Method, r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("Content-Type"), wantPath)
		}
		answer(w, body)
	}))
	t.Cleanup(srv.Close)
	return Control{URL: srv.URL, Token: testToken, TokenFile: "/box/token", HTTPClient: srv.Client()}
}

func answerWith(status int, body string, header ...string) func(http.ResponseWriter, []byte) {
	return func(w http.ResponseWriter, _ []byte) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// wantErr checks an error's type and words, and that it shows no token.
func wantErr(t *testing.T, err error, want string, words ...string) {
	t.Helper()
	var refused *RefusedError
	var stopped *StoppedError
	switch {
	case want == "" && err != nil:
		t.Fatalf("error %v, want none", err)
	case want == "":
		return
	case want == "refused" && !errors.As(err, &refused), want == "stopped" && !errors.As(err, &stopped):
		t.Fatalf("error %T %v, want a %s error", err, err, want)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q does not say %q", err, w)
		}
	}
	if strings.Contains(err.Error(), testToken) {
		t.Errorf("%q shows the token", err)
	}
}

// TestImages: the status's images, decoded and each kept as compacted
// JSON (with fields this client does not know); each kind of failure as
// the CLI needs it: refused (token, route, an unreadable list) or stopped
// (busy, no answer).
func TestImages(t *testing.T) {
	const listed = `{"available":true,"images":[
		{"upload_id":"0123456789abcdef01234567", "name":"a disk","efi":false,"size":196616,"virtual_size":1073741824,
		 "sha256":"3b107e52f63fab104395d42dbb0d08b9ef9cb3f10b1e32fe083674dba258e7f8","created_at":"2026-12-01T15:21:00Z","later":1},
		{"upload_id":"89abcdef0123456789abcdef","name":"b","efi":true,"size":1,"virtual_size":2,"sha256":"00","created_at":"2026-12-01T15:22:00Z"}],
		"sessions":[]}`
	for _, tc := range []struct {
		name   string
		answer func(http.ResponseWriter, []byte)
		want   string // "", "refused" or "stopped"
		words  []string
	}{
		{"listed", answerWith(http.StatusOK, listed), "", nil},
		{"bad token", answerWith(http.StatusUnauthorized, `{"error":"unknown token","reason":"unauthorized"}`), "refused",
			[]string{"did not accept the token in /box/token"}},
		{"no such route", answerWith(http.StatusNotFound, `{"error":"no such route","reason":"notFound"}`), "refused",
			[]string{"no vmshelf control plane route for the image list (404)", "--control"}},
		{"busy", answerWith(http.StatusServiceUnavailable, `{"error":"busy","reason":"busy"}`, "Retry-After", "1"), "stopped",
			[]string{"asking the control plane for the image list failed", "busy (503 busy)", "run the same command again"}},
		{"a redirect is not followed", answerWith(http.StatusTemporaryRedirect, "", "Location", "http://127.0.0.1:1/market/vms/status"), "refused",
			[]string{"the control plane refused the image list", "307"}},
		{"an image that does not parse", answerWith(http.StatusOK, `{"images":[{"upload_id":7}]}`), "refused",
			[]string{"cannot read"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			imgs, err := fakeControl(t, "/market/vms/status", tc.answer).Images(context.Background())
			wantErr(t, err, tc.want, tc.words...)
			if tc.want != "" {
				return
			}
			if len(imgs) != 2 || imgs[0].UploadID != testID || imgs[0].Name != "a disk" || imgs[0].VirtualSize != 1<<30 ||
				imgs[0].CreatedAt.Minute() != 21 || !imgs[1].EFI || imgs[1].SHA256 != "00" {
				t.Errorf("Images = %+v", imgs)
			}
			if raw := string(imgs[0].Raw); !strings.HasPrefix(raw, `{"upload_id":"`+testID+`","name":"a disk",`) || !strings.HasSuffix(raw, `,"later":1}`) {
				t.Errorf("Raw = %s; want the image's JSON compacted, unknown fields kept", raw)
			}
		})
	}

	t.Run("no answer", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Close() // its port refuses connections now
		_, err := Control{URL: srv.URL, Token: testToken}.Images(context.Background())
		wantErr(t, err, "stopped", "asking the control plane for the image list failed", "run the same command again")
	})
}

// TestRemove: the request names the image; a 200 that names it is
// success, anything else is refused in the control plane's words (unknown,
// in use, not sharing) or stopped.
func TestRemove(t *testing.T) {
	var asked atomic.Value
	record := func(next func(http.ResponseWriter, []byte)) func(http.ResponseWriter, []byte) {
		return func(w http.ResponseWriter, body []byte) {
			asked.Store(string(body))
			next(w, body)
		}
	}
	for _, tc := range []struct {
		name   string
		answer func(http.ResponseWriter, []byte)
		want   string
		words  []string
	}{
		{"removed", answerWith(http.StatusOK, `{"removed":"`+testID+`"}`), "", nil},
		{"unknown", answerWith(http.StatusNotFound, `{"error":"this box has no image with that upload_id","reason":"imageUnknown"}`), "refused",
			[]string{"the control plane refused removing image " + testID + ": this box has no image with that upload_id (404 imageUnknown)"}},
		{"in use", answerWith(http.StatusConflict, `{"error":"an order that is awaiting payment, paid or running uses this image","reason":"imageInUse"}`), "refused",
			[]string{"removing image " + testID, "uses this image (409 imageInUse)"}},
		{"another image named", answerWith(http.StatusOK, `{"removed":"89abcdef0123456789abcdef"}`), "refused",
			[]string{"does not name " + testID + " as removed"}},
		{"restarting", answerWith(http.StatusServiceUnavailable, `{"error":"the edge is shutting down","reason":"shuttingDown"}`), "stopped",
			[]string{"removing image " + testID + " failed", "run the same command again"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := fakeControl(t, "/market/vm-images/remove", record(tc.answer)).Remove(context.Background(), testID)
			wantErr(t, err, tc.want, tc.words...)
			var req map[string]any
			if body, _ := asked.Load().(string); json.Unmarshal([]byte(body), &req) != nil || len(req) != 1 || req["upload_id"] != testID {
				t.Errorf("the request's body was %q, want {\"upload_id\":%q}", body, testID)
			}
		})
	}
}
