package qcow2test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/qcow2"
)

// qemuImage is one image QemuImages makes: steps run in order in the
// directory, file is the image they leave.
type qemuImage struct {
	name  string
	file  string
	want  string
	steps [][]string // argv; "qemu-img"/"qemu-io" are looked up
}

// writes returns qemu-io write commands at several offsets of a disk of
// size bytes: the start, a partial cluster just past 1 MiB, the middle and
// the last 64 KiB, each with its own pattern; then a zeroed range.
func writes(file string, size int64) []string {
	mid := size / 2 &^ (1<<20 - 1)
	args := []string{"qemu-io", "-f", "qcow2",
		"-c", "write -P 0xa1 0 192k",
		"-c", "write -P 0xb2 1049088 3000", // 1 MiB + 512, not cluster-aligned
		"-c", "write -P 0xc3 " + itoa(mid) + " 64k",
		"-c", "write -P 0xd4 " + itoa(size-64<<10) + " 64k",
		"-c", "write -z " + itoa(mid+64<<10) + " 64k",
	}
	return append(args, file)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func create(file, size string, opts ...string) []string {
	return append(append([]string{"qemu-img", "create", "-q", "-f", "qcow2"}, opts...), file, size)
}

// qemuImages lists what QemuImages makes.
func qemuImages() []qemuImage {
	// 256 MiB disks keep the byte-for-byte comparison with qemu-img
	// convert quick; the 512 GiB and 512-byte-cluster images have several
	// L2 tables.
	const G, M, S = 1 << 30, 1 << 20, 256 << 20
	c := func(file, opt string) [][]string {
		return [][]string{create(file, "256M", "-o", opt), writes(file, S)}
	}
	return []qemuImage{
		{"qemu/v2", "v2.qcow2", "", [][]string{create("v2.qcow2", "64M", "-o", "compat=0.10"), writes("v2.qcow2", 64*M)}},
		{"qemu/v3", "v3.qcow2", "", [][]string{create("v3.qcow2", "256M"), writes("v3.qcow2", S),
			{"qemu-io", "-f", "qcow2", "-c", "discard 0 64k", "v3.qcow2"}}},
		{"qemu/deflate compressed", "deflate.qcow2", "", [][]string{create("src.qcow2", "256M"), writes("src.qcow2", S),
			{"qemu-img", "convert", "-c", "-O", "qcow2", "src.qcow2", "deflate.qcow2"}}},
		{"qemu/zstd compressed", "zstd.qcow2", "", [][]string{create("src.qcow2", "256M"), writes("src.qcow2", S),
			{"qemu-img", "convert", "-c", "-O", "qcow2", "-o", "compression_type=zstd", "src.qcow2", "zstd.qcow2"}}},
		{"qemu/v2 deflate compressed", "v2deflate.qcow2", "", [][]string{create("src.qcow2", "256M"), writes("src.qcow2", S),
			{"qemu-img", "convert", "-c", "-O", "qcow2", "-o", "compat=0.10", "src.qcow2", "v2deflate.qcow2"}}},
		{"qemu/512 GiB", "big.qcow2", "", [][]string{create("big.qcow2", "512G"), writes("big.qcow2", 512*G)}},
		{"qemu/600 GiB", "huge.qcow2", qcow2.ReasonVirtualSizeTooLarge, [][]string{create("huge.qcow2", "600G")}},
		{"qemu/backing file", "backed.qcow2", qcow2.ReasonBackingFile, [][]string{create("base.qcow2", "256M"),
			{"qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "backed.qcow2"}}},
		{"qemu/external data file", "datafile.qcow2", qcow2.ReasonExternalDataFile, [][]string{create("datafile.qcow2", "1G", "-o", "data_file=ext.raw")}},
		{"qemu/external raw data file", "datafileraw.qcow2", qcow2.ReasonExternalDataFile, [][]string{create("datafileraw.qcow2", "1G", "-o", "data_file=ext2.raw,data_file_raw=on")}},
		{"qemu/luks", "luks.qcow2", qcow2.ReasonEncrypted, [][]string{{"qemu-img", "create", "-q", "-f", "qcow2",
			"--object", "secret,id=sec0,data=abc", "-o", "encrypt.format=luks,encrypt.key-secret=sec0", "luks.qcow2", "64M"}}},
		{"qemu/512-byte clusters", "c512.qcow2", "", [][]string{create("c512.qcow2", "64M", "-o", "cluster_size=512"), writes("c512.qcow2", 64*M)}},
		{"qemu/2 MiB clusters", "c2m.qcow2", "", [][]string{create("c2m.qcow2", "256M", "-o", "cluster_size=2M"),
			{"qemu-io", "-f", "qcow2", "-c", "write -P 0xa1 4096 3000", "-c", "write -P 0xd4 268431360 4096", "c2m.qcow2"}}},
		{"qemu/extended L2", "extl2.qcow2", "", append([][]string{create("extl2.qcow2", "64M", "-o", "extended_l2=on"), writes("extl2.qcow2", 64*M)},
			[]string{"qemu-io", "-f", "qcow2", "-c", "write -P 0xe5 2097152 2048", "-c", "write -z 2101248 8192", "extl2.qcow2"})},
		{"qemu/lazy refcounts", "lazy.qcow2", "", c("lazy.qcow2", "lazy_refcounts=on")},
		{"qemu/refcount bits 1", "ref1.qcow2", "", c("ref1.qcow2", "refcount_bits=1")},
		{"qemu/refcount bits 64", "ref64.qcow2", "", c("ref64.qcow2", "refcount_bits=64")},
		{"qemu/preallocated metadata", "prealloc.qcow2", "", [][]string{create("prealloc.qcow2", "8M", "-o", "preallocation=metadata"),
			{"qemu-io", "-f", "qcow2", "-c", "write -P 0xf6 1M 64k", "prealloc.qcow2"}}},
		{"qemu/internal snapshot", "snap.qcow2", "", [][]string{create("snap.qcow2", "256M"), writes("snap.qcow2", S),
			{"qemu-img", "snapshot", "-c", "first", "snap.qcow2"},
			{"qemu-io", "-f", "qcow2", "-c", "write -P 0x17 0 64k", "-c", "write -P 0x28 200M 64k", "snap.qcow2"},
			{"qemu-img", "snapshot", "-c", "second", "snap.qcow2"},
			{"qemu-io", "-f", "qcow2", "-c", "write -P 0x39 64k 64k", "snap.qcow2"}}},
		{"qemu/persistent bitmap", "bitmap.qcow2", "", [][]string{create("bitmap.qcow2", "256M"),
			{"qemu-img", "bitmap", "--add", "bitmap.qcow2", "b0"}, writes("bitmap.qcow2", S)}},
		{"qemu/raw", "raw.img", qcow2.ReasonNotQcow2, [][]string{{"qemu-img", "create", "-q", "-f", "raw", "raw.img", "1M"}}},
		{"qemu/vmdk", "disk.vmdk", qcow2.ReasonNotQcow2, [][]string{{"qemu-img", "create", "-q", "-f", "vmdk", "disk.vmdk", "1G"}}},
	}
}

// QemuImages creates images with qemu-img and qemu-io in dir and returns
// them as cases: v2, v3, zstd and deflate compressed (with data), 512 GiB
// virtual size (accepted), 600 GiB (virtualSizeTooLarge), backing file,
// external data file (both variants), LUKS, cluster sizes 512 and 2M,
// extended L2, lazy refcounts, with data written by qemu-io at several
// offsets, with internal snapshots, raw and vmdk (notQcow2). When
// qemu-img or qemu-io is missing it calls t.Skip, or t.Fatal when
// os.Getenv("CI")=="true".
func QemuImages(t testing.TB, dir string) []Case {
	t.Helper()
	tools := map[string]string{}
	for _, name := range []string{"qemu-img", "qemu-io"} {
		p, err := exec.LookPath(name)
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s not found (apt-get install qemu-utils): %v", name, err)
			}
			t.Skipf("%s not found, test skipped (apt-get install qemu-utils): %v", name, err)
		}
		tools[name] = p
	}
	var cases []Case
	for _, img := range qemuImages() {
		sub := filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_").Replace(img.name))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, argv := range img.steps {
			RunQemu(t, sub, tools[argv[0]], argv[1:]...)
		}
		data, err := os.ReadFile(filepath.Join(sub, img.file))
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, Case{Name: img.name, Data: data, Want: img.want})
	}
	return cases
}

// runTimeout bounds one qemu-img or qemu-io command; the slowest writes a
// few MiB. A hung tool fails the test, naming the command, instead of
// hanging the package until go test's own timeout.
const runTimeout = 2 * time.Minute

// RunQemu runs a qemu tool (qemu-img, qemu-io) in dir. LUKS creation times PBKDF2 with the thread
// CPU clock and gives up ("Unable to get accurate CPU usage") when a
// coarse clock measures 0 ms, about one run in three here: that failure
// is retried, at most 10 times.
func RunQemu(t testing.TB, dir, bin string, args ...string) {
	t.Helper()
	var out []byte
	var err error
	for range 10 {
		ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = dir
		out, err = cmd.CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatalf("%s %s did not finish within %v", filepath.Base(bin), strings.Join(args, " "), runTimeout)
		}
		if err == nil {
			return
		}
		if !strings.Contains(string(out), "accurate CPU usage") {
			break
		}
	}
	t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
}
