package qcow2

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

const (
	// l2OffsetMask keeps bits 9-55 of an L1 entry: the L2 table offset.
	l2OffsetMask = 0x00fffffffffffe00
	// minSnapshotEntry is the fixed part of a snapshot table entry; the
	// table is at least this many bytes per snapshot. (Its exact length
	// needs the entries parsed, which a later check does.)
	minSnapshotEntry = 40
	// scanChunk bounds the memory CheckStructure uses, whatever the
	// header claims.
	scanChunk = 64 << 10
)

// region is a byte range of the image file that a header field claims.
type region struct {
	name   string
	off, n uint64
}

// CheckStructure checks, after the last byte and before the image becomes
// visible, that the tables the header h points to lie inside the file of
// size bytes, do not overlap the header cluster or each other, and that
// every L2 table and refcount block they point to is cluster-aligned and
// inside the file. It reads the L1 and refcount tables through r in
// chunks (both bounded by the header rules: 32 MiB and 8 MiB), using
// bounded memory. A bad structure is a *Reject with ReasonCorrupt; a read
// error is returned wrapped, not as a Reject.
func CheckStructure(r io.ReaderAt, size int64, h *Header) error {
	if h == nil || size < 0 {
		return errors.New("qcow2: check structure: no header or negative size")
	}
	cs := h.ClusterSize()
	if h.ClusterBits < minClusterBits || h.ClusterBits > maxClusterBits {
		return reject(ReasonBadHeader, "cluster_bits %d outside %d..%d", h.ClusterBits, minClusterBits, maxClusterBits)
	}
	fsize := uint64(size)
	// Every length below is a 32-bit count times at most 2^21: no overflow.
	regions := []region{
		{"header cluster", 0, cs},
		{"L1 table", h.L1TableOffset, uint64(h.L1Size) * 8},
		{"refcount table", h.RefcountTableOffset, uint64(h.RefcountTableClusters) * cs},
	}
	if h.NbSnapshots > 0 {
		regions = append(regions, region{"snapshot table", h.SnapshotsOffset, uint64(h.NbSnapshots) * minSnapshotEntry})
	}
	for i, a := range regions {
		if a.off > fsize || a.n > fsize-a.off {
			return reject(ReasonCorrupt, "%s [%d, +%d) lies outside the file of %d bytes", a.name, a.off, a.n, fsize)
		}
		for _, b := range regions[:i] {
			// Both lie inside the file, so the sums cannot overflow.
			if a.n > 0 && b.n > 0 && a.off < b.off+b.n && b.off < a.off+a.n {
				return reject(ReasonCorrupt, "%s [%d, +%d) overlaps the %s [%d, +%d)", a.name, a.off, a.n, b.name, b.off, b.n)
			}
		}
	}
	l1 := regions[1]
	err := scanTable(r, l1, func(i, e uint64) error {
		return checkPointer("L1", i, e&l2OffsetMask, cs, fsize, "L2 table")
	})
	if err != nil {
		return err
	}
	// Refcount table entries are the block offset itself; bits 0-8 are
	// reserved and zero, which the alignment check covers.
	return scanTable(r, regions[2], func(i, e uint64) error {
		return checkPointer("refcount table", i, e, cs, fsize, "refcount block")
	})
}

// checkPointer checks that a cluster at off (0: unallocated) is aligned
// and starts inside the file. Only the start: QEMU reads past the end of
// the file as zeros, so a table cut short at the end is not a hazard.
func checkPointer(table string, i, off, cs, fsize uint64, what string) error {
	switch {
	case off == 0:
		return nil
	case off%cs != 0:
		return reject(ReasonCorrupt, "%s entry %d: %s offset %d is not cluster-aligned", table, i, what, off)
	case off >= fsize:
		return reject(ReasonCorrupt, "%s entry %d: %s at %d lies outside the file of %d bytes", table, i, what, off, fsize)
	}
	return nil
}

// scanTable calls check on each big-endian 64-bit entry of reg, reading
// it scanChunk bytes at a time.
func scanTable(r io.ReaderAt, reg region, check func(i, e uint64) error) error {
	buf := make([]byte, min(reg.n, scanChunk))
	for done := uint64(0); done < reg.n; {
		chunk := buf[:min(reg.n-done, uint64(len(buf)))]
		// reg lies inside a file whose size is an int64: no overflow.
		off := int64(reg.off + done)
		if err := readFull(r, chunk, off); err != nil {
			return fmt.Errorf("qcow2: read %s at %d: %w", reg.name, off, err)
		}
		for k := 0; k+8 <= len(chunk); k += 8 {
			if err := check((done+uint64(k))/8, binary.BigEndian.Uint64(chunk[k:])); err != nil {
				return err
			}
		}
		done += uint64(len(chunk))
	}
	return nil
}

// readFull reads len(p) bytes at off; io.ReaderAt may report io.EOF along
// with a full read, which is no error here.
func readFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// Inspect checks a complete image offline (`vmshelf check`): the header,
// read through an Inspector, then CheckStructure. If the header passes but
// the structure does not, the header is returned along with the error.
func Inspect(r io.ReaderAt, size int64, l Limits) (*Header, error) {
	if size < 0 {
		return nil, fmt.Errorf("qcow2: inspect: negative size %d", size)
	}
	in := NewInspector(l)
	// The inspector decides within the first cluster (at most 2 MiB);
	// stop reading as soon as it has.
	buf := make([]byte, 32<<10)
	for off := int64(0); off < size; {
		if _, ok := in.Header(); ok {
			break
		}
		chunk := buf[:min(size-off, int64(len(buf)))]
		if err := readFull(r, chunk, off); err != nil {
			return nil, fmt.Errorf("qcow2: read header at %d: %w", off, err)
		}
		if _, err := in.Write(chunk); err != nil {
			return nil, err
		}
		off += int64(len(chunk))
	}
	h, err := in.Finish()
	if err != nil {
		return nil, err
	}
	if err := CheckStructure(r, size, h); err != nil {
		return h, err
	}
	return h, nil
}
