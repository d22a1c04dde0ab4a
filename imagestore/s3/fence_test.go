package s3_test

import (
	"context"
	"errors"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// TestFence: a writer whose fence says no sends no more part, tail or
// commit, and the newer writer that resumed the blob meanwhile is the one
// whose bytes stay.
func TestFence(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	old, cur := open(t, cfg), open(t, cfg) // two replicas
	ctx := context.Background()
	id := imagestore.NewUploadID()
	first := blobtest.Pattern(1, partSize)
	w, err := old.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	errFenced := errors.New("lease lapsed")
	allowed := true
	w.(imagestore.Fenceable).SetFence(func(context.Context) error {
		if allowed {
			return nil
		}
		return errFenced
	})
	if _, err := w.Write(first); err != nil { // one whole part, sent
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}

	// The old writer stalls; its lease lapses and another replica resumes
	// the blob at the durable offset and writes the rest.
	allowed = false
	rest := blobtest.Pattern(2, partSize+100)
	nw, err := cur.Resume(ctx, id, int64(len(first)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nw.Write(rest); err != nil {
		t.Fatal(err)
	}

	// The stale writer wakes up with different bytes for the second part.
	if _, err := w.Write(blobtest.Pattern(9, partSize)); !errors.Is(err, errFenced) {
		t.Errorf("stale Write across a part boundary: %v, want the fence's error", err)
	}
	if err := w.Sync(); !errors.Is(err, errFenced) {
		t.Errorf("stale Sync: %v, want the fence's error", err)
	}
	if err := w.Commit(ctx); err == nil {
		t.Error("stale Commit succeeded")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	if err := nw.Commit(ctx); err != nil {
		t.Fatalf("the newer writer's Commit: %v", err)
	}
	got := blobtest.Committed(t, cur, id)
	want := append(append([]byte{}, first...), rest...)
	if string(got) != string(want) {
		t.Errorf("committed blob (%d bytes) is not the newer writer's bytes (%d)", len(got), len(want))
	}
}
