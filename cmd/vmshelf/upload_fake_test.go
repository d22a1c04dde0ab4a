package main

// Tests of 'vmshelf upload' (the built binary) against a fake edge: a
// loopback httptest server that speaks the control plane's two routes and
// tus 1.0.0 as serve does, but can lie about the stored digest or answer
// 503 with Retry-After on demand. They need no qemu (the image is
// qcow2test.Base) and no serve, so they check what the real edge cannot
// be made to do on cue.

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// fakeEdge is a control plane and a tus data plane for one upload.
type fakeEdge struct {
	t        *testing.T
	srv      *httptest.Server
	token    string
	ticket   string // the one ticket it hands out
	uploadID string
	sid      string // the one session's id

	mu       sync.Mutex
	name     string
	efi      bool
	length   int64 // the session's Upload-Length; -1 before creation
	got      []byte
	tickets  int // tickets handed out
	sessions int // sessions created
	// busy holds, per route ("ticket", "patch"), the Retry-After values
	// of the 503 answers to give before serving that route.
	busy map[string][]string
	// wrongDigest: status reports a digest other than the bytes'.
	wrongDigest bool
	reported    string // the digest status reported
	reqs        []fakeRequest
}

// fakeRequest is one request the fake edge answered.
type fakeRequest struct {
	route  string    // ticket, create, head, patch, status, or the method and path
	status int       // the answer's status
	at     time.Time // when it arrived (before its body was read)
	done   time.Time // when its answer was written
}

func (r fakeRequest) String() string { return fmt.Sprintf("%s %d", r.route, r.status) }

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func startFakeEdge(t *testing.T) *fakeEdge {
	t.Helper()
	f := &fakeEdge{
		t: t, token: randomHex(t, 32), ticket: randomHex(t, 32), uploadID: randomHex(t, 12), sid: randomHex(t, 32),
		length: -1, busy: map[string][]string{},
	}
	f.srv = httptest.NewServer(f) // 127.0.0.1
	t.Cleanup(f.srv.Close)
	return f
}

// tokenFile writes the fake edge's token to a 0600 file.
func (f *fakeEdge) tokenFile(dir string) string {
	f.t.Helper()
	p := filepath.Join(dir, "token")
	if err := os.WriteFile(p, []byte(f.token+"\n"), 0o600); err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *fakeEdge) requests() []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeRequest(nil), f.reqs...)
}

func (f *fakeEdge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	route, status := f.serve(w, r)
	f.mu.Lock()
	f.reqs = append(f.reqs, fakeRequest{route: route, status: status, at: at, done: time.Now()})
	f.mu.Unlock()
}

// fail writes the JSON error shape.
func fail(w http.ResponseWriter, status int, reason, msg string) int {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg, "reason": reason})
	return status
}

func answerJSON(w http.ResponseWriter, status int, v any) int {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
	return status
}

// refuseBusy answers 503 busy with the next Retry-After queued for route,
// if any.
func (f *fakeEdge) refuseBusy(w http.ResponseWriter, route string) (int, bool) {
	q := f.busy[route]
	if len(q) == 0 {
		return 0, false
	}
	f.busy[route] = q[1:]
	w.Header().Set("Retry-After", q[0])
	return fail(w, http.StatusServiceUnavailable, "busy", "the edge is running as many transfers as it may; retry after a few seconds"), true
}

func (f *fakeEdge) serve(w http.ResponseWriter, r *http.Request) (string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sessionPath := "/upload-sessions/" + f.sid
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/market/vm-images/ticket":
		if r.Header.Get("Authorization") != "Bearer "+f.token {
			return "ticket", fail(w, http.StatusUnauthorized, "unauthorized", "unknown token")
		}
		if status, ok := f.refuseBusy(w, "ticket"); ok {
			return "ticket", status
		}
		var req struct {
			Name string `json:"name"`
			EFI  bool   `json:"efi"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || f.tickets > 0 {
			// One ticket only: a second one is a test failure, seen in the
			// request list.
			return "ticket", fail(w, http.StatusBadRequest, "badRequest", "the fake edge hands out one ticket")
		}
		f.tickets++
		f.name, f.efi = req.Name, req.EFI
		return "ticket", answerJSON(w, http.StatusCreated, map[string]any{
			"ticket": f.ticket, "upload_id": f.uploadID, "upload_url": f.srv.URL + "/upload/" + f.ticket,
			"expires_at": time.Now().Add(time.Hour).UTC(),
		})
	case r.Method == http.MethodPost && r.URL.Path == "/upload/"+f.ticket:
		n, err := strconv.ParseInt(r.Header.Get("Upload-Length"), 10, 64)
		if r.Header.Get("Tus-Resumable") != "1.0.0" || err != nil || n < 0 {
			return "create", fail(w, http.StatusBadRequest, "badRequest", "tus creation needs Tus-Resumable and Upload-Length")
		}
		if f.sessions > 0 {
			return "create", fail(w, http.StatusGone, "ticketUsed", "the ticket was used")
		}
		f.sessions++
		f.length = n
		w.Header().Set("Location", sessionPath)
		w.WriteHeader(http.StatusCreated)
		return "create", http.StatusCreated
	case r.Method == http.MethodHead && r.URL.Path == sessionPath:
		w.Header().Set("Upload-Offset", strconv.Itoa(len(f.got)))
		w.Header().Set("Upload-Length", strconv.FormatInt(f.length, 10))
		w.WriteHeader(http.StatusOK)
		return "head", http.StatusOK
	case r.Method == http.MethodPatch && r.URL.Path == sessionPath:
		if status, ok := f.refuseBusy(w, "patch"); ok { // before the body, as serve's admitPatch
			return "patch", status
		}
		off, err := strconv.ParseInt(r.Header.Get("Upload-Offset"), 10, 64)
		if err != nil || off != int64(len(f.got)) {
			w.Header().Set("Upload-Offset", strconv.Itoa(len(f.got)))
			return "patch", fail(w, http.StatusConflict, "offsetMismatch", "not the session's offset")
		}
		b, err := io.ReadAll(io.LimitReader(r.Body, f.length-off+1))
		f.got = append(f.got, b[:min(int64(len(b)), f.length-off)]...)
		if err != nil || int64(len(b)) > f.length-off {
			return "patch", fail(w, http.StatusBadRequest, "badRequest", "the body ended early or is too long")
		}
		w.Header().Set("Upload-Offset", strconv.Itoa(len(f.got)))
		w.WriteHeader(http.StatusNoContent)
		return "patch", http.StatusNoContent
	case r.Method == http.MethodPost && r.URL.Path == "/market/vms/status":
		if r.Header.Get("Authorization") != "Bearer "+f.token {
			return "status", fail(w, http.StatusUnauthorized, "unauthorized", "unknown token")
		}
		images := []map[string]any{}
		if f.length >= 0 && int64(len(f.got)) == f.length {
			sum := sha256.Sum256(f.got)
			digest := hex.EncodeToString(sum[:])
			if f.wrongDigest {
				other := sha256.Sum256(append([]byte("not the file"), f.got...))
				digest = hex.EncodeToString(other[:])
			}
			f.reported = digest
			images = append(images, map[string]any{
				"upload_id": f.uploadID, "name": f.name, "efi": f.efi, "size": f.length,
				"virtual_size": 64 << 20, "sha256": digest, "created_at": time.Now().UTC(),
			})
		}
		return "status", answerJSON(w, http.StatusOK, map[string]any{"available": true, "images": images})
	}
	return r.Method + " " + r.URL.Path, fail(w, http.StatusNotFound, "notFound", "no such route")
}

// fakeImage writes qcow2test.Base, a valid QCOW2 the local check accepts.
func fakeImage(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	b := qcow2test.Base()
	p := filepath.Join(dir, "disk.qcow2")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, b
}

// wantRoutes checks the exact sequence of requests the edge answered.
func wantRoutes(t *testing.T, got []fakeRequest, want ...string) {
	t.Helper()
	var s []string
	for _, r := range got {
		s = append(s, r.String())
	}
	if strings.Join(s, ", ") != strings.Join(want, ", ") {
		t.Errorf("the edge answered:\n  %s\nwant:\n  %s", strings.Join(s, ", "), strings.Join(want, ", "))
	}
}

// TestUploadDigestMismatch: when the stored image's sha256 is not the
// file's, 'vmshelf upload' refuses (exit 1) naming both digests, prints no
// image and removes its state file (the session is over: a rerun would
// find the same image). With the right digest the same fake edge stores
// the image: the refusal is the digest's doing.
func TestUploadDigestMismatch(t *testing.T) {
	for _, wrong := range []bool{false, true} {
		t.Run(fmt.Sprintf("wrong digest %v", wrong), func(t *testing.T) {
			work := t.TempDir()
			f := startFakeEdge(t)
			f.wrongDigest = wrong
			disk, b := fakeImage(t, work)
			r := vmshelf(t, "upload", "--control", f.srv.URL, "--token-file", f.tokenFile(work), "--name", "digest", disk)

			wantRoutes(t, f.requests(), "ticket 201", "create 201", "patch 204", "status 200")
			f.mu.Lock()
			got := f.got
			f.mu.Unlock()
			if string(got) != string(b) {
				t.Errorf("the edge received %d bytes, not the file's %d", len(got), len(b))
			}
			if _, err := os.Stat(disk + ".vmshelf-upload"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the state file is still there (stat: %v)", err)
			}
			f.mu.Lock()
			reported := f.reported
			f.mu.Unlock()
			// Digests are 64 hex too: only they may show.
			if shown := strings.NewReplacer(reported, "", sha256hex(b), "").Replace(r.stdout + r.stderr); anySecret.MatchString(shown) {
				t.Errorf("upload printed something capability-shaped:\n%s", r.stderr)
			}
			if !wrong {
				var img imageAnswer
				if r.code != 0 {
					t.Fatalf("exit %d with the right digest; stderr:\n%s", r.code, r.stderr)
				}
				decode(t, []byte(r.stdout), &img)
				if img.UploadID != f.uploadID || img.SHA256 != sha256hex(b) || img.Size != int64(len(b)) {
					t.Errorf("printed %+v; want image %s with sha256 %s", img, f.uploadID, sha256hex(b))
				}
				return
			}
			line := refusal(t, r, 1)
			for _, want := range []string{"sha256 " + reported, "has " + sha256hex(b), disk, f.uploadID} {
				if !strings.Contains(line, want) {
					t.Errorf("the refusal %q does not mention %q", line, want)
				}
			}
		})
	}
}

// TestUploadHonoursRetryAfter: a 503 with Retry-After from the control
// plane (1 s) and from the data plane (2 s) is waited out before the
// retry, measured at the edge: the next request arrives at least
// Retry-After after the 503 was answered (the client's own first backoff
// is 0.5 s), and not much later; then the upload succeeds.
func TestUploadHonoursRetryAfter(t *testing.T) {
	work := t.TempDir()
	f := startFakeEdge(t)
	f.busy["ticket"] = []string{"1"}
	f.busy["patch"] = []string{"2"}
	disk, b := fakeImage(t, work)
	r := vmshelf(t, "upload", "--control", f.srv.URL, "--token-file", f.tokenFile(work), "--name", "busy", disk)
	if r.code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", r.code, r.stderr)
	}
	var img imageAnswer
	decode(t, []byte(r.stdout), &img)
	if img.UploadID != f.uploadID || img.SHA256 != sha256hex(b) {
		t.Errorf("printed %+v; want image %s with sha256 %s", img, f.uploadID, sha256hex(b))
	}
	reqs := f.requests()
	// After the PATCH's 503 the client asks how far the upload got.
	wantRoutes(t, reqs, "ticket 503", "ticket 201", "create 201", "patch 503", "head 200", "patch 204", "status 200")
	if len(reqs) != 7 {
		t.FailNow()
	}
	// The client binary is not built with -race; 2 s covers a loaded
	// machine's scheduling delays, and is well under the next backoff step
	// a double wait would show.
	const slack = 2 * time.Second
	for _, c := range []struct {
		refused, retry int
		after          time.Duration
	}{{0, 1, time.Second}, {3, 4, 2 * time.Second}} {
		gap := reqs[c.retry].at.Sub(reqs[c.refused].done)
		if gap < c.after || gap > c.after+slack {
			t.Errorf("%s came %v after the %s with Retry-After %v; want %v to %v",
				reqs[c.retry].route, gap, reqs[c.refused], c.after, c.after, c.after+slack)
		}
		t.Logf("%s came %v after the %s with Retry-After %v", reqs[c.retry].route, gap, reqs[c.refused], c.after)
	}
	for _, want := range []string{"retry 1 of 10 in 1s", "retry 1 of 10 in 2s"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, r.stderr)
		}
	}
}
