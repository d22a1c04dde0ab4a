package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
)

// tusReq sends one tus request; body may be nil. It returns the answer
// with its body read.
func tusReq(t *testing.T, method, u string, body io.Reader, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Tus-Resumable", "1.0.0")
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if b, ok := body.(*bytes.Reader); ok {
		req.ContentLength = int64(b.Len())
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// create makes a tus session for size bytes and returns its absolute URL
// and the upload id.
func (e *env) create(size int) (string, string) {
	e.t.Helper()
	up, id := e.ticket()
	resp, b := tusReq(e.t, "POST", up, nil, "Upload-Length", strconv.Itoa(size))
	if resp.StatusCode != 201 {
		e.t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	loc, err := url.Parse(up)
	if err != nil {
		e.t.Fatal(err)
	}
	ref, err := loc.Parse(resp.Header.Get("Location"))
	if err != nil {
		e.t.Fatal(err)
	}
	return ref.String(), id
}

func patch(t *testing.T, sess string, off int, data []byte) (*http.Response, []byte) {
	t.Helper()
	return tusReq(t, "PATCH", sess, bytes.NewReader(data),
		"Content-Type", "application/offset+octet-stream", "Upload-Offset", strconv.Itoa(off))
}

func headOffset(t *testing.T, sess string) (int, int) {
	t.Helper()
	resp, _ := tusReq(t, "HEAD", sess, nil)
	if resp.StatusCode != 200 {
		return -1, resp.StatusCode
	}
	n, _ := strconv.Atoi(resp.Header.Get("Upload-Offset"))
	return n, 200
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestTusDiscovery(t *testing.T) {
	e := newEnv(t, nil)
	up, _ := e.ticket()
	req, _ := http.NewRequest("OPTIONS", up, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for k, want := range map[string]string{
		"Tus-Resumable": "1.0.0", "Tus-Version": "1.0.0", "Tus-Max-Size": strconv.Itoa(1 << 30),
		"Tus-Extension": "creation,creation-with-upload,termination,expiration",
	} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if resp.StatusCode != 204 {
		t.Errorf("status %d", resp.StatusCode)
	}
}

func TestTusCreateRefusals(t *testing.T) {
	cases := []struct {
		name   string
		mod    func(*Config)
		ticket func(e *env) string
		hdr    []string
		status int
		reason string
	}{
		{name: "no Tus-Resumable", hdr: []string{"Tus-Resumable", "", "Upload-Length", "100"}, status: 412, reason: "tusVersion"},
		{name: "wrong version", hdr: []string{"Tus-Resumable", "0.2.2", "Upload-Length", "100"}, status: 412, reason: "tusVersion"},
		{name: "no Upload-Length", status: 400, reason: "badRequest"},
		{name: "deferred length", hdr: []string{"Upload-Defer-Length", "1"}, status: 400, reason: "badRequest"},
		{name: "over the limit", mod: func(c *Config) { c.UploadMax = 1 << 20 }, hdr: []string{"Upload-Length", strconv.Itoa(2 << 20)}, status: 413, reason: "tooLarge"},
		{name: "no space for Upload-Length", mod: func(c *Config) { c.UploadMax = 1 << 60 }, hdr: []string{"Upload-Length", strconv.Itoa(1 << 59)}, status: 507, reason: "noSpace"},
		{name: "unknown ticket", ticket: func(e *env) string { return e.base + uploadPrefix + imagestore.NewSecret() },
			hdr: []string{"Upload-Length", "100"}, status: 404, reason: "ticketUnknown"},
		{name: "used ticket", ticket: func(e *env) string {
			u, _ := e.ticket()
			tusReq(e.t, "POST", u, nil, "Upload-Length", "100")
			return u
		}, hdr: []string{"Upload-Length", "100"}, status: 410, reason: "ticketUsed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.mod)
			u, _ := e.ticket()
			if tc.ticket != nil {
				u = tc.ticket(e)
			}
			resp, b := tusReq(t, "POST", u, nil, tc.hdr...)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d %s, want %d", resp.StatusCode, b, tc.status)
			}
			if r := errorOf(t, bytes.NewReader(b)).Reason; r != tc.reason {
				t.Errorf("reason %q, want %q", r, tc.reason)
			}
			if resp.Header.Get("Tus-Resumable") != "1.0.0" {
				t.Error("answer without Tus-Resumable")
			}
			if tc.name != "used ticket" { // its first POST made a live session
				e.assertNothingLeft()
			}
		})
	}
}

// TestTusUpload is the whole protocol on one image: a header split across
// PATCHes, a wrong offset, a wrong content type, HEAD between, and the
// final image with the sha256 of all bytes.
func TestTusUpload(t *testing.T) {
	data, _ := os.ReadFile(makeImage(t, "64M"))
	e := newEnv(t, nil)
	sess, id := e.create(len(data))
	if off, _ := headOffset(t, sess); off != 0 {
		t.Fatalf("HEAD after create: %d", off)
	}
	// 10 bytes: magic and version only; the header is decided later.
	if resp, b := patch(t, sess, 0, data[:10]); resp.StatusCode != 204 || resp.Header.Get("Upload-Offset") != "10" {
		t.Fatalf("first PATCH: %d %s offset %q", resp.StatusCode, b, resp.Header.Get("Upload-Offset"))
	}
	if resp, b := patch(t, sess, 0, data[:10]); resp.StatusCode != 409 || errorOf(t, bytes.NewReader(b)).Reason != "offsetMismatch" || resp.Header.Get("Upload-Offset") != "10" {
		t.Fatalf("stale offset: %d %s", resp.StatusCode, b)
	}
	if resp, _ := tusReq(t, "PATCH", sess, bytes.NewReader(data[10:20]), "Content-Type", "application/octet-stream", "Upload-Offset", "10"); resp.StatusCode != 415 {
		t.Fatalf("wrong content type: %d", resp.StatusCode)
	}
	half := len(data) / 2
	if resp, b := patch(t, sess, 10, data[10:half]); resp.StatusCode != 204 {
		t.Fatalf("second PATCH: %d %s", resp.StatusCode, b)
	}
	if off, _ := headOffset(t, sess); off != half {
		t.Fatalf("HEAD: offset %d, want %d", off, half)
	}
	if resp, b := patch(t, sess, half, append(append([]byte(nil), data[half:]...), 1, 2, 3)); resp.StatusCode != 413 {
		t.Fatalf("PATCH past Upload-Length: %d %s", resp.StatusCode, b)
	}
	if resp, b := patch(t, sess, half, data[half:]); resp.StatusCode != 204 || resp.Header.Get("Upload-Offset") != strconv.Itoa(len(data)) {
		t.Fatalf("last PATCH: %d %s", resp.StatusCode, b)
	}
	img, err := e.st.Image(context.Background(), id)
	if err != nil || img.SHA256 != sha(data) || img.Size != int64(len(data)) {
		t.Fatalf("stored image %+v (%v), want sha %s", img, err, sha(data))
	}
	// A client whose last answer was lost learns it is done.
	if off, _ := headOffset(t, sess); off != len(data) {
		t.Fatalf("HEAD after the end: %d", off)
	}
	if resp, _ := patch(t, sess, len(data), nil); resp.StatusCode != 204 {
		t.Fatalf("empty PATCH at the end: %d", resp.StatusCode)
	}
	e.assertNothingLeft(id)
}

func TestTusCreationWithUpload(t *testing.T) {
	data, _ := os.ReadFile(makeImage(t, "64M"))
	e := newEnv(t, nil)
	up, id := e.ticket()
	resp, b := tusReq(t, "POST", up, bytes.NewReader(data[:1000]), "Upload-Length", strconv.Itoa(len(data)),
		"Content-Type", "application/offset+octet-stream")
	if resp.StatusCode != 201 || resp.Header.Get("Upload-Offset") != "1000" || resp.Header.Get("Location") == "" || resp.Header.Get("Upload-Expires") == "" {
		t.Fatalf("creation with upload: %d %s %v", resp.StatusCode, b, resp.Header)
	}
	sess := e.base + resp.Header.Get("Location")
	if resp, b := patch(t, sess, 1000, data[1000:]); resp.StatusCode != 204 {
		t.Fatalf("rest: %d %s", resp.StatusCode, b)
	}
	e.assertNothingLeft(id)
}

// TestTusHostileAcrossPatches: a backing-file header whose deciding bytes
// arrive in the second PATCH is refused there, and the session ends.
func TestTusHostileAcrossPatches(t *testing.T) {
	dir := t.TempDir()
	qemuImg(t, "create", "-q", "-f", "qcow2", filepath.Join(dir, "base.qcow2"), "64M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-b", filepath.Join(dir, "base.qcow2"), "-F", "qcow2", filepath.Join(dir, "top.qcow2"))
	data, _ := os.ReadFile(filepath.Join(dir, "top.qcow2"))
	e := newEnv(t, nil)
	sess, _ := e.create(len(data))
	if resp, b := patch(t, sess, 0, data[:9]); resp.StatusCode != 204 {
		t.Fatalf("first 9 bytes: %d %s", resp.StatusCode, b)
	}
	resp, b := patch(t, sess, 9, data[9:])
	if resp.StatusCode != 422 || errorOf(t, bytes.NewReader(b)).Reason != "backingFile" {
		t.Fatalf("rest: %d %s, want 422 backingFile", resp.StatusCode, b)
	}
	if _, code := headOffset(t, sess); code != 404 {
		t.Fatalf("HEAD after refusal: %d, want 404", code)
	}
	e.assertNothingLeft()
}

// TestTusRestartBetweenPatches: the gateway restarts between PATCHes; the
// upload continues and the sha256 covers every byte, from the saved hash
// state.
func TestTusRestartBetweenPatches(t *testing.T) {
	data, _ := os.ReadFile(makeImage(t, "64M"))
	dataDir, db := t.TempDir(), filepath.Join(t.TempDir(), "vmshelf.db")
	e := newEnvFull(t, dataDir, db, nil)
	sess, id := e.create(len(data))
	third := len(data) / 3
	if resp, b := patch(t, sess, 0, data[:third]); resp.StatusCode != 204 {
		t.Fatalf("first PATCH: %d %s", resp.StatusCode, b)
	}
	e.stop()
	if err := imagestore.Reconcile(context.Background(), mustOpen(t, db), e.blobs, e.g.log); err != nil {
		t.Fatal(err)
	}
	e2 := newEnvFull(t, dataDir, db, nil)
	sess2 := e2.base + sess[len(e.base):]
	if off, _ := headOffset(t, sess2); off != third {
		t.Fatalf("HEAD after restart: %d, want %d", off, third)
	}
	if resp, b := patch(t, sess2, third, data[third:]); resp.StatusCode != 204 {
		t.Fatalf("PATCH after restart: %d %s", resp.StatusCode, b)
	}
	img, err := e2.st.Image(context.Background(), id)
	if err != nil || img.SHA256 != sha(data) {
		t.Fatalf("image after restart: %+v %v, want sha %s", img, err, sha(data))
	}
	e2.assertNothingLeft(id)
}

func mustOpen(t *testing.T, db string) imagestore.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// holding reports whether a PATCH holds the upload's lock.
func (l *patchLocks) holding(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held[id] != nil
}

// slowPatch starts a PATCH whose body is a pipe; the caller writes to it.
func slowPatch(t *testing.T, sess string, off, length int) (*io.PipeWriter, chan *http.Response) {
	t.Helper()
	pr, pw := io.Pipe()
	out := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest("PATCH", sess, pr)
		req.ContentLength = int64(length)
		req.Header.Set("Tus-Resumable", "1.0.0")
		req.Header.Set("Content-Type", "application/offset+octet-stream")
		req.Header.Set("Upload-Offset", strconv.Itoa(off))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			close(out)
			return
		}
		resp.Body.Close()
		out <- resp
	}()
	return pw, out
}

// TestTusTakeover: a second PATCH while the first still streams takes the
// upload over; the first stops and saves what it wrote; the second learns
// the true offset (409) and the upload ends with the right bytes.
func TestTusTakeover(t *testing.T) {
	data, _ := os.ReadFile(makeImage(t, "64M"))
	e := newEnv(t, nil)
	sess, id := e.create(len(data))
	pw, first := slowPatch(t, sess, 0, len(data))
	pw.Write(data[:100000])
	waitFor(t, func() bool { return e.g.locks.holding(id) })
	waitFor(t, func() bool { return bytesReceived(e) >= 100000 })

	resp, b := patch(t, sess, 0, data)
	if resp.StatusCode != 409 || resp.Header.Get("Upload-Offset") != "100000" {
		t.Fatalf("second PATCH: %d %s (Upload-Offset %q), want 409 at 100000", resp.StatusCode, b, resp.Header.Get("Upload-Offset"))
	}
	pw.CloseWithError(io.ErrClosedPipe)
	if r, ok := <-first; ok && r.StatusCode != 423 {
		t.Fatalf("first PATCH: %d, want 423", r.StatusCode)
	}
	if resp, b := patch(t, sess, 100000, data[100000:]); resp.StatusCode != 204 {
		t.Fatalf("rest: %d %s", resp.StatusCode, b)
	}
	img, err := e.st.Image(context.Background(), id)
	if err != nil || img.SHA256 != sha(data) {
		t.Fatalf("image: %+v %v", img, err)
	}
}

// TestTusReconnectBeforeHandler: an old PATCH that hangs before its first
// bytes (fasthttp reads 8 KiB before the handler runs) holds nothing; the
// reconnected PATCH at the same offset proceeds at once.
func TestTusReconnectBeforeHandler(t *testing.T) {
	data, _ := os.ReadFile(makeImage(t, "64M"))
	e := newEnv(t, nil)
	sess, id := e.create(len(data))
	pw, first := slowPatch(t, sess, 0, len(data))
	if resp, b := patch(t, sess, 0, data); resp.StatusCode != 204 {
		t.Fatalf("reconnected PATCH: %d %s", resp.StatusCode, b)
	}
	pw.CloseWithError(io.ErrClosedPipe)
	<-first
	if img, err := e.st.Image(context.Background(), id); err != nil || img.SHA256 != sha(data) {
		t.Fatalf("image: %+v %v", img, err)
	}
}

func bytesReceived(e *env) float64 {
	return testutil.ToFloat64(e.g.metrics.bytes.WithLabelValues(dirUpload))
}

// TestTusIdleKeepsProgress: a PATCH that stalls ends with 408 but keeps the
// bytes it received for the next PATCH.
func TestTusIdleKeepsProgress(t *testing.T) {
	data, _ := os.ReadFile(makeImage(t, "64M"))
	e := newEnv(t, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	sess, id := e.create(len(data))
	pw, first := slowPatch(t, sess, 0, len(data))
	defer pw.Close()
	pw.Write(data[:50000])
	r, ok := <-first
	if !ok || r.StatusCode != 408 {
		t.Fatalf("stalled PATCH: %v, want 408", r)
	}
	if off, _ := headOffset(t, sess); off != 50000 {
		t.Fatalf("offset after idle: %d, want 50000", off)
	}
	if resp, b := patch(t, sess, 50000, data[50000:]); resp.StatusCode != 204 {
		t.Fatalf("rest: %d %s", resp.StatusCode, b)
	}
	e.assertNothingLeft(id)
}

// TestTusShutdownSavesProgress: a PATCH running when the gateway shuts
// down is answered 503 and its bytes are kept.
func TestTusShutdownSavesProgress(t *testing.T) {
	data, _ := os.ReadFile(makeImage(t, "64M"))
	e := newEnv(t, nil)
	sess, id := e.create(len(data))
	pw, first := slowPatch(t, sess, 0, len(data))
	defer pw.Close()
	pw.Write(data[:70000])
	waitFor(t, func() bool { return bytesReceived(e) >= 70000 })
	stopped := make(chan struct{})
	go func() { e.stop(); close(stopped) }()
	if r, ok := <-first; ok && r.StatusCode != 503 {
		t.Fatalf("PATCH during shutdown: %d, want 503", r.StatusCode)
	}
	<-stopped
	st := mustOpen(t, e.db)
	got, err := st.Session(context.Background(), imagestore.HashSecret(sess[len(sess)-64:]))
	if err != nil || got.Offset != 70000 || got.UploadID != id {
		t.Fatalf("session after shutdown: %+v %v, want offset 70000", got, err)
	}
}

// TestTusExpiry: an unfinished upload ends 24 h after its last byte; the
// sweep removes the session and its partial file.
func TestTusExpiry(t *testing.T) {
	data, _ := os.ReadFile(makeImage(t, "64M"))
	e := newEnv(t, nil)
	sess, _ := e.create(len(data))
	if resp, _ := patch(t, sess, 0, data[:5000]); resp.StatusCode != 204 {
		t.Fatal("PATCH")
	}
	e.clock.advance(23 * time.Hour)
	e.g.sweepSessions()
	if off, _ := headOffset(t, sess); off != 5000 {
		t.Fatalf("after 23 h: offset %d", off)
	}
	e.clock.advance(2 * time.Hour)
	e.g.sweepSessions()
	if _, code := headOffset(t, sess); code != 404 {
		t.Fatalf("after 25 h: HEAD %d, want 404", code)
	}
	e.assertNothingLeft()
}

func TestTusTerminate(t *testing.T) {
	data, _ := os.ReadFile(makeImage(t, "64M"))
	e := newEnv(t, nil)
	sess, _ := e.create(len(data))
	patch(t, sess, 0, data[:5000])
	if resp, _ := tusReq(t, "DELETE", sess, nil); resp.StatusCode != 204 {
		t.Fatalf("DELETE: %d", resp.StatusCode)
	}
	if _, code := headOffset(t, sess); code != 404 {
		t.Fatalf("HEAD after DELETE: %d", code)
	}
	e.assertNothingLeft()
}

func TestCORS(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.CORSOrigin = "https://box.example" })
	up, _ := e.ticket()
	req, _ := http.NewRequest("OPTIONS", up, nil)
	req.Header.Set("Origin", "https://box.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "tus-resumable, upload-length")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "https://box.example" ||
		!bytes.Contains([]byte(resp.Header.Get("Access-Control-Allow-Headers")), []byte("Upload-Length")) ||
		!bytes.Contains([]byte(resp.Header.Get("Access-Control-Allow-Methods")), []byte("PATCH")) {
		t.Fatalf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
	r2, _ := tusReq(t, "POST", up, nil, "Upload-Length", "100", "Origin", "https://box.example")
	if r2.Header.Get("Access-Control-Allow-Origin") != "https://box.example" || !bytes.Contains([]byte(r2.Header.Get("Access-Control-Expose-Headers")), []byte("Location")) {
		t.Fatalf("answer to the origin lacks CORS headers: %v", r2.Header)
	}
	r3, _ := tusReq(t, "HEAD", e.base+fetchPrefix+imagestore.NewSecret(), nil, "Origin", "https://evil.example")
	if r3.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatal("CORS headers for a foreign origin")
	}
}
