package imagestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// StoreLostError is Reconcile's refusal when the store holds no image
// record while committed image files exist: the database was lost,
// emptied or replaced (a missing vmshelf.db is created anew). Going on
// would treat every image as an orphan; the files may be the only copy of
// somebody's disk, so the service must not start until an operator
// restores the database or moves the files away.
type StoreLostError struct {
	Files int // committed image files found
}

func (e *StoreLostError) Error() string {
	return fmt.Sprintf("the store holds no image record but %d image files exist", e.Files)
}

// Reconcile makes the blobs agree with the records after a crash, before
// the service takes traffic. Nothing it does deletes a committed image:
//   - a store with no image record beside committed files is refused
//     (*StoreLostError), before anything is touched;
//   - a committed blob no record names (an upload that died between rename
//     and record, a db restored from an older backup) is quarantined;
//   - a record whose blob is missing is reported, never deleted: "not
//     there" must not look like "could not ask";
//   - only unfinished writes of ended uploads are removed (partials of
//     live resumable sessions are kept for Resume);
//   - plain uploads still marked running are ended: the crash ended them
//     and their partials are gone, so they no longer hold a quota place.
func Reconcile(ctx context.Context, st Store, blobs Blobs, log *slog.Logger) error {
	return reconcile(ctx, st, blobs, log, nil)
}

// SharedReconcile is what differs when other replicas use the same
// records and blobs at this moment (PostgreSQL and S3): what looks left
// over by a crash may be another replica's work in flight.
type SharedReconcile struct {
	// Now is the time the grace is counted back from.
	Now time.Time
	// Grace: a committed blob without a record is quarantined only once
	// it was committed longer ago than this, since another replica may be
	// between its Commit and its AddImage. It must exceed the longest
	// such gap (one store write), with room for the replicas' clock skew.
	Grace time.Duration
}

// ReconcileShared is Reconcile for one replica among several. As
// Reconcile, it refuses a store without image records beside committed
// blobs and never deletes a committed blob; unlike it:
//   - a committed blob without a record is quarantined only once older
//     than sh.Grace (see SharedReconcile);
//   - plain uploads marked running are left alone: they may be running
//     on another replica;
//   - unfinished writes are removed only as the blobs' RemovePartials
//     judges them abandoned (the S3 blobs wait for their own grace).
func ReconcileShared(ctx context.Context, st Store, blobs Blobs, log *slog.Logger, sh SharedReconcile) error {
	return reconcile(ctx, st, blobs, log, &sh)
}

func reconcile(ctx context.Context, st Store, blobs Blobs, log *slog.Logger, shared *SharedReconcile) error {
	ids, err := st.ImageIDs(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list image records: %w", err)
	}
	files, err := blobs.List(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list image files: %w", err)
	}
	if len(ids) == 0 && len(files) > 0 {
		return &StoreLostError{Files: len(files)}
	}
	live, err := st.SessionUploadIDs(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list upload sessions: %w", err)
	}
	resumable := make(map[string]bool, len(live))
	for _, id := range live {
		resumable[id] = true
	}
	partials, err := blobs.RemovePartials(ctx, func(id string) bool { return resumable[id] })
	if err != nil {
		return fmt.Errorf("reconcile: remove partial uploads: %w", err)
	}
	// Nothing of this process serves uploads yet, so alone on the store
	// every upload marked running is one the crash (or a kill) cut off.
	ended := 0
	if shared == nil {
		if ended, err = st.EndRunningUploads(ctx); err != nil {
			return fmt.Errorf("reconcile: end running uploads: %w", err)
		}
	}
	recorded := make(map[string]bool, len(ids))
	for _, id := range ids {
		recorded[id] = true
	}
	quarantined, young := 0, 0
	for _, id := range files {
		if recorded[id] {
			delete(recorded, id)
			continue
		}
		if shared != nil {
			fresh, err := committedSince(ctx, blobs, id, shared.Now.Add(-shared.Grace))
			if err != nil {
				return fmt.Errorf("reconcile: image file %s: %w", id, err)
			}
			if fresh {
				young++ // perhaps another replica's upload about to be recorded
				continue
			}
		}
		switch err := blobs.Quarantine(ctx, id); {
		case err == nil:
			quarantined++
			log.Warn("image file without a record quarantined; see 'vmshelf quarantine list'", "upload_id", id)
		case errors.Is(err, ErrExists):
			// Left where it is: still not served (no record), still not deleted.
			log.Error("image file without a record could not be quarantined: a quarantined file has its id", "upload_id", id)
		default:
			return fmt.Errorf("reconcile: quarantine image file %s: %w", id, err)
		}
	}
	for id := range recorded {
		log.Error("image record without its file; fetches of it will fail", "upload_id", id)
	}
	if young > 0 {
		log.Info("image files without a record left for now: committed within the grace, perhaps by another replica",
			"files", young, "grace", shared.Grace)
	}
	if partials > 0 || quarantined > 0 || ended > 0 {
		log.Info("start-up cleanup", "partial_uploads_removed", partials, "files_quarantined", quarantined,
			"running_uploads_ended", ended)
	}
	return nil
}

// committedSince reports whether blob id was committed after t. A blob
// that vanished meanwhile (removed by its owner) counts as fresh: there
// is nothing to quarantine.
func committedSince(ctx context.Context, blobs Blobs, id string, t time.Time) (bool, error) {
	b, err := blobs.Open(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer b.Close()
	return b.ModTime().After(t), nil
}
