package gateway

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestUploadSaysWhichFirmwareStartsIt: the answer and the record of an
// upload carry the firmware its disk's first sectors could be started
// by, read through the stored QCOW2: plain, deflate- and zstd-compressed
// clusters, and a GPT disk laid out by the real sfdisk and mkfs.vfat.
func TestUploadSaysWhichFirmwareStartsIt(t *testing.T) {
	needQemu(t)
	needTool(t, "curl", "sfdisk", "mkfs.vfat")
	dir := t.TempDir()
	// A BIOS's: boot code (the 0xab qemu-io writes) and the signature.
	mbr := makeImage(t, "64M")
	qemuIO(t, mbr, "write -q -P 0x55 510 1", "write -q -P 0xaa 511 1")
	deflated := filepath.Join(dir, "deflate.qcow2")
	qemuImg(t, "convert", "-c", "-O", "qcow2", mbr, deflated)
	// UEFI's: a GPT with an EFI system partition holding a FAT file
	// system, and a zeroed protective MBR's boot code.
	raw := filepath.Join(dir, "gpt.raw")
	if err := os.WriteFile(raw, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(raw, 64<<20); err != nil {
		t.Fatal(err)
	}
	tool(t, strings.NewReader("label: gpt\nstart=2048, size=65536, type=U\nstart=67584, type=L\n"),
		"sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", raw)
	tool(t, nil, "mkfs.vfat", "--offset", "2048", raw, "32768")
	gpt := filepath.Join(dir, "gpt.qcow2")
	qemuImg(t, "convert", "-c", "-f", "raw", "-O", "qcow2", "-o", "compression_type=zstd", raw, gpt)
	// Neither: qemu-img's empty disk.
	blank := filepath.Join(dir, "blank.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", blank, "64M")

	cases := []struct{ name, file, want string }{
		{"an MBR with boot code", mbr, "bios"},
		{"the same, deflate-compressed", deflated, "bios"},
		{"a GPT disk with an ESP, zstd-compressed", gpt, "uefi"},
		{"an empty disk", blank, "none"},
	}
	e := newEnv(t, func(c *Config) { c.ImagesPerTenant = len(cases) })
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			url, id := e.ticket()
			code, body := curlPut(t, url, c.file)
			if code != 201 || body["boot"] != c.want {
				t.Fatalf("upload answered %d %v, want 201 with boot %q", code, body, c.want)
			}
			rec, err := e.st.Image(context.Background(), id)
			if err != nil || rec.Boot != c.want {
				t.Errorf("the image's record says boot %q (%v), want %q", rec.Boot, err, c.want)
			}
		})
	}
}

// tool runs a tool a test needs, with stdin, and fails the test on an error.
func tool(t *testing.T, stdin *strings.Reader, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = stdin
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatal(fmt.Errorf("%s %v: %w\n%s", name, args, err, out))
	}
}
