package qcow2_test

import (
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/qcow2"
	q "github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// sparseFile is a file of any size held as a few written ranges; the rest
// reads as zeros. It lets a test hand the gate a 40 MiB L1 table or a
// 2 GiB file of L2 tables without holding them.
type sparseFile struct {
	size int64
	segs []segment // sorted by off, not overlapping
	// read counts the bytes ReadAt returned and reads the calls: the
	// gate's work, measured without a clock.
	read, reads int64
}

type segment struct {
	off  int64
	data []byte
}

func (f *sparseFile) write(off int64, data []byte) {
	f.segs = append(f.segs, segment{off, data})
	sort.Slice(f.segs, func(i, j int) bool { return f.segs[i].off < f.segs[j].off })
}

func (f *sparseFile) put64(off int64, v uint64) {
	f.write(off, binary.BigEndian.AppendUint64(nil, v))
}

func (f *sparseFile) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= f.size {
		return 0, io.EOF
	}
	n := len(p)
	if rest := f.size - off; int64(n) > rest {
		n = int(rest)
	}
	clear(p[:n])
	f.read += int64(n)
	f.reads++
	i := sort.Search(len(f.segs), func(i int) bool { return f.segs[i].off+int64(len(f.segs[i].data)) > off })
	for ; i < len(f.segs) && f.segs[i].off < off+int64(n); i++ {
		s := f.segs[i]
		lo, hi := max(s.off, off), min(s.off+int64(len(s.data)), off+int64(n))
		copy(p[lo-off:hi-off], s.data[lo-s.off:hi-s.off])
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// hostileImage lays out a header for cluster_bits bits: reftable at
// cluster 1 (reftableClusters long) pointing at one refcount block right
// after it, then the L1 table of l1Size entries, then extra clusters.
// The refcount block gives every cluster of the file refcount 1 (16-bit
// refcounts), so only what the test breaks is wrong.
func hostileImage(bits uint32, vsize uint64, l1Size, reftableClusters uint32, extra int64) (*sparseFile, int64) {
	cs := int64(1) << bits
	be := binary.BigEndian
	rb := (1 + int64(reftableClusters)) * cs
	l1 := rb + cs
	l1Clusters := (int64(l1Size)*8 + cs - 1) / cs
	size := l1 + (l1Clusters+extra)*cs
	h := make([]byte, 112)
	copy(h, "QFI\xfb")
	be.PutUint32(h[4:], 3)
	be.PutUint32(h[20:], bits)
	be.PutUint64(h[24:], vsize)
	be.PutUint32(h[36:], l1Size)
	be.PutUint64(h[40:], uint64(l1))
	be.PutUint64(h[48:], uint64(cs))
	be.PutUint32(h[56:], reftableClusters)
	be.PutUint32(h[96:], 4)
	be.PutUint32(h[100:], 112)
	f := &sparseFile{size: size}
	f.write(0, h)
	f.put64(cs, uint64(rb))
	clusters := size / cs
	if clusters > cs/2 {
		panic("hostileImage: one refcount block does not cover the file")
	}
	refs := make([]byte, 2*clusters)
	for c := range clusters {
		be.PutUint16(refs[2*c:], 1)
	}
	f.write(rb, refs)
	return f, l1
}

// table returns n big-endian entries e(i).
func table(n int64, e func(i int64) uint64) []byte {
	b := make([]byte, 8*n)
	for i := range n {
		binary.BigEndian.PutUint64(b[8*i:], e(i))
	}
	return b
}

// manySnapshots is an image whose header claims n disk-only snapshots
// (no L1 table, 16 bytes of extra data) and whose table holds the first
// have of them: 56 bytes each, parsed 40 at a time.
func manySnapshots(n, have int) *sparseFile {
	const entry = 56
	f, _ := hostileImage(16, 1<<30, 2, 1, int64(have*entry)>>16+1)
	table := f.size - int64(have*entry)>>16<<16 - 1<<16
	be := binary.BigEndian
	h := make([]byte, 12)
	be.PutUint32(h[0:], uint32(n))
	be.PutUint64(h[4:], uint64(table))
	f.write(60, h)
	b := make([]byte, have*entry)
	for i := range have {
		be.PutUint32(b[i*entry+36:], 16) // extra_data_size
	}
	f.write(table, b)
	f.size = table + int64(len(b))
	return f
}

// decide runs the whole gate over f and returns its reason, the bytes it
// allocated and how long it took.
func decide(t *testing.T, f *sparseFile) (string, uint64, time.Duration) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, _, err := qcow2.Inspect(f, f.size, q.Limits)
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	var rej *qcow2.Reject
	if err != nil && !errors.As(err, &rej) {
		t.Fatalf("Inspect: %v", err)
	}
	return reason(err), after.TotalAlloc - before.TotalAlloc, took
}

// TestHostileSizes: headers that claim the most the header rules allow
// are decided in bounded memory (never proportional to l1_size, the
// reftable, the virtual size or the metadata volume) and with work
// proportional to the file: the bytes read are counted, not timed, so
// the bound holds on a loaded machine under -race (where the slowest case
// takes seconds, nearly all of it in sparseFile).
func TestHostileSizes(t *testing.T) {
	const (
		memBound = 3 << 20 // a 2 MiB cluster buffer, 64 KiB chunks, the cluster map
		// readFactor bounds the bytes read, as a multiple of the file's
		// size; the hungriest case, a full 32 MiB L1 table that maps
		// nothing, reads 1.8 times its file.
		readFactor = 2
		// hangBound only catches runaway CPU work that reads nothing
		// (a loop over claimed entries): far beyond any honest run.
		hangBound = time.Minute
		fullL1    = 4 << 20 // entries: the 32 MiB QEMU allows
	)
	cases := []struct {
		name  string
		build func() *sparseFile
		want  string
	}{
		{"4Mi-entry L1 past EOF", func() *sparseFile {
			f, _ := hostileImage(16, 512<<30, fullL1, 1, 0)
			f.size = 4 << 16 // the L1 table would start at 3 clusters: cut before it ends
			return f
		}, qcow2.ReasonCorrupt},
		{"4Mi-entry L1 inside, entries past EOF", func() *sparseFile {
			f, l1 := hostileImage(16, 512<<30, fullL1, 1, 0)
			f.write(l1, table(fullL1, func(i int64) uint64 { return 1<<63 | uint64(f.size+i<<16) }))
			return f
		}, qcow2.ReasonCorrupt},
		{"4Mi-entry L1 inside, all pointing at one L2 table", func() *sparseFile {
			f, l1 := hostileImage(16, 512<<30, fullL1, 1, 1)
			f.write(l1, table(fullL1, func(int64) uint64 { return 1<<63 | uint64(f.size-1<<16) }))
			return f
		}, qcow2.ReasonCorrupt},
		{"2 MiB clusters, full L1 scanned, last entry bad", func() *sparseFile {
			f, l1 := hostileImage(21, 512<<30, fullL1, 1, 0)
			f.put64(l1+8*(fullL1-1), 1<<63|1<<40)
			return f
		}, qcow2.ReasonCorrupt},
		{"2 MiB clusters, full empty L1", func() *sparseFile {
			f, _ := hostileImage(21, 512<<30, fullL1, 1, 0)
			return f
		}, ""},
		{"2 MiB clusters, 64 L2 tables in a 128 MiB sparse file", func() *sparseFile {
			f, l1 := hostileImage(21, 512<<30, 1024, 1, 64)
			f.write(l1, table(64, func(i int64) uint64 { return 1<<63 | uint64(l1+1<<21+i<<21) }))
			return f
		}, ""},
		{"refcount table at the 8 MiB bound, past EOF", func() *sparseFile {
			f, _ := hostileImage(16, 1<<30, 2, 128, 1)
			f.size = 4 << 16
			return f
		}, qcow2.ReasonCorrupt},
		{"refcount table at the 8 MiB bound, inside", func() *sparseFile {
			f, _ := hostileImage(16, 1<<30, 2, 128, 1)
			return f
		}, ""},
		{"refcount table at the bound, every other entry a block past EOF", func() *sparseFile {
			f, _ := hostileImage(16, 1<<30, 2, 128, 1)
			f.write(1<<16+8, table(128<<13-1, func(i int64) uint64 { return uint64(f.size + i<<16) }))
			return f
		}, qcow2.ReasonCorrupt},
		{"65536 snapshots", func() *sparseFile {
			return manySnapshots(65536, 65536)
		}, ""},
		{"65536 snapshots, table cut by EOF", func() *sparseFile {
			return manySnapshots(65536, 60000)
		}, qcow2.ReasonCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := c.build()
			got, alloc, took := decide(t, f)
			t.Logf("file %d bytes: %q after %v, %d bytes allocated, %d bytes read in %d reads", f.size, got, took, alloc, f.read, f.reads)
			if got != c.want {
				t.Errorf("verdict %q, want %q", got, c.want)
			}
			if alloc > memBound {
				t.Errorf("allocated %d bytes, bound %d", alloc, memBound)
			}
			if f.read > readFactor*f.size {
				t.Errorf("read %d bytes of a %d-byte file, bound %d×", f.read, f.size, readFactor)
			}
			if took > hangBound {
				t.Errorf("took %v, bound %v", took, hangBound)
			}
		})
	}
}
