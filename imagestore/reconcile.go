package imagestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// Nothing serves uploads yet, so every upload marked running is one
	// the crash (or a kill) cut off.
	ended, err := st.EndRunningUploads(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: end running uploads: %w", err)
	}
	recorded := make(map[string]bool, len(ids))
	for _, id := range ids {
		recorded[id] = true
	}
	quarantined := 0
	for _, id := range files {
		if recorded[id] {
			delete(recorded, id)
			continue
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
	if partials > 0 || quarantined > 0 || ended > 0 {
		log.Info("start-up cleanup", "partial_uploads_removed", partials, "files_quarantined", quarantined,
			"running_uploads_ended", ended)
	}
	return nil
}
