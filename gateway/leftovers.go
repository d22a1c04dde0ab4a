package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Bounds of the background removals (leftovers). One is tried again,
// waiting from firstAbortBackoff, doubled up to maxAbortBackoff, while
// the image storage does not answer, for at most abortRetryFor: beyond
// that, the start-up cleanup of a later serve takes what is left (over
// S3 once the partial grace has passed; docs/operations.md says so).
const (
	firstAbortBackoff = time.Second
	maxAbortBackoff   = 15 * time.Second
	abortRetryFor     = time.Hour
)

// leftovers removes, in the background, what uploads that ended left in
// the image storage when the storage could not take the removal: the
// blob of an upload that failed because the storage did not answer, or
// the partial bytes of a session ended (terminated, expired) while it did
// not. The removal needs that same storage, so run before the answer it
// would hold the client for its deadlines (over S3 tens of seconds) and
// then fail too, leaving an S3 multipart upload and its parts for the
// next start-up's cleanup. Here the client has its answer first, and the
// removal is tried until the storage answers. Shutdown stops the retries
// and waits for the try in progress (each has the storage's own
// deadlines), so no removal outlives serve unannounced.
type leftovers struct {
	wg      sync.WaitGroup
	stop    <-chan struct{} // closed when Shutdown begins
	log     *slog.Logger
	backoff time.Duration // the first wait between tries

	mu      sync.Mutex
	waiting bool // wait has begun: no removal joins wg any more
}

// remove runs remove (an Abort, a RemovePartial) of upload uploadID in the
// background until it succeeds, fails for another reason than an
// unreachable storage, abortRetryFor passes or Shutdown begins. Once
// Shutdown waits for the others, a late one (a request that outlived the
// shutdown's bound) is tried once, by its caller.
func (l *leftovers) remove(uploadID string, remove func() error) {
	l.mu.Lock()
	if l.waiting {
		l.mu.Unlock()
		l.retry(uploadID, remove) // stop is closed: one try
		return
	}
	l.wg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		l.retry(uploadID, remove)
	}()
}

func (l *leftovers) retry(uploadID string, remove func() error) {
	wait, giveUp := l.backoff, time.Now().Add(abortRetryFor)
	for tries := 1; ; tries++ {
		err := remove()
		switch {
		case err == nil:
			if tries > 1 {
				l.log.Info("upload left behind removed", "upload_id", uploadID, "tries", tries)
			}
			return
		case !errors.Is(err, imagestore.ErrBlobsUnavailable) || time.Now().After(giveUp):
			l.log.Error("remove upload: what it wrote stays for the start-up cleanup", "upload_id", uploadID, "tries", tries, "err", err)
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-l.stop:
			t.Stop()
			l.log.Warn("remove upload unfinished at shutdown: what it wrote stays for the start-up cleanup",
				"upload_id", uploadID, "tries", tries, "err", err)
			return
		case <-t.C:
		}
		wait = min(2*wait, maxAbortBackoff)
	}
}

// wait waits until every removal has ended, or ctx.
func (l *leftovers) wait(ctx context.Context) error {
	l.mu.Lock()
	l.waiting = true
	l.mu.Unlock()
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("removals of failed uploads still running: %w", ctx.Err())
	}
}
