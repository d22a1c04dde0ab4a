package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
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
	req := newRequest(t, method, u, body)
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
	return do(t, req)
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
	return e.sessionOf(up, resp), id
}

// sessionOf resolves the Location of a creation answer against the upload
// URL, and remembers the session id as a capability.
func (e *env) sessionOf(up string, resp *http.Response) string {
	e.t.Helper()
	loc, err := url.Parse(up)
	if err != nil {
		e.t.Fatal(err)
	}
	ref, err := loc.Parse(resp.Header.Get("Location"))
	if err != nil || !strings.HasPrefix(ref.Path, sessionPrefix) {
		e.t.Fatalf("Location %q: %v", resp.Header.Get("Location"), err)
	}
	e.remember(capabilityOf(ref.Path))
	return ref.String()
}

func patch(t *testing.T, sess string, off int, data []byte) (*http.Response, []byte) {
	t.Helper()
	return tusReq(t, "PATCH", sess, bytes.NewReader(data),
		"Content-Type", "application/offset+octet-stream", "Upload-Offset", strconv.Itoa(off))
}

// headOffset asks a session's offset: the offset and 200, or -1 and the
// status when HEAD is refused.
func headOffset(t *testing.T, sess string) (int, int) {
	t.Helper()
	resp, _ := tusReq(t, "HEAD", sess, nil)
	if resp.StatusCode != 200 {
		return -1, resp.StatusCode
	}
	n, err := strconv.Atoi(resp.Header.Get("Upload-Offset"))
	if err != nil {
		t.Fatalf("HEAD answered 200 with Upload-Offset %q: %v", resp.Header.Get("Upload-Offset"), err)
	}
	return n, 200
}

// wantOffset fails unless HEAD answers 200 with offset want.
func wantOffset(t *testing.T, sess string, want int, when string) {
	t.Helper()
	if off, code := headOffset(t, sess); code != 200 || off != want {
		t.Fatalf("HEAD %s: %d, offset %d; want 200, offset %d", when, code, off, want)
	}
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestTusDiscovery(t *testing.T) {
	e := newEnv(t, nil)
	up, _ := e.ticket()
	resp, _ := do(t, newRequest(t, "OPTIONS", up, nil))
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
	e.assertTicket(up, false)
}

func TestTusCreateRefusals(t *testing.T) {
	cases := []struct {
		name   string
		mod    func(*Config)
		ticket func(e *env) (string, string) // upload URL and the upload id of a session it opened
		hdr    []string
		status int
		reason string
		ends   bool // the refusal ends the ticket (release.go)
	}{
		{name: "no Tus-Resumable", hdr: []string{"Tus-Resumable", "", "Upload-Length", "100"}, status: 412, reason: "tusVersion"},
		{name: "wrong version", hdr: []string{"Tus-Resumable", "0.2.2", "Upload-Length", "100"}, status: 412, reason: "tusVersion"},
		{name: "no Upload-Length", status: 400, reason: "badRequest"},
		{name: "deferred length", hdr: []string{"Upload-Defer-Length", "1"}, status: 400, reason: "badRequest"},
		{name: "over the limit", mod: func(c *Config) { c.UploadMax = 1 << 20 }, hdr: []string{"Upload-Length", strconv.Itoa(2 << 20)}, status: 413, reason: "tooLarge", ends: true},
		// A session holds no space, but one whose first chunk has no room
		// now is refused at once.
		{name: "no space for the first chunk", mod: func(c *Config) { c.UploadMax, c.SessionAhead = 1<<60, 1<<59 }, hdr: []string{"Upload-Length", strconv.Itoa(1 << 59)}, status: 507, reason: "noSpace"},
		{name: "unknown ticket", ticket: func(e *env) (string, string) { return e.base + uploadPrefix + imagestore.NewSecret(), "" },
			hdr: []string{"Upload-Length", "100"}, status: 404, reason: "ticketUnknown"},
		{name: "used ticket", ticket: func(e *env) (string, string) {
			u, id := e.ticket()
			if resp, b := tusReq(e.t, "POST", u, nil, "Upload-Length", "100"); resp.StatusCode != 201 {
				e.t.Fatalf("first POST: %d %s", resp.StatusCode, b)
			}
			return u, id
		}, hdr: []string{"Upload-Length", "100"}, status: 410, reason: "ticketUsed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.mod)
			u, _ := e.ticket()
			var open []string
			if tc.ticket != nil {
				var id string
				if u, id = tc.ticket(e); id != "" {
					open = append(open, id) // its first POST made a live session
				}
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
			e.assertLeft(nil, open)
			switch {
			case tc.ends:
				e.assertReleased(u)
			case tc.ticket == nil: // refused before the ticket was used
				e.assertTicket(u, false)
			}
			if got := testutil.ToFloat64(e.g.metrics.rejections.WithLabelValues(dirUpload, tc.reason)); got != 1 {
				t.Errorf("rejections{reason=%s} = %v, want 1", tc.reason, got)
			}
		})
	}
}

// TestTusUpload is the whole protocol on one image: a header split across
// PATCHes, a wrong offset, a wrong content type, HEAD between, and the
// final image with the sha256 of all bytes.
func TestTusUpload(t *testing.T) {
	needQemu(t)
	data := mustRead(t, makeImage(t, "64M"))
	e := newEnv(t, nil)
	sess, id := e.create(len(data))
	wantOffset(t, sess, 0, "after create")
	// 10 bytes: magic and version only; the header is decided later.
	if resp, b := patch(t, sess, 0, data[:10]); resp.StatusCode != 204 || resp.Header.Get("Upload-Offset") != "10" {
		t.Fatalf("first PATCH: %d %s offset %q", resp.StatusCode, b, resp.Header.Get("Upload-Offset"))
	}
	if resp, b := patch(t, sess, 0, data[:10]); resp.StatusCode != 409 || errorOf(t, bytes.NewReader(b)).Reason != "offsetMismatch" || resp.Header.Get("Upload-Offset") != "10" {
		t.Fatalf("stale offset: %d %s", resp.StatusCode, b)
	}
	if resp, b := tusReq(t, "PATCH", sess, bytes.NewReader(data[10:20]), "Content-Type", "application/octet-stream", "Upload-Offset", "10"); resp.StatusCode != 415 || errorOf(t, bytes.NewReader(b)).Reason != "badContentType" {
		t.Fatalf("wrong content type: %d %s", resp.StatusCode, b)
	}
	half := len(data) / 2
	if resp, b := patch(t, sess, 10, data[10:half]); resp.StatusCode != 204 {
		t.Fatalf("second PATCH: %d %s", resp.StatusCode, b)
	}
	wantOffset(t, sess, half, "after the second PATCH")
	if resp, b := patch(t, sess, half, append(append([]byte(nil), data[half:]...), 1, 2, 3)); resp.StatusCode != 413 {
		t.Fatalf("PATCH past Upload-Length: %d %s", resp.StatusCode, b)
	}
	e.assertLeft(nil, []string{id})
	if resp, b := patch(t, sess, half, data[half:]); resp.StatusCode != 204 || resp.Header.Get("Upload-Offset") != strconv.Itoa(len(data)) {
		t.Fatalf("last PATCH: %d %s", resp.StatusCode, b)
	}
	img, err := e.st.Image(context.Background(), id)
	if err != nil || img.SHA256 != sha(data) || img.Size != int64(len(data)) {
		t.Fatalf("stored image %+v (%v), want sha %s", img, err, sha(data))
	}
	// A client whose last answer was lost learns it is done.
	wantOffset(t, sess, len(data), "after the end")
	if resp, _ := patch(t, sess, len(data), nil); resp.StatusCode != 204 {
		t.Fatalf("empty PATCH at the end: %d", resp.StatusCode)
	}
	e.assertNothingLeft(id)
	if got := uploadedBytes(e); got != float64(len(data)) {
		t.Errorf("upload bytes metric %v, want %d: every byte once", got, len(data))
	}
}

func TestTusCreationWithUpload(t *testing.T) {
	needQemu(t)
	data := mustRead(t, makeImage(t, "64M"))
	e := newEnv(t, nil)
	up, id := e.ticket()
	resp, b := tusReq(t, "POST", up, bytes.NewReader(data[:1000]), "Upload-Length", strconv.Itoa(len(data)),
		"Content-Type", "application/offset+octet-stream")
	if resp.StatusCode != 201 || resp.Header.Get("Upload-Offset") != "1000" || resp.Header.Get("Location") == "" || resp.Header.Get("Upload-Expires") == "" {
		t.Fatalf("creation with upload: %d %s %v", resp.StatusCode, b, resp.Header)
	}
	sess := e.sessionOf(up, resp)
	e.waitSlotFreed(dirUpload)
	e.assertLeft(nil, []string{id})
	if resp, b := patch(t, sess, 1000, data[1000:]); resp.StatusCode != 204 {
		t.Fatalf("rest: %d %s", resp.StatusCode, b)
	}
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft(id)
}

// TestTusHostileAcrossPatches: a backing-file header whose deciding bytes
// arrive in the second PATCH is refused there, and the session ends.
func TestTusHostileAcrossPatches(t *testing.T) {
	needQemu(t)
	dir := t.TempDir()
	qemuImg(t, "create", "-q", "-f", "qcow2", filepath.Join(dir, "base.qcow2"), "64M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-b", filepath.Join(dir, "base.qcow2"), "-F", "qcow2", filepath.Join(dir, "top.qcow2"))
	data := mustRead(t, filepath.Join(dir, "top.qcow2"))
	e := newEnv(t, nil)
	sess, id := e.create(len(data))
	if resp, b := patch(t, sess, 0, data[:9]); resp.StatusCode != 204 {
		t.Fatalf("first 9 bytes: %d %s", resp.StatusCode, b)
	}
	e.waitSlotFreed(dirUpload)
	e.assertLeft(nil, []string{id})
	resp, b := patch(t, sess, 9, data[9:])
	if resp.StatusCode != 422 || errorOf(t, bytes.NewReader(b)).Reason != "backingFile" {
		t.Fatalf("rest: %d %s, want 422 backingFile", resp.StatusCode, b)
	}
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft() // no image, no partial file, no session
	if _, code := headOffset(t, sess); code != 404 {
		t.Fatalf("HEAD after refusal: %d, want 404", code)
	}
	if got := testutil.ToFloat64(e.g.metrics.rejections.WithLabelValues(dirUpload, "backingFile")); got != 1 {
		t.Errorf("rejections{reason=backingFile} = %v, want 1", got)
	}
}

// TestTusRestartBetweenPatches: the gateway restarts between PATCHes; the
// upload continues and the sha256 covers every byte, from the saved hash
// state.
func TestTusRestartBetweenPatches(t *testing.T) {
	needQemu(t)
	data := mustRead(t, makeImage(t, "64M"))
	dataDir, db := t.TempDir(), filepath.Join(t.TempDir(), "vmshelf.db")
	e := newEnvFull(t, dataDir, db, nil)
	sess, id := e.create(len(data))
	third := len(data) / 3
	if resp, b := patch(t, sess, 0, data[:third]); resp.StatusCode != 204 {
		t.Fatalf("first PATCH: %d %s", resp.StatusCode, b)
	}
	e.stop()
	e.assertLogClean()
	if err := imagestore.Reconcile(context.Background(), mustOpen(t, db), e.blobs, e.g.log); err != nil {
		t.Fatal(err)
	}
	e2 := newEnvFull(t, dataDir, db, nil)
	e2.remember(capabilityOf(sess))
	sess2 := e2.base + sess[len(e.base):]
	wantOffset(t, sess2, third, "after restart")
	e2.assertLeft(nil, []string{id})
	if resp, b := patch(t, sess2, third, data[third:]); resp.StatusCode != 204 {
		t.Fatalf("PATCH after restart: %d %s", resp.StatusCode, b)
	}
	img, err := e2.st.Image(context.Background(), id)
	if err != nil || img.SHA256 != sha(data) {
		t.Fatalf("image after restart: %+v %v, want sha %s", img, err, sha(data))
	}
	e2.waitSlotFreed(dirUpload)
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

// slowPatch starts a PATCH of length bytes at off on a raw connection and
// sends first, the beginning of its body; the caller sends the rest or
// lets it stall.
func slowPatch(t *testing.T, e *env, sess string, off, length int, first []byte, extra ...string) *rawConn {
	t.Helper()
	head := fmt.Sprintf("PATCH %s HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\nContent-Type: application/offset+octet-stream\r\nUpload-Offset: %d\r\nContent-Length: %d",
		strings.TrimPrefix(sess, e.base), off, length)
	for _, h := range extra {
		head += "\r\n" + h
	}
	rc := openRaw(t, e.base, head)
	if len(first) > 0 {
		rc.send(first, fmt.Sprintf("the first %d bytes of a PATCH", len(first)))
	}
	return rc
}

// TestTusTakeover: a second PATCH while the first still streams takes the
// upload over; the first stops, saves what it wrote and is answered 423;
// the second learns the true offset (409) and the upload ends with the
// right bytes.
func TestTusTakeover(t *testing.T) {
	needQemu(t)
	data := mustRead(t, makeImage(t, "64M"))
	e := newEnv(t, nil)
	sess, id := e.create(len(data))
	first := slowPatch(t, e, sess, 0, len(data), data[:100000])
	waitFor(t, "the first PATCH to hold the upload", func() bool { return e.g.locks.holding(id) })
	waitFor(t, "the first PATCH's 100000 bytes to be taken", func() bool { return uploadedBytes(e) == 100000 })

	resp, b := patch(t, sess, 0, data)
	if resp.StatusCode != 409 || resp.Header.Get("Upload-Offset") != "100000" {
		t.Fatalf("second PATCH: %d %s (Upload-Offset %q), want 409 at 100000", resp.StatusCode, b, resp.Header.Get("Upload-Offset"))
	}
	// The first PATCH's connection is still open (its client is alive but
	// stalled): it must get its answer.
	r, rb := first.answer("the PATCH that was taken over")
	if r.StatusCode != 423 || errorOf(t, bytes.NewReader(rb)).Reason != "takenOver" || r.Header.Get("Upload-Offset") != "100000" {
		t.Fatalf("first PATCH: %d %s (Upload-Offset %q), want 423 takenOver at 100000", r.StatusCode, rb, r.Header.Get("Upload-Offset"))
	}
	first.c.Close()
	e.waitSlotFreed(dirUpload)
	e.waitSlotFreed(dirUpload)
	if resp, b := patch(t, sess, 100000, data[100000:]); resp.StatusCode != 204 {
		t.Fatalf("rest: %d %s", resp.StatusCode, b)
	}
	img, err := e.st.Image(context.Background(), id)
	if err != nil || img.SHA256 != sha(data) {
		t.Fatalf("image: %+v %v", img, err)
	}
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft(id)
	if got := testutil.ToFloat64(e.g.metrics.transfers.WithLabelValues(dirUpload, outcomeAborted)); got != 1 {
		t.Errorf("aborted uploads = %v, want 1 (the PATCH taken over)", got)
	}
}

// TestTusReconnectBeforeHandler: an old PATCH that hangs before its first
// body byte, its headers read (it was answered 100 Continue) but its
// handler not yet running (fasthttp reads the first bytes of a body
// before), holds nothing; the reconnected PATCH at the same offset
// proceeds at once.
func TestTusReconnectBeforeHandler(t *testing.T) {
	needQemu(t)
	data := mustRead(t, makeImage(t, "64M"))
	e := newEnv(t, nil)
	sess, id := e.create(len(data))
	first := slowPatch(t, e, sess, 0, len(data), nil, "Expect: 100-continue")
	// The server has read and admitted the old PATCH's headers...
	r, _ := first.answer("the stalled PATCH's Expect")
	if r.StatusCode != 100 {
		t.Fatalf("stalled PATCH: %d, want 100 Continue", r.StatusCode)
	}
	// ... and it holds nothing while it waits for body bytes.
	if e.g.locks.holding(id) || len(e.g.slots) != 0 {
		t.Fatalf("a PATCH without a body byte holds the upload (%v) or a slot (%d)", e.g.locks.holding(id), len(e.g.slots))
	}
	if resp, b := patch(t, sess, 0, data); resp.StatusCode != 204 {
		t.Fatalf("reconnected PATCH: %d %s", resp.StatusCode, b)
	}
	if img, err := e.st.Image(context.Background(), id); err != nil || img.SHA256 != sha(data) {
		t.Fatalf("image: %+v %v", img, err)
	}
	e.waitSlotFreed(dirUpload)
	first.c.Close()
	e.assertNothingLeft(id)
}

func bytesReceived(e *env) float64 { return uploadedBytes(e) }

// TestTusIdleKeepsProgress: a PATCH that stalls ends with 408 but keeps the
// bytes it received for the next PATCH.
func TestTusIdleKeepsProgress(t *testing.T) {
	needQemu(t)
	data := mustRead(t, makeImage(t, "64M"))
	// The test only waits for the timeout to fire: 2 s cannot fire early
	// on a loaded machine.
	e := newEnv(t, func(c *Config) { c.IdleTimeout = 2 * time.Second })
	sess, id := e.create(len(data))
	first := slowPatch(t, e, sess, 0, len(data), data[:50000])
	r, b := first.answer("a PATCH stalled after 50000 bytes")
	if r.StatusCode != 408 || errorOf(t, bytes.NewReader(b)).Reason != "idle" || r.Header.Get("Upload-Offset") != "50000" {
		t.Fatalf("stalled PATCH: %d %s (Upload-Offset %q), want 408 idle at 50000", r.StatusCode, b, r.Header.Get("Upload-Offset"))
	}
	e.waitSlotFreed(dirUpload)
	wantOffset(t, sess, 50000, "after idle")
	e.assertLeft(nil, []string{id})
	if resp, b := patch(t, sess, 50000, data[50000:]); resp.StatusCode != 204 {
		t.Fatalf("rest: %d %s", resp.StatusCode, b)
	}
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft(id)
}

// TestTusShutdownSavesProgress: a PATCH running when the gateway shuts
// down is answered 503 with Retry-After, and its bytes are kept.
func TestTusShutdownSavesProgress(t *testing.T) {
	needQemu(t)
	data := mustRead(t, makeImage(t, "64M"))
	e := newEnv(t, nil)
	sess, id := e.create(len(data))
	first := slowPatch(t, e, sess, 0, len(data), data[:70000])
	waitFor(t, "the PATCH to hold the upload", func() bool { return e.g.locks.holding(id) })
	waitFor(t, "the PATCH's 70000 bytes to be taken", func() bool { return bytesReceived(e) == 70000 })
	stopped := make(chan struct{})
	go func() { e.stop(); close(stopped) }()
	r, b := first.answer("the PATCH running at shutdown")
	if r.StatusCode != 503 || errorOf(t, bytes.NewReader(b)).Reason != "shuttingDown" ||
		r.Header.Get("Retry-After") != "5" || r.Header.Get("Upload-Offset") != "70000" {
		t.Fatalf("PATCH during shutdown: %d %s (Retry-After %q, Upload-Offset %q), want 503 shuttingDown, Retry-After 5, offset 70000",
			r.StatusCode, b, r.Header.Get("Retry-After"), r.Header.Get("Upload-Offset"))
	}
	within(t, stopped, "the gateway to shut down")
	st := mustOpen(t, e.db)
	got, err := st.Session(context.Background(), imagestore.HashSecret(capabilityOf(sess)))
	if err != nil || got.Offset != 70000 || got.UploadID != id {
		t.Fatalf("session after shutdown: %+v %v, want offset 70000", got, err)
	}
	// The log up to and through the shutdown names no capability.
	// It says why: the shutdown, not a takeover (Shutdown stops reads
	// through the takeover's flag).
	if line := e.logHas("reason=shuttingDown", "upload_id="+id); !strings.Contains(line, "shutting down") || strings.Contains(line, "taken over") {
		t.Errorf("the PATCH stopped by the shutdown is logged as %q; want its cause to be the shutdown", line)
	}
	e.assertLogClean()
}

// TestTusExpiry: an unfinished upload ends 24 h after its last byte; the
// sweep removes the session and its partial file.
func TestTusExpiry(t *testing.T) {
	needQemu(t)
	data := mustRead(t, makeImage(t, "64M"))
	e := newEnv(t, nil)
	sess, id := e.create(len(data))
	if resp, b := patch(t, sess, 0, data[:5000]); resp.StatusCode != 204 {
		t.Fatalf("PATCH: %d %s", resp.StatusCode, b)
	}
	e.clock.Advance(23 * time.Hour)
	e.g.sweepSessions()
	wantOffset(t, sess, 5000, "after 23 h")
	e.assertLeft(nil, []string{id})
	e.clock.Advance(2 * time.Hour)
	e.g.sweepSessions()
	if _, code := headOffset(t, sess); code != 404 {
		t.Fatalf("after 25 h: HEAD %d, want 404", code)
	}
	e.assertNothingLeft()
}

func TestTusTerminate(t *testing.T) {
	needQemu(t)
	data := mustRead(t, makeImage(t, "64M"))
	e := newEnv(t, nil)
	sess, _ := e.create(len(data))
	if resp, b := patch(t, sess, 0, data[:5000]); resp.StatusCode != 204 || resp.Header.Get("Upload-Offset") != "5000" {
		t.Fatalf("PATCH: %d %s (Upload-Offset %q), want 204 at 5000", resp.StatusCode, b, resp.Header.Get("Upload-Offset"))
	}
	if resp, _ := tusReq(t, "DELETE", sess, nil); resp.StatusCode != 204 {
		t.Fatalf("DELETE: %d", resp.StatusCode)
	}
	if _, code := headOffset(t, sess); code != 404 {
		t.Fatalf("HEAD after DELETE: %d", code)
	}
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft()
}

func TestCORS(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.CORSOrigins = []string{"https://box.example"} })
	up, id := e.ticket()
	req := newRequest(t, "OPTIONS", up, nil)
	req.Header.Set("Origin", "https://box.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "tus-resumable, upload-length")
	resp, _ := do(t, req)
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "https://box.example" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "Upload-Length") ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Methods"), "PATCH") {
		t.Fatalf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
	r2, b := tusReq(t, "POST", up, nil, "Upload-Length", "100", "Origin", "https://box.example")
	if r2.StatusCode != 201 {
		t.Fatalf("POST from the origin: %d %s, want 201", r2.StatusCode, b)
	}
	e.sessionOf(up, r2)
	if r2.Header.Get("Access-Control-Allow-Origin") != "https://box.example" || !strings.Contains(r2.Header.Get("Access-Control-Expose-Headers"), "Location") {
		t.Fatalf("answer to the origin lacks CORS headers: %v", r2.Header)
	}
	r3, _ := tusReq(t, "HEAD", e.base+fetchPrefix+imagestore.NewSecret(), nil, "Origin", "https://evil.example")
	if r3.StatusCode != 404 {
		t.Fatalf("HEAD of an unknown token: %d, want 404", r3.StatusCode)
	}
	if r3.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatal("CORS headers for a foreign origin")
	}
	e.assertLeft(nil, []string{id})
}

// TestCORSRefusalLogged: a browser request from an origin not allowed
// gets no CORS headers, and the first one of each origin is logged with
// the flag that allows it; at most maxCORSRefusedLogged origins are kept,
// with one line saying that no more are logged.
func TestCORSRefusalLogged(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.CORSOrigins = []string{"https://box.example"} })
	up, _ := e.ticket()
	preflight := func(origin string) *http.Response {
		req := newRequest(t, "OPTIONS", up, nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		resp, _ := do(t, req)
		return resp
	}
	for range 3 {
		if r := preflight("http://laptop.lan:8481"); r.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Fatal("CORS headers for an origin not allowed")
		}
	}
	line := e.logHas("origin=http://laptop.lan:8481", `flag="--cors-origin http://laptop.lan:8481"`)
	if strings.Contains(line, up[strings.LastIndex(up, "/")+1:]) {
		t.Errorf("the line %q carries the ticket", line)
	}
	if n := strings.Count(e.log.String(), "origin=http://laptop.lan:8481"); n != 1 {
		t.Errorf("the origin was logged %d times, want once", n)
	}
	for i := range maxCORSRefusedLogged + 5 {
		preflight(fmt.Sprintf("http://page%d.example", i))
	}
	e.logHas("no further origin is logged")
	if n := strings.Count(e.log.String(), "a browser page on an origin"); n != maxCORSRefusedLogged {
		t.Errorf("%d origins logged, want the first %d", n, maxCORSRefusedLogged)
	}
}
