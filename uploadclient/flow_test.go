package uploadclient

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// fakeEdge is a control plane and a data plane in one: it issues tickets,
// keeps one tus session and lists the image once the session has every
// byte. It can cut the first PATCH after some bytes (the connection
// closed, as a proxy's restart does) and report another digest than the
// one of the bytes it holds (a file changed, or bytes changed on the way).
type fakeEdge struct {
	t   *testing.T
	srv *httptest.Server

	mu          sync.Mutex
	cutAfter    int  // the first PATCH is cut after this many bytes; 0: none
	wrongDigest bool // the image is listed with another digest
	tickets     int
	sessions    int
	length      int64
	data        []byte // the session's bytes
	received    int    // body bytes taken over every PATCH
}

func newFakeEdge(t *testing.T) *fakeEdge {
	e := &fakeEdge{t: t}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEdge) control() Control {
	return Control{URL: e.srv.URL, Token: testToken, TokenFile: "/box/token", HTTPClient: e.srv.Client()}
}

func (e *fakeEdge) serve(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/market/vm-images/ticket":
		e.tickets++
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]string{"ticket": testToken, "upload_id": testID, "upload_url": e.srv.URL + "/up/" + testID})
	case r.Method == http.MethodPost && r.URL.Path == "/up/"+testID:
		e.sessions++
		e.length, _ = strconv.ParseInt(r.Header.Get("Upload-Length"), 10, 64)
		e.data = nil
		w.Header().Set("Location", "/sessions/"+testID)
		w.WriteHeader(http.StatusCreated)
	case r.Method == http.MethodHead && r.URL.Path == "/sessions/"+testID:
		w.Header().Set("Upload-Offset", strconv.Itoa(len(e.data)))
		w.Header().Set("Upload-Length", strconv.FormatInt(e.length, 10))
	case r.Method == http.MethodPatch && r.URL.Path == "/sessions/"+testID:
		e.patch(w, r)
	case r.Method == http.MethodPost && r.URL.Path == "/market/vms/status":
		images := []Image{}
		if e.length > 0 && int64(len(e.data)) == e.length {
			sum := sha256.Sum256(e.data)
			if e.wrongDigest {
				sum[0] ^= 1
			}
			images = append(images, Image{UploadID: testID, Name: "disk", Size: e.length, SHA256: hex.EncodeToString(sum[:])})
		}
		json.NewEncoder(w).Encode(map[string]any{"images": images})
	default:
		e.t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
		w.WriteHeader(http.StatusNotFound)
	}
}

func (e *fakeEdge) patch(w http.ResponseWriter, r *http.Request) {
	if off, err := strconv.Atoi(r.Header.Get("Upload-Offset")); err != nil || off != len(e.data) {
		w.Header().Set("Upload-Offset", strconv.Itoa(len(e.data)))
		w.WriteHeader(http.StatusConflict)
		return
	}
	if e.cutAfter > 0 {
		buf := make([]byte, e.cutAfter)
		n, _ := io.ReadFull(r.Body, buf)
		e.data, e.received, e.cutAfter = append(e.data, buf[:n]...), e.received+n, 0
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			e.t.Errorf("hijack to cut the PATCH: %v", err)
			return
		}
		conn.Close()
		return
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		e.t.Errorf("read a PATCH: %v", err)
	}
	e.data, e.received = append(e.data, b...), e.received+len(b)
	w.Header().Set("Upload-Offset", strconv.Itoa(len(e.data)))
	w.WriteHeader(http.StatusNoContent)
}

// TestUploadFlow runs Upload against the fake edge: a whole upload whose
// stored digest is the file's; a PATCH cut halfway is resumed in the same
// session from the edge's offset, with one ticket and each byte sent once;
// a stored digest that is not the file's is refused naming both.
func TestUploadFlow(t *testing.T) {
	img := qcow2test.Base()
	sum := sha256.Sum256(img)
	want := hex.EncodeToString(sum[:])
	sum[0] ^= 1 // what the fake lists when told to report another digest
	other := hex.EncodeToString(sum[:])
	for _, tc := range []struct {
		name        string
		cutAfter    int
		wrongDigest bool
	}{
		{name: "whole"},
		{name: "cut halfway", cutAfter: len(img) / 2},
		{name: "digest not the file's", wrongDigest: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEdge(t)
			e.cutAfter, e.wrongDigest = tc.cutAfter, tc.wrongDigest
			path := filepath.Join(t.TempDir(), "disk.qcow2")
			if err := os.WriteFile(path, img, 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := OpenImage(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var said bytes.Buffer
			got, err := Upload(t.Context(), Config{Control: e.control(), Name: "disk", Retries: 2, MaxVirtual: 1 << 40, Progress: &said}, f)
			e.mu.Lock()
			defer e.mu.Unlock()
			if tc.wrongDigest {
				var refused *RefusedError
				if !errors.As(err, &refused) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), other) {
					t.Fatalf("Upload with another digest stored: %v, want a refusal naming the file's %s and the stored %s", err, want, other)
				}
				return
			}
			if err != nil {
				t.Fatalf("Upload: %v (it said: %s)", err, said.String())
			}
			if got.SHA256 != want || got.UploadID != testID {
				t.Errorf("stored %+v, want image %s with sha256 %s", got, testID, want)
			}
			if e.tickets != 1 || e.sessions != 1 || e.received != len(img) || !bytes.Equal(e.data, img) {
				t.Errorf("%d tickets, %d sessions, %d bytes received (the edge holds %d, the file's: %v); want one ticket, one session, each of the %d bytes once",
					e.tickets, e.sessions, e.received, len(e.data), bytes.Equal(e.data, img), len(img))
			}
			if _, err := os.Stat(path + stateSuffix); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the state file is left after the upload: %v", err)
			}
			if tc.cutAfter > 0 && !strings.Contains(said.String(), "the edge has") {
				t.Errorf("the resumed upload does not say where it resumed:\n%s", said.String())
			}
		})
	}
}
