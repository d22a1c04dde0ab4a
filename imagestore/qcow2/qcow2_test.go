package qcow2

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var testLimits = Limits{MaxVirtualSize: 1 << 40} // 1 TiB

// --- synthetic images ---------------------------------------------------

const (
	synthBits = 16
	synthCS   = 1 << synthBits
	synthSize = 1 << 30 // 1 GiB: 2 L1 entries with 64 KiB clusters
)

// synthImage builds a minimal, valid QCOW2 v3 image like qemu-img's:
// header (header_length 112, no extensions) in cluster 0, refcount table
// in cluster 1, refcount block in cluster 2, an empty L1 table in cluster
// 3. The mutation tests start from it, so they need no qemu-img.
func synthImage() []byte {
	b := make([]byte, 4*synthCS)
	be := binary.BigEndian
	copy(b, "QFI\xfb")
	be.PutUint32(b[4:], 3)
	be.PutUint32(b[20:], synthBits)
	be.PutUint64(b[24:], synthSize)
	be.PutUint32(b[36:], 2)              // l1_size
	be.PutUint64(b[40:], 3*synthCS)      // l1_table_offset
	be.PutUint64(b[48:], 1*synthCS)      // refcount_table_offset
	be.PutUint32(b[56:], 1)              // refcount_table_clusters
	be.PutUint32(b[96:], 4)              // refcount_order
	be.PutUint32(b[100:], 112)           // header_length
	be.PutUint64(b[synthCS:], 2*synthCS) // reftable[0] -> refcount block
	for i := range 4 {                   // clusters 0-3 are in use
		be.PutUint16(b[2*synthCS+2*i:], 1)
	}
	return b
}

// mutate returns a copy of synthImage changed by each f.
func mutate(fs ...func(b []byte)) []byte {
	b := synthImage()
	for _, f := range fs {
		f(b)
	}
	return b
}

func put32(off int, v uint32) func([]byte) {
	return func(b []byte) { binary.BigEndian.PutUint32(b[off:], v) }
}

func put64(off int, v uint64) func([]byte) {
	return func(b []byte) { binary.BigEndian.PutUint64(b[off:], v) }
}

func put8(off int, v byte) func([]byte) { return func(b []byte) { b[off] = v } }

// ext is one header extension for exts.
type ext struct {
	typ  uint32
	data []byte
}

// end is the end-of-extensions marker.
var end = ext{}

// exts writes a header extension list at byte 112; the caller adds the
// end marker if it wants one.
func exts(list ...ext) func([]byte) {
	return func(b []byte) {
		off := 112
		for _, e := range list {
			binary.BigEndian.PutUint32(b[off:], e.typ)
			binary.BigEndian.PutUint32(b[off+4:], uint32(len(e.data)))
			copy(b[off+8:], e.data)
			off += 8 + (len(e.data)+7)&^7
		}
	}
}

// --- feeding ------------------------------------------------------------

// verdict is what the gate decides about a whole file: the reason of the
// reject ("" if accepted), the header if accepted, and after how many
// bytes the inspector decided.
type verdict struct {
	reason    string
	hdr       *Header
	decidedAt int  // bytes fed when decided; -1 if only Finish decided
	headerOK  bool // the header passed (a reject came from the structure)
}

// feed runs data through an Inspector in chunks of chunk bytes, then
// Finish and, if accepted, CheckStructure over the whole data.
func feed(t testing.TB, data []byte, chunk int, l Limits) verdict {
	t.Helper()
	in := NewInspector(l)
	v := verdict{decidedAt: -1}
	for off := 0; off < len(data); off += chunk {
		end := min(off+chunk, len(data))
		n, err := in.Write(data[off:end])
		if err != nil {
			var r *Reject
			if !errors.As(err, &r) {
				t.Fatalf("Write returned %T %v, want *Reject", err, err)
			}
			if n > end-off {
				t.Fatalf("Write consumed %d of %d bytes", n, end-off)
			}
			v.decidedAt = off + n
			// Every later call gets the same reject.
			if n2, err2 := in.Write([]byte{0}); n2 != 0 || err2 != err {
				t.Fatalf("Write after reject = %d, %v; want 0, %v", n2, err2, err)
			}
			if _, ok := in.Header(); ok {
				t.Fatal("Header() ok after a reject")
			}
			break
		}
		if n != end-off {
			t.Fatalf("Write = %d, nil for %d bytes", n, end-off)
		}
		if _, ok := in.Header(); ok {
			v.decidedAt = end
			// Later writes are cheap no-ops.
			if n, err := in.Write(data[end:]); n != len(data)-end || err != nil {
				t.Fatalf("Write after accept = %d, %v", n, err)
			}
			break
		}
	}
	h, err := in.Finish()
	v.headerOK = err == nil
	if err == nil {
		err = CheckStructure(bytes.NewReader(data), int64(len(data)), h)
	}
	// Finish is stable.
	if h2, err2 := in.Finish(); (err2 == nil) != v.headerOK || (!v.headerOK && err2 != err) || (v.headerOK && *h2 != *h) {
		t.Fatalf("second Finish = %v, %v; first %v, %v", h2, err2, h, err)
	}
	if err != nil {
		var r *Reject
		if !errors.As(err, &r) {
			t.Fatalf("verdict error %T %v, want *Reject", err, err)
		}
		v.reason = r.Reason
		return v
	}
	v.hdr = h
	return v
}

var chunkings = []int{1, 7, 4096, 1 << 30}

// judge feeds data in every chunking, requires the same verdict each
// time and the same from Inspect, and returns it.
func judge(t testing.TB, data []byte, l Limits) verdict {
	t.Helper()
	var first verdict
	for i, c := range chunkings {
		v := feed(t, data, c, l)
		if i == 0 {
			first = v
			continue
		}
		if v.reason != first.reason || v.headerOK != first.headerOK {
			t.Fatalf("chunk %d: verdict %q (header ok %v), chunk 1 gave %q (%v)", c, v.reason, v.headerOK, first.reason, first.headerOK)
		}
		if (v.hdr == nil) != (first.hdr == nil) || (v.hdr != nil && *v.hdr != *first.hdr) {
			t.Fatalf("chunk %d: header %+v, chunk 1 gave %+v", c, v.hdr, first.hdr)
		}
		// A reject names the exact byte; an accept shows at the end of
		// the chunk that held the end of the header.
		wantAt := first.decidedAt
		if first.headerOK && wantAt >= 0 {
			wantAt = min(len(data), (wantAt+c-1)/c*c)
		}
		if v.decidedAt != wantAt {
			t.Fatalf("chunk %d: decided at %d, want %d (byte-wise %d)", c, v.decidedAt, wantAt, first.decidedAt)
		}
	}
	h, err := Inspect(bytes.NewReader(data), int64(len(data)), l)
	var r *Reject
	switch {
	case err == nil && first.reason != "":
		t.Fatalf("Inspect accepted, streaming said %q", first.reason)
	case err != nil && (!errors.As(err, &r) || r.Reason != first.reason):
		t.Fatalf("Inspect: %v, streaming said %q", err, first.reason)
	case first.hdr != nil && *h != *first.hdr:
		t.Fatalf("Inspect header %+v, streaming %+v", h, first.hdr)
	}
	return first
}

// check judges data and compares the verdict with want ("" for
// accepted); it returns the accepted header.
func check(t *testing.T, data []byte, l Limits, want string) *Header {
	t.Helper()
	v := judge(t, data, l)
	if v.reason != want {
		t.Fatalf("verdict %q, want %q", v.reason, want)
	}
	return v.hdr
}

// --- rules, on written-by-hand headers ----------------------------------

func TestRules(t *testing.T) {
	cs := uint64(synthCS)
	unknown := uint32(0x12345678)
	cases := []struct {
		name   string
		data   []byte
		limits *Limits
		want   string
		hdr    func(t *testing.T, h *Header)
	}{
		{name: "valid", data: synthImage(), hdr: func(t *testing.T, h *Header) {
			want := Header{Version: 3, VirtualSize: synthSize, ClusterBits: synthBits, L1Size: 2,
				L1TableOffset: 3 * cs, RefcountTableOffset: cs, RefcountTableClusters: 1,
				RefcountOrder: 4, HeaderLength: 112}
			if *h != want {
				t.Errorf("header %+v, want %+v", *h, want)
			}
		}},
		{name: "magic", data: mutate(put8(3, 0xfc)), want: ReasonNotQcow2},
		{name: "magic raw zeros", data: make([]byte, 4096), want: ReasonNotQcow2},
		{name: "version 1", data: mutate(put32(4, 1)), want: ReasonNotQcow2},
		{name: "version 4", data: mutate(put32(4, 4)), want: ReasonNotQcow2},
		{name: "backing offset", data: mutate(put64(8, 0x200)), want: ReasonBackingFile},
		{name: "backing size", data: mutate(put32(16, 9)), want: ReasonBackingFile},
		{name: "cluster bits 8", data: mutate(put32(20, 8)), want: ReasonBadHeader},
		{name: "cluster bits 22", data: mutate(put32(20, 22)), want: ReasonBadHeader},
		{name: "cluster bits huge", data: mutate(put32(20, 0xffffffff)), want: ReasonBadHeader},
		{name: "virtual size 0", data: mutate(put64(24, 0)), want: ReasonBadHeader},
		{name: "virtual size too large", data: mutate(put64(24, 1<<41)), want: ReasonVirtualSizeTooLarge},
		{name: "virtual size max uint64", data: mutate(put64(24, ^uint64(0))), want: ReasonVirtualSizeTooLarge},
		{name: "zero limits shut the gate", data: synthImage(), limits: &Limits{}, want: ReasonVirtualSizeTooLarge},
		{name: "virtual size at the limit", data: synthImage(), limits: &Limits{MaxVirtualSize: synthSize}},
		{name: "crypt aes", data: mutate(put32(32, 1)), want: ReasonEncrypted},
		{name: "crypt luks", data: mutate(put32(32, 2)), want: ReasonEncrypted},
		{name: "l1 too small", data: mutate(put32(36, 1)), want: ReasonBadHeader},
		{name: "l1 zero", data: mutate(put32(36, 0)), want: ReasonBadHeader},
		{name: "l1 larger than 32 MiB", data: mutate(put32(36, 4<<20+1)), want: ReasonBadHeader},
		{name: "l1 huge", data: mutate(put32(36, 0xffffffff)), want: ReasonBadHeader},
		{name: "l1 unaligned", data: mutate(put64(40, 3*cs+512)), want: ReasonBadHeader},
		{name: "reftable unaligned", data: mutate(put64(48, cs+8)), want: ReasonBadHeader},
		{name: "reftable 0 clusters", data: mutate(put32(56, 0)), want: ReasonBadHeader},
		{name: "reftable over 8 MiB", data: mutate(put32(56, 129)), want: ReasonBadHeader},
		{name: "reftable huge", data: mutate(put32(56, 0xffffffff)), want: ReasonBadHeader},
		{name: "too many snapshots", data: mutate(put32(60, maxSnapshots+1)), want: ReasonBadHeader},
		{name: "snapshots unaligned", data: mutate(put64(64, 7)), want: ReasonBadHeader},
		{name: "dirty is allowed", data: mutate(put64(72, IncompatDirty)), hdr: func(t *testing.T, h *Header) {
			if !h.Dirty() {
				t.Error("Dirty() false")
			}
		}},
		{name: "corrupt bit", data: mutate(put64(72, IncompatCorrupt)), want: ReasonCorrupt},
		{name: "data file bit", data: mutate(put64(72, IncompatDataFile)), want: ReasonExternalDataFile},
		{name: "unknown incompatible bit 5", data: mutate(put64(72, 1<<5)), want: ReasonBadHeader},
		{name: "unknown incompatible bit 63", data: mutate(put64(72, 1<<63)), want: ReasonBadHeader},
		{name: "extended L2 halves L1 reach", data: mutate(put64(72, IncompatExtendedL2)), want: ReasonBadHeader},
		{name: "extended L2", data: mutate(put64(72, IncompatExtendedL2), put32(36, 4))},
		{name: "extended L2 small clusters", data: mutate(put64(72, IncompatExtendedL2), put32(20, 13), put32(36, 1<<16)), want: ReasonBadHeader},
		{name: "compatible bits are fine", data: mutate(put64(80, ^uint64(0)))},
		{name: "autoclear raw data file", data: mutate(put64(88, AutoclearDataFileRaw)), want: ReasonExternalDataFile},
		{name: "autoclear bitmaps", data: mutate(put64(88, AutoclearBitmaps))},
		{name: "refcount order 7", data: mutate(put32(96, 7)), want: ReasonBadHeader},
		{name: "refcount order 6", data: mutate(put32(96, 6))},
		{name: "header length 100", data: mutate(put32(100, 100)), want: ReasonBadHeader},
		{name: "header length 106", data: mutate(put32(100, 106)), want: ReasonBadHeader},
		{name: "header length past cluster", data: mutate(put32(100, synthCS+8)), want: ReasonBadHeader},
		{name: "header length 104", data: mutate(put32(100, 104))},
		{name: "header length 104 with compression bit", data: mutate(put32(100, 104), put64(72, IncompatCompression)), want: ReasonBadHeader},
		{name: "header length fills the cluster", data: mutate(put32(100, synthCS))},
		{name: "header length long, tail skipped", data: mutate(put32(100, 4096), put64(200, ^uint64(0)))},
		{name: "zstd", data: mutate(put8(104, CompressionZstd), put64(72, IncompatCompression)), hdr: func(t *testing.T, h *Header) {
			if h.CompressionType != CompressionZstd {
				t.Errorf("compression %d", h.CompressionType)
			}
		}},
		{name: "zstd without bit", data: mutate(put8(104, CompressionZstd)), want: ReasonBadHeader},
		{name: "compression bit with zlib", data: mutate(put64(72, IncompatCompression)), want: ReasonBadHeader},
		{name: "unknown compression", data: mutate(put8(104, 2), put64(72, IncompatCompression)), want: ReasonBadHeader},
		{name: "ext backing format", data: mutate(exts(ext{extBackingFormat, []byte("qcow2")}, end)), want: ReasonBackingFile},
		{name: "ext data file without bit", data: mutate(exts(ext{unknown, []byte("x")}, ext{extDataFile, []byte("/etc/shadow")}, end)), want: ReasonExternalDataFile},
		{name: "ext luks without crypt", data: mutate(exts(ext{extLUKS, make([]byte, 16)}, end)), want: ReasonEncrypted},
		{name: "ext unknown ignored", data: mutate(exts(ext{unknown, []byte("hello")}, ext{unknown + 1, make([]byte, 4000)}, end))},
		{name: "ext empty unknown", data: mutate(exts(ext{unknown, nil}, ext{unknown, nil}, end))},
		{name: "ext end marker with length", data: mutate(exts(ext{0, []byte("ignored")}))},
		{name: "ext overruns cluster", data: mutate(exts(ext{unknown, make([]byte, synthCS-112-8+1)})), want: ReasonBadHeader},
		{name: "ext length huge", data: mutate(put32(112, unknown), put32(116, 0xffffffff)), want: ReasonBadHeader},
		{name: "ext list fills cluster exactly", data: mutate(exts(ext{unknown, make([]byte, synthCS-112-8)}))},
		{name: "ext after long header", data: mutate(put32(100, 4096), func(b []byte) {
			binary.BigEndian.PutUint32(b[4096:], extDataFile)
		}), want: ReasonExternalDataFile},
		{name: "v2", data: mutate(put32(4, 2), put64(72, IncompatCorrupt)), hdr: func(t *testing.T, h *Header) {
			// Bytes 72+ are extensions in v2: the "feature word" here is
			// type 0 (end), so it is simply the end of the list.
			if h.Version != 2 || h.RefcountOrder != 4 || h.HeaderLength != 72 || h.IncompatibleFeatures != 0 {
				t.Errorf("v2 header %+v", *h)
			}
		}},
		{name: "v2 backing format ext", data: mutate(put32(4, 2), put32(72, extBackingFormat), put32(76, 5)), want: ReasonBackingFile},
		{name: "v2 l1 too small", data: mutate(put32(4, 2), put32(36, 1)), want: ReasonBadHeader},

		// Truncated streams.
		{name: "empty", data: nil, want: ReasonNotQcow2},
		{name: "3 bytes", data: synthImage()[:3], want: ReasonNotQcow2},
		{name: "7 bytes", data: synthImage()[:7], want: ReasonNotQcow2},
		{name: "8 bytes", data: synthImage()[:8], want: ReasonBadHeader},
		{name: "50 bytes", data: synthImage()[:50], want: ReasonBadHeader},
		{name: "inside ext header", data: synthImage()[:116], want: ReasonBadHeader},
		{name: "inside ext data", data: mutate(exts(ext{unknown, make([]byte, 64)}))[:150], want: ReasonBadHeader},

		// Structure.
		{name: "truncated before L1", data: synthImage()[:3*synthCS], want: ReasonCorrupt},
		{name: "L1 partly outside", data: synthImage()[:3*synthCS+8], want: ReasonCorrupt},
		{name: "L1 exactly at the end", data: synthImage()[:3*synthCS+16]},
		{name: "L1 over header", data: mutate(put64(40, 0)), want: ReasonCorrupt},
		{name: "L1 over reftable", data: mutate(put64(40, cs)), want: ReasonCorrupt},
		{name: "L1 beyond file", data: mutate(put64(40, 1<<62)), want: ReasonCorrupt},
		{name: "reftable over header", data: mutate(put64(48, 0)), want: ReasonCorrupt},
		{name: "reftable beyond file", data: mutate(put64(48, 1<<63)), want: ReasonCorrupt},
		{name: "reftable over L1", data: mutate(put64(48, 2*cs), put32(56, 2)), want: ReasonCorrupt},
		{name: "L2 beyond file", data: mutate(put64(3*synthCS+8, 8*cs)), want: ReasonCorrupt},
		{name: "L2 unaligned", data: mutate(put64(3*synthCS, 2*cs+512)), want: ReasonCorrupt},
		{name: "L2 in file, flags ignored", data: mutate(put64(3*synthCS, 1<<63|2*cs|1<<56|1))},
		{name: "refblock beyond file", data: mutate(put64(synthCS+8, 4*cs)), want: ReasonCorrupt},
		{name: "refblock unaligned", data: mutate(put64(synthCS, 2*cs+1)), want: ReasonCorrupt},
		{name: "snapshots beyond file", data: mutate(put32(60, 1), put64(64, 4*cs)), want: ReasonCorrupt},
		{name: "snapshots over header", data: mutate(put32(60, 1), put64(64, 0)), want: ReasonCorrupt},
		{name: "snapshot offset ignored when none", data: mutate(put64(64, 1<<40))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := testLimits
			if c.limits != nil {
				l = *c.limits
			}
			h := check(t, c.data, l, c.want)
			if c.hdr != nil && h != nil {
				c.hdr(t, h)
			}
		})
	}
}

// TestEarlyDecision: the gate answers as soon as the bytes decide.
func TestEarlyDecision(t *testing.T) {
	cases := []struct {
		name string
		data []byte
		at   int // the decision comes with byte number at
	}{
		{"raw zeros", make([]byte, 512), 1},
		{"wrong last magic byte", []byte("QFI\x00\x00\x00\x00\x03"), 4},
		{"ELF", []byte("\x7fELF"), 1},
		{"version", mutate(put32(4, 9)), 8},
		{"backing", mutate(put64(8, 1)), 20},
		{"crypt", mutate(put32(32, 2)), 36},
		{"ext data file", mutate(exts(ext{extDataFile, []byte("x")})), 120},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if v := feed(t, c.data, 1, testLimits); v.decidedAt != c.at {
				t.Fatalf("decided after %d bytes (%q), want %d", v.decidedAt, v.reason, c.at)
			}
			// A wrong magic is decided within the first 4 bytes however
			// it is chunked.
			if c.at <= 4 {
				in := NewInspector(testLimits)
				if _, err := in.Write(c.data[:4]); err == nil {
					t.Fatal("4 bytes of a wrong magic accepted")
				}
			}
		})
	}
}

// TestAcceptAfterHeader: once accepted, the rest of the body is not
// looked at (and an image is accepted long before its end).
func TestAcceptAfterHeader(t *testing.T) {
	data := synthImage()
	in := NewInspector(testLimits)
	if n, err := in.Write(data[:120]); n != 120 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	h, ok := in.Header()
	if !ok || h.VirtualSize != synthSize {
		t.Fatalf("Header() = %+v, %v after the end marker", h, ok)
	}
	if n, err := in.Write([]byte("garbage that is never looked at")); n != 31 || err != nil {
		t.Fatalf("Write after accept = %d, %v", n, err)
	}
	// Header returns a copy.
	h.VirtualSize = 1
	if h2, _ := in.Header(); h2.VirtualSize != synthSize {
		t.Fatal("Header() shares its state")
	}
}

type failingReader struct{ err error }

func (f failingReader) ReadAt(p []byte, off int64) (int, error) { return 0, f.err }

type shortReader struct{}

func (shortReader) ReadAt(p []byte, off int64) (int, error) { return len(p) / 2, nil }

func TestCheckStructureReadErrors(t *testing.T) {
	data := synthImage()
	h, err := Inspect(bytes.NewReader(data), int64(len(data)), testLimits)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk on fire")
	for _, r := range []struct {
		name string
		r    interface {
			ReadAt([]byte, int64) (int, error)
		}
		is error
	}{{"error", failingReader{boom}, boom}, {"short", shortReader{}, nil}} {
		err := CheckStructure(r.r, int64(len(data)), h)
		var rej *Reject
		if err == nil || errors.As(err, &rej) {
			t.Errorf("%s: CheckStructure = %v, want a plain read error", r.name, err)
		}
		if r.is != nil && !errors.Is(err, r.is) {
			t.Errorf("%s: %v does not wrap %v", r.name, err, r.is)
		}
		if _, err := Inspect(r.r, int64(len(data)), testLimits); err == nil || errors.As(err, &rej) {
			t.Errorf("%s: Inspect = %v, want a plain read error", r.name, err)
		}
	}
	if err := CheckStructure(bytes.NewReader(data), -1, h); err == nil {
		t.Error("negative size accepted")
	}
	if err := CheckStructure(bytes.NewReader(data), 10, nil); err == nil {
		t.Error("nil header accepted")
	}
	bad := *h
	bad.ClusterBits = 200
	if err := CheckStructure(bytes.NewReader(data), int64(len(data)), &bad); err == nil {
		t.Error("cluster bits 200 accepted")
	}
}

// --- real images from qemu-img ------------------------------------------

// qemuTool finds a qemu binary; without it the test is skipped, except
// in CI, where a missing tool is a broken machine.
func qemuTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found (install qemu-utils): %v", name, err)
		}
		t.Skipf("%s not found (install qemu-utils): %v", name, err)
	}
	return p
}

func run(t *testing.T, dir, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
}

// runRetry is run for commands that may fail by chance: LUKS creation
// times PBKDF2 with the thread CPU clock and gives up ("Unable to get
// accurate CPU usage") when a coarse clock measures 0 ms.
func runRetry(t *testing.T, dir, bin string, args ...string) {
	t.Helper()
	var out []byte
	var err error
	for range 10 {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		if out, err = cmd.CombinedOutput(); err == nil {
			return
		}
		if !strings.Contains(string(out), "accurate CPU usage") {
			break
		}
	}
	t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
}

func TestQemuImages(t *testing.T) {
	img := qemuTool(t, "qemu-img")
	io := qemuTool(t, "qemu-io")
	dir := t.TempDir()
	create := func(name string, args ...string) {
		run(t, dir, img, append(append([]string{"create", "-q", "-f", "qcow2"}, args...), name)...)
	}
	sized := func(name, size string, args ...string) {
		run(t, dir, img, append(append([]string{"create", "-q", "-f", "qcow2"}, args...), name, size)...)
	}
	sized("v2.qcow2", "1G", "-o", "compat=0.10")
	sized("v3.qcow2", "1G")
	sized("zstd.qcow2", "1G", "-o", "compression_type=zstd")
	sized("big.qcow2", "512G")
	sized("base.qcow2", "1G")
	create("backed.qcow2", "-b", "base.qcow2", "-F", "qcow2")
	sized("datafile.qcow2", "1G", "-o", "data_file=ext.raw")
	sized("datafileraw.qcow2", "1G", "-o", "data_file=ext2.raw,data_file_raw=on")
	runRetry(t, dir, img, "create", "-q", "-f", "qcow2", "--object", "secret,id=sec0,data=abc",
		"-o", "encrypt.format=luks,encrypt.key-secret=sec0", "luks.qcow2", "1G")
	sized("c512.qcow2", "1G", "-o", "cluster_size=512")
	sized("c2m.qcow2", "1G", "-o", "cluster_size=2M")
	sized("extl2.qcow2", "1G", "-o", "extended_l2=on")
	sized("lazy.qcow2", "1G", "-o", "lazy_refcounts=on")
	sized("written.qcow2", "1G")
	run(t, dir, io, "-f", "qcow2", "-c", "write -P 0xab 0 1M", "written.qcow2")
	sized("written512.qcow2", "64M", "-o", "cluster_size=512")
	run(t, dir, io, "-f", "qcow2", "-c", "write -P 0xab 0 1M", "-c", "write -P 0xcd 60M 1M", "written512.qcow2")
	sized("snap.qcow2", "1G")
	run(t, dir, io, "-f", "qcow2", "-c", "write -P 0xab 0 1M", "snap.qcow2")
	run(t, dir, img, "snapshot", "-c", "first", "snap.qcow2")
	run(t, dir, img, "create", "-q", "-f", "raw", "raw.img", "1M")
	run(t, dir, img, "create", "-q", "-f", "vmdk", "disk.vmdk", "1G")

	cases := []struct {
		file   string
		limits Limits
		want   string
		hdr    func(t *testing.T, h *Header)
	}{
		{file: "v2.qcow2", hdr: func(t *testing.T, h *Header) {
			if h.Version != 2 || h.RefcountOrder != 4 || h.HeaderLength != 72 {
				t.Errorf("%+v", *h)
			}
		}},
		{file: "v3.qcow2", hdr: func(t *testing.T, h *Header) {
			if h.Version != 3 || h.VirtualSize != 1<<30 || h.ClusterBits != 16 {
				t.Errorf("%+v", *h)
			}
		}},
		{file: "zstd.qcow2", hdr: func(t *testing.T, h *Header) {
			if h.CompressionType != CompressionZstd || h.IncompatibleFeatures&IncompatCompression == 0 {
				t.Errorf("%+v", *h)
			}
		}},
		{file: "big.qcow2", hdr: func(t *testing.T, h *Header) {
			if h.VirtualSize != 512<<30 {
				t.Errorf("%+v", *h)
			}
		}},
		{file: "big.qcow2", limits: Limits{MaxVirtualSize: 256 << 30}, want: ReasonVirtualSizeTooLarge},
		{file: "backed.qcow2", want: ReasonBackingFile},
		{file: "datafile.qcow2", want: ReasonExternalDataFile},
		{file: "datafileraw.qcow2", want: ReasonExternalDataFile},
		{file: "luks.qcow2", want: ReasonEncrypted},
		{file: "c512.qcow2", hdr: func(t *testing.T, h *Header) {
			if h.ClusterBits != 9 {
				t.Errorf("%+v", *h)
			}
		}},
		{file: "c2m.qcow2", hdr: func(t *testing.T, h *Header) {
			if h.ClusterBits != 21 {
				t.Errorf("%+v", *h)
			}
		}},
		{file: "extl2.qcow2", hdr: func(t *testing.T, h *Header) {
			if h.IncompatibleFeatures&IncompatExtendedL2 == 0 {
				t.Errorf("%+v", *h)
			}
		}},
		{file: "lazy.qcow2"},
		{file: "written.qcow2"},
		{file: "written512.qcow2"},
		{file: "snap.qcow2", hdr: func(t *testing.T, h *Header) {
			if h.NbSnapshots != 1 {
				t.Errorf("%+v", *h)
			}
		}},
		{file: "raw.img", want: ReasonNotQcow2},
		{file: "disk.vmdk", want: ReasonNotQcow2},
	}
	for _, c := range cases {
		t.Run(c.file+"/"+c.want, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, c.file))
			if err != nil {
				t.Fatal(err)
			}
			l := c.limits
			if l == (Limits{}) {
				l = testLimits
			}
			h := check(t, data, l, c.want)
			if c.hdr != nil && h != nil {
				c.hdr(t, h)
			}
			// Offline, through a file, as `vmshelf check` does.
			f, err := os.Open(filepath.Join(dir, c.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			_, err = Inspect(f, int64(len(data)), l)
			var r *Reject
			if got := ""; err != nil {
				if !errors.As(err, &r) {
					t.Fatalf("Inspect(file): %v", err)
				}
				if got = r.Reason; got != c.want {
					t.Fatalf("Inspect(file) = %q, want %q", got, c.want)
				}
			} else if c.want != "" {
				t.Fatalf("Inspect(file) accepted, want %q", c.want)
			}
		})
	}

	// The synthetic image the rule tests start from is one QEMU accepts.
	syn := filepath.Join(dir, "synth.qcow2")
	if err := os.WriteFile(syn, synthImage(), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, dir, img, "check", "-q", syn)
}

func TestRejectError(t *testing.T) {
	_, err := NewInspector(testLimits).Write([]byte("MZ"))
	var r *Reject
	if !errors.As(err, &r) || r.Reason != ReasonNotQcow2 {
		t.Fatalf("Write = %v", err)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "qcow2: notQcow2: ") || !strings.Contains(msg, "magic") {
		t.Errorf("Error() = %q", msg)
	}
	h := synthImage()
	hdr, err := Inspect(bytes.NewReader(h), int64(len(h)), testLimits)
	if err != nil {
		t.Fatal(err)
	}
	if s := hdr.String(); !strings.Contains(s, "qcow2 v3") || !strings.Contains(s, "cluster size 65536") {
		t.Errorf("String() = %q", s)
	}
}

// FuzzInspector feeds arbitrary bytes through the Inspector in several
// chunkings and, when the header passes, through CheckStructure. It must
// never panic, and the verdict must not depend on the chunking. The seed
// corpus in testdata/ holds the heads of small qemu-img images.
func FuzzInspector(f *testing.F) {
	f.Add([]byte("QFI\xfb\x00\x00\x00\x02"))
	f.Add(synthImage()[:4096])
	f.Add(mutate(exts(ext{extDataFile, []byte("x")}, end))[:256])
	f.Add(mutate(put32(100, 4096), put64(72, IncompatExtendedL2), put32(36, 4))[:8192])
	f.Fuzz(func(t *testing.T, data []byte) {
		v := judge(t, data, testLimits)
		if h := v.hdr; h != nil {
			if h.ClusterBits < minClusterBits || h.ClusterBits > maxClusterBits ||
				h.VirtualSize == 0 || h.VirtualSize > testLimits.MaxVirtualSize ||
				uint64(h.L1Size)*8 > maxL1Bytes || (h.Version != 2 && h.Version != 3) {
				t.Fatalf("accepted a header that breaks the rules: %+v", *h)
			}
		}
	})
}
