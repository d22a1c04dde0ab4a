// Package guestimage builds the guest the boot tests run: Debian 12 with
// its cloud kernel and cloud-init, made from Debian's own packages by
// mmdebstrap, as QCOW2 disks of three kinds: one a BIOS machine boots
// (MBR, GRUB for i386-pc), one a UEFI machine boots (GPT, an EFI system
// partition with GRUB at the removable-media path), and the system's file
// system alone, with no partition table and no boot loader, which no
// firmware can start.
//
// Building takes minutes (mmdebstrap downloads and installs about 250
// packages), so the disks are kept in a cache outside the repository,
// under a key made of the exact package versions Debian's mirror resolves
// today: a run that finds them does not build again, and a point release
// or security update of any package builds afresh.
//
// Nothing is mounted: the host may have no loop-device partitions and no
// vfat, so the file systems are made from directories and files
// (mkfs.ext4 -d, mkfs.vfat + mtools), the partition tables by sfdisk in a
// plain file, and the boot loaders by GRUB's image tools instead of
// grub-install. Building needs root (mmdebstrap's root mode keeps file
// owners as the guest needs them).
package guestimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Kind is one of the disks built.
type Kind string

const (
	// BIOS: an MBR disk whose first sector is GRUB's boot.img and whose
	// gap before the first partition holds GRUB's core.img.
	BIOS Kind = "bios"
	// EFI: a GPT disk with an EFI system partition holding a standalone
	// GRUB as \EFI\BOOT\BOOTX64.EFI, the path firmware boots with no boot
	// entries of its own (a fresh machine's NVRAM has none).
	EFI Kind = "efi"
	// NoBootLoader: the root file system alone, as a partition converted
	// instead of its disk: the system is there, but no partition table and
	// no boot loader, nothing that any firmware can start.
	NoBootLoader Kind = "noboot"
)

// Kinds are every disk a Set holds.
var Kinds = []Kind{BIOS, EFI, NoBootLoader}

// Suite is the Debian release the guest is made of.
const Suite = "bookworm"

// packages are installed into the guest beside minbase's: a kernel with
// the virtio drivers and no AHCI (a disk on a SATA bus is invisible to
// it), systemd as init (its serial getty prints the login prompt),
// cloud-init with what it needs to read KubeVirt's NoCloud disk and bring
// up the network by DHCP, and python3, whose http.server the tests' user
// data starts on port 80.
var packages = []string{
	"linux-image-cloud-amd64", "systemd-sysv", "udev", "dbus", "cloud-init", "python3",
	"ifupdown", "isc-dhcp-client", "iproute2", "netbase", "initramfs-tools", "e2fsprogs",
}

// recipe names this file's way of building: a change to the disks'
// layout or the guest's configuration changes it, so that a cache of the
// old recipe is not taken for the new one.
const recipe = "guestimage recipe 2: minbase, no docs; MBR+core.img / GPT+ESP 64MiB / the root file system alone; root ext4 LABEL=root"

// Disk geometry: the virtual size is a little over 2 GiB, so that a
// replica sized from it (whole GiB, rounded up) is larger than the image,
// and the guest can be seen to have been given the whole of it.
const (
	mib         = 1 << 20
	virtualSize = 2<<30 + 64*mib
	firstLBA    = 2048 // 1 MiB: the partitions' alignment; the BIOS disk's core.img lives before it
	espSize     = 64 * mib
	// gptTail is room for the backup GPT at the end of the EFI disk.
	gptTail = mib
)

// VirtualSize is the virtual size of the BIOS and the EFI disk; the
// NoBootLoader one is its root file system's, RootSize.
const (
	VirtualSize = virtualSize
	RootSize    = virtualSize - firstLBA*512 - espSize - gptTail
)

// Tools are the commands Ensure runs, and the Debian package of each
// (.ci/deps installs the same).
var Tools = map[string]string{
	"mmdebstrap":        "mmdebstrap",
	"mkfs.ext4":         "e2fsprogs",
	"mkfs.vfat":         "dosfstools",
	"mmd":               "mtools",
	"mcopy":             "mtools",
	"sfdisk":            "fdisk",
	"grub-mkimage":      "grub-common", // grub-pc-bin and grub-efi-amd64-bin bring it, and their modules
	"grub-mkstandalone": "grub-common",
	"qemu-img":          "qemu-utils",
}

// grubPC is where Debian's grub-pc-bin keeps GRUB's i386-pc modules and
// boot images; grubEFI the x86_64-efi modules (grub-efi-amd64-bin).
const (
	grubPC  = "/usr/lib/grub/i386-pc"
	grubEFI = "/usr/lib/grub/x86_64-efi"
)

// Options tune Ensure.
type Options struct {
	// CacheDir holds the disks, one folder per key. Empty: DefaultCacheDir.
	CacheDir string
	// Logf, if set, is told what Ensure does (its steps take minutes).
	Logf func(format string, args ...any)
}

// Set is the disks of one key.
type Set struct {
	// Dir holds the disks: <kind>.qcow2.
	Dir string
	// Key is the cache key: a hash of the recipe and every package's version.
	Key string
	// Packages are the guest's packages as "name version", sorted.
	Packages []string
	// Built says whether this call built the disks (false: the cache had them).
	Built bool
	// Resolve is how long asking Debian's mirror for the versions took, and
	// Build how long building took (0 when the cache had them).
	Resolve, Build time.Duration
}

// Path is the QCOW2 disk of kind k.
func (s *Set) Path(k Kind) string { return filepath.Join(s.Dir, string(k)+".qcow2") }

// DefaultCacheDir is $VMSHELF_GUEST_CACHE, or vmshelf/guest-images in the
// user's cache folder (~/.cache): outside any clone, so that every clone
// and worktree of the machine shares one build.
func DefaultCacheDir() (string, error) {
	if d := os.Getenv("VMSHELF_GUEST_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("guestimage: no cache folder (set VMSHELF_GUEST_CACHE): %w", err)
	}
	return filepath.Join(d, "vmshelf", "guest-images"), nil
}

// Missing names each tool Ensure needs that is not installed, with its
// Debian package, and root if the process is not root.
func Missing() []string {
	var out []string
	for _, tool := range slices.Sorted(mapsKeys(Tools)) {
		if _, err := exec.LookPath(tool); err != nil {
			out = append(out, fmt.Sprintf("%s (Debian package %s)", tool, Tools[tool]))
		}
	}
	for _, f := range []string{filepath.Join(grubPC, "boot.img"), filepath.Join(grubEFI, "linux.mod")} {
		if _, err := os.Stat(f); err != nil {
			out = append(out, fmt.Sprintf("%s (Debian packages grub-pc-bin, grub-efi-amd64-bin)", f))
		}
	}
	if os.Geteuid() != 0 {
		out = append(out, "root (mmdebstrap's root mode)")
	}
	return out
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Ensure returns the disks of today's package versions: from the cache if
// a build of the same versions is there, otherwise built now (and older
// builds removed). Concurrent callers on one machine wait for one build.
func Ensure(ctx context.Context, opts Options) (*Set, error) {
	if missing := Missing(); len(missing) > 0 {
		return nil, fmt.Errorf("guestimage: missing %s", strings.Join(missing, ", "))
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	dir := opts.CacheDir
	if dir == "" {
		var err error
		if dir, err = DefaultCacheDir(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("guestimage: cache folder: %w", err)
	}
	unlock, err := lock(ctx, filepath.Join(dir, ".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()

	start := time.Now()
	pkgs, err := resolve(ctx, dir)
	if err != nil {
		return nil, err
	}
	s := &Set{Key: key(pkgs), Packages: pkgs, Resolve: time.Since(start)}
	s.Dir = filepath.Join(dir, s.Key)
	logf("guestimage: %d packages of Debian %s resolved in %s: key %s", len(pkgs), Suite, s.Resolve.Round(time.Second), s.Key)
	if complete(s) {
		logf("guestimage: cached in %s", s.Dir)
		return s, nil
	}

	start = time.Now()
	work, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return nil, fmt.Errorf("guestimage: %w", err)
	}
	defer os.RemoveAll(work)
	out := filepath.Join(work, "out")
	if err := build(ctx, work, out, logf); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(out, "packages.txt"), []byte(strings.Join(pkgs, "\n")+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("guestimage: %w", err)
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		return nil, fmt.Errorf("guestimage: %w", err)
	}
	if err := os.Rename(out, s.Dir); err != nil {
		return nil, fmt.Errorf("guestimage: %w", err)
	}
	s.Built, s.Build = true, time.Since(start)
	logf("guestimage: built in %s into %s", s.Build.Round(time.Second), s.Dir)
	removeOthers(dir, s.Key, logf)
	return s, nil
}

// complete reports whether every disk of s is in the cache.
func complete(s *Set) bool {
	for _, k := range Kinds {
		if fi, err := os.Stat(s.Path(k)); err != nil || !fi.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// removeOthers removes the builds of other keys: each is over 1 GiB, and
// only today's versions are ever used again.
func removeOthers(dir, keep string, logf func(string, ...any)) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != keep && !strings.HasPrefix(e.Name(), ".") {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err == nil {
				logf("guestimage: removed the older build %s", e.Name())
			}
		}
	}
}

// key is the cache key of a package list: the recipe and the versions.
func key(pkgs []string) string {
	h := sha256.New()
	h.Write([]byte(recipe + "\n" + Suite + "\n"))
	for _, p := range pkgs {
		h.Write([]byte(p + "\n"))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// lock takes an exclusive lock on path, waiting while another process of
// this machine builds; it gives up when ctx ends.
func lock(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("guestimage: lock: %w", err)
	}
	got := make(chan error, 1)
	go func() { got <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("guestimage: lock: %w", err)
		}
		return func() { f.Close() }, nil
	case <-ctx.Done():
		// The goroutine's flock ends when the file is closed or the other
		// holder lets go; closing after it returns releases what it got.
		go func() { <-got; f.Close() }()
		return nil, fmt.Errorf("guestimage: waiting for another build: %w", ctx.Err())
	}
}
