package qcow2_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/qcow2"
	q "github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// verdict is what the gate decides about a whole file: the reason of the
// reject ("" if accepted), the header if accepted, and after how many
// bytes the inspector decided.
type verdict struct {
	reason    string
	hdr       *qcow2.Header
	decidedAt int  // bytes fed when decided; -1 if only Finish decided
	headerOK  bool // the header passed (a reject came from the structure)
}

// feed runs data through an Inspector in chunks of chunk bytes, then
// Finish and, if accepted, CheckStructure over the whole data.
func feed(t testing.TB, data []byte, chunk int, l qcow2.Limits) verdict {
	t.Helper()
	in := qcow2.NewInspector(l)
	v := verdict{decidedAt: -1}
	for off := 0; off < len(data); off += chunk {
		end := min(off+chunk, len(data))
		n, err := in.Write(data[off:end])
		if err != nil {
			var r *qcow2.Reject
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
		err = qcow2.CheckStructure(bytes.NewReader(data), int64(len(data)), h)
	}
	// Finish is stable.
	if h2, err2 := in.Finish(); (err2 == nil) != v.headerOK || (!v.headerOK && err2 != err) || (v.headerOK && *h2 != *h) {
		t.Fatalf("second Finish = %v, %v; first %v, %v", h2, err2, h, err)
	}
	if err != nil {
		var r *qcow2.Reject
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
// time and the same from Inspect, and returns it with Inspect's Stats.
func judge(t testing.TB, data []byte, l qcow2.Limits) (verdict, qcow2.Stats) {
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
	h, st, err := qcow2.Inspect(bytes.NewReader(data), int64(len(data)), l)
	var r *qcow2.Reject
	switch {
	case err == nil && first.reason != "":
		t.Fatalf("Inspect accepted, streaming said %q", first.reason)
	case err != nil && (!errors.As(err, &r) || r.Reason != first.reason):
		t.Fatalf("Inspect: %v, streaming said %q", err, first.reason)
	case first.hdr != nil && *h != *first.hdr:
		t.Fatalf("Inspect header %+v, streaming %+v", h, first.hdr)
	case first.headerOK != (h != nil):
		t.Fatalf("Inspect header %v, streaming header ok %v", h, first.headerOK)
	case err != nil && st != (qcow2.Stats{}):
		t.Fatalf("Inspect rejected with stats %+v", st)
	}
	return first, st
}

// TestBaseHeader: the image every header mutation starts from parses to
// the header qemu-img would write.
func TestBaseHeader(t *testing.T) {
	h, st, err := qcow2.Inspect(bytes.NewReader(q.Base()), int64(len(q.Base())), q.Limits)
	if err != nil {
		t.Fatal(err)
	}
	want := qcow2.Header{Version: 3, VirtualSize: 64 << 20, ClusterBits: 12, L1Size: 32,
		L1TableOffset: 3 * q.BaseClusterSize, RefcountTableOffset: q.BaseClusterSize, RefcountTableClusters: 1,
		RefcountOrder: 4, HeaderLength: 112}
	if *h != want {
		t.Errorf("header %+v, want %+v", *h, want)
	}
	if st != (qcow2.Stats{}) {
		t.Errorf("stats %+v of an empty image", st)
	}
	if s := h.String(); !strings.Contains(s, "qcow2 v3") || !strings.Contains(s, "cluster size 4096") {
		t.Errorf("String() = %q", s)
	}
}

// TestZeroLimits: a gate that was not configured stays shut.
func TestZeroLimits(t *testing.T) {
	if v, _ := judge(t, q.Base(), qcow2.Limits{}); v.reason != qcow2.ReasonVirtualSizeTooLarge {
		t.Fatalf("verdict %q with zero limits", v.reason)
	}
	if v, _ := judge(t, q.Base(), qcow2.Limits{MaxVirtualSize: 64 << 20}); v.reason != "" {
		t.Fatalf("verdict %q at the limit", v.reason)
	}
}

// TestDirty: the dirty bit is reported.
func TestDirty(t *testing.T) {
	v, _ := judge(t, q.Mutate(q.Base(), q.Put64(72, qcow2.IncompatDirty)), q.Limits)
	if v.hdr == nil || !v.hdr.Dirty() {
		t.Fatalf("dirty image: %+v", v)
	}
}

// TestEarlyDecision: the gate answers as soon as the bytes decide.
func TestEarlyDecision(t *testing.T) {
	b := q.Base()
	cases := []struct {
		name string
		data []byte
		at   int // the decision comes with byte number at
	}{
		{"raw zeros", make([]byte, 512), 1},
		{"wrong last magic byte", []byte("QFI\x00\x00\x00\x00\x03"), 4},
		{"ELF", []byte("\x7fELF"), 1},
		{"version", q.Mutate(b, q.Put32(4, 9)), 8},
		{"backing", q.Mutate(b, q.Put64(8, 1)), 20},
		{"crypt", q.Mutate(b, q.Put32(32, 2)), 36},
		{"ext data file", q.Mutate(b, q.Exts(q.Ext{Type: q.ExtDataFile, Data: []byte("x")})), 120},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if v := feed(t, c.data, 1, q.Limits); v.decidedAt != c.at {
				t.Fatalf("decided after %d bytes (%q), want %d", v.decidedAt, v.reason, c.at)
			}
			// A wrong magic is decided within the first 4 bytes however
			// it is chunked.
			if c.at <= 4 {
				in := qcow2.NewInspector(q.Limits)
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
	data := q.Base()
	in := qcow2.NewInspector(q.Limits)
	if n, err := in.Write(data[:120]); n != 120 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	h, ok := in.Header()
	if !ok || h.VirtualSize != 64<<20 {
		t.Fatalf("Header() = %+v, %v after the end marker", h, ok)
	}
	if n, err := in.Write([]byte("garbage that is never looked at")); n != 31 || err != nil {
		t.Fatalf("Write after accept = %d, %v", n, err)
	}
	// Header returns a copy.
	h.VirtualSize = 1
	if h2, _ := in.Header(); h2.VirtualSize != 64<<20 {
		t.Fatal("Header() shares its state")
	}
}

type failingReader struct{ err error }

func (f failingReader) ReadAt(p []byte, off int64) (int, error) { return 0, f.err }

type shortReader struct{}

func (shortReader) ReadAt(p []byte, off int64) (int, error) { return len(p) / 2, nil }

// failAfter serves data but fails every read at or past off.
type failAfter struct {
	data []byte
	off  int64
	err  error
}

func (f failAfter) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > f.off {
		return 0, f.err
	}
	return copy(p, f.data[off:]), nil
}

// TestReadErrors: a failing reader is an error, not a verdict, at every
// step of the walk.
func TestReadErrors(t *testing.T) {
	var rich []byte
	for _, c := range q.Synthetic() {
		if c.Name == "valid/snapshot" {
			rich = c.Data
		}
	}
	h, _, err := qcow2.Inspect(bytes.NewReader(rich), int64(len(rich)), q.Limits)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk on fire")
	type readerAt interface {
		ReadAt([]byte, int64) (int, error)
	}
	readers := []struct {
		name string
		r    readerAt
		is   error
	}{{"error", failingReader{boom}, boom}, {"short", shortReader{}, nil}}
	// Fail from each cluster on: the first read there breaks the walk.
	for off := int64(h.ClusterSize()); off < int64(len(rich)); off += int64(h.ClusterSize()) {
		readers = append(readers, struct {
			name string
			r    readerAt
			is   error
		}{fmt.Sprintf("fail from %d", off), failAfter{rich, off, boom}, boom})
	}
	for _, r := range readers {
		err := qcow2.CheckStructure(r.r, int64(len(rich)), h)
		var rej *qcow2.Reject
		if err == nil || errors.As(err, &rej) {
			t.Errorf("%s: CheckStructure = %v, want a plain read error", r.name, err)
		}
		if r.is != nil && !errors.Is(err, r.is) {
			t.Errorf("%s: %v does not wrap %v", r.name, err, r.is)
		}
		if _, _, err := qcow2.Inspect(r.r, int64(len(rich)), q.Limits); err == nil || errors.As(err, &rej) {
			t.Errorf("%s: Inspect = %v, want a plain read error", r.name, err)
		}
	}
	if err := qcow2.CheckStructure(bytes.NewReader(rich), -1, h); err == nil {
		t.Error("negative size accepted")
	}
	if _, _, err := qcow2.Inspect(bytes.NewReader(rich), -1, q.Limits); err == nil {
		t.Error("Inspect: negative size accepted")
	}
	if err := qcow2.CheckStructure(bytes.NewReader(rich), 10, nil); err == nil {
		t.Error("nil header accepted")
	}
}

// TestHandMadeHeaders: CheckStructure is exported and takes any Header;
// one the Inspector would refuse is badHeader, never a panic.
func TestHandMadeHeaders(t *testing.T) {
	data := q.Base()
	good, _, err := qcow2.Inspect(bytes.NewReader(data), int64(len(data)), q.Limits)
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func(h *qcow2.Header){
		"cluster bits 200":   func(h *qcow2.Header) { h.ClusterBits = 200 },
		"cluster bits 8":     func(h *qcow2.Header) { h.ClusterBits = 8 },
		"version 1":          func(h *qcow2.Header) { h.Version = 1 },
		"virtual size 0":     func(h *qcow2.Header) { h.VirtualSize = 0 },
		"virtual size 2^63":  func(h *qcow2.Header) { h.VirtualSize = 1 << 63 },
		"refcount order 9":   func(h *qcow2.Header) { h.RefcountOrder = 9 },
		"compression 7":      func(h *qcow2.Header) { h.CompressionType = 7 },
		"corrupt bit":        func(h *qcow2.Header) { h.IncompatibleFeatures = qcow2.IncompatCorrupt },
		"extended L2, 4 KiB": func(h *qcow2.Header) { h.IncompatibleFeatures = qcow2.IncompatExtendedL2 },
		"L1 size 0":          func(h *qcow2.Header) { h.L1Size = 0 },
		"L1 size 2^32-1":     func(h *qcow2.Header) { h.L1Size = 1<<32 - 1 },
		"reftable 0":         func(h *qcow2.Header) { h.RefcountTableClusters = 0 },
		"reftable 2^32-1":    func(h *qcow2.Header) { h.RefcountTableClusters = 1<<32 - 1 },
		"snapshots 2^32-1":   func(h *qcow2.Header) { h.NbSnapshots = 1<<32 - 1 },
	} {
		h := *good
		f(&h)
		err := qcow2.CheckStructure(bytes.NewReader(data), int64(len(data)), &h)
		var rej *qcow2.Reject
		if !errors.As(err, &rej) || rej.Reason != qcow2.ReasonBadHeader {
			t.Errorf("%s: %v, want badHeader", name, err)
		}
	}
}

func TestRejectError(t *testing.T) {
	_, err := qcow2.NewInspector(q.Limits).Write([]byte("MZ"))
	var r *qcow2.Reject
	if !errors.As(err, &r) || r.Reason != qcow2.ReasonNotQcow2 {
		t.Fatalf("Write = %v", err)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "qcow2: notQcow2: ") || !strings.Contains(msg, "magic") {
		t.Errorf("Error() = %q", msg)
	}
}
