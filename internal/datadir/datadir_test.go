package datadir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestPrepareTightens: an existing 0755 dir and its 0750 directory inside
// come out 0700; a missing one inside is left to be created.
func TestPrepareTightens(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(filepath.Join(dir, "images"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Prepare(dir, "images", "missing"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Join(dir, "images")} {
		if m := mode(t, d); m != 0o700 {
			t.Errorf("%s: mode %04o, want 0700", d, m)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Prepare made %s (%v); only dir itself is created", "missing", err)
	}
}

// TestPrepareRefusesAFile: a data dir that is a file is refused in one line.
func TestPrepareRefusesAFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Prepare(file); err == nil {
		t.Fatal("Prepare of a file: no error")
	}
}

// TestLockInUse: a second Lock of the same dir is ErrInUse until the first
// is closed.
func TestLockInUse(t *testing.T) {
	dir := t.TempDir()
	first, err := Lock(dir, "x.lock")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Lock(dir, "x.lock"); !errors.Is(err, ErrInUse) {
		t.Fatalf("second Lock: %v, want ErrInUse", err)
	}
	first.Close()
	again, err := Lock(dir, "x.lock")
	if err != nil {
		t.Fatalf("Lock after the first closed: %v", err)
	}
	again.Close()
	if m := mode(t, filepath.Join(dir, "x.lock")); m != 0o600 {
		t.Errorf("lock file: mode %04o, want 0600", m)
	}
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}
