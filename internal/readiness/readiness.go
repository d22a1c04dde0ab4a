// Package readiness is what both planes' /readyz say of the storage they
// share, and how they log it: the same reasons for the same causes on
// the data plane's port as on the control plane's, and one log line per
// change of verdict, not one per probe (a load balancer and a kubelet
// probe every few seconds, each replica, each plane).
package readiness

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/logsample"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// Store is why the record store is not ready, from its Ping's error; nil
// when it is. A store whose last write failed for want of space answers
// all the same: the caller asks the disk itself (noSpace).
func Store(err error) *apierr.Error {
	switch {
	case err == nil, errors.Is(err, imagestore.ErrNoSpace):
		return nil
	case errors.Is(err, imagestore.ErrDamaged):
		return apierr.Wrap(err, reason.StoreCorrupt)
	case errors.Is(err, imagestore.ErrUnwritable):
		return apierr.Wrap(err, reason.StoreUnwritable)
	case errors.Is(err, imagestore.ErrStoreUnavailable):
		return apierr.Wrap(err, reason.StoreUnreachable).WithMsg("the record store does not answer")
	}
	return apierr.Wrap(err, reason.NotReady)
}

// Blobs is why the image storage is not ready, from its Ping's error;
// nil when it is.
func Blobs(err error) *apierr.Error {
	if err == nil {
		return nil
	}
	return apierr.Wrap(err, reason.BlobStoreUnreachable).
		WithMsg("the image storage (the S3 bucket or the image directory) does not answer")
}

// Ask asks the record store and the image storage at once, each within
// ctx: asked one after the other, a store that holds its probe for the
// whole bound would leave none to the image storage, which would then
// look unreachable too.
func Ask(ctx context.Context, store, blobs func(context.Context) error) (storeErr, blobErr error) {
	var wg sync.WaitGroup
	wg.Go(func() { storeErr = store(ctx) })
	wg.Go(func() { blobErr = blobs(ctx) })
	wg.Wait()
	return storeErr, blobErr
}

// Watch logs a plane's readiness when it changes: "not ready" (Warn)
// with every reason and cause when it stops being ready or its reasons
// change, "ready again" (Info) when it is ready after not being so. The
// first verdict is logged only if it is not ready: a start is logged
// already. Causes are redacted as every logged error is (logsample).
//
// Verdicts are taken in the order their probes asked, not the order they
// end: when a stalled store resumes, probes that waited through the stall
// end, not ready, after a newer probe found it ready, and taken as they
// end they would log "not ready" and "ready again" in turn, a line pair
// per stale probe.
type Watch struct {
	log   *slog.Logger
	mu    sync.Mutex
	last  []string  // reasons of the last verdict; nil: ready
	known bool      // a verdict was noted
	asked time.Time // when the probe of the last verdict asked
}

// NewWatch returns a Watch that writes to log.
func NewWatch(log *slog.Logger) *Watch { return &Watch{log: log} }

// Note is the verdict of one probe that asked at asked: the problems
// found, none when ready. A verdict older than the last one noted is
// dropped.
func (w *Watch) Note(asked time.Time, problems []*apierr.Error) {
	var reasons []string
	var causes []string
	for _, p := range problems {
		reasons = append(reasons, p.Reason)
		if p.Err != nil {
			causes = append(causes, p.Reason+": "+logsample.Redact(p.Err.Error()))
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.known && asked.Before(w.asked) {
		return
	}
	w.asked = asked
	if w.known && slices.Equal(w.last, reasons) {
		return
	}
	wasReady := !w.known || w.last == nil
	w.last, w.known = reasons, true
	switch {
	case reasons != nil:
		w.log.Warn("not ready", "reasons", strings.Join(reasons, ","), "causes", strings.Join(causes, "; "))
	case !wasReady:
		w.log.Info("ready again")
	}
}
