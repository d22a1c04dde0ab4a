package gateway

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// unreachableBlobs are blobs whose writers fail every Write as an image
// storage that stopped answering does. Their Abort tells aborting, waits
// for release (if set), then fails as unreachable while failing is above
// zero, else aborts the real writer and closes aborted.
type unreachableBlobs struct {
	Blobs
	release  chan struct{}
	aborting chan struct{}
	failing  atomic.Int32
	aborted  chan struct{}
	once     sync.Once
}

func newUnreachableBlobs(b Blobs) *unreachableBlobs {
	return &unreachableBlobs{Blobs: b, aborting: make(chan struct{}, 16), aborted: make(chan struct{})}
}

// heldAborts makes e's blobs unreachable ones whose Abort waits until the
// returned release is called (at the latest by the test's cleanup, which
// runs before the gateway's shutdown waits for the abort).
func heldAborts(t *testing.T, e *env) (*unreachableBlobs, func()) {
	t.Helper()
	u := newUnreachableBlobs(e.g.blobs)
	u.release = make(chan struct{})
	release := sync.OnceFunc(func() { close(u.release) })
	t.Cleanup(release)
	e.g.blobs = u
	return u, release
}

func (b *unreachableBlobs) Create(ctx context.Context, id string) (imagestore.BlobWriter, error) {
	w, err := b.Blobs.Create(ctx, id)
	if err != nil {
		return nil, err
	}
	return &unreachableWriter{BlobWriter: w, b: b}, nil
}

type unreachableWriter struct {
	imagestore.BlobWriter
	b *unreachableBlobs
}

func (w *unreachableWriter) Write([]byte) (int, error) {
	return 0, fmt.Errorf("s3: upload part 1: %w", imagestore.ErrBlobsUnavailable)
}

func (w *unreachableWriter) Abort() error {
	select {
	case w.b.aborting <- struct{}{}:
	default:
	}
	if w.b.release != nil {
		<-w.b.release
	}
	if w.b.failing.Add(-1) >= 0 {
		return fmt.Errorf("s3: abort upload: %w", imagestore.ErrBlobsUnavailable)
	}
	err := w.BlobWriter.Abort()
	w.b.once.Do(func() { close(w.b.aborted) })
	return err
}

// putUnreachable sends a QCOW2 image to a fresh ticket over e's
// unreachable blobs and returns the channel its answer comes on.
func putUnreachable(t *testing.T, e *env) <-chan *http.Response {
	t.Helper()
	body := mustRead(t, makeImage(t, "64M"))
	url, _ := e.ticket()
	answer := make(chan *http.Response, 1)
	go func() {
		resp, err := testClient.Do(newRequest(t, http.MethodPut, url, bytes.NewReader(body)))
		if err != nil {
			t.Errorf("PUT: %v", err)
			close(answer)
			return
		}
		resp.Body.Close()
		answer <- resp
	}()
	return answer
}

// wantUnreachable checks an answer is 503 blobStoreUnreachable with
// Retry-After.
func wantUnreachable(t *testing.T, resp *http.Response) {
	t.Helper()
	if resp == nil {
		t.Fatal("no answer")
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "60" {
		t.Errorf("PUT with the storage unreachable: %d Retry-After %q; want 503 with Retry-After 60",
			resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestUnreachableUploadAnswersFirst: an upload that failed because the
// image storage is unreachable is answered at once, 503
// blobStoreUnreachable; the abort of what it wrote, which needs that same
// storage, runs after the answer. Before, the client waited for the abort
// to fail too (over S3: 20 s of deadlines on top of the write's 15).
func TestUnreachableUploadAnswersFirst(t *testing.T) {
	needQemu(t)
	e := newEnv(t, nil)
	u, release := heldAborts(t, e)
	answer := putUnreachable(t, e)
	within(t, u.aborting, "the abort to start")
	select {
	case resp := <-answer:
		wantUnreachable(t, resp)
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10 s while the abort runs: the client waits for the cleanup")
	}
	release()
	within(t, u.aborted, "the abort to end")
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft()
}

// TestUnreachableAbortRetried: the abort of an upload that failed for an
// unreachable storage fails as long as the storage is unreachable; it is
// tried again until the storage answers, so that an S3 multipart upload
// does not wait an hour's grace for the next start-up's cleanup.
func TestUnreachableAbortRetried(t *testing.T) {
	needQemu(t)
	e := newEnv(t, nil)
	e.g.leftovers.First = 10 * time.Millisecond
	u := newUnreachableBlobs(e.g.blobs)
	u.failing.Store(3)
	e.g.blobs = u
	wantUnreachable(t, within(t, putUnreachable(t, e), "the PUT's answer"))
	within(t, u.aborted, "the abort to succeed once the storage answers")
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft()
	e.logHas("upload left behind removed")
}

// TestShutdownWaitsForAbort: a shutdown waits for the aborts still
// running after their answers, within its bound, and says so when the
// bound ends first: no cleanup is cut off unannounced, none outlives serve.
func TestShutdownWaitsForAbort(t *testing.T) {
	needQemu(t)
	e := newEnv(t, nil)
	u, release := heldAborts(t, e)
	wantUnreachable(t, within(t, putUnreachable(t, e), "the PUT's answer"))
	within(t, u.aborting, "the abort to start")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := e.g.Shutdown(ctx); err == nil {
		t.Error("Shutdown returned nil while an upload's abort was still running; want it to wait, then say so")
	}
	release()
	within(t, u.aborted, "the abort to end")
}
