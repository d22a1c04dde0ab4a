package blobfs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestStoreIDFile: the identity is a 0600 file in the image directory,
// left nowhere else; a file that holds no id is an error, not "none".
func TestStoreIDFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vm-images")
	f, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	id := imagestore.NewStoreID()
	if err := f.SetStoreID(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, identityFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("identity file: %v, mode %v; want 0600", err, st.Mode().Perm())
	}
	if es, err := os.ReadDir(filepath.Join(dir, partialDir)); err != nil || len(es) != 0 {
		t.Errorf(".partial after SetStoreID holds %v (%v), want nothing", es, err)
	}
	if err := os.WriteFile(filepath.Join(dir, identityFile), []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := f.StoreID(t.Context()); err == nil {
		t.Errorf("StoreID of a damaged file = %q, no error", got)
	}
}
