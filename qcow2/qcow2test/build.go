package qcow2test

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"fmt"
)

// Guest cluster kinds the builder maps.
type clKind int

const (
	clData      clKind = iota // a standard cluster of fill bytes
	clZeroPlain               // reads as zeros, no host cluster
	clZeroAlloc               // reads as zeros, preallocated host cluster (holding garbage)
	clDeflate                 // a compressed cluster of fill bytes, deflate
	clZstd                    // a compressed cluster of fill bytes, zstd
)

// guest is one guest cluster the builder maps. With extended L2 entries,
// alloc and zero are the subcluster bitmaps of a clData or clZeroAlloc
// cluster (alloc 0 means all allocated) or of a clZeroPlain one (zero 0
// means all zero).
type guest struct {
	idx         uint64 // guest cluster number
	kind        clKind
	fill        byte
	alloc, zero uint32
}

// spec describes an image for build; zero values are the defaults.
type spec struct {
	version  uint32 // 3
	bits     uint32 // cluster_bits: 12 (4 KiB clusters keep the corpus small)
	size     uint64 // virtual size: 64 MiB
	refOrder int    // refcount_order: 4 (set -1 for 0)
	extL2    bool
	zstd     bool // compression type zstd (the header's; clZstd clusters need it)
	dirty    bool
	snapshot bool // one internal snapshot sharing everything mapped
	clusters []guest
}

// layout is a built image and where its parts are, for mutations.
type layout struct {
	b          []byte
	cs         int
	entry      int // L2 entry size
	l1, rt, rb int
	l1Size     int
	l2         map[uint64]int // L1 index -> L2 table offset
	host       []int          // per spec cluster: host offset (compressed: byte offset), 0 for none
	l2e        []int          // per spec cluster: file offset of its L2 entry
	snapTable  int
	snapL1     int
}

const garbage = 0xee // what unreadable bytes of a cluster hold

// build lays an image out as qemu-img would: header, refcount table,
// refcount block, L1 table, then L2 tables, data clusters, compressed data
// packed byte by byte, and the snapshot's L1 and table; refcounts and
// COPIED flags are exact, so `qemu-img check` calls it clean. It panics
// on a spec it cannot lay out: the corpus is fixed, a panic is a bug in it.
func build(s spec) *layout {
	if s.version == 0 {
		s.version = 3
	}
	if s.bits == 0 {
		s.bits = 12
	}
	if s.size == 0 {
		s.size = 64 << 20
	}
	switch s.refOrder {
	case 0:
		s.refOrder = 4
	case -1:
		s.refOrder = 0
	}
	cs := 1 << s.bits
	L := &layout{cs: cs, entry: 8, l2: map[uint64]int{}, rt: cs, rb: 2 * cs, l1: 3 * cs}
	if s.extL2 {
		L.entry = 16
	}
	l2N := uint64(cs / L.entry)
	perL1 := uint64(cs) * l2N
	L.l1Size = int((s.size + perL1 - 1) / perL1)
	l1Clusters := (L.l1Size*8 + cs - 1) / cs

	ref := map[int]int{0: 1, 1: 1, 2: 1} // refcount by cluster number
	next := 3
	for range l1Clusters {
		ref[next]++
		next++
	}
	l2Order := []uint64{}
	for _, g := range s.clusters {
		if li := g.idx / l2N; L.l2[li] == 0 {
			L.l2[li] = next * cs
			l2Order = append(l2Order, li)
			ref[next]++
			next++
		}
	}
	L.host = make([]int, len(s.clusters))
	L.l2e = make([]int, len(s.clusters))
	for i, g := range s.clusters {
		if g.kind == clData || g.kind == clZeroAlloc {
			L.host[i] = next * cs
			ref[next]++
			next++
		}
	}
	payload := make([][]byte, len(s.clusters))
	pos := next * cs
	for i, g := range s.clusters {
		if g.kind != clDeflate && g.kind != clZstd {
			continue
		}
		payload[i] = compress(g.kind, g.fill, cs)
		L.host[i] = pos
		for c := pos / cs; c <= (pos+len(payload[i])-1)/cs; c++ {
			ref[c]++
		}
		pos += len(payload[i])
	}
	end := next * cs
	if pos > next*cs {
		next = (pos + cs - 1) / cs
		end = (pos + 511) &^ 511 // qemu-img leaves compressed images sector-aligned
	}
	if s.snapshot {
		L.snapL1 = next * cs
		for range l1Clusters {
			ref[next]++
			next++
		}
		L.snapTable = next * cs
		ref[next]++
		next++
		end = next * cs
		// The snapshot shares every L2 table, data cluster and extent.
		for _, li := range l2Order {
			ref[L.l2[li]/cs]++
		}
		for i, g := range s.clusters {
			switch g.kind {
			case clData, clZeroAlloc:
				ref[L.host[i]/cs]++
			case clDeflate, clZstd:
				for c := L.host[i] / cs; c <= (L.host[i]+len(payload[i])-1)/cs; c++ {
					ref[c]++
				}
			}
		}
	}

	b := make([]byte, end)
	L.b = b
	be := binary.BigEndian
	L.header(s)
	be.PutUint64(b[L.rt:], uint64(L.rb))
	copied := func(off int) uint64 {
		if ref[off/cs] == 1 {
			return 1 << 63
		}
		return 0
	}
	for _, li := range l2Order {
		be.PutUint64(b[L.l1+8*int(li):], uint64(L.l2[li])|copied(L.l2[li]))
	}
	for i, g := range s.clusters {
		e := L.l2[g.idx/l2N] + int(g.idx%l2N)*L.entry
		L.l2e[i] = e
		var ent, bitmap uint64
		alloc, zero := g.alloc, g.zero
		if alloc == 0 {
			alloc = ^uint32(0)
		}
		if zero == 0 {
			zero = ^uint32(0)
		}
		switch g.kind {
		case clData:
			ent = uint64(L.host[i]) | copied(L.host[i])
			fill(b[L.host[i]:L.host[i]+cs], g.fill)
			if s.extL2 {
				bitmap = uint64(alloc)
				sub := cs / 32
				for k := range 32 {
					if alloc&(1<<k) == 0 {
						fill(b[L.host[i]+k*sub:L.host[i]+(k+1)*sub], garbage)
					}
				}
			}
		case clZeroAlloc:
			ent = uint64(L.host[i]) | copied(L.host[i]) | 1
			if s.extL2 {
				ent, bitmap = ent&^1, uint64(zero)<<32
			}
			fill(b[L.host[i]:L.host[i]+cs], garbage)
		case clZeroPlain:
			ent = 1
			if s.extL2 {
				ent, bitmap = 0, uint64(zero)<<32
			}
		case clDeflate, clZstd:
			x := 62 - (s.bits - 8)
			first, last := L.host[i]>>9, (L.host[i]+len(payload[i])-1)>>9
			ent = 1<<62 | uint64(last-first)<<x | uint64(L.host[i])
			copy(b[L.host[i]:], payload[i])
		}
		be.PutUint64(b[e:], ent)
		if s.extL2 {
			be.PutUint64(b[e+8:], bitmap)
		}
	}
	if s.snapshot {
		// The snapshot's L1 is the active one; with refcount 2 nothing
		// is COPIED.
		for _, li := range l2Order {
			be.PutUint64(b[L.snapL1+8*int(li):], uint64(L.l2[li]))
		}
		t := b[L.snapTable:]
		be.PutUint64(t[0:], uint64(L.snapL1))
		be.PutUint32(t[8:], uint32(L.l1Size))
		be.PutUint16(t[12:], 1) // id "1"
		be.PutUint16(t[14:], 4) // name "snap"
		be.PutUint32(t[36:], 16)
		be.PutUint64(t[48:], s.size) // extra: vm_state_size_large 0, disk_size
		copy(t[56:], "1snap")
	}
	perBlock := cs * 8 >> s.refOrder
	for c, n := range ref {
		if c >= perBlock || n >= 1<<(1<<s.refOrder) && s.refOrder < 6 {
			panic(fmt.Sprintf("qcow2test: cluster %d with refcount %d does not fit one refcount block of order %d", c, n, s.refOrder))
		}
		putRefcount(b[L.rb:L.rb+cs], c, uint64(n), s.refOrder)
	}
	return L
}

// header writes the image header for s.
func (L *layout) header(s spec) {
	b, be := L.b, binary.BigEndian
	copy(b, "QFI\xfb")
	be.PutUint32(b[4:], s.version)
	be.PutUint32(b[20:], s.bits)
	be.PutUint64(b[24:], s.size)
	be.PutUint32(b[36:], uint32(L.l1Size))
	be.PutUint64(b[40:], uint64(L.l1))
	be.PutUint64(b[48:], uint64(L.rt))
	be.PutUint32(b[56:], 1)
	if s.snapshot {
		be.PutUint32(b[60:], 1)
		be.PutUint64(b[64:], uint64(L.snapTable))
	}
	if s.version == 2 {
		return
	}
	var incompat uint64
	if s.dirty {
		incompat |= 1
	}
	if s.zstd {
		incompat |= 1 << 3
		b[104] = 1
	}
	if s.extL2 {
		incompat |= 1 << 4
	}
	be.PutUint64(b[72:], incompat)
	be.PutUint32(b[96:], uint32(s.refOrder))
	be.PutUint32(b[100:], 112)
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// putRefcount stores refcount n of cluster c in a refcount block, as QEMU
// does: entries narrower than a byte from its least significant bit.
func putRefcount(block []byte, c int, n uint64, order int) {
	be := binary.BigEndian
	switch order {
	case 4:
		be.PutUint16(block[2*c:], uint16(n))
	case 5:
		be.PutUint32(block[4*c:], uint32(n))
	case 6:
		be.PutUint64(block[8*c:], n)
	default:
		width := 1 << order
		bit := c * width
		block[bit/8] |= byte(n) << (bit % 8)
	}
}

// compress returns a cluster of cs fill bytes compressed as QEMU reads
// it: raw deflate (no zlib header) or a zstd frame.
func compress(k clKind, v byte, cs int) []byte {
	if k == clZstd {
		return zstdRLE(v, cs)
	}
	var buf bytes.Buffer
	w, err := flate.NewWriter(&buf, flate.BestCompression)
	if err != nil {
		panic(err)
	}
	w.Write(bytes.Repeat([]byte{v}, cs)) //nolint:errcheck // a bytes.Buffer does not fail
	if err := w.Close(); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// zstdRLE returns a zstd frame (RFC 8878) of n bytes v: a single-segment
// frame header with a 2-byte content size, then one RLE block. Written by
// hand so the corpus needs no zstd encoder.
func zstdRLE(v byte, n int) []byte {
	if n < 256 || n > 128<<10 {
		panic("zstdRLE: size out of range")
	}
	f := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x60} // magic; FCS 2 bytes, single segment
	f = binary.LittleEndian.AppendUint16(f, uint16(n-256))
	h := uint32(1 | 1<<1 | n<<3) // last block, RLE, regenerated size n
	return append(f, byte(h), byte(h>>8), byte(h>>16), v)
}
