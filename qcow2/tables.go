package qcow2

import "encoding/binary"

// markRefcountBlocks claims every refcount block the refcount table
// points to. A block must lie wholly inside the file: QEMU writes
// metadata clusters whole, so a block cut short by the end of the file is
// a truncated upload.
func (w *walker) markRefcountBlocks() error {
	return w.scanTable(w.rtable, noLimit, func(i, e uint64) error {
		if e == 0 {
			return nil
		}
		if e&reftableReserved != 0 {
			return reject(ReasonCorrupt, "refcount table entry %d has reserved bits set (%#x)", i, e)
		}
		return w.mark(region{"refcount block", e, w.cs, -1}, kindMeta)
	})
}

// l1Entry checks entry i of the L1 table (the active one or a
// snapshot's) and returns the L2 table offset, 0 for none.
func (w *walker) l1Entry(table region, i, e uint64) (uint64, error) {
	if e == 0 {
		return 0, nil
	}
	off := e & l2OffsetMask
	switch {
	case e&l1ReservedMask != 0:
		return 0, reject(ReasonCorrupt, "%v entry %d has reserved bits set (%#x)", table, i, e)
	case off == 0:
		// QEMU reads this as unallocated but `qemu-img check` follows
		// it to the header cluster.
		return 0, reject(ReasonCorrupt, "%v entry %d has flags but no L2 table (%#x)", table, i, e)
	case off%w.cs != 0:
		return 0, reject(ReasonCorrupt, "%v entry %d: L2 table offset %d is not cluster-aligned", table, i, off)
	case !w.inside(off, w.cs):
		// L2 tables are written whole, as refcount blocks are.
		return 0, reject(ReasonCorrupt, "%v entry %d: L2 table at %d lies outside the file of %d bytes", table, i, off, w.fsize)
	}
	return off, nil
}

// markL2Tables claims the L2 tables of the active L1 table, each once.
func (w *walker) markL2Tables() error {
	return w.scanTable(w.l1, noLimit, func(i, e uint64) error {
		off, err := w.l1Entry(w.l1, i, e)
		if err != nil || off == 0 {
			return err
		}
		k := kindL2
		if e&oflagCopied != 0 {
			k |= copiedBit
		}
		if prev := w.m.get(off / w.cs); prev != kindFree {
			return reject(ReasonCorrupt, "L1 entry %d: L2 table at %d is already %v", i, off, prev)
		}
		w.m.set(off/w.cs, k)
		w.st.L2Tables++
		return nil
	})
}

// checkL2Tables reads each L2 table of the active L1 once, now that all
// metadata is claimed, and checks its entries.
func (w *walker) checkL2Tables() error {
	return w.scanTable(w.l1, noLimit, func(i, e uint64) error {
		off := e & l2OffsetMask // checked by markL2Tables
		if off == 0 {
			return nil
		}
		if err := w.readCluster("L2 table", off); err != nil {
			return err
		}
		be := binary.BigEndian
		for j := uint64(0); j < w.l2N; j++ {
			var ent, bitmap uint64
			if w.extL2 {
				ent, bitmap = be.Uint64(w.buf[16*j:]), be.Uint64(w.buf[16*j+8:])
			} else {
				ent = be.Uint64(w.buf[8*j:])
			}
			if ent == 0 && bitmap == 0 {
				continue
			}
			// i < 2^22 (L1 bound), l2N <= 2^18, cs <= 2^21: < 2^61.
			if err := w.l2Entry(l2Pos{i, j, (i*w.l2N + j) * w.cs}, ent, bitmap); err != nil {
				return err
			}
		}
		return nil
	})
}

// l2Pos locates an L2 entry: L1 index, L2 index, guest offset.
type l2Pos struct{ l1, l2, guest uint64 }

// l2Entry checks one L2 entry (bitmap: its extended L2 bitmap, else 0).
func (w *walker) l2Entry(p l2Pos, e, bitmap uint64) error {
	if e&oflagCompressed != 0 {
		return w.compressedEntry(p, e, bitmap)
	}
	off := e & l2OffsetMask
	alloc, zeros := uint32(bitmap), uint32(bitmap>>32)
	switch {
	case e&l2StdReservedMask != 0:
		return reject(ReasonCorrupt, "L2 entry %d/%d has reserved bits set (%#x)", p.l1, p.l2, e)
	case e&oflagZero != 0 && (w.h.Version < 3 || w.extL2):
		// qcow2.txt: "With version 2 or with extended L2 entries, this
		// is always 0". QEMU refuses the read of a v2 zero cluster.
		return reject(ReasonCorrupt, "L2 entry %d/%d: zero flag set in a version %d image (extended L2: %v)", p.l1, p.l2, w.h.Version, w.extL2)
	case alloc&zeros != 0:
		return reject(ReasonCorrupt, "L2 entry %d/%d: subclusters %#x are both allocated and zero", p.l1, p.l2, alloc&zeros)
	case off == 0 && alloc != 0:
		return reject(ReasonCorrupt, "L2 entry %d/%d: subclusters %#x allocated without a host cluster", p.l1, p.l2, alloc)
	case off == 0:
		return nil // unallocated, or reads as zeros
	case off%w.cs != 0:
		return reject(ReasonCorrupt, "L2 entry %d/%d: data cluster offset %d is not cluster-aligned", p.l1, p.l2, off)
	case off >= w.fsize:
		// Only the start: QEMU reads past the end of the file as zeros,
		// and qemu-img leaves files ending inside their last cluster.
		return reject(ReasonCorrupt, "L2 entry %d/%d: data cluster at %d lies outside the file of %d bytes", p.l1, p.l2, off, w.fsize)
	}
	if prev := w.m.get(off / w.cs); prev != kindFree {
		return reject(ReasonCorrupt, "L2 entry %d/%d: data cluster at %d is already %v", p.l1, p.l2, off, prev)
	}
	k := kindData
	if e&oflagCopied != 0 {
		k |= copiedBit
	}
	w.m.set(off/w.cs, k)
	w.st.DataClusters++
	switch {
	case w.extL2:
		sub := w.cs / subclustersPerEntry
		for s := uint64(0); s < subclustersPerEntry; s++ {
			if alloc&(1<<s) != 0 {
				w.addAllocated(p.guest+s*sub, sub)
			}
		}
	case e&oflagZero == 0:
		w.addAllocated(p.guest, w.cs)
	}
	return nil
}

// compressedEntry checks a compressed cluster descriptor (qcow2.txt:
// x = 62 - (cluster_bits - 8); bits 0..x-1 host offset, x..61 the number
// of 512-byte sectors after the first).
func (w *walker) compressedEntry(p l2Pos, e, bitmap uint64) error {
	off, end := compressedExtent(e, w.h.ClusterBits)
	// The file ends in the sector holding the compressed data's last byte.
	fileEnd := (w.fsize + sectorSize - 1) &^ (sectorSize - 1)
	switch {
	case e&oflagCopied != 0:
		return reject(ReasonCorrupt, "L2 entry %d/%d: compressed cluster with the copied flag", p.l1, p.l2)
	case bitmap != 0:
		return reject(ReasonCorrupt, "L2 entry %d/%d: compressed cluster with a subcluster bitmap (%#x)", p.l1, p.l2, bitmap)
	case off >= w.fsize || end > fileEnd:
		// off < 2^61 and sectors <= 2^13: end cannot overflow.
		return reject(ReasonCorrupt, "L2 entry %d/%d: compressed data [%d, %d) lies outside the file of %d bytes", p.l1, p.l2, off, end, w.fsize)
	}
	// end <= fileEnd <= the end of the last cluster: in the map.
	for c := off / w.cs; c <= (end-1)/w.cs; c++ {
		switch prev := w.m.get(c); prev {
		case kindFree, kindCompressed:
			w.m.set(c, kindCompressed)
		default:
			return reject(ReasonCorrupt, "L2 entry %d/%d: compressed data at %d overlaps %v in cluster %d", p.l1, p.l2, off, prev, c)
		}
	}
	w.st.CompressedClusters++
	w.addAllocated(p.guest, w.cs)
	return nil
}

// compressedExtent is the file extent QEMU reads for the compressed
// cluster descriptor e: from its host offset to the end of its last
// 512-byte sector (qcow2.txt: x = 62 - (cluster_bits - 8); bits 0..x-1
// the offset, x..61 the number of sectors after the first).
func compressedExtent(e uint64, clusterBits uint32) (off, end uint64) {
	x := 62 - (clusterBits - 8) // cluster_bits 9..21: x is 49..61
	off = e & (1<<x - 1)
	sectors := (e>>x)&(1<<(clusterBits-8)-1) + 1
	return off, off&^(sectorSize-1) + sectors*sectorSize
}

// addAllocated counts n bytes of the virtual disk at guest as allocated,
// clipped at the virtual size.
func (w *walker) addAllocated(guest, n uint64) {
	if guest >= w.h.VirtualSize {
		return
	}
	// At most the virtual size (< 2^63 after the limits) in all.
	w.st.AllocatedBytes += int64(min(n, w.h.VirtualSize-guest))
}
