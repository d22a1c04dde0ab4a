package imagestore_test

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobfs"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
)

var quiet = slog.New(slog.DiscardHandler)

// TestReconcileCrashWindows: the crash of a store's first upload between
// its file's commit and its record, and the crash of the removal of its
// last image between the record's delete and the file's, each leave image
// files beside no image record. Start-up carries on: the upload's file is
// quarantined (never deleted), the removed image's file is deleted (its
// owner asked), and their intents end.
func TestReconcileCrashWindows(t *testing.T) {
	ctx := t.Context()
	for _, tc := range []struct {
		name string
		// crash leaves the store as the crash would, and returns the id
		// of the file it left.
		crash          func(t *testing.T, st imagestore.Store, blobs imagestore.Blobs, tn imagestore.Tenant) string
		quarantined    bool
		stampedAlready bool
	}{
		{"first upload, committed, not recorded", func(t *testing.T, st imagestore.Store, blobs imagestore.Blobs, _ imagestore.Tenant) string {
			id := imagestore.NewUploadID()
			if err := st.IntendCommit(ctx, id, time.Now()); err != nil {
				t.Fatal(err)
			}
			blobtest.Put(t, blobs, id, []byte("first"))
			return id
		}, true, false},
		{"last image, record removed, file not", func(t *testing.T, st imagestore.Store, blobs imagestore.Blobs, tn imagestore.Tenant) string {
			id := imagestore.NewUploadID()
			blobtest.Put(t, blobs, id, []byte("last"))
			if err := st.AddImage(ctx, imagestore.Image{UploadID: id, TenantID: tn.ID, Name: "last"}, 0); err != nil {
				t.Fatal(err)
			}
			// The store started once with its image: the identity is on both sides.
			if err := imagestore.Reconcile(ctx, st, blobs, quiet); err != nil {
				t.Fatal(err)
			}
			if err := st.RemoveImage(ctx, tn.ID, id); err != nil {
				t.Fatal(err)
			}
			return id
		}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, st, blobs, tn := openStores(t)
			if err := imagestore.Reconcile(ctx, st, blobs, quiet); err != nil {
				t.Fatalf("Reconcile of the new store: %v", err)
			}
			id := tc.crash(t, st, blobs, tn)
			for run := range 2 { // the second start-up finds nothing left
				if err := imagestore.Reconcile(ctx, st, blobs, quiet); err != nil {
					t.Fatalf("Reconcile %d after the crash: %v", run, err)
				}
			}
			if files, err := blobs.List(ctx); err != nil || len(files) != 0 {
				t.Errorf("image files after Reconcile = %v, %v; want none", files, err)
			}
			q, err := blobs.Quarantined(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(q) == 1 && q[0].ID == id; got != tc.quarantined {
				t.Errorf("quarantine = %+v; want %s quarantined: %v", q, id, tc.quarantined)
			}
			if in, err := st.Intents(ctx); err != nil || len(in) != 0 {
				t.Errorf("intents after Reconcile = %+v, %v; want none", in, err)
			}
		})
	}
}

// stamped is a store that started once with one image: the identity is
// written on both sides.
func stamped(t *testing.T) (string, *sqlite.Store, *blobfs.FS, imagestore.Tenant, string) {
	t.Helper()
	dir, st, blobs, tn := openStores(t)
	id := imagestore.NewUploadID()
	blobtest.Put(t, blobs, id, []byte("disk"))
	if err := st.AddImage(t.Context(), imagestore.Image{UploadID: id, TenantID: tn.ID, Name: "disk"}, 0); err != nil {
		t.Fatal(err)
	}
	if err := imagestore.Reconcile(t.Context(), st, blobs, quiet); err != nil {
		t.Fatal(err)
	}
	return dir, st, blobs, tn, id
}

// TestReconcileRefusesOtherRecords: beside image files that carry the
// store's identity, records with none (a new or emptied database) or
// another store's are refused, and so are records with the identity but
// no image while no intent explains the files (an emptied images table);
// nothing is touched.
func TestReconcileRefusesOtherRecords(t *testing.T) {
	ctx := t.Context()
	for _, tc := range []struct {
		name   string
		reason imagestore.LostReason
		other  func(t *testing.T, dir string, st *sqlite.Store) imagestore.Store
	}{
		{"new database", imagestore.LostNoIdentity, func(t *testing.T, dir string, _ *sqlite.Store) imagestore.Store {
			return openSQLite(t, filepath.Join(t.TempDir(), "vmshelf.db"))
		}},
		{"another store's database", imagestore.LostOtherStore, func(t *testing.T, dir string, _ *sqlite.Store) imagestore.Store {
			other := openSQLite(t, filepath.Join(t.TempDir(), "vmshelf.db"))
			if _, err := other.InitStoreID(ctx, imagestore.NewStoreID()); err != nil {
				t.Fatal(err)
			}
			return other
		}},
		{"images table emptied", imagestore.LostNoRecords, func(t *testing.T, dir string, st *sqlite.Store) imagestore.Store {
			ids, err := st.ImageIDs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// What an emptied table looks like through the Store: the
			// image's record gone, and no intent (RemoveImage would write one).
			tenants, err := st.Tenants(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				if err := st.RemoveImage(ctx, tenants[0].ID, id); err != nil {
					t.Fatal(err)
				}
				if err := st.EndIntent(ctx, id, imagestore.IntentRemove); err != nil {
					t.Fatal(err)
				}
			}
			return st
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, st, blobs, _, id := stamped(t)
			records := tc.other(t, dir, st)
			for range 2 {
				err := imagestore.Reconcile(ctx, records, blobs, quiet)
				var lost *imagestore.StoreLostError
				if !errors.As(err, &lost) || lost.Reason != tc.reason || lost.Files != 1 {
					t.Fatalf("Reconcile = %v, want StoreLostError{Files: 1, Reason: %d}", err, tc.reason)
				}
			}
			if b, err := os.ReadFile(filepath.Join(dir, "vm-images", id+".qcow2")); err != nil || string(b) != "disk" {
				t.Errorf("image after the refusal = %q, %v", b, err)
			}
			if q, err := blobs.Quarantined(ctx); err != nil || len(q) != 0 {
				t.Errorf("quarantine after the refusal = %v, %v", q, err)
			}
		})
	}
}

// TestReconcileStampsIdentity: start-up writes the records' identity and
// the same beside the blobs; blobs from before identities are judged by
// the count of records once, then stamped. Without image files a new
// database is no loss: it takes the blobs' identity.
func TestReconcileStampsIdentity(t *testing.T) {
	ctx := t.Context()
	_, st, blobs, _, _ := stamped(t)
	rec, err := st.StoreID(ctx)
	if err != nil || !imagestore.ValidStoreID(rec) {
		t.Fatalf("records' store id after start-up = %q, %v", rec, err)
	}
	if b, err := blobs.StoreID(ctx); err != nil || b != rec {
		t.Errorf("blobs' store id = %q, %v; want the records' %q", b, err, rec)
	}

	dir := t.TempDir()
	empty, err := blobfs.Open(filepath.Join(dir, "vm-images"))
	if err != nil {
		t.Fatal(err)
	}
	if err := empty.SetStoreID(ctx, rec); err != nil {
		t.Fatal(err)
	}
	fresh := openSQLite(t, filepath.Join(dir, "vmshelf.db"))
	if err := imagestore.Reconcile(ctx, fresh, empty, quiet); err != nil {
		t.Fatalf("Reconcile of a new database beside blobs with no image: %v", err)
	}
	if got, err := fresh.StoreID(ctx); err != nil || got != rec {
		t.Errorf("the new database's store id = %q, %v; want the blobs' %q", got, err, rec)
	}
}

// TestReconcileOldBackup: a database of this store from before
// identities (a backup restored) has no identity but names image files
// here: it is accepted, takes the blobs' identity, and the files it does
// not name are quarantined as after any restore of an older backup.
func TestReconcileOldBackup(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	old := openSQLite(t, filepath.Join(dir, "old.db"))
	tn, err := old.CreateTenant(ctx, imagestore.Tenant{Name: "alpha"}, imagestore.HashSecret("tok"))
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := blobfs.Open(filepath.Join(dir, "vm-images"))
	if err != nil {
		t.Fatal(err)
	}
	backedUp, later := imagestore.NewUploadID(), imagestore.NewUploadID()
	blobtest.Put(t, blobs, backedUp, []byte("in the backup"))
	blobtest.Put(t, blobs, later, []byte("uploaded after it"))
	if err := old.AddImage(ctx, imagestore.Image{UploadID: backedUp, TenantID: tn.ID, Name: "b"}, 0); err != nil {
		t.Fatal(err)
	}
	id := imagestore.NewStoreID()
	if err := blobs.SetStoreID(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := imagestore.Reconcile(ctx, old, blobs, quiet); err != nil {
		t.Fatalf("Reconcile of this store's pre-identity backup: %v", err)
	}
	if got, err := old.StoreID(ctx); err != nil || got != id {
		t.Errorf("the backup's store id after start-up = %q, %v; want the blobs' %q", got, err, id)
	}
	if q, err := blobs.Quarantined(ctx); err != nil || len(q) != 1 || q[0].ID != later {
		t.Errorf("quarantine = %+v, %v; want the image uploaded after the backup", q, err)
	}
}

// TestFinishRemovals: the sweep deletes the file of a removed image whose
// deletion failed (the intent kept it), ends the intent, and keeps the
// file of an image that has a record.
func TestFinishRemovals(t *testing.T) {
	ctx := t.Context()
	_, st, blobs, tn, kept := stamped(t)
	gone := imagestore.NewUploadID()
	blobtest.Put(t, blobs, gone, []byte("removed"))
	if err := st.AddImage(ctx, imagestore.Image{UploadID: gone, TenantID: tn.ID, Name: "gone"}, 0); err != nil {
		t.Fatal(err)
	}
	if err := st.RemoveImage(ctx, tn.ID, gone); err != nil {
		t.Fatal(err)
	}
	n, err := imagestore.FinishRemovals(ctx, st, blobs)
	if err != nil || n != 1 {
		t.Fatalf("FinishRemovals = %d, %v; want 1", n, err)
	}
	if files, err := blobs.List(ctx); err != nil || !slices.Equal(files, []string{kept}) {
		t.Errorf("files after FinishRemovals = %v, %v; want [%s]", files, err, kept)
	}
	if in, err := st.Intents(ctx); err != nil || len(in) != 0 {
		t.Errorf("intents after FinishRemovals = %+v, %v", in, err)
	}
	if n, err := imagestore.FinishRemovals(ctx, st, blobs); err != nil || n != 0 {
		t.Errorf("FinishRemovals again = %d, %v; want 0", n, err)
	}
}

func openSQLite(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}
