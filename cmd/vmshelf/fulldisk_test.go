package main

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// mountTmpfs mounts a tmpfs of size on a fresh directory: a real small
// file system to fill. It needs root, as CI has; elsewhere the test says
// why it skips.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput()
	if err != nil {
		if os.Getenv("CI") == "true" || os.Geteuid() == 0 {
			t.Fatalf("mount a %s tmpfs: %v %s", size, err, out)
		}
		t.Skipf("mounting a tmpfs needs root (run the tests as root, as CI does): %v %s", err, out)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// freeBytes is what statfs says an unprivileged writer may still use.
func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// fillUp writes a file into dir until the disk refuses more.
func fillUp(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := 0; ; i++ {
		if i > 1<<14 {
			t.Fatal("the disk never filled")
		}
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	for i := 0; i < 1<<10; i++ { // the last blocks too
		if _, err := f.Write(buf[:4096]); err != nil {
			break
		}
	}
}

// TestE2EFullDisk: serve on a disk filled to the last block. A remove
// still works and frees the space; tickets are 507 noSpace, never 500;
// /readyz is 503 noSpace until the remove, 200 after it.
func TestE2EFullDisk(t *testing.T) {
	mnt := mountTmpfs(t, "512m")
	data := filepath.Join(mnt, "data")
	s := startServe(t, data, []string{"--headroom-mib", "8"})
	disk, diskBytes := makeImageData(t, t.TempDir(), "big.qcow2", 60)
	img := s.upload(t, s.ticket(t, "big"), disk, diskBytes)
	s.upload(t, s.ticket(t, "second"), disk, diskBytes)
	if code, body := curl(t, s.ctlBase+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before the disk filled: %d %s", code, body)
	}

	fillUp(t, mnt)
	if free := freeBytes(t, mnt); free > 1<<20 {
		t.Fatalf("%d bytes still free after filling", free)
	}
	code, body := curl(t, s.ctlBase+"/readyz")
	wantError(t, "/readyz on a full disk", code, body, http.StatusServiceUnavailable, "noSpace")
	code, body = s.ctl(t, "/market/vm-images/ticket", s.token, `{"name":"no room"}`)
	wantError(t, "a ticket on a full disk", code, body, http.StatusInsufficientStorage, "noSpace")

	code, body = s.ctl(t, "/market/vm-images/remove", s.token, `{"upload_id":"`+img.UploadID+`"}`)
	if code != http.StatusOK {
		t.Fatalf("remove on a full disk: %d %s", code, body)
	}
	if free := freeBytes(t, mnt); free < int64(len(diskBytes)) {
		t.Errorf("after the remove %d bytes are free, want at least the image's %d", free, len(diskBytes))
	}
	if _, err := os.Stat(filepath.Join(data, imagesDir, img.UploadID+".qcow2")); !os.IsNotExist(err) {
		t.Errorf("the removed image's file: %v", err)
	}
	if code, body := curl(t, s.ctlBase+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after the remove freed space: %d %s", code, body)
	}
	if n := len(s.status(t, s.token).Images); n != 1 {
		t.Errorf("status lists %d images, want 1", n)
	}
	s.ticket(t, "room again") // 201, or the helper fails the test
}
