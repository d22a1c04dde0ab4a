package imagestore

import (
	"context"
	"fmt"
	"log/slog"
)

// Reconcile makes the blobs agree with the records after a crash, before
// the service takes traffic: unfinished writes are removed (except those of
// live resumable sessions, which a client will continue), and so is every
// committed blob no record names (an upload that died between rename and
// record, or a removal that died between record and file). A record whose
// blob is missing cannot be repaired here; it is reported, never deleted:
// "not there" must not look like "could not ask".
func Reconcile(ctx context.Context, st Store, blobs Blobs, log *slog.Logger) error {
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
	ids, err := st.ImageIDs(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list image records: %w", err)
	}
	files, err := blobs.List(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list image files: %w", err)
	}
	recorded := make(map[string]bool, len(ids))
	for _, id := range ids {
		recorded[id] = true
	}
	orphans := 0
	for _, id := range files {
		if recorded[id] {
			delete(recorded, id)
			continue
		}
		if err := blobs.Delete(ctx, id); err != nil {
			return fmt.Errorf("reconcile: remove orphan image file %s: %w", id, err)
		}
		orphans++
	}
	for id := range recorded {
		log.Error("image record without its file; fetches of it will fail", "upload_id", id)
	}
	if partials > 0 || orphans > 0 {
		log.Info("start-up cleanup", "partial_uploads_removed", partials, "orphan_files_removed", orphans)
	}
	return nil
}
