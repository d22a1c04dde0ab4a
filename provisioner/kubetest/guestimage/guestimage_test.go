package guestimage

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// needTools skips t (fails it under CI=true, where nothing may be
// skipped) when a tool of Ensure is missing, and under -short.
func needTools(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: building the guest takes minutes")
	}
	if missing := Missing(); len(missing) > 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("building the guest needs %v (.ci/deps installs them)", missing)
		}
		t.Skipf("building the guest needs %v (.ci/deps installs them)", missing)
	}
}

// TestEnsure: the disks are built (or found), each a QCOW2 of the
// promised virtual size with the boot sector its kind needs; a second
// Ensure finds them in the cache and builds nothing.
func TestEnsure(t *testing.T) {
	needTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	s, err := Ensure(ctx, Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first Ensure: built=%v, resolve %s, build %s", s.Built, s.Resolve.Round(time.Second), s.Build.Round(time.Second))
	again, err := Ensure(ctx, Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if again.Built || again.Key != s.Key {
		t.Errorf("second Ensure: built=%v key %s, want the first's (%s) from the cache", again.Built, again.Key, s.Key)
	}
	t.Logf("second Ensure (warm): %s", again.Resolve.Round(time.Second))

	bootImg, err := os.ReadFile(filepath.Join(grubPC, "boot.img"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Kinds {
		t.Run(string(k), func(t *testing.T) {
			p := s.Path(k)
			out, err := exec.Command("qemu-img", "info", "--output=json", p).Output()
			if err != nil {
				t.Fatalf("qemu-img info %s: %v", p, err)
			}
			var info struct {
				Format      string `json:"format"`
				VirtualSize int64  `json:"virtual-size"`
			}
			if err := json.Unmarshal(out, &info); err != nil {
				t.Fatal(err)
			}
			size := int64(VirtualSize)
			if k == NoBootLoader {
				size = RootSize
			}
			if info.Format != "qcow2" || info.VirtualSize != size {
				t.Errorf("%s: %s of %d bytes, want qcow2 of %d", p, info.Format, info.VirtualSize, size)
			}
			head := firstSectors(t, p, 3)
			mbr, gpt := head[:512], head[512:1024]
			if signed := mbr[510] == 0x55 && mbr[511] == 0xaa; signed == (k == NoBootLoader) {
				t.Errorf("%s: sector 0 ends % x; the boot signature 55 aa is what a firmware boots", p, mbr[510:])
			}
			code := mbr[:440]
			switch k {
			case BIOS:
				if !bytes.Equal(code, bootImg[:440]) {
					t.Errorf("%s: sector 0 is not GRUB's boot.img", p)
				}
				if mbr[446] != 0x80 || mbr[446+4] != 0x83 {
					t.Errorf("%s: first partition flags %#x type %#x, want bootable Linux", p, mbr[446], mbr[446+4])
				}
			case NoBootLoader:
				if !bytes.Equal(code, make([]byte, 440)) {
					t.Errorf("%s: sector 0 has boot code", p)
				}
				// ext4's superblock at 1024: the file system, not a disk.
				if head[1024+0x38] != 0x53 || head[1024+0x39] != 0xef {
					t.Errorf("%s: no ext4 superblock at 1024", p)
				}
			case EFI:
				if !bytes.HasPrefix(gpt, []byte("EFI PART")) {
					t.Errorf("%s: sector 1 starts %q, want a GPT header", p, gpt[:8])
				}
			}
		})
	}
}

// firstSectors reads the first n sectors of the guest's disk in image.
func firstSectors(t *testing.T, image string, n int) []byte {
	t.Helper()
	raw := filepath.Join(t.TempDir(), "head.raw")
	if out, err := exec.Command("qemu-img", "dd", "-f", "qcow2", "-O", "raw", "bs=512", "count="+strconv.Itoa(n),
		"if="+image, "of="+raw).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img dd: %v\n%s", err, out)
	}
	b, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < n*512 {
		t.Fatalf("read %d bytes of %s, want %d", len(b), image, n*512)
	}
	return b
}
