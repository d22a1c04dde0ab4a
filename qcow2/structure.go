package qcow2

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Stats describes the active layer of an accepted image: what
// `qemu-img convert` (and so a CDI importer) will read.
type Stats struct {
	// AllocatedBytes is how much of the virtual disk reads from data
	// stored in the file: standard clusters that do not read as zeros
	// (with extended L2 entries, their allocated subclusters) and
	// compressed clusters, clipped at the virtual size. The rest of the
	// disk reads as zeros.
	AllocatedBytes int64
	// DataClusters counts L2 entries mapping a standard host cluster,
	// preallocated zero clusters included.
	DataClusters int64
	// CompressedClusters counts L2 entries of compressed clusters.
	CompressedClusters int64
	// L2Tables counts the L2 tables of the active L1 table.
	L2Tables int64
}

// CheckStructure checks, after the last byte and before the image becomes
// visible, the metadata the header h points to in the file of size bytes.
//
//   - The header cluster, L1 table, refcount table, every refcount block,
//     the snapshot table, every snapshot L1 table and every L2 table of
//     the active L1 lie inside the file, cluster-aligned, and no two of
//     them share a cluster; no L2 table is used twice.
//   - Every L2 entry has its reserved bits clear; a standard cluster is
//     aligned, starts inside the file (QEMU reads past the end of the file
//     as zeros, and real images end inside their last cluster) and is
//     neither metadata nor mapped twice; a compressed extent starts inside
//     the file, ends at most in the sector holding its end, and shares
//     clusters only with other compressed extents; extended L2 subcluster
//     bitmaps are consistent.
//   - Snapshot table entries parse within QEMU's bounds and their L1
//     tables point at aligned L2 tables inside the file. Snapshot L2
//     tables are not walked: what a CDI importer converts is the active
//     layer, and a snapshot's L2 tables are either the active ones or
//     clusters nothing we read points into, so walking them would only
//     multiply the work (by up to 65536 snapshots) without protecting the
//     conversion.
//   - Every cluster found above has a nonzero refcount and one flagged
//     COPIED has refcount 1, so QEMU writing to the image never reuses a
//     cluster still in use nor writes into one a snapshot shares; the
//     dirty bit is no exception (see checkRefcounts).
//
// Work is proportional to the metadata in the file, never to the virtual
// size: tables are read in 64 KiB chunks and each L2 table and refcount
// block once into one cluster buffer. Memory is that buffer (at most
// 2 MiB), the chunk, and 4 bits per cluster of the file (clusterMap).
//
// A bad structure is a *Reject with ReasonCorrupt (ReasonBadHeader for a
// header the Inspector would not have accepted); a read error is returned
// wrapped, not as a Reject.
func CheckStructure(r io.ReaderAt, size int64, h *Header) error {
	_, err := walk(r, size, h)
	return err
}

// Inspect checks a complete image offline (`vmshelf check`): the header,
// read through an Inspector, then the structure as CheckStructure does,
// and returns what the active layer maps. If the header passes but the
// structure does not, the header is returned along with the error.
func Inspect(r io.ReaderAt, size int64, l Limits) (*Header, Stats, error) {
	if size < 0 {
		return nil, Stats{}, fmt.Errorf("qcow2: inspect: negative size %d", size)
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
			return nil, Stats{}, fmt.Errorf("qcow2: read header at %d: %w", off, err)
		}
		if _, err := in.Write(chunk); err != nil {
			return nil, Stats{}, err
		}
		off += int64(len(chunk))
	}
	h, err := in.Finish()
	if err != nil {
		return nil, Stats{}, err
	}
	st, err := walk(r, size, h)
	if err != nil {
		return h, Stats{}, err
	}
	return h, st, nil
}

// Entry bits (qcow2.txt, "Cluster mapping").
const (
	// l2OffsetMask keeps bits 9-55: the L2 table offset of an L1 entry,
	// the host cluster offset of a standard L2 entry.
	l2OffsetMask        = 0x00fffffffffffe00
	l1ReservedMask      = 0x7f000000000001ff // bits 0-8, 56-62
	l2StdReservedMask   = 0x3f000000000001fe // bits 1-8, 56-61
	reftableReserved    = 0x1ff              // bits 0-8
	oflagCopied         = 1 << 63
	oflagCompressed     = 1 << 62
	oflagZero           = 1 << 0
	sectorSize          = 512
	subclustersPerEntry = 32
	// scanChunk is how much of the L1 or refcount table is read at once.
	scanChunk = 64 << 10
)

// walker is one structure check: the file, its header, and the little
// state the check keeps.
type walker struct {
	r      io.ReaderAt
	h      *Header
	fsize  uint64
	cs     uint64
	extL2  bool
	l2N    uint64 // entries per L2 table
	m      clusterMap
	buf    []byte // one cluster: an L2 table or a refcount block
	chunk  []byte // part of the L1 or refcount table
	st     Stats
	l1     region
	rtable region
}

// region is a byte range of the file that a header field claims: name,
// and for a snapshot's table the snapshot's number (else -1), formatted
// only into messages so that parsing 65536 snapshots allocates nothing.
type region struct {
	name     string
	off, n   uint64
	snapshot int64
}

func (r region) String() string {
	if r.snapshot < 0 {
		return r.name
	}
	return fmt.Sprintf("%s of snapshot %d", r.name, r.snapshot)
}

func walk(r io.ReaderAt, size int64, h *Header) (Stats, error) {
	if h == nil || size < 0 {
		return Stats{}, errors.New("qcow2: check structure: no header or negative size")
	}
	if rej := saneHeader(h); rej != nil {
		return Stats{}, rej
	}
	w := &walker{r: r, h: h, fsize: uint64(size), cs: h.ClusterSize(), l2N: h.ClusterSize() / 8}
	if h.IncompatibleFeatures&IncompatExtendedL2 != 0 {
		w.extL2, w.l2N = true, w.cs/16
	}
	var err error
	// ceil(size / cs) without overflow: size < 2^63.
	if w.m, err = newClusterMap((w.fsize + w.cs - 1) / w.cs); err != nil {
		return Stats{}, err
	}
	w.buf = make([]byte, w.cs)
	w.chunk = make([]byte, scanChunk)
	// Every length is a 32-bit count times at most 2^21: no overflow.
	w.l1 = region{"L1 table", h.L1TableOffset, uint64(h.L1Size) * 8, -1}
	w.rtable = region{"refcount table", h.RefcountTableOffset, uint64(h.RefcountTableClusters) * w.cs, -1}
	steps := []func() error{
		func() error { return w.mark(region{"header cluster", 0, w.cs, -1}, kindMeta) },
		func() error { return w.mark(w.l1, kindMeta) },
		func() error { return w.mark(w.rtable, kindMeta) },
		w.markSnapshots,
		w.markRefcountBlocks,
		w.markL2Tables,
		w.checkL2Tables,
		w.checkSnapshotL1s,
		w.checkRefcounts,
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return Stats{}, err
		}
	}
	return w.st, nil
}

// saneHeader re-checks what the walk's arithmetic relies on, for a
// Header that did not come from an Inspector.
func saneHeader(h *Header) *Reject {
	cs := h.ClusterSize()
	switch {
	case h.ClusterBits < minClusterBits || h.ClusterBits > maxClusterBits:
		return reject(ReasonBadHeader, "cluster_bits %d outside %d..%d", h.ClusterBits, minClusterBits, maxClusterBits)
	case h.Version != 2 && h.Version != 3:
		return reject(ReasonBadHeader, "unsupported QCOW2 version %d", h.Version)
	case h.VirtualSize == 0 || h.VirtualSize > math.MaxInt64:
		return reject(ReasonBadHeader, "virtual size %d", h.VirtualSize)
	case h.RefcountOrder > maxRefcountOrder:
		return reject(ReasonBadHeader, "refcount_order %d exceeds %d", h.RefcountOrder, maxRefcountOrder)
	case h.CompressionType != CompressionZlib && h.CompressionType != CompressionZstd:
		return reject(ReasonBadHeader, "unknown compression type %d", h.CompressionType)
	case h.IncompatibleFeatures&^(IncompatDirty|IncompatCompression|IncompatExtendedL2) != 0:
		return reject(ReasonBadHeader, "incompatible features %#x", h.IncompatibleFeatures)
	case h.IncompatibleFeatures&IncompatExtendedL2 != 0 && h.ClusterBits < minExtL2ClusterBits:
		return reject(ReasonBadHeader, "extended L2 entries need clusters of at least %d bytes", 1<<minExtL2ClusterBits)
	case h.L1Size == 0 || uint64(h.L1Size)*8 > maxL1Bytes:
		return reject(ReasonBadHeader, "L1 table of %d entries", h.L1Size)
	case h.RefcountTableClusters == 0 || uint64(h.RefcountTableClusters)*cs > maxRefcountTableBytes:
		return reject(ReasonBadHeader, "refcount table of %d clusters", h.RefcountTableClusters)
	case h.NbSnapshots > maxSnapshots:
		return reject(ReasonBadHeader, "%d snapshots exceed the limit of %d", h.NbSnapshots, maxSnapshots)
	}
	return nil
}

// inside reports whether [off, off+n) lies inside the file.
func (w *walker) inside(off, n uint64) bool {
	return off <= w.fsize && n <= w.fsize-off
}

// mark claims the clusters of reg, which must lie inside the file, for k;
// a cluster already claimed means two structures overlap.
func (w *walker) mark(reg region, k kind) error {
	if reg.n == 0 {
		return nil
	}
	if !w.inside(reg.off, reg.n) {
		return reject(ReasonCorrupt, "%v [%d, +%d) lies outside the file of %d bytes", reg, reg.off, reg.n, w.fsize)
	}
	if reg.off%w.cs != 0 {
		return reject(ReasonCorrupt, "%v at %d is not cluster-aligned", reg, reg.off)
	}
	// Inside the file: the sum cannot overflow, and the clusters are
	// those of the map.
	for c := reg.off / w.cs; c <= (reg.off+reg.n-1)/w.cs; c++ {
		if prev := w.m.get(c); prev != kindFree {
			return reject(ReasonCorrupt, "%v [%d, +%d) overlaps %v in cluster %d", reg, reg.off, reg.n, prev, c)
		}
		w.m.set(c, k)
	}
	return nil
}

// scanTable calls check on each big-endian 64-bit entry of reg (which
// lies inside the file) until limit entries, reading it scanChunk bytes
// at a time into w.chunk.
func (w *walker) scanTable(reg region, limit uint64, check func(i, e uint64) error) error {
	n := min(reg.n, limit*8) // limit*8: limit is at most a table's entries
	for done := uint64(0); done < n; {
		chunk := w.chunk[:min(n-done, uint64(len(w.chunk)))]
		off := int64(reg.off + done) // inside the file: fits
		if err := readFull(w.r, chunk, off); err != nil {
			return fmt.Errorf("qcow2: read %v at %d: %w", reg, off, err)
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

// readCluster reads the cluster at off (inside the file) into w.buf.
func (w *walker) readCluster(what string, off uint64) error {
	if err := readFull(w.r, w.buf, int64(off)); err != nil {
		return fmt.Errorf("qcow2: read %s at %d: %w", what, off, err)
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

// noLimit is a scanTable limit beyond any table.
const noLimit = math.MaxUint64 / 8
