package s3

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// RemovePartial removes the unfinished blob id: its multipart uploads, its
// tails and durable offset, and its staged bytes unless a marker says they
// are committed. A missing one is not an error. The caller makes sure no
// writer holds it.
func (s *Store) RemovePartial(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	defer s.usage.invalidate()
	if err := s.removePartial(ctx, id, true); err != nil {
		return s.errorf(err, "remove partial %s", id)
	}
	return nil
}

func (s *Store) removePartial(ctx context.Context, id string, staged bool) error {
	key := s.imageKey(id)
	ups, err := s.uploadsFor(ctx, key)
	if err != nil {
		return err
	}
	for _, u := range ups {
		if err := s.abortUpload(ctx, key, u.UploadID); err != nil {
			return err
		}
	}
	if staged {
		if err := s.removeStaged(ctx, id); err != nil {
			return err
		}
	}
	return s.removeAll(ctx, s.partialDir(id))
}

// RemovePartials removes the unfinished writes that crashed or were
// abandoned, except those keep names (live resumable sessions; a nil keep
// keeps nothing), and returns how many blobs it removed. keep is only
// asked about valid ids.
//
// Several replicas share the store, and each runs this at its start-up
// while the others are writing: an unfinished write is removed only if it
// has been idle for the configured grace (its upload initiated, its last
// part, tail or durable offset, or its staged bytes written that long
// ago). A writer sends a part at least every part size, so an idle one is
// dead. Committed blobs are never touched, nor is anything outside the
// partial forms (a stray key under images/ stays).
func (s *Store) RemovePartials(ctx context.Context, keep func(id string) bool) (int, error) {
	defer s.usage.invalidate()
	cutoff := s.now().Add(-s.grace)
	kept := func(id string) bool { return keep != nil && imagestore.ValidUploadID(id) && keep(id) }
	// last is the latest activity seen of each unfinished blob.
	last := map[string]time.Time{}
	seen := func(id string, t time.Time) {
		if cur, ok := last[id]; !ok || t.After(cur) {
			last[id] = t
		}
	}
	images := s.prefix + "images/"
	ups, err := s.uploads(ctx, images)
	if err != nil {
		return 0, s.errorf(err, "remove partials")
	}
	for _, u := range ups {
		id, ok := strings.CutSuffix(strings.TrimPrefix(u.Key, images), ".qcow2")
		if !ok || !imagestore.ValidUploadID(id) {
			continue // not one of ours
		}
		seen(id, u.Initiated)
		parts, err := s.parts(ctx, u.Key, u.UploadID)
		if err != nil && !isNotFound(err) {
			return 0, s.errorf(err, "remove partials")
		}
		for _, p := range parts {
			seen(id, p.LastModified)
		}
	}
	committed := map[string]bool{}
	ids, err := s.List(ctx)
	if err != nil {
		return 0, err
	}
	for _, id := range ids {
		committed[id] = true
	}
	objs, err := s.listObjects(ctx, images)
	if err != nil {
		return 0, s.errorf(err, "remove partials")
	}
	staged := map[string]bool{}
	for _, o := range objs {
		id, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, images), ".qcow2")
		if ok && imagestore.ValidUploadID(id) && !committed[id] {
			staged[id] = true
			seen(id, o.LastModified)
		}
	}
	partial := s.prefix + "partial/"
	objs, err = s.listObjects(ctx, partial)
	if err != nil {
		return 0, s.errorf(err, "remove partials")
	}
	var strays []string
	for _, o := range objs {
		id, _, _ := strings.Cut(strings.TrimPrefix(o.Key, partial), "/")
		if !imagestore.ValidUploadID(id) {
			if o.LastModified.Before(cutoff) {
				strays = append(strays, o.Key)
			}
			continue
		}
		seen(id, o.LastModified)
	}
	n := 0
	var errs []error
	for id, at := range last {
		if kept(id) || !at.Before(cutoff) {
			continue
		}
		if err := s.removePartial(ctx, id, staged[id]); err != nil {
			errs = append(errs, s.errorf(err, "remove partial %s", id))
			continue
		}
		n++
	}
	for _, k := range strays {
		if err := s.remove(ctx, k); err != nil {
			errs = append(errs, s.errorf(err, "remove %s", k))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
