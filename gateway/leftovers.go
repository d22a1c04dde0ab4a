package gateway

import (
	"errors"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/settle"
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

// newLeftovers is the queue that removes, in the background, what
// uploads that ended left in the image storage when the storage could
// not take the removal: the blob of an upload that failed because the
// storage did not answer, or the partial bytes of a session ended
// (terminated, expired) while it did not. The removal needs that same
// storage: run before the answer, it would hold the client for its
// deadlines (over S3 tens of seconds) and then fail too, leaving an S3
// multipart upload and its parts for the next start-up's cleanup.
func (g *Gateway) newLeftovers() *settle.Queue {
	return settle.New(g.stopping, g.log, func(err error) bool { return errors.Is(err, imagestore.ErrBlobsUnavailable) },
		firstAbortBackoff, maxAbortBackoff)
}

// removeLater runs remove (an Abort, a RemovePartial) of upload uploadID
// in the background (leftovers) until it succeeds, fails for another
// reason than an unreachable storage, abortRetryFor passes or the
// shutdown begins.
func (g *Gateway) removeLater(uploadID string, remove func() error) {
	g.leftovers.Go(settle.Job{Name: "remove upload", Attrs: []any{"upload_id", uploadID},
		Until: time.Now().Add(abortRetryFor), Done: "upload left behind removed",
		Left: "what it wrote stays for the start-up cleanup", Run: remove})
}
