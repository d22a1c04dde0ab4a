package main

// A shutdown that begins between a resumable upload's last byte and its
// commit: the PATCH that brought every byte must still commit the image
// (the work after the last byte is never cut short by a shutdown), and
// whatever happens, no answer and no HEAD may report the whole upload
// stored (Upload-Offset equal to its length) while no image is: a tus
// client would take that for done and throw its file away.

import (
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/crashpoint"
)

// sigtermAtLastByte is the crashpoints binary's environment that makes
// serve send itself SIGTERM once a PATCH has its last byte, and go on
// once the shutdown has begun.
var sigtermAtLastByte = []string{crashpoint.Env + "=" + crashpoint.PatchAfterLastByte, crashpoint.SignalEnv + "=TERM"}

// exitedAfterSigterm waits for s to end by the SIGTERM it sent itself:
// cleanly, once its running requests ended.
func (s *server) exitedAfterSigterm(t *testing.T) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not stop within 30s of the SIGTERM at %s; stderr:\n%s", crashpoint.PatchAfterLastByte, s.stderr)
	}
	s.stopped = true
	if s.waitErr != nil {
		t.Fatalf("serve ended with %v after its SIGTERM, want exit 0; stderr:\n%s", s.waitErr, s.stderr)
	}
}

// hasImage reports whether the dev tenant holds image id.
func (s *server) hasImage(t *testing.T, id string) bool {
	t.Helper()
	for _, img := range s.status(t, s.token).Images {
		if img.UploadID == id {
			return true
		}
	}
	return false
}

// checkShutdownAtLastByte runs one upload over first (the crashpoints
// binary, which begins its shutdown after the PATCH's last byte) and
// checks it on restarted, the same store started again.
func checkShutdownAtLastByte(t *testing.T, first *server, restart func(t *testing.T) *server) {
	t.Helper()
	_, img := makeImage(t, t.TempDir(), "window.qcow2")
	tk := first.ticket(t, "window")
	sess := tusCreate(t, first, tk, len(img))
	resp := tusPatch(t, sess, 0, img)
	answered := resp.Header.Get("Upload-Offset")
	first.exitedAfterSigterm(t)
	// The window was hit: the shutdown began before the PATCH ended.
	logs := first.logs()
	began, ended := strings.Index(logs, "shutting down"), strings.Index(logs, "msg=upload ")
	if began < 0 || ended < 0 || began > ended {
		t.Fatalf("the shutdown did not begin between the last byte and the PATCH's end; first serve said:\n%s", logs)
	}

	s := restart(t)
	stored := s.hasImage(t, tk.UploadID)
	if answered == strconv.Itoa(len(img)) && !stored {
		t.Errorf("the PATCH cut by the shutdown answered %d with Upload-Offset %s (all bytes) but no image is stored",
			resp.StatusCode, answered)
	}
	if resp.StatusCode != http.StatusNoContent || answered != strconv.Itoa(len(img)) || !stored {
		t.Errorf("the PATCH that brought every byte as the shutdown began: %d, Upload-Offset %q, image stored %v; "+
			"want 204, %d, stored: a shutdown must not cut the work after the last byte; first serve said:\n%s",
			resp.StatusCode, answered, stored, len(img), first.logs())
	}
	onS := on(sess, first, s)
	off := tusOffset(t, onS)
	if off == len(img) && !stored {
		t.Fatalf("after the restart HEAD reports all %d bytes stored, but no image is: a tus client would take it for done", off)
	}
	if !stored { // the client resumes where HEAD says, and finishes
		if r := tusPatch(t, onS, off, img[off:]); r.StatusCode != http.StatusNoContent {
			t.Fatalf("resuming PATCH from %d after the restart: %d", off, r.StatusCode)
		}
	}
	checkImage(t, s, s, tk.UploadID, img)
}

// TestE2ESigtermAfterLastByte: on one box (SQLite and the data dir).
func TestE2ESigtermAfterLastByte(t *testing.T) {
	bin := crashBinary(t)
	dir := filepath.Join(t.TempDir(), "data")
	first := startServeWith(t, bin, dir, nil, sigtermAtLastByte)
	checkShutdownAtLastByte(t, first, func(t *testing.T) *server { return startServe(t, dir, nil) })
}

// TestE2ESigtermAfterLastByteS3: over PostgreSQL and S3, where every
// durable step is fenced by the upload's lease in the store. Before the
// fix the fence after the last byte ran on the request's context, which
// the shutdown cancels: the PATCH answered 500 and recorded the whole
// length as stored with no image committed, and HEAD said done.
func TestE2ESigtermAfterLastByteS3(t *testing.T) {
	bin := crashBinary(t)
	e := newS3Edge(t)
	db, prefix := e.cluster.NewDatabase(t), "window"
	first := e.start(t, bin, db, prefix, sigtermAtLastByte...)
	checkShutdownAtLastByte(t, first, func(t *testing.T) *server { return e.startBeside(t, first, binPath, db, prefix) })
}
