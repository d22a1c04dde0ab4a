package imagestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// StoreLostError is Reconcile's refusal when the records are not those
// of the image files beside them: the database was lost, emptied or
// replaced (a missing vmshelf.db is created anew). Going on would treat
// every image as an orphan; the files may be the only copy of somebody's
// disk, so the service must not start until an operator puts back the
// database that recorded them or moves the files away.
//
// It is judged from the store's own evidence (see Journal), never from a
// count of records alone: a crash between a file's move and its record
// leaves files beside no record at all, and those files are explained by
// their intents.
type StoreLostError struct {
	Files  int        // committed image files found
	Reason LostReason // what gave the loss away
}

// LostReason says why Reconcile took the records for lost.
type LostReason int

const (
	// LostNoIdentity: the image files carry the store's identity and the
	// records none: a database created anew, or one whose tables were
	// emptied.
	LostNoIdentity LostReason = iota + 1
	// LostOtherStore: the records carry another store's identity.
	LostOtherStore
	// LostNoRecords: the records hold no image at all, and an image file
	// is explained neither by a record nor by an intent: an emptied images
	// table, or (before identities) a lost database.
	LostNoRecords
)

func (e *StoreLostError) Error() string {
	switch e.Reason {
	case LostNoIdentity:
		return fmt.Sprintf("the store is new or was emptied, but %d image files belong to a store", e.Files)
	case LostOtherStore:
		return fmt.Sprintf("the store is another store's, not the one of the %d image files", e.Files)
	}
	return fmt.Sprintf("the store holds no image record but %d image files exist", e.Files)
}

// Reconcile makes the blobs agree with the records after a crash, before
// the service takes traffic. It deletes no image file but those whose
// owner removed them:
//   - records that are not those of the image files are refused
//     (*StoreLostError), before anything is touched: the files carry the
//     store's identity and the records none or another, or the records
//     hold no image and some file is explained by no intent;
//   - a removal a crash (or an unreachable blob store) left half done,
//     its record gone and its remove intent kept, is finished: the file
//     goes, as its owner asked;
//   - a committed blob no record names (an upload that died between
//     rename and record, whose commit intent says so, or a db restored
//     from an older backup) is quarantined, never deleted;
//   - a record whose blob is missing is reported, never deleted: "not
//     there" must not look like "could not ask";
//   - only unfinished writes of ended uploads are removed (partials of
//     live resumable sessions are kept for Resume);
//   - plain uploads still marked running are ended: the crash ended them
//     and their partials are gone, so they no longer hold a quota place;
//   - last, the store's identity is written where it is missing (the
//     records', then the blobs'): blobs from before identities are judged
//     by the records' count once, and by their identity from then on.
func Reconcile(ctx context.Context, st ReconcileRecords, blobs ReconcileBlobs, log *slog.Logger) error {
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
	// A commit intent without its file is kept as long, since its
	// replica may be about to commit.
	Grace time.Duration
}

// ReconcileShared is Reconcile for one replica among several. As
// Reconcile, it refuses records that are not those of the blobs, finishes
// pending removals and never deletes a committed blob otherwise; unlike
// it:
//   - a committed blob without a record is quarantined only once older
//     than sh.Grace (see SharedReconcile);
//   - plain uploads marked running are left alone: they may be running
//     on another replica;
//   - unfinished writes are removed only as the blobs' RemovePartials
//     judges them abandoned (the S3 blobs wait for their own grace).
func ReconcileShared(ctx context.Context, st ReconcileRecords, blobs ReconcileBlobs, log *slog.Logger, sh SharedReconcile) error {
	return reconcile(ctx, st, blobs, log, &sh)
}

// evidence is what start-up reads before it touches anything.
type evidence struct {
	recorded map[string]bool
	files    []string
	intents  map[string]Intent
	recID    string // the records' identity; "" if none
	blobID   string // the blobs'; "" if none
}

func gather(ctx context.Context, st ReconcileRecords, blobs ReconcileBlobs) (*evidence, error) {
	ev := &evidence{recorded: map[string]bool{}, intents: map[string]Intent{}}
	var err error
	if ev.recID, err = st.StoreID(ctx); err != nil {
		return nil, fmt.Errorf("reconcile: read the records' store id: %w", err)
	}
	if ev.blobID, err = blobs.StoreID(ctx); err != nil {
		return nil, fmt.Errorf("reconcile: read the image files' store id: %w", err)
	}
	// Files, intents, records, intents again: over a shared store another
	// replica may commit or remove meanwhile, and in this order a file it
	// commits is recorded or has its intent in one of the reads, and one
	// it removes has its record or its intent, or is gone by the last
	// read (see judge).
	if ev.files, err = blobs.List(ctx); err != nil {
		return nil, fmt.Errorf("reconcile: list image files: %w", err)
	}
	if err := ev.readIntents(ctx, st); err != nil {
		return nil, err
	}
	ids, err := st.ImageIDs(ctx)
	if err != nil {
		return nil, fmt.Errorf("reconcile: list image records: %w", err)
	}
	for _, id := range ids {
		ev.recorded[id] = true
	}
	if err := ev.readIntents(ctx, st); err != nil {
		return nil, err
	}
	return ev, nil
}

func (ev *evidence) readIntents(ctx context.Context, st ReconcileRecords) error {
	intents, err := st.Intents(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list intents: %w", err)
	}
	for _, in := range intents {
		ev.intents[in.UploadID] = in
	}
	return nil
}

// judge refuses records that are not those of the files (StoreLostError).
// Without files there is nothing to lose.
func (ev *evidence) judge(ctx context.Context, blobs ReconcileBlobs) error {
	if len(ev.files) == 0 {
		return nil
	}
	switch {
	case ev.blobID != "" && ev.recID == "" && !ev.namesAFile():
		// (Records without an identity that name an image file here are
		// this store's, from before identities: a backup restored.)
		return &StoreLostError{Files: len(ev.files), Reason: LostNoIdentity}
	case ev.blobID != "" && ev.recID != "" && ev.recID != ev.blobID:
		return &StoreLostError{Files: len(ev.files), Reason: LostOtherStore}
	case len(ev.recorded) > 0 || ev.explained(ev.files):
		return nil
	}
	// No image record at all, and a file no intent explains: only a file
	// removed since the listing (by another replica) may be that, so the
	// files still there are asked for.
	now, err := blobs.List(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list image files: %w", err)
	}
	listed := make(map[string]bool, len(ev.files))
	for _, id := range ev.files {
		listed[id] = true
	}
	var still []string
	for _, id := range now {
		if listed[id] {
			still = append(still, id)
		}
	}
	if ev.explained(still) {
		return nil
	}
	return &StoreLostError{Files: len(now), Reason: LostNoRecords}
}

// namesAFile reports whether a record names one of the image files:
// upload ids are random, so only this store's records do.
func (ev *evidence) namesAFile() bool {
	for _, id := range ev.files {
		if ev.recorded[id] {
			return true
		}
	}
	return false
}

// explained reports whether an intent names every one of files.
func (ev *evidence) explained(files []string) bool {
	for _, id := range files {
		if _, ok := ev.intents[id]; !ok {
			return false
		}
	}
	return true
}

// cleanup counts what start-up did, for its log line.
type cleanup struct {
	partials, quarantined, removed, ended, young int
}

func reconcile(ctx context.Context, st ReconcileRecords, blobs ReconcileBlobs, log *slog.Logger, shared *SharedReconcile) error {
	ev, err := gather(ctx, st, blobs)
	if err != nil {
		return err
	}
	if err := ev.judge(ctx, blobs); err != nil {
		return err
	}
	var c cleanup
	live, err := st.SessionUploadIDs(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list upload sessions: %w", err)
	}
	resumable := make(map[string]bool, len(live))
	for _, id := range live {
		resumable[id] = true
	}
	if c.partials, err = blobs.RemovePartials(ctx, func(id string) bool { return resumable[id] }); err != nil {
		return fmt.Errorf("reconcile: remove partial uploads: %w", err)
	}
	// Nothing of this process serves uploads yet, so alone on the store
	// every upload marked running is one the crash (or a kill) cut off.
	if shared == nil {
		if c.ended, err = st.EndRunningUploads(ctx); err != nil {
			return fmt.Errorf("reconcile: end running uploads: %w", err)
		}
	}
	if err := settleFiles(ctx, st, blobs, log, shared, ev, &c); err != nil {
		return err
	}
	if err := settleIntents(ctx, st, blobs, log, shared, ev); err != nil {
		return err
	}
	if err := stampIdentity(ctx, st, blobs, ev); err != nil {
		return err
	}
	if c.young > 0 {
		log.Info("image files without a record left for now: committed within the grace, perhaps by another replica",
			"files", c.young, "grace", shared.Grace)
	}
	if c.partials > 0 || c.quarantined > 0 || c.ended > 0 || c.removed > 0 {
		log.Info("start-up cleanup", "partial_uploads_removed", c.partials, "files_quarantined", c.quarantined,
			"running_uploads_ended", c.ended, "removals_finished", c.removed)
	}
	return nil
}

// settleFiles judges every committed file: a recorded one is kept, one
// whose removal is pending is deleted, any other is quarantined (once
// past the grace over a shared store). Records without a file are
// reported.
func settleFiles(ctx context.Context, st ReconcileRecords, blobs ReconcileBlobs, log *slog.Logger, shared *SharedReconcile, ev *evidence, c *cleanup) error {
	seen := make(map[string]bool, len(ev.files))
	for _, id := range ev.files {
		seen[id] = true
		if ev.recorded[id] {
			continue
		}
		in, explained := ev.intents[id]
		if explained && in.Kind == IntentRemove {
			if err := finishRemoval(ctx, st, blobs, id); err != nil {
				log.Error("removed image's file could not be deleted; the sweep tries again", "upload_id", id, "err", err.Error())
				continue
			}
			c.removed++
			continue
		}
		if shared != nil {
			fresh, err := committedSince(ctx, blobs, id, shared.Now.Add(-shared.Grace))
			if err != nil {
				return fmt.Errorf("reconcile: image file %s: %w", id, err)
			}
			if fresh {
				c.young++ // perhaps another replica's upload about to be recorded
				continue
			}
		}
		switch err := blobs.Quarantine(ctx, id); {
		case err == nil:
			c.quarantined++
			log.Warn("image file without a record quarantined; see 'vmshelf quarantine list'", "upload_id", id,
				"cut_off_upload", explained)
		case errors.Is(err, ErrExists):
			// Left where it is: still not served (no record), still not deleted.
			log.Error("image file without a record could not be quarantined: a quarantined file has its id", "upload_id", id)
			continue
		default:
			return fmt.Errorf("reconcile: quarantine image file %s: %w", id, err)
		}
		if explained {
			if err := st.EndIntent(ctx, id, IntentCommit); err != nil {
				return fmt.Errorf("reconcile: end the commit intent of %s: %w", id, err)
			}
		}
	}
	for id := range ev.recorded {
		if !seen[id] {
			log.Error("image record without its file; fetches of it will fail", "upload_id", id)
		}
	}
	return nil
}

// settleIntents ends the intents of files that are not (or no longer)
// there: a removal whose file is gone, a commit that never happened or
// was recorded.
func settleIntents(ctx context.Context, st ReconcileRecords, blobs ReconcileBlobs, log *slog.Logger, shared *SharedReconcile, ev *evidence) error {
	listed := make(map[string]bool, len(ev.files))
	for _, id := range ev.files {
		listed[id] = true
	}
	for id, in := range ev.intents {
		if listed[id] {
			continue // settleFiles judged it
		}
		switch {
		case ev.recorded[id]:
			// Recorded (the record wins): the intent is stale.
			if err := st.EndIntent(ctx, id, in.Kind); err != nil {
				return fmt.Errorf("reconcile: end the intent of %s: %w", id, err)
			}
		case in.Kind == IntentRemove:
			if err := finishRemoval(ctx, st, blobs, id); err != nil {
				log.Error("removed image's file could not be deleted; the sweep tries again", "upload_id", id, "err", err.Error())
			}
		case shared != nil && in.At.After(shared.Now.Add(-shared.Grace)):
			// Another replica may be about to commit the file.
		default:
			if err := st.EndIntent(ctx, id, in.Kind); err != nil {
				return fmt.Errorf("reconcile: end the intent of %s: %w", id, err)
			}
		}
	}
	return nil
}

// stampIdentity writes the store's identity where it is missing: first
// in the records (the blobs' own if they have one: judge let such records
// through only if they are this store's, from before identities, or if
// there is no file to lose), then beside the blobs. A crash in
// between leaves blobs without one, judged by the count of records once
// more.
func stampIdentity(ctx context.Context, st ReconcileRecords, blobs ReconcileBlobs, ev *evidence) error {
	id := ev.recID
	if id == "" {
		want := ev.blobID
		if want == "" {
			want = NewStoreID()
		}
		var err error
		if id, err = st.InitStoreID(ctx, want); err != nil {
			return fmt.Errorf("reconcile: write the records' store id: %w", err)
		}
	}
	if id != ev.blobID {
		if err := blobs.SetStoreID(ctx, id); err != nil {
			return fmt.Errorf("reconcile: write the image files' store id: %w", err)
		}
	}
	return nil
}

// finishRemoval deletes a removed image's file and then its remove
// intent. The record is gone (RemoveImage deleted it in the transaction
// that wrote the intent): this is the deletion the owner asked for.
func finishRemoval(ctx context.Context, st intentEnder, blobs RemovalBlobs, id string) error {
	if err := blobs.Delete(ctx, id); err != nil {
		return err
	}
	return st.EndIntent(ctx, id, IntentRemove)
}

// FinishRemovals finishes the removals whose files are still there (the
// blob store could not be reached when their owner removed them, or the
// process died in between) and returns how many it finished. Over a
// shared store only the leader runs it; alone, the one process. An image
// that has a record again (a restored database) keeps its file: the
// intent is dropped.
func FinishRemovals(ctx context.Context, st RemovalRecords, blobs RemovalBlobs) (int, error) {
	intents, err := st.Intents(ctx)
	if err != nil {
		return 0, fmt.Errorf("finish removals: %w", err)
	}
	n := 0
	for _, in := range intents {
		if in.Kind != IntentRemove {
			continue
		}
		_, err := st.Image(ctx, in.UploadID)
		switch {
		case err == nil:
			if err := st.EndIntent(ctx, in.UploadID, IntentRemove); err != nil {
				return n, fmt.Errorf("finish removals: %w", err)
			}
			continue
		case !errors.Is(err, ErrNotFound):
			return n, fmt.Errorf("finish removals: %w", err)
		}
		if err := finishRemoval(ctx, st, blobs, in.UploadID); err != nil {
			return n, fmt.Errorf("finish removals: %s: %w", in.UploadID, err)
		}
		n++
	}
	return n, nil
}

// RunRemovals calls FinishRemovals now and then every `every` until ctx
// ends, logging what it did or why it failed (it tries again next time).
func RunRemovals(ctx context.Context, st RemovalRecords, blobs RemovalBlobs, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n, err := FinishRemovals(ctx, st, blobs)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("finishing image removals failed; trying again later", "err", err.Error())
		case n > 0:
			log.Info("image removals finished", "files_deleted", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// committedSince reports whether blob id was committed after t. A blob
// that vanished meanwhile (removed by its owner) counts as fresh: there
// is nothing to quarantine.
func committedSince(ctx context.Context, blobs ReconcileBlobs, id string, t time.Time) (bool, error) {
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
