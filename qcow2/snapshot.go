package qcow2

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Snapshot table bounds, QEMU's (block/qcow2.h), so that what we accept
// QEMU opens.
const (
	snapshotHeaderLen = 40 // the fixed part of an entry
	// maxSnapshotExtra is QCOW_MAX_SNAPSHOT_EXTRA_DATA.
	maxSnapshotExtra = 1024
	// minSnapshotExtraV3: version 3 entries carry vm_state_size_large and
	// disk_size; `qemu-img check` calls a shorter entry incomplete.
	minSnapshotExtraV3 = 16
	// maxSnapshotTableBytes is QCOW_MAX_SNAPSHOTS_SIZE.
	maxSnapshotTableBytes = 1024 * maxSnapshots
)

// snapshot is what the walk needs of a snapshot table entry.
type snapshot struct {
	l1Off  uint64
	l1Size uint32
}

// l1 is the snapshot's L1 table, snapshot i.
func (s snapshot) l1(i uint32) region {
	return region{"L1 table", s.l1Off, uint64(s.l1Size) * 8, int64(i)}
}

// eachSnapshot parses the snapshot table entry by entry (40 bytes read
// each; the id, name and extra data are skipped, not read) and calls fn
// on each. It returns the table's length. Every entry must lie inside the
// file, so the work is bounded by the file as well as by the 65536
// entries and 64 MiB QEMU allows.
func (w *walker) eachSnapshot(fn func(i uint32, s snapshot) error) (uint64, error) {
	be := binary.BigEndian
	start := w.h.SnapshotsOffset
	pos := start
	var hdr [snapshotHeaderLen]byte
	for i := uint32(0); i < w.h.NbSnapshots; i++ {
		if !w.inside(pos, snapshotHeaderLen) {
			return 0, reject(ReasonCorrupt, "snapshot %d at %d lies outside the file of %d bytes", i, pos, w.fsize)
		}
		if err := readFull(w.r, hdr[:], int64(pos)); err != nil {
			return 0, fmt.Errorf("qcow2: read snapshot %d at %d: %w", i, pos, err)
		}
		s := snapshot{l1Off: be.Uint64(hdr[0:]), l1Size: be.Uint32(hdr[8:])}
		idLen, nameLen := uint64(be.Uint16(hdr[12:])), uint64(be.Uint16(hdr[14:]))
		extra := uint64(be.Uint32(hdr[36:]))
		switch {
		case extra > maxSnapshotExtra:
			return 0, reject(ReasonCorrupt, "snapshot %d has %d bytes of extra data (QEMU allows %d)", i, extra, maxSnapshotExtra)
		case w.h.Version >= 3 && extra < minSnapshotExtraV3:
			return 0, reject(ReasonCorrupt, "snapshot %d has %d bytes of extra data, a version 3 entry needs %d", i, extra, minSnapshotExtraV3)
		case uint64(s.l1Size)*8 > maxL1Bytes:
			return 0, reject(ReasonCorrupt, "snapshot %d: L1 table of %d entries exceeds %d bytes", i, s.l1Size, maxL1Bytes)
		case s.l1Off%w.cs != 0: // `qemu-img check` asks this even of an empty table
			return 0, reject(ReasonCorrupt, "snapshot %d: L1 table offset %d is not cluster-aligned", i, s.l1Off)
		}
		// pos is inside the file (< 2^63) and the rest is < 2^18.
		end := pos + snapshotHeaderLen + extra + idLen + nameLen
		if end > w.fsize {
			return 0, reject(ReasonCorrupt, "snapshot %d [%d, %d) lies outside the file of %d bytes", i, pos, end, w.fsize)
		}
		if end-start > maxSnapshotTableBytes {
			return 0, reject(ReasonCorrupt, "snapshot table exceeds %d bytes at snapshot %d", maxSnapshotTableBytes, i)
		}
		if err := fn(i, s); err != nil {
			return 0, err
		}
		pos = end
		if i+1 < w.h.NbSnapshots {
			pos = (pos + 7) &^ 7 // entries start 8-aligned
		}
	}
	return pos - start, nil
}

// markSnapshots claims the snapshot table and every snapshot's L1 table.
func (w *walker) markSnapshots() error {
	if w.h.NbSnapshots == 0 {
		// QEMU validates the offset even without snapshots.
		if w.h.SnapshotsOffset > math.MaxInt64 {
			return reject(ReasonCorrupt, "snapshot table offset %d is beyond any file", w.h.SnapshotsOffset)
		}
		return nil
	}
	n, err := w.eachSnapshot(func(i uint32, s snapshot) error {
		return w.mark(s.l1(i), kindMeta)
	})
	if err != nil {
		return err
	}
	return w.mark(region{"snapshot table", w.h.SnapshotsOffset, n, -1}, kindMeta)
}

// checkSnapshotL1s checks the entries of every snapshot's L1 table, once
// the active layer is claimed: each L2 table is aligned, inside the file,
// and either an active L2 table (shared) or a cluster nothing active
// uses. Snapshot L2 tables are not read (see CheckStructure).
func (w *walker) checkSnapshotL1s() error {
	if w.h.NbSnapshots == 0 {
		return nil
	}
	_, err := w.eachSnapshot(func(i uint32, s snapshot) error {
		l1 := s.l1(i)
		return w.scanTable(l1, noLimit, func(j, e uint64) error {
			off, err := w.l1Entry(l1, j, e)
			if err != nil || off == 0 {
				return err
			}
			if k := w.m.get(off/w.cs) & kindMask; k != kindFree && k != kindL2 {
				return reject(ReasonCorrupt, "%v entry %d: L2 table at %d is %v", l1, j, off, k)
			}
			return nil
		})
	})
	return err
}
