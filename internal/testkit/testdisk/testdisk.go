// Package testdisk gives tests real small file systems to fill: a tmpfs,
// or an ext4 image on a loop device. A full disk is the normal state of a
// small home server, so tests of it run on real file systems, not on
// injected errors.
package testdisk

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// Kinds are the file systems Mount makes.
var Kinds = []string{"tmpfs", "ext4"}

// Mount mounts a file system of kind ("tmpfs" or "ext4") and sizeMiB on a
// fresh directory, mode 0700, unmounted when the test ends. The ext4 has
// no root-reserved blocks, so that full means full for root too (the tests
// run as root). Mounting needs root, as CI has: there a failure fails the
// test; elsewhere the test skips, saying why, before it did anything.
func Mount(t testing.TB, kind string, sizeMiB int) string {
	t.Helper()
	dir := t.TempDir()
	var cmd *exec.Cmd
	switch kind {
	case "tmpfs":
		cmd = exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm", sizeMiB), "tmpfs", dir)
	case "ext4":
		if _, err := exec.LookPath("mkfs.ext4"); err != nil {
			unavailable(t, "mkfs.ext4 missing (apt-get install e2fsprogs)")
		}
		img := filepath.Join(t.TempDir(), "disk.ext4")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, int64(sizeMiB)<<20); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext4: %v %s", err, out)
		}
		cmd = exec.Command("mount", "-o", "loop", img, dir)
	default:
		t.Fatalf("testdisk: unknown file system %q", kind)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		if os.Geteuid() == 0 {
			t.Fatalf("mount a %d MiB %s: %v %s", sizeMiB, kind, err, out)
		}
		unavailable(t, fmt.Sprintf("mounting a %s needs root (run the tests as root, as CI does): %v %s", kind, err, out))
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// unavailable fails the test under CI=true, where a missing capability is
// a broken runner, and skips it elsewhere.
func unavailable(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// Fill writes a file named filler in dir until the file system refuses
// more, the last blocks included, and returns its path, for freeing the
// space again.
func Fill(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 256<<10)
	for i := 0; ; i++ {
		if i > 1<<16 {
			t.Fatal("testdisk: the disk never filled")
		}
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	for i := 0; i < 1<<10; i++ { // the last blocks, in smaller writes
		if _, err := f.Write(buf[:4096]); err != nil {
			break
		}
	}
	return p
}

// Free is what statfs says an unprivileged writer may still use in dir.
func Free(t testing.TB, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}
