package blobfs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestQuarantine: a quarantined blob leaves service with every byte, keeps
// its mode, can be listed, is never replaced, and goes only when removed
// by name.
func TestQuarantine(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	f, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	id := imagestore.NewUploadID()
	data := bytes.Repeat([]byte("orphan disk "), 1000)
	w, err := f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	if err := f.Quarantine(ctx, imagestore.NewUploadID()); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Quarantine of a missing blob: %v, want ErrNotFound", err)
	}
	if err := f.Quarantine(ctx, "../escape"); err == nil {
		t.Error("Quarantine accepted an id that is a path")
	}
	if err := f.Quarantine(ctx, id); err != nil {
		t.Fatalf("Quarantine: %v", err)
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("List after Quarantine = %v, %v; want nothing", ids, err)
	}
	if _, err := f.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Open after Quarantine: %v, want ErrNotFound", err)
	}
	qdir := filepath.Join(dir, quarantineDir)
	if st, err := os.Stat(qdir); err != nil || st.Mode().Perm() != dirMode {
		t.Errorf("quarantine dir: %v, %v; want mode %v", st, err, os.FileMode(dirMode))
	}
	qfile := filepath.Join(qdir, id+blobExt)
	got, err := os.ReadFile(qfile)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("quarantined bytes differ (%d bytes, %v)", len(got), err)
	}
	if st, err := os.Stat(qfile); err != nil || st.Mode().Perm() != fileMode {
		t.Errorf("quarantined file: %v, %v; want mode %v", st, err, os.FileMode(fileMode))
	}
	q, err := f.Quarantined(ctx)
	if err != nil || len(q) != 1 || q[0].ID != id || q[0].Size != int64(len(data)) || q[0].QuarantinedAt.IsZero() {
		t.Fatalf("Quarantined = %+v, %v; want %s of %d bytes", q, err, id, len(data))
	}

	// A second orphan with the same id (an operator put the file back and
	// its record is still missing) never replaces the first.
	w, err = f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("other")); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Quarantine(ctx, id); !errors.Is(err, imagestore.ErrExists) {
		t.Errorf("second Quarantine of %s: %v, want ErrExists", id, err)
	}
	if got, _ := os.ReadFile(qfile); !bytes.Equal(got, data) {
		t.Error("the first quarantined file was replaced")
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 1 {
		t.Errorf("the second orphan must stay where it was: List = %v, %v", ids, err)
	}

	if err := f.RemoveQuarantined(ctx, imagestore.NewUploadID()); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("RemoveQuarantined of a missing blob: %v, want ErrNotFound", err)
	}
	if err := f.RemoveQuarantined(ctx, id); err != nil {
		t.Fatalf("RemoveQuarantined: %v", err)
	}
	if q, err := f.Quarantined(ctx); err != nil || len(q) != 0 {
		t.Errorf("Quarantined after removal = %+v, %v", q, err)
	}
}

// TestQuarantinedEmpty: an edge that never quarantined lists nothing.
func TestQuarantinedEmpty(t *testing.T) {
	f, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if q, err := f.Quarantined(t.Context()); err != nil || len(q) != 0 {
		t.Errorf("Quarantined = %v, %v; want empty", q, err)
	}
}
