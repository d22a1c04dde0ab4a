package qcow2_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	lq "github.com/lima-vm/go-qcow2reader/image/qcow2"

	"github.com/vmshelf/vmshelf/qcow2"
	q "github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// The corpus properties, for synthetic and qemu-made images alike:
//   - each case gets its Want through the streaming Inspector in several
//     chunkings plus CheckStructure, and through Inspect (judge);
//   - every accepted case opens with go-qcow2reader (Readable, no backing
//     file) and reads its first, last and every mapped cluster without an
//     error (readMapped; no tool needed);
//   - with qemu-img: every accepted case is clean for `qemu-img check`
//     (exit 0), reads through go-qcow2reader the same bytes as `qemu-img
//     convert -O raw` (the whole disk where readsWhole), and
//     Stats.AllocatedBytes is what `qemu-img map` calls data; of the
//     corrupt ones, qemu-img check flags all but notFlaggedByQemuCheck.

func TestSynthetic(t *testing.T) {
	cases := q.Synthetic()
	names := map[string]bool{}
	total := 0
	for _, c := range cases {
		if names[c.Name] {
			t.Errorf("duplicate case name %q", c.Name)
		}
		names[c.Name] = true
		total += len(c.Data)
	}
	if total > 16<<20 {
		t.Errorf("the synthetic corpus holds %d bytes, keep it small", total)
	}
	t.Logf("%d synthetic cases, %d bytes", len(cases), total)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			v, st := judge(t, c.Data, q.Limits)
			if v.reason != c.Want {
				_, _, err := qcow2.Inspect(bytes.NewReader(c.Data), int64(len(c.Data)), q.Limits)
				t.Fatalf("verdict %q, want %q (%v)", v.reason, c.Want, err)
			}
			if v.hdr != nil {
				checkStats(t, v.hdr, st)
				img := openSecond(t, qemuFile{bytes.NewReader(c.Data)})
				readMapped(t, img, c.Data, v.hdr)
			}
		})
	}
}

// checkStats checks what Stats can promise on its own.
func checkStats(t *testing.T, h *qcow2.Header, st qcow2.Stats) {
	t.Helper()
	mapped := st.DataClusters + st.CompressedClusters
	if st.AllocatedBytes < 0 || uint64(st.AllocatedBytes) > h.VirtualSize ||
		st.AllocatedBytes > mapped*int64(h.ClusterSize()) || (mapped > 0 && st.L2Tables == 0) {
		t.Errorf("stats %+v for %v", st, h)
	}
}

// TestSyntheticAgainstQemu holds the accepted synthetic images to what
// QEMU says of them.
func TestSyntheticAgainstQemu(t *testing.T) {
	tools := qemuTools(t)
	dir := t.TempDir()
	for _, c := range q.Synthetic() {
		if c.Want != "" {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_", ",", "").Replace(c.Name)+".qcow2")
			if err := os.WriteFile(path, c.Data, 0o600); err != nil {
				t.Fatal(err)
			}
			agreeWithQemu(t, tools, path, c.Data)
		})
	}
}

func TestQemuImages(t *testing.T) {
	tools := qemuTools(t)
	dir := t.TempDir()
	cases := q.QemuImages(t, dir)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			if len(c.Data) > 20<<20 {
				t.Errorf("image of %d bytes, keep it small", len(c.Data))
			}
			v, st := judge(t, c.Data, q.Limits)
			_, _, err := qcow2.Inspect(bytes.NewReader(c.Data), int64(len(c.Data)), q.Limits)
			t.Logf("%d bytes, %+v: %v", len(c.Data), st, err)
			if v.reason != c.Want {
				t.Fatalf("verdict %q, want %q (%v)", v.reason, c.Want, err)
			}
			// Offline, through a file, as `vmshelf check` does.
			path := filepath.Join(t.TempDir(), "image")
			if err := os.WriteFile(path, c.Data, 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			h, _, err := qcow2.Inspect(f, int64(len(c.Data)), q.Limits)
			if got := reason(err); got != c.Want {
				t.Fatalf("Inspect(file) = %v, want %q", err, c.Want)
			}
			if c.Want == "" {
				if *h != *v.hdr {
					t.Fatalf("Inspect(file) header %+v, streaming %+v", h, v.hdr)
				}
				agreeWithQemu(t, tools, path, c.Data)
			}
		})
	}
}

func reason(err error) string {
	if err == nil {
		return ""
	}
	if r, ok := err.(*qcow2.Reject); ok {
		return r.Reason
	}
	return "error: " + err.Error()
}

// qemu is where the qemu tools are.
type qemu struct{ img string }

// qemuTools finds qemu-img; without it the test is skipped, except in CI,
// where a missing tool is a broken machine. Call it first, before the test
// checks anything: a skip never comes halfway.
func qemuTools(t *testing.T) qemu {
	t.Helper()
	p, err := exec.LookPath("qemu-img")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("qemu-img not found (apt-get install qemu-utils): %v", err)
		}
		t.Skipf("qemu-img not found, test skipped (apt-get install qemu-utils): %v", err)
	}
	return qemu{img: p}
}

// qemuTimeout bounds one qemu-img command. The slowest, a convert of a
// 2 GiB disk, takes seconds; this holds on two cores busy with -race.
const qemuTimeout = 3 * time.Minute

// exec runs qemu-img with args, bounded by qemuTimeout: a hung qemu-img
// fails the test, naming the command, instead of hanging the package.
// It returns the combined output and the exit code.
func (qm qemu) exec(t *testing.T, args ...string) ([]byte, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), qemuTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, qm.img, args...).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("qemu-img %s did not finish within %v", strings.Join(args, " "), qemuTimeout)
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out, 0
	case errors.As(err, &exit) && exit.Exited():
		return out, exit.ExitCode()
	}
	t.Fatalf("qemu-img %s: %v\n%s", strings.Join(args, " "), err, out)
	return nil, -1
}

// run runs qemu-img, which must succeed.
func (qm qemu) run(t *testing.T, args ...string) []byte {
	t.Helper()
	out, code := qm.exec(t, args...)
	if code != 0 {
		t.Fatalf("qemu-img %s: exit status %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// agreeWithQemu checks an accepted image at path (holding data) against
// QEMU: `qemu-img check` calls it clean, go-qcow2reader and our own Guest
// read what `qemu-img convert` reads, and our Stats match `qemu-img map`.
func agreeWithQemu(t *testing.T, qm qemu, path string, data []byte) {
	t.Helper()
	if out, code := qm.exec(t, "check", path); code != 0 {
		t.Fatalf("qemu-img check: exit status %d on an image the gate accepts\n%s", code, out)
	}
	h, st, err := qcow2.Inspect(bytes.NewReader(data), int64(len(data)), q.Limits)
	if err != nil {
		t.Fatal(err)
	}
	var extents []struct {
		Start, Length int64
		Data          bool
	}
	if err := json.Unmarshal(qm.run(t, "map", "--output=json", path), &extents); err != nil {
		t.Fatal(err)
	}
	var mapped int64
	for _, e := range extents {
		if e.Data {
			mapped += e.Length
		}
	}
	if st.AllocatedBytes != mapped {
		t.Errorf("AllocatedBytes %d, qemu-img map says %d bytes of data (%+v)", st.AllocatedBytes, mapped, st)
	}
	img := openSecond(t, qemuFile{bytes.NewReader(data)})
	guest, err := qcow2.NewGuest(bytes.NewReader(data), int64(len(data)), h)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	vsize := int64(h.VirtualSize)
	// Whole disks up to 2 GiB (extended L2: 64 MiB, see readsWhole).
	if readsWhole(h) {
		raw := filepath.Join(dir, "full.raw")
		qm.run(t, "convert", "-O", "raw", path, raw)
		compareRange(t, img, guest, raw, 0, vsize)
		return
	}
	// Too big to read whole: every cluster the tables map is read without
	// an error...
	readMapped(t, img, data, h)
	// ...and compared with QEMU's bytes: each data extent (and the start
	// of the disk, which reads as zeros if nothing is there), converted
	// through a raw window on the qcow2 node.
	extents = append(extents, struct {
		Start, Length int64
		Data          bool
	}{0, 1 << 20, true})
	for i, e := range extents {
		if !e.Data {
			continue
		}
		n := e.Length
		if n > 16<<20 {
			// The corpus writes 192 KiB at most in one place; a longer
			// extent means the corpus changed, and the docs' "compared
			// byte for byte" would no longer hold.
			t.Fatalf("data extent of %d bytes at %d: longer than the 16 MiB this test compares", n, e.Start)
		}
		raw := filepath.Join(dir, fmt.Sprintf("window%d.raw", i))
		qm.run(t, "convert", "-O", "raw", "--image-opts",
			fmt.Sprintf("driver=raw,offset=%d,size=%d,file.driver=qcow2,file.file.driver=file,file.file.filename=%s", e.Start, n, path), raw)
		compareRange(t, img, guest, raw, e.Start, n)
	}
}

// compareRange compares [off, off+n) of the virtual disk as go-qcow2reader
// and Guest read it with the raw file QEMU wrote for it, 1 MiB at a time.
func compareRange(t *testing.T, img *lq.Qcow2, guest *qcow2.Guest, rawPath string, off, n int64) {
	t.Helper()
	raw, err := os.Open(rawPath)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	want, got := make([]byte, 1<<20), make([]byte, 1<<20)
	for done := int64(0); done < n; {
		k := min(n-done, int64(len(want)))
		if _, err := raw.ReadAt(want[:k], done); err != nil {
			t.Fatalf("read %s at %d: %v", rawPath, done, err)
		}
		if err := readSecond(img, got[:k], off+done); err != nil {
			t.Fatalf("go-qcow2reader at %d: %v", off+done, err)
		}
		if !bytes.Equal(want[:k], got[:k]) {
			i := 0
			for want[i] == got[i] {
				i++
			}
			t.Fatalf("at virtual offset %d: go-qcow2reader reads %#x, qemu-img convert %#x", off+done+int64(i), got[i], want[i])
		}
		if m, err := guest.ReadAt(got[:k], off+done); m != int(k) || err != nil && err != io.EOF {
			t.Fatalf("Guest at %d: %d of %d bytes, %v", off+done, m, k, err)
		}
		if !bytes.Equal(want[:k], got[:k]) {
			i := 0
			for want[i] == got[i] {
				i++
			}
			t.Fatalf("at virtual offset %d: Guest reads %#x, qemu-img convert %#x", off+done+int64(i), got[i], want[i])
		}
		done += k
	}
}
