package qcow2

import "encoding/binary"

// checkRefcounts reads the refcount blocks covering the file, each once,
// and checks the refcount of every cluster the walk claimed: nonzero, or
// QEMU writing to the image would allocate the cluster again over live
// data or metadata; exactly 1 where the entry carries COPIED, or QEMU
// would write in place into a cluster a snapshot shares.
//
// Not checked: leaks (refcounts nothing we walked explains: snapshot-only
// clusters, persistent bitmaps, or clusters a crash left allocated, all
// harmless), and a refcount of 1 without COPIED, which only makes QEMU
// copy before writing and which images of old QEMU versions carry.
//
// The dirty bit (lazy refcounts after a crash) allows stale refcounts,
// which QEMU rebuilds at the first read-write open; they are checked all
// the same. What we accept `qemu-img check` must call clean, and the
// uploader can run `qemu-img check -r all` first.
func (w *walker) checkRefcounts() error {
	// A block holds cs*8 >> order entries: at least 2^9*8/64 = 64.
	perBlock := w.cs * 8 >> w.h.RefcountOrder
	blocks := (w.m.n + perBlock - 1) / perBlock // the blocks covering the file
	covered := uint64(0)
	err := w.scanTable(w.rtable, blocks, func(i, e uint64) error {
		covered = i + 1
		first, last := i*perBlock, min((i+1)*perBlock, w.m.n)
		if e == 0 {
			return w.noneInUse(first, last)
		}
		if err := w.readCluster("refcount block", e); err != nil { // checked by markRefcountBlocks
			return err
		}
		for c := first; c < last; c++ {
			k := w.m.get(c)
			if k == kindFree {
				continue
			}
			rc := refcountAt(w.buf, c-first, w.h.RefcountOrder)
			switch {
			case rc == 0:
				return reject(ReasonCorrupt, "cluster %d (%v) is in use but its refcount is 0", c, k&kindMask)
			case k&copiedBit != 0 && rc != 1:
				return reject(ReasonCorrupt, "cluster %d (%v) is flagged COPIED but its refcount is %d", c, k&kindMask, rc)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Clusters past the refcount table's reach have refcount 0.
	return w.noneInUse(covered*perBlock, w.m.n)
}

// noneInUse checks that clusters [first, last) are free: their refcount
// is 0 (no refcount block, or beyond the refcount table).
func (w *walker) noneInUse(first, last uint64) error {
	for c := first; c < last; c++ {
		if k := w.m.get(c); k != kindFree {
			return reject(ReasonCorrupt, "cluster %d (%v) is in use but has no refcount block", c, k&kindMask)
		}
	}
	return nil
}

// refcountAt returns entry i of a refcount block of 1<<order-bit entries.
// Entries narrower than a byte fill it from the least significant bit,
// as QEMU stores them.
func refcountAt(block []byte, i uint64, order uint32) uint64 {
	be := binary.BigEndian
	switch order {
	case 4:
		return uint64(be.Uint16(block[2*i:]))
	case 5:
		return uint64(be.Uint32(block[4*i:]))
	case 6:
		return be.Uint64(block[8*i:])
	}
	width := uint64(1) << order // 1, 2, 4 or 8 bits
	bit := i * width
	return uint64(block[bit/8]>>(bit%8)) & (1<<width - 1)
}
