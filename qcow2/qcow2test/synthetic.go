package qcow2test

import (
	"encoding/binary"

	"github.com/vmshelf/vmshelf/qcow2"
)

// Synthetic returns every header and structure mutation case, built in
// memory (no tools needed): each rule of the header gate and each
// structure rule has at least one case, plus several valid images. Every
// valid image is one `qemu-img check` calls clean; the gate's tests hold
// the whole list to that.
func Synthetic() []Case {
	var cs []Case
	cs = append(cs, headerCases()...)
	cs = append(cs, regionCases()...)
	cs = append(cs, tableCases()...)
	cs = append(cs, snapshotCases()...)
	cs = append(cs, refcountCases()...)
	cs = append(cs, validCases()...)
	return cs
}

const (
	c4k     = BaseClusterSize
	unknown = 0x12345678 // an extension type QEMU does not know
	copied  = 1 << 63
)

// headerCases cover the streaming header rules, on Base.
func headerCases() []Case {
	b := Base()
	m := func(fs ...func([]byte)) []byte { return Mutate(b, fs...) }
	wide := build(spec{bits: 16, size: 1 << 30}).b // 64 KiB clusters, 2 L1 entries
	limit := build(spec{bits: 16, size: 512 << 30}).b
	const (
		notQcow2  = qcow2.ReasonNotQcow2
		bad       = qcow2.ReasonBadHeader
		backing   = qcow2.ReasonBackingFile
		dataFile  = qcow2.ReasonExternalDataFile
		encrypted = qcow2.ReasonEncrypted
		tooLarge  = qcow2.ReasonVirtualSizeTooLarge
	)
	return []Case{
		{"header/magic", m(Put8(3, 0xfc)), notQcow2},
		{"header/magic raw zeros", make([]byte, 4096), notQcow2},
		{"header/version 1", m(Put32(4, 1)), notQcow2},
		{"header/version 4", m(Put32(4, 4)), notQcow2},
		{"header/backing offset", m(Put64(8, 0x200)), backing},
		{"header/backing name size", m(Put32(16, 9)), backing},
		{"header/cluster bits 8", m(Put32(20, 8)), bad},
		{"header/cluster bits 22", m(Put32(20, 22)), bad},
		{"header/cluster bits 63", m(Put32(20, 63)), bad},
		{"header/cluster bits huge", m(Put32(20, 0xffffffff)), bad},
		{"header/virtual size 0", m(Put64(24, 0)), bad},
		{"header/virtual size 2 TiB", m(Put64(24, 1<<41)), tooLarge},
		{"header/virtual size max uint64", m(Put64(24, ^uint64(0))), tooLarge},
		{"valid/virtual size at the limit", limit, ""},
		{"header/virtual size one byte over the limit", Mutate(limit, Put64(24, 512<<30+1)), tooLarge},
		{"header/crypt aes", m(Put32(32, 1)), encrypted},
		{"header/crypt luks", m(Put32(32, 2)), encrypted},
		{"header/l1 too small", m(Put32(36, 1)), bad},
		{"header/l1 zero", m(Put32(36, 0)), bad},
		{"header/l1 larger than 32 MiB", m(Put32(36, 4<<20+1)), bad},
		{"header/l1 huge", m(Put32(36, 0xffffffff)), bad},
		{"header/l1 unaligned", m(Put64(40, 3*c4k+512)), bad},
		{"header/reftable unaligned", m(Put64(48, c4k+8)), bad},
		{"header/reftable 0 clusters", m(Put32(56, 0)), bad},
		{"header/reftable over 8 MiB", m(Put32(56, 8<<20/c4k+1)), bad},
		{"header/reftable huge", m(Put32(56, 0xffffffff)), bad},
		{"header/too many snapshots", m(Put32(60, 65537)), bad},
		{"header/snapshots unaligned", m(Put64(64, 7)), bad},
		{"valid/dirty", m(Put64(72, qcow2.IncompatDirty)), ""},
		{"header/corrupt bit", m(Put64(72, qcow2.IncompatCorrupt)), qcow2.ReasonCorrupt},
		{"header/data file bit", m(Put64(72, qcow2.IncompatDataFile)), dataFile},
		{"header/unknown incompatible bit 5", m(Put64(72, 1<<5)), bad},
		{"header/unknown incompatible bit 63", m(Put64(72, 1<<63)), bad},
		{"header/extended L2 halves L1 reach", Mutate(wide, Put64(72, qcow2.IncompatExtendedL2)), bad},
		{"valid/extended L2 bit, L1 grown", Mutate(wide, Put64(72, qcow2.IncompatExtendedL2), Put32(36, 4)), ""},
		{"header/extended L2 small clusters", Mutate(wide, Put64(72, qcow2.IncompatExtendedL2), Put32(20, 13), Put32(36, 1<<16)), bad},
		{"valid/compatible bits", m(Put64(80, ^uint64(0))), ""},
		{"header/autoclear raw data file", m(Put64(88, qcow2.AutoclearDataFileRaw)), dataFile},
		{"valid/autoclear bitmaps", m(Put64(88, qcow2.AutoclearBitmaps)), ""},
		{"header/refcount order 7", m(Put32(96, 7)), bad},
		{"header/header length 100", m(Put32(100, 100)), bad},
		{"header/header length 106", m(Put32(100, 106)), bad},
		{"header/header length past cluster", m(Put32(100, c4k+8)), bad},
		{"valid/header length 104", m(Put32(100, 104)), ""},
		{"header/header length 104 with compression bit", m(Put32(100, 104), Put64(72, qcow2.IncompatCompression)), bad},
		{"valid/header length fills the cluster", m(Put32(100, c4k)), ""},
		{"valid/header length long, tail skipped", m(Put32(100, 1024), Put64(200, ^uint64(0))), ""},
		{"valid/zstd header", m(Put8(104, qcow2.CompressionZstd), Put64(72, qcow2.IncompatCompression)), ""},
		{"header/zstd without bit", m(Put8(104, qcow2.CompressionZstd)), bad},
		{"header/compression bit with zlib", m(Put64(72, qcow2.IncompatCompression)), bad},
		{"header/unknown compression", m(Put8(104, 2), Put64(72, qcow2.IncompatCompression)), bad},
		{"header/ext backing format", m(Exts(Ext{ExtBackingFormat, []byte("qcow2")}, End)), backing},
		{"header/ext data file without bit", m(Exts(Ext{unknown, []byte("x")}, Ext{ExtDataFile, []byte("/etc/shadow")}, End)), dataFile},
		{"header/ext luks without crypt", m(Exts(Ext{ExtLUKS, make([]byte, 16)}, End)), encrypted},
		{"valid/ext unknown ignored", m(Exts(Ext{unknown, []byte("hello")}, Ext{unknown + 1, make([]byte, 3000)}, End)), ""},
		{"valid/ext empty unknown", m(Exts(Ext{unknown, nil}, Ext{unknown, nil}, End)), ""},
		{"valid/ext end marker with length", m(Exts(Ext{0, []byte("ignored")})), ""},
		{"header/ext overruns cluster", m(Exts(Ext{unknown, make([]byte, c4k-112-8+1)})), bad},
		{"header/ext length huge", m(Put32(112, unknown), Put32(116, 0xffffffff)), bad},
		{"valid/ext list fills cluster exactly", m(Exts(Ext{unknown, make([]byte, c4k-112-8)})), ""},
		{"header/ext after long header", m(Put32(100, 1024), Put32(1024, ExtDataFile)), dataFile},
		// Bytes 72+ are extensions in v2: the "feature word" here starts
		// with type 0 (end), so it is simply the end of the list.
		{"valid/v2 header", m(Put32(4, 2), Put64(72, qcow2.IncompatCorrupt)), ""},
		{"header/v2 backing format ext", m(Put32(4, 2), Put32(72, ExtBackingFormat), Put32(76, 5)), backing},
		{"header/v2 l1 too small", m(Put32(4, 2), Put32(36, 1)), bad},
		// Truncated streams.
		{"header/empty", nil, notQcow2},
		{"header/3 bytes", b[:3], notQcow2},
		{"header/7 bytes", b[:7], notQcow2},
		{"header/8 bytes", b[:8], bad},
		{"header/50 bytes", b[:50], bad},
		{"header/inside ext header", b[:116], bad},
		{"header/inside ext data", m(Exts(Ext{unknown, make([]byte, 64)}))[:150], bad},
	}
}

// rich is an image with something of every kind: standard clusters, a
// preallocated and a plain zero cluster, two deflate extents sharing a
// host cluster, and a second L2 table. Its spec clusters, by index:
const (
	richData0 = iota // guest 0
	richData5        // guest 5
	richZeroAlloc
	richZeroPlain
	richDeflate9
	richDeflate10
	richData600 // guest 600: L1 entry 1
)

func richSpec() spec {
	return spec{clusters: []guest{
		{idx: 0, kind: clData, fill: 0xab},
		{idx: 5, kind: clData, fill: 0xcd},
		{idx: 7, kind: clZeroAlloc},
		{idx: 8, kind: clZeroPlain},
		{idx: 9, kind: clDeflate, fill: 0x11},
		{idx: 10, kind: clDeflate, fill: 0x22},
		{idx: 600, kind: clData, fill: 0xef},
	}}
}

// with returns a copy of L's image changed by each f.
func (L *layout) with(fs ...func(L *layout, b []byte)) []byte {
	b := append([]byte(nil), L.b...)
	for _, f := range fs {
		f(L, b)
	}
	return b
}

// grown returns L's image with n zero bytes appended, changed by each f.
func (L *layout) grown(n int, fs ...func(L *layout, b []byte)) []byte {
	b := append(append([]byte(nil), L.b...), make([]byte, n)...)
	for _, f := range fs {
		f(L, b)
	}
	return b
}

var be = binary.BigEndian

func setL1(i int, v uint64) func(*layout, []byte) {
	return func(L *layout, b []byte) { be.PutUint64(b[L.l1+8*i:], v) }
}

func l1Of(L *layout, i int) uint64 { return be.Uint64(L.b[L.l1+8*i:]) }

// setL2 sets the L2 entry of spec cluster i; orL2 sets bits in it.
func setL2(i int, v uint64) func(*layout, []byte) {
	return func(L *layout, b []byte) { be.PutUint64(b[L.l2e[i]:], v) }
}

func orL2(i int, v uint64) func(*layout, []byte) {
	return func(L *layout, b []byte) { be.PutUint64(b[L.l2e[i]:], be.Uint64(b[L.l2e[i]:])|v) }
}

func l2Of(L *layout, i int) uint64 { return be.Uint64(L.b[L.l2e[i]:]) }

// setBitmap sets the extended L2 bitmap of spec cluster i.
func setBitmap(i int, v uint64) func(*layout, []byte) {
	return func(L *layout, b []byte) { be.PutUint64(b[L.l2e[i]+8:], v) }
}

func setRT(i int, v uint64) func(*layout, []byte) {
	return func(L *layout, b []byte) { be.PutUint64(b[L.rt+8*i:], v) }
}

// setRef sets the (16-bit) refcount of the cluster at byte offset off.
func setRef(off int, n uint16) func(*layout, []byte) {
	return func(L *layout, b []byte) { be.PutUint16(b[L.rb+2*(off/L.cs):], n) }
}

func put64(off int, v uint64) func(*layout, []byte) {
	return func(_ *layout, b []byte) { be.PutUint64(b[off:], v) }
}

func put32(off int, v uint32) func(*layout, []byte) {
	return func(_ *layout, b []byte) { be.PutUint32(b[off:], v) }
}

// regionCases: the tables the header points to must lie inside the file,
// aligned, each in clusters of its own.
func regionCases() []Case {
	B := build(spec{})
	corrupt := qcow2.ReasonCorrupt
	return []Case{
		{"structure/truncated before L1", B.b[:3*c4k], corrupt},
		{"structure/L1 partly outside", B.b[:3*c4k+8], corrupt},
		{"structure/L1 over header", B.with(put64(40, 0)), corrupt},
		{"structure/L1 over reftable", B.with(put64(40, c4k)), corrupt},
		{"structure/L1 over refblock", B.with(put64(40, 2*c4k)), corrupt},
		{"structure/L1 beyond file", B.with(put64(40, 1<<62)), corrupt},
		{"structure/L1 of 4Mi entries past EOF", B.with(put32(36, 4<<20)), corrupt},
		{"structure/reftable over header", B.with(put64(48, 0)), corrupt},
		{"structure/reftable beyond file", B.with(put64(48, 1<<63)), corrupt},
		{"structure/reftable over L1", B.with(put64(48, 2*c4k), put32(56, 2)), corrupt},
		{"structure/reftable of 8 MiB past EOF", B.with(put32(56, 8<<20/c4k)), corrupt},
		{"structure/refblock beyond file", B.with(setRT(1, 100*c4k)), corrupt},
		{"structure/refblock unaligned", B.with(setRT(0, 2*c4k+512)), corrupt},
		{"structure/refblock reserved bit", B.with(setRT(0, 2*c4k|1)), corrupt},
		{"structure/refblock over L1", B.with(setRT(1, 3*c4k)), corrupt},
		{"structure/refblock over reftable", B.with(setRT(1, c4k)), corrupt},
		{"structure/refblock twice", B.with(setRT(1, 2*c4k)), corrupt},
		// Metadata clusters are written whole: one cut by the end of the
		// file is a truncated upload.
		{"structure/refblock cut by EOF", B.grown(100, setRT(1, 4*c4k)), corrupt},
		{"valid/L1 ends the file", B.b[:3*c4k+8*B.l1Size], ""},
	}
}

// tableCases: L1 and L2 entries of the active layer.
func tableCases() []Case {
	R := build(richSpec())
	V2 := build(spec{version: 2, clusters: []guest{{idx: 0, kind: clData, fill: 1}}})
	E := build(extSpec())
	// One data cluster, the last cluster of the file: the file ends
	// cluster-aligned, so its end is a place a data cluster could name.
	D := build(spec{clusters: []guest{{idx: 0, kind: clData, fill: 1}}})
	corrupt := qcow2.ReasonCorrupt
	l1 := l1Of(R, 0)
	data0 := uint64(R.host[richData0])
	comp := uint64(R.host[richDeflate9])
	// The second deflate extent ends the file; 2 more sectors run past it.
	x := uint(62 - (12 - 8))
	pastEOF := l2Of(R, richDeflate10) + 2<<x
	return []Case{
		{"structure/L2 beyond file", R.with(setL1(3, copied|1000*c4k)), corrupt},
		{"structure/L2 unaligned", R.with(setL1(0, l1+512)), corrupt},
		{"structure/L1 entry reserved bit 0", R.with(setL1(0, l1|1)), corrupt},
		{"structure/L1 entry reserved bit 56", R.with(setL1(0, l1|1<<56)), corrupt},
		{"structure/L1 entry flags without table", R.with(setL1(2, copied)), corrupt},
		{"structure/L2 over refblock", R.with(setL1(0, copied|2*c4k)), corrupt},
		{"structure/L2 used twice", R.with(setL1(1, l1)), corrupt},
		{"structure/L2 over a data cluster", R.with(setL1(0, copied|data0)), corrupt},
		{"structure/L2 cut by EOF", build(spec{}).grown(100, setL1(0, copied|4*c4k)), corrupt},
		{"structure/L2 entry reserved bit 1", R.with(orL2(richData0, 2)), corrupt},
		{"structure/L2 entry reserved bit 56", R.with(orL2(richData0, 1<<56)), corrupt},
		{"structure/data cluster unaligned", R.with(setL2(richData0, copied|(data0+512))), corrupt},
		{"structure/data cluster outside file", R.with(setL2(richData0, copied|1000*c4k)), corrupt},
		// Exactly at the end: the first offset outside the file.
		{"structure/data cluster at the end of the file", D.with(setL2(0, copied|uint64(len(D.b)))), corrupt},
		{"structure/data cluster over L1", R.with(setL2(richData0, copied|3*c4k)), corrupt},
		{"structure/data cluster over reftable", R.with(setL2(richData0, copied|c4k)), corrupt},
		{"structure/data cluster over its L2 table", R.with(setL2(richData0, copied|uint64(R.l2[0]))), corrupt},
		{"structure/data cluster mapped twice", R.with(setL2(richData5, l2Of(R, richData0))), corrupt},
		{"structure/data cluster over compressed data", R.with(setL2(richData0, copied|comp&^(c4k-1))), corrupt},
		{"structure/preallocated zero cluster outside file", R.with(setL2(richZeroAlloc, copied|1000*c4k|1)), corrupt},
		{"structure/zero flag in v2", V2.with(orL2(0, 1)), corrupt},
		{"structure/zero flag with extended L2", E.with(orL2(extData, 1)), corrupt},
		{"structure/compressed with COPIED", R.with(orL2(richDeflate9, copied)), corrupt},
		{"structure/compressed outside file", R.with(setL2(richDeflate9, 1<<62|uint64(len(R.b)+c4k))), corrupt},
		{"structure/compressed runs past EOF", R.with(setL2(richDeflate10, pastEOF)), corrupt},
		{"structure/compressed at offset 0", R.with(setL2(richDeflate9, 1<<62)), corrupt},
		{"structure/compressed over L1", R.with(setL2(richDeflate9, 1<<62|(3*c4k+100))), corrupt},
		{"structure/compressed over a data cluster", R.with(setL2(richDeflate9, 1<<62|(data0+10))), corrupt},
		{"structure/compressed with subcluster bitmap", E.with(setBitmap(extDeflate, 1)), corrupt},
		{"structure/subclusters allocated and zero", E.with(setBitmap(extData, 0x3<<32|0x1)), corrupt},
		{"structure/subclusters allocated without cluster", E.with(setBitmap(extZeroPlain, 0x1)), corrupt},
	}
}

// extSpec is an image with extended L2 entries (16 KiB clusters, the
// smallest QEMU allows): partly allocated, partly zero clusters.
const (
	extData = iota
	extZeroAlloc
	extZeroPlain
	extDeflate
	extDataFull
)

func extSpec() spec {
	return spec{bits: 14, extL2: true, clusters: []guest{
		{idx: 0, kind: clData, fill: 0x5a, alloc: 0x0000ff0f},
		{idx: 3, kind: clZeroAlloc, zero: 0xffff0000},
		{idx: 4, kind: clZeroPlain, zero: 0x0f0f0f0f},
		{idx: 6, kind: clDeflate, fill: 0x77},
		{idx: 2000, kind: clData, fill: 0x99},
	}}
}

// snapshotCases: the snapshot table and the snapshots' L1 tables.
func snapshotCases() []Case {
	sp := richSpec()
	sp.snapshot = true
	S := build(sp)
	B := build(spec{})
	corrupt := qcow2.ReasonCorrupt
	t := S.snapTable
	return []Case{
		{"valid/snapshot", S.b, ""},
		{"structure/snapshot table outside file", B.with(put32(60, 1), put64(64, 100*c4k)), corrupt},
		{"structure/snapshot table over header", B.with(put32(60, 1), put64(64, 0)), corrupt},
		{"structure/snapshot table over L1", S.with(put64(64, uint64(S.l1))), corrupt},
		// QEMU keeps up to 1024 bytes of extra data it does not know: the
		// entry at that limit, its id and name moved behind the extra.
		{"valid/snapshot extra data at QEMU's limit", S.with(put32(t+36, 1024), func(_ *layout, b []byte) {
			copy(b[t+56:t+61], make([]byte, 5))
			copy(b[t+40+1024:], "1snap")
		}), ""},
		{"structure/snapshot extra data too large", S.with(put32(t+36, 1025)), corrupt},
		{"structure/snapshot extra data too short", S.with(put32(t+36, 8)), corrupt},
		{"structure/snapshot name past EOF", S.with(func(_ *layout, b []byte) { be.PutUint16(b[t+14:], 0xffff) }), corrupt},
		{"structure/snapshot count beyond the table", S.with(put32(60, 2)), corrupt},
		{"structure/snapshot L1 unaligned", S.with(put64(t, uint64(S.snapL1+512))), corrupt},
		{"structure/snapshot L1 too large", S.with(put32(t+8, 4<<20+1)), corrupt},
		{"structure/snapshot L1 outside file", S.with(put64(t, 1000*c4k)), corrupt},
		{"structure/snapshot L1 over active L1", S.with(put64(t, uint64(S.l1))), corrupt},
		{"structure/snapshot L1 entry reserved bit", S.with(put64(S.snapL1, l1Of(S, 0)|1<<56)), corrupt},
		{"structure/snapshot L1 entry on a data cluster", S.with(put64(S.snapL1, uint64(S.host[richData0]))), corrupt},
		{"structure/snapshot L1 entry outside file", S.with(put64(S.snapL1, 1000*c4k)), corrupt},
		{"structure/snapshot table offset beyond int64", B.with(put64(64, 1<<63)), corrupt},
		{"valid/snapshot table offset ignored when none", B.with(put64(64, 1<<40)), ""},
	}
}

// refcountCases: every cluster in use has a refcount, COPIED means 1.
func refcountCases() []Case {
	R := build(richSpec())
	dirty := richSpec()
	dirty.dirty = true
	D := build(dirty)
	corrupt := qcow2.ReasonCorrupt
	return []Case{
		{"structure/refcount 0 for the header", R.with(setRef(0, 0)), corrupt},
		{"structure/refcount 0 for the L1 table", R.with(setRef(R.l1, 0)), corrupt},
		{"structure/refcount 0 for the refcount block", R.with(setRef(R.rb, 0)), corrupt},
		{"structure/refcount 0 for an L2 table", R.with(setRef(R.l2[1], 0)), corrupt},
		{"structure/refcount 0 for a data cluster", R.with(setRef(R.host[richData600], 0)), corrupt},
		{"structure/refcount 0 for a preallocated zero cluster", R.with(setRef(R.host[richZeroAlloc], 0)), corrupt},
		{"structure/refcount 0 for compressed data", R.with(setRef(R.host[richDeflate9], 0)), corrupt},
		{"structure/no refcount block", R.with(setRT(0, 0)), corrupt},
		{"structure/COPIED data cluster with refcount 2", R.with(setRef(R.host[richData0], 2)), corrupt},
		{"structure/COPIED L2 table with refcount 2", R.with(setRef(R.l2[0], 2)), corrupt},
		// Dirty images are not exempt: `qemu-img check -r all` repairs
		// them before upload, and what we accept it must call clean.
		{"structure/dirty with a stale refcount", D.with(setRef(D.host[richData0], 0)), corrupt},
	}
}

// validCases are images QEMU writes, built here.
func validCases() []Case {
	cases := []Case{
		{"valid/base", Base(), ""},
		{"valid/rich", build(richSpec()).b, ""},
		{"valid/v2", build(spec{version: 2, bits: 9, size: 1 << 20, clusters: []guest{
			{idx: 0, kind: clData, fill: 1}, {idx: 3, kind: clDeflate, fill: 2}, {idx: 900, kind: clData, fill: 3},
		}}).b, ""},
		{"valid/zstd", build(spec{zstd: true, clusters: []guest{
			{idx: 1, kind: clZstd, fill: 0x31}, {idx: 2, kind: clZstd, fill: 0x32}, {idx: 3, kind: clData, fill: 0x33},
		}}).b, ""},
		{"valid/extended L2", build(extSpec()).b, ""},
		{"valid/512-byte clusters", build(spec{bits: 9, size: 1 << 20, clusters: []guest{
			{idx: 0, kind: clData, fill: 1}, {idx: 100, kind: clData, fill: 2}, {idx: 200, kind: clDeflate, fill: 3}, {idx: 2047, kind: clData, fill: 4},
		}}).b, ""},
		{"valid/dirty rich", build(spec{dirty: true, clusters: richSpec().clusters}).b, ""},
	}
	for order := -1; order <= 6; order++ {
		if order == 0 || order == 4 {
			continue // -1 is order 0; 4 is every other image
		}
		n := order
		if n < 0 {
			n = 0
		}
		cases = append(cases, Case{"valid/refcount order " + string(rune('0'+n)), build(spec{refOrder: order, bits: 9, size: 1 << 20, clusters: []guest{
			{idx: 0, kind: clData, fill: 1}, {idx: 5, kind: clZeroAlloc}, {idx: 1000, kind: clData, fill: 2},
		}}).b, ""})
	}
	// Compact images of every kind, small enough for fuzz seeds.
	smallSnap := richSpec()
	smallSnap.bits, smallSnap.size, smallSnap.snapshot = 9, 1<<20, true
	smallSnap.clusters[richData600].idx = 1000
	cases = append(cases,
		Case{"valid/small snapshot", build(smallSnap).b, ""},
		Case{"valid/small extended L2", build(spec{bits: 14, size: 1 << 20, extL2: true, clusters: []guest{
			{idx: 0, kind: clData, fill: 0x5a, alloc: 0x0000000f}, {idx: 2, kind: clZeroPlain, zero: 0xff00}, {idx: 3, kind: clDeflate, fill: 0x77},
		}}).b, ""},
		Case{"valid/small zstd", build(spec{bits: 9, size: 1 << 20, zstd: true, clusters: []guest{
			{idx: 0, kind: clZstd, fill: 0x31}, {idx: 1, kind: clZstd, fill: 0x32}, {idx: 70, kind: clData, fill: 0x33}, {idx: 71, kind: clZeroPlain},
		}}).b, ""},
	)
	// qemu-img leaves files ending inside their last data cluster; QEMU
	// reads the rest as zeros.
	tail := build(spec{clusters: []guest{{idx: 0, kind: clData, fill: 1}, {idx: 1, kind: clData, fill: 2}}})
	cases = append(cases, Case{"valid/data cluster cut by EOF", tail.b[:tail.host[1]+100], ""})
	return cases
}
