package blobfs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
)

// TestQuarantineFiles: a quarantined blob is its own file, moved with every
// byte and its mode into a directory of the images' mode, and a second
// quarantine of its id never replaces that file. The suite checks what
// Open, List and Quarantined answer.
func TestQuarantineFiles(t *testing.T) {
	ctx := t.Context()
	f, dir := openTemp(t)
	id := imagestore.NewUploadID()
	data := blobtest.Pattern(5, 12000)
	blobtest.Put(t, f, id, data)
	if err := f.Quarantine(ctx, id); err != nil {
		t.Fatalf("Quarantine: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, id+blobExt)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the blob's file after Quarantine: %v, want it moved", err)
	}
	qdir := filepath.Join(dir, quarantineDir)
	if m := mode(t, qdir); m != dirMode {
		t.Errorf("quarantine dir mode %v, want %v", m, os.FileMode(dirMode))
	}
	qfile := filepath.Join(qdir, id+blobExt)
	if got, err := os.ReadFile(qfile); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("quarantined bytes differ (%d bytes, %v)", len(got), err)
	}
	if m := mode(t, qfile); m != fileMode {
		t.Errorf("quarantined file mode %v, want %v", m, os.FileMode(fileMode))
	}

	blobtest.Put(t, f, id, []byte("other"))
	if err := f.Quarantine(ctx, id); !errors.Is(err, imagestore.ErrExists) {
		t.Fatalf("second Quarantine of %s: %v, want ErrExists", id, err)
	}
	if got, err := os.ReadFile(qfile); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the first quarantined file was replaced (%d bytes, %v)", len(got), err)
	}
}
