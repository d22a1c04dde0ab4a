package gateway

import (
	"errors"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/settle"
)

// An upload answered storeUnreachable (503) keeps nothing, and its ticket
// works again for the retry the answer asks for: "try again" must not
// turn into "ask for a new ticket", and a client told an error must not
// find an image or a used ticket afterwards. The store could not answer
// when the upload failed, so what the upload may have written there
// (its ticket's use, a session, the commit's intent, even the image's
// record, if that write landed after its deadline) is taken back once the
// store answers again: in the background, after the answer, tried every
// firstUndoBackoff to maxUndoBackoff for at most undoRetryFor.
// imagestore.Store's UndoUpload is the one write that does it, and it
// touches only the start it is given (the ticket's use at that instant),
// so that a retry the client made meanwhile is never undone.
const (
	firstUndoBackoff = 500 * time.Millisecond
	// maxUndoBackoff is short: the client retries after the answer's
	// Retry-After (unavailable.RetryAfter), and its ticket should be
	// back by then once the store answers.
	maxUndoBackoff = 2 * time.Second
	undoRetryFor   = time.Hour
)

// newUndos is the queue of the undos: tried again while the record store,
// or the image storage whose blob the undo removes, does not answer.
func (g *Gateway) newUndos() *settle.Queue {
	return settle.New(g.stopping, g.log, func(err error) bool {
		return errors.Is(err, imagestore.ErrStoreUnavailable) || errors.Is(err, imagestore.ErrBlobsUnavailable)
	}, firstUndoBackoff, maxUndoBackoff)
}

// undoUpload takes back, in the background, what the upload uploadID
// started at startedAt left in the records (imagestore.Store.UndoUpload),
// and the blob its commit may have made visible; with partial, the
// unfinished blob of a resumable upload's session too, once the session
// is gone (a plain upload's is its caller's: dropWrite).
func (g *Gateway) undoUpload(uploadID string, startedAt time.Time, partial bool) {
	g.undos.Go(settle.Job{Name: "give back the ticket of an upload answered storeUnreachable", Attrs: []any{"upload_id", uploadID},
		Until: time.Now().Add(undoRetryFor), Done: "upload answered storeUnreachable undone: its ticket works again",
		Left: "its ticket stays used, and what it committed stays for the removal sweep and start-up",
		Run: func() error {
			// The partial bytes go before the ticket comes back: from then
			// on a retry with it may open a session of the same upload id,
			// whose partial file must not be removed under it. Until then
			// nobody can write there (the answer named no session, and the
			// ticket is used), and an image storage that does not answer
			// retries the whole undo.
			if partial {
				if err := g.removePartial(uploadID)(); errors.Is(err, imagestore.ErrBlobsUnavailable) {
					return err
				} else if err != nil {
					g.log.Error("partial bytes of an upload answered storeUnreachable not removed; start-up removes them", "upload_id", uploadID, "err", err)
				}
			}
			octx, cancel := g.op()
			removeBlob, err := g.store.UndoUpload(octx, uploadID, startedAt)
			cancel()
			if err != nil {
				return err
			}
			if !removeBlob {
				return nil
			}
			// The blob may have been committed: its remove intent is
			// written; delete it now, or the removal sweep does.
			octx, cancel = g.blobOp()
			defer cancel()
			if err := g.blobs.Delete(octx, uploadID); err != nil {
				g.log.Warn("image of an upload answered storeUnreachable not deleted yet; the removal sweep deletes it", "upload_id", uploadID, "err", err)
				return nil
			}
			if err := g.store.EndIntent(octx, uploadID, imagestore.IntentRemove); err != nil {
				g.log.Warn("removal of an upload answered storeUnreachable not ended yet; the removal sweep ends it", "upload_id", uploadID, "err", err)
			}
			return nil
		}})
}

// answeredUnreachable reports whether an upload's answer is the store's
// outage, which is undone (undoUpload); nil is a success.
func answeredUnreachable(aerr *apierr.Error) bool {
	return aerr != nil && errors.Is(aerr, answerStoreUnreachable)
}

// committedUnrecorded reports whether an upload's answer came after its
// blob was committed and its record not confirmed (errCommittedUnrecorded).
func committedUnrecorded(aerr *apierr.Error) bool {
	return aerr != nil && errors.Is(aerr, errCommittedUnrecorded)
}
