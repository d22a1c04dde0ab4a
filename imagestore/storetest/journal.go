package storetest

import (
	"slices"
	"sync"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// testStoreID: a new store has no identity; InitStoreID gives it one,
// for good: a second call (another replica's, with another id) gets the
// first, also when both race.
func testStoreID(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	id, err := s.StoreID(ctx)
	must(t, "StoreID of a new store", err)
	if id != "" {
		t.Fatalf("StoreID of a new store = %q, want none", id)
	}
	if _, err := s.InitStoreID(ctx, "not-an-id"); err == nil {
		t.Errorf("InitStoreID of a malformed id: no error")
	}
	ids := []string{imagestore.NewStoreID(), imagestore.NewStoreID(), imagestore.NewStoreID(), imagestore.NewStoreID()}
	got := make([]string, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			var err error
			if got[i], err = s.InitStoreID(ctx, id); err != nil {
				t.Errorf("InitStoreID %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if !slices.Contains(ids, got[0]) {
		t.Fatalf("InitStoreID returned %q, none of the ids given", got[0])
	}
	for i := range got {
		if got[i] != got[0] {
			t.Errorf("racing InitStoreID: call %d got %q, call 0 %q; want one identity", i, got[i], got[0])
		}
	}
	if id, err := s.StoreID(ctx); err != nil || id != got[0] {
		t.Errorf("StoreID = %q, %v; want %q", id, err, got[0])
	}
	if again, err := s.InitStoreID(ctx, imagestore.NewStoreID()); err != nil || again != got[0] {
		t.Errorf("InitStoreID once set = %q, %v; want the first %q kept", again, err, got[0])
	}
}

// testIntents: IntendCommit writes an intent (a second replaces the
// first), Intents lists them sorted by id, EndIntent deletes only the
// kind named.
func testIntents(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	if in, err := s.Intents(ctx); err != nil || len(in) != 0 {
		t.Fatalf("Intents of a new store = %v, %v; want none", in, err)
	}
	must(t, "IntendCommit 2", s.IntendCommit(ctx, uploadID(2), t0))
	must(t, "IntendCommit 1", s.IntendCommit(ctx, uploadID(1), t0.Add(-1)))
	must(t, "IntendCommit 2 again", s.IntendCommit(ctx, uploadID(2), t0.Add(1)))
	want := []imagestore.Intent{
		{UploadID: uploadID(1), Kind: imagestore.IntentCommit, At: t0.Add(-1)},
		{UploadID: uploadID(2), Kind: imagestore.IntentCommit, At: t0.Add(1)},
	}
	checkIntents(t, "after IntendCommit", s, want)
	must(t, "EndIntent of another kind", s.EndIntent(ctx, uploadID(1), imagestore.IntentRemove))
	checkIntents(t, "after EndIntent of another kind", s, want)
	must(t, "EndIntent", s.EndIntent(ctx, uploadID(1), imagestore.IntentCommit))
	must(t, "EndIntent of none", s.EndIntent(ctx, uploadID(9), imagestore.IntentCommit))
	checkIntents(t, "after EndIntent", s, want[1:])
}

// testIntentsOfImages: AddImage ends the image's commit intent, in its
// transaction; a refused AddImage keeps it. RemoveImage writes the remove
// intent in its transaction; a refused RemoveImage writes none.
func testIntentsOfImages(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	must(t, "IntendCommit 1", s.IntendCommit(ctx, uploadID(1), t0))
	must(t, "IntendCommit 2", s.IntendCommit(ctx, uploadID(2), t0))
	newImage(t, s, a.ID, uploadID(1), t0, 100)
	// At quota 1 the second image is refused: its intent stays, for the
	// file the caller is about to delete.
	img := imagestore.Image{UploadID: uploadID(2), TenantID: a.ID, Name: "two", CreatedAt: t0}
	wantErr(t, "AddImage over quota", s.AddImage(ctx, img, 1), imagestore.ErrQuota)
	checkIntents(t, "after AddImage", s, []imagestore.Intent{{UploadID: uploadID(2), Kind: imagestore.IntentCommit, At: t0}})

	b := newTenant(t, s, "bravo")
	wantErr(t, "RemoveImage of another's image", s.RemoveImage(ctx, b.ID, uploadID(1)), imagestore.ErrNotFound)
	checkIntents(t, "after a refused RemoveImage", s, []imagestore.Intent{{UploadID: uploadID(2), Kind: imagestore.IntentCommit, At: t0}})
	must(t, "RemoveImage", s.RemoveImage(ctx, a.ID, uploadID(1)))
	in, err := s.Intents(ctx)
	must(t, "Intents", err)
	if len(in) != 2 || in[0].UploadID != uploadID(1) || in[0].Kind != imagestore.IntentRemove || in[0].At.IsZero() {
		t.Fatalf("Intents after RemoveImage = %+v, want a remove intent of %s first", in, uploadID(1))
	}
	must(t, "EndIntent remove", s.EndIntent(ctx, uploadID(1), imagestore.IntentRemove))
	checkIntents(t, "after the removal ended", s, []imagestore.Intent{{UploadID: uploadID(2), Kind: imagestore.IntentCommit, At: t0}})
}

func checkIntents(t *testing.T, what string, s imagestore.Store, want []imagestore.Intent) {
	t.Helper()
	got, err := s.Intents(t.Context())
	must(t, "Intents "+what, err)
	if len(got) != len(want) {
		t.Fatalf("Intents %s = %+v, want %+v", what, got, want)
	}
	for i := range got {
		if got[i].UploadID != want[i].UploadID || got[i].Kind != want[i].Kind || !got[i].At.Equal(want[i].At) {
			t.Errorf("Intents %s [%d] = %+v, want %+v", what, i, got[i], want[i])
		}
	}
}
