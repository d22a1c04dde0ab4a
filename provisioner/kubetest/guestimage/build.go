package guestimage

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// mmdebstrapArgs are mmdebstrap's arguments but the target: minbase and
// the guest's packages, without documentation, man pages and locales
// (a third of the size, nothing the guest reads).
func mmdebstrapArgs() []string {
	return []string{
		"--variant=minbase",
		"--include=" + strings.Join(packages, ","),
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-exclude=/usr/share/info/*",
		Suite,
	}
}

// instLine is apt's line for a package it would install:
// "Inst NAME (VERSION Debian:12.x/...".
var instLine = regexp.MustCompile(`^Inst (\S+) \((\S+) `)

// resolve asks Debian's mirror (mmdebstrap --simulate: apt's indexes,
// no package downloaded) which package versions a build would install
// today, as sorted "name version" lines.
func resolve(ctx context.Context, cache string) ([]string, error) {
	work, err := os.MkdirTemp(cache, ".resolve-")
	if err != nil {
		return nil, fmt.Errorf("guestimage: %w", err)
	}
	defer os.RemoveAll(work)
	args := append([]string{"--simulate", "--verbose"}, mmdebstrapArgs()...)
	args = append(args, filepath.Join(work, "rootfs.tar"))
	out, err := run(ctx, "mmdebstrap", args...)
	if err != nil {
		return nil, err
	}
	var pkgs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m := instLine.FindStringSubmatch(sc.Text()); m != nil {
			pkgs = append(pkgs, m[1]+" "+m[2])
		}
	}
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	if len(pkgs) < len(packages) {
		return nil, fmt.Errorf("guestimage: mmdebstrap --simulate named %d packages, fewer than the %d asked for:\n%s", len(pkgs), len(packages), tail(out))
	}
	return pkgs, nil
}

// build makes every Kind's disk in out, working in work.
func build(ctx context.Context, work, out string, logf func(string, ...any)) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("guestimage: %w", err)
	}
	rootfs := filepath.Join(work, "rootfs")
	logf("guestimage: mmdebstrap %s (minutes: it downloads and installs every package)", Suite)
	if _, err := run(ctx, "mmdebstrap", append(mmdebstrapArgs(), rootfs)...); err != nil {
		return err
	}
	if err := configure(ctx, rootfs); err != nil {
		return err
	}
	// One root file system for every disk: the partition is as large as
	// the EFI disk has room for; the BIOS disk leaves the same space free.
	root := filepath.Join(work, "root.ext4")
	logf("guestimage: mkfs.ext4 of %d MiB from the tree", RootSize/mib)
	if _, err := run(ctx, "mkfs.ext4", "-q", "-L", "root", "-d", rootfs, root, fmt.Sprintf("%dk", RootSize/1024)); err != nil {
		return err
	}
	if err := os.RemoveAll(rootfs); err != nil {
		return fmt.Errorf("guestimage: %w", err)
	}
	for _, k := range Kinds {
		raw := filepath.Join(work, string(k)+".raw")
		logf("guestimage: %s disk", k)
		if k == NoBootLoader {
			raw = root
		} else if err := assemble(ctx, work, raw, root, k); err != nil {
			return fmt.Errorf("guestimage: the %s disk: %w", k, err)
		}
		if _, err := run(ctx, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, filepath.Join(out, string(k)+".qcow2")); err != nil {
			return err
		}
		if err := os.Remove(raw); err != nil {
			return fmt.Errorf("guestimage: %w", err)
		}
	}
	return nil
}

// grubConfig boots the guest's kernel from the file system labelled root,
// with the console on the screen and on the first serial port (the last
// console= is the one systemd and cloud-init write to); GRUB's own menu
// shows on both too.
const grubConfig = `set timeout=1
serial --unit=0 --speed=115200
terminal_input console serial
terminal_output console serial
search --no-floppy --label root --set=root
menuentry 'Debian GNU/Linux (vmshelf boot test)' {
	linux /boot/%s root=LABEL=root ro console=tty0 console=ttyS0,115200n8
	initrd /boot/%s
}
`

// configure writes what a cloud image's installer would: the mount of
// the root file system, cloud-init's data sources (KubeVirt's NoCloud
// disk, or none), and GRUB's configuration and BIOS modules.
func configure(ctx context.Context, rootfs string) error {
	kernels, _ := filepath.Glob(filepath.Join(rootfs, "boot", "vmlinuz-*"))
	initrds, _ := filepath.Glob(filepath.Join(rootfs, "boot", "initrd.img-*"))
	if len(kernels) != 1 || len(initrds) != 1 {
		return fmt.Errorf("guestimage: want one kernel and one initrd in /boot, found %v and %v", kernels, initrds)
	}
	files := map[string]string{
		"etc/fstab": "LABEL=root / ext4 defaults,errors=remount-ro 0 1\n",
		// NoCloud only: ds-identify then looks for nothing else (no
		// metadata service to wait for on a network that has none).
		"etc/cloud/cloud.cfg.d/90_vmshelf.cfg": "datasource_list: [ NoCloud, None ]\n",
		"boot/grub/grub.cfg":                   fmt.Sprintf(grubConfig, filepath.Base(kernels[0]), filepath.Base(initrds[0])),
	}
	for name, content := range files {
		p := filepath.Join(rootfs, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("guestimage: %w", err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return fmt.Errorf("guestimage: %w", err)
		}
	}
	// The BIOS core.img finds its modules here (its prefix).
	if _, err := run(ctx, "cp", "-a", grubPC, filepath.Join(rootfs, "boot", "grub", "i386-pc")); err != nil {
		return err
	}
	return nil
}

// assemble writes the raw disk of kind k: partition table, boot loader,
// file systems.
func assemble(ctx context.Context, work, raw, root string, k Kind) error {
	f, err := os.Create(raw)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(virtualSize); err != nil {
		return err
	}
	rootStart := int64(firstLBA * 512)
	var table string
	switch k {
	case BIOS:
		table = fmt.Sprintf("label: dos\nstart=%d, size=%d, type=83, bootable\n", firstLBA, fileSize(root)/512)
	case EFI:
		rootStart += espSize
		table = fmt.Sprintf("label: gpt\nstart=%d, size=%d, type=U, name=esp\nstart=%d, size=%d, type=L, name=root\n",
			firstLBA, espSize/512, rootStart/512, fileSize(root)/512)
	}
	if _, err := runIn(ctx, strings.NewReader(table), "sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", raw); err != nil {
		return err
	}
	if err := copyAt(f, rootStart, root); err != nil {
		return err
	}
	switch k {
	case BIOS:
		core := filepath.Join(work, "core.img")
		if _, err := run(ctx, "grub-mkimage", "-O", "i386-pc", "-o", core, "-p", "(hd0,msdos1)/boot/grub",
			"biosdisk", "part_msdos", "ext2"); err != nil {
			return err
		}
		if fileSize(core) > (firstLBA-1)*512 {
			return fmt.Errorf("core.img is %d bytes, more than the gap before the first partition", fileSize(core))
		}
		// boot.img's code only: bytes 440.. are the disk signature and
		// the partition table sfdisk wrote.
		boot, err := os.ReadFile(filepath.Join(grubPC, "boot.img"))
		if err != nil {
			return err
		}
		if _, err := f.WriteAt(boot[:440], 0); err != nil {
			return err
		}
		// core.img from sector 1, where boot.img looks for it; grub-mkimage
		// wrote its length into its first sector's block list.
		if err := copyAt(f, 512, core); err != nil {
			return err
		}
	case EFI:
		esp, err := makeESP(ctx, work)
		if err != nil {
			return err
		}
		if err := copyAt(f, firstLBA*512, esp); err != nil {
			return err
		}
	}
	return f.Close()
}

// makeESP makes the EFI system partition's FAT file system holding a
// standalone GRUB (every module in its memory disk, grub.cfg embedded) at
// \EFI\BOOT\BOOTX64.EFI.
func makeESP(ctx context.Context, work string) (string, error) {
	cfg := filepath.Join(work, "grub-efi.cfg")
	// The embedded configuration finds the root file system by its label
	// and reads the one the system keeps there, as the BIOS GRUB does.
	if err := os.WriteFile(cfg, []byte("search --no-floppy --label root --set=root\nconfigfile /boot/grub/grub.cfg\n"), 0o644); err != nil {
		return "", err
	}
	efi := filepath.Join(work, "BOOTX64.EFI")
	if _, err := run(ctx, "grub-mkstandalone", "-O", "x86_64-efi", "-o", efi,
		"--modules=part_gpt ext2 search search_label serial linux normal configfile",
		"--locales=", "--fonts=", "--themes=", "boot/grub/grub.cfg="+cfg); err != nil {
		return "", err
	}
	esp := filepath.Join(work, "esp.vfat")
	if _, err := run(ctx, "mkfs.vfat", "-C", "-n", "ESP", esp, fmt.Sprint(espSize/1024)); err != nil {
		return "", err
	}
	if _, err := run(ctx, "mmd", "-i", esp, "::/EFI", "::/EFI/BOOT"); err != nil {
		return "", err
	}
	if _, err := run(ctx, "mcopy", "-i", esp, efi, "::/EFI/BOOT/BOOTX64.EFI"); err != nil {
		return "", err
	}
	return esp, nil
}

// copyAt writes file src into f at off, leaving holes where src has whole
// MiB of zeros (f was made sparse).
func copyAt(f *os.File, off int64, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	buf := make([]byte, mib)
	zero := make([]byte, mib)
	for {
		n, err := io.ReadFull(in, buf)
		if n > 0 && !bytes.Equal(buf[:n], zero[:n]) {
			if _, werr := f.WriteAt(buf[:n], off); werr != nil {
				return werr
			}
		}
		off += int64(n)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// run runs name with args and returns its combined output; an error
// carries the command and the output's end.
func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return runIn(ctx, nil, name, args...)
}

// runIn is run with stdin.
func runIn(ctx context.Context, stdin io.Reader, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("guestimage: %s %s: %w\n%s", name, strings.Join(args, " "), err, tail(out))
	}
	return out, nil
}

// tail is the last 20 lines of out: where a tool says why it failed.
func tail(out []byte) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}
