// Package qcow2 decides whether an uploaded file is a QCOW2 image vmshelf
// may store and hand to a hypervisor. It is the safety gate for hostile
// uploads: an image that points QEMU at another file (backing file,
// external data file), that QEMU cannot open without a key, or whose
// header announces features we do not know is refused, as early in the
// stream as the bytes decide, with bounded memory.
//
// The format is QEMU's docs/interop/qcow2.txt. The rules mirror what QEMU
// itself refuses at open, plus the references to other files that QEMU
// would follow and we must not.
//
// The gate has two parts: the Inspector decides on the header while the
// bytes stream in; CheckStructure walks the metadata once the last byte is
// stored, before the image becomes visible (Inspect does both, offline).
//
// The gate is our own code on purpose. A QCOW2 library that opens the
// image is not a gate: github.com/lima-vm/go-qcow2reader v0.7.x, for one,
// follows a backing file path on the host at Open, panics inside ReadAt
// on a hostile cluster_bits, allocates whatever l1_size claims, takes a
// version 1 file for raw and only warns on the dirty and corrupt bits.
// The tests use it the other way round, as a second reader proving that
// whatever this gate accepts it opens and reads like qemu-img.
package qcow2

import (
	"encoding/binary"
	"fmt"
)

// Limits are the operator's bounds on an acceptable image.
type Limits struct {
	// MaxVirtualSize is the largest virtual disk size accepted, in bytes.
	// The zero value accepts nothing: a gate that was not configured
	// stays shut rather than open. A 0 virtual size is always refused.
	MaxVirtualSize uint64
}

// Header is an accepted QCOW2 header. For version 2 images RefcountOrder
// is 4 and HeaderLength 72, as the format implies; the feature words and
// CompressionType are 0.
type Header struct {
	Version               uint32
	VirtualSize           uint64
	ClusterBits           uint32
	L1Size                uint32
	L1TableOffset         uint64
	RefcountTableOffset   uint64
	RefcountTableClusters uint32
	NbSnapshots           uint32
	SnapshotsOffset       uint64
	IncompatibleFeatures  uint64
	CompatibleFeatures    uint64
	AutoclearFeatures     uint64
	RefcountOrder         uint32
	HeaderLength          uint32
	CompressionType       uint8
}

// ClusterSize is 1 << ClusterBits (0 for a nonsensical ClusterBits; an
// accepted header never has one).
func (h *Header) ClusterSize() uint64 {
	if h.ClusterBits >= 64 {
		return 0
	}
	return 1 << h.ClusterBits
}

// Dirty reports the dirty bit: refcounts may be stale, which
// `qemu-img check -r` repairs; the image is otherwise usable.
func (h *Header) Dirty() bool { return h.IncompatibleFeatures&IncompatDirty != 0 }

// Feature bits (qcow2.txt, header bytes 72-95).
const (
	IncompatDirty       = 1 << 0
	IncompatCorrupt     = 1 << 1
	IncompatDataFile    = 1 << 2
	IncompatCompression = 1 << 3
	IncompatExtendedL2  = 1 << 4
	incompatKnown       = IncompatDirty | IncompatCorrupt | IncompatDataFile | IncompatCompression | IncompatExtendedL2

	AutoclearBitmaps     = 1 << 0
	AutoclearDataFileRaw = 1 << 1
)

// Compression types (header byte 104).
const (
	CompressionZlib = 0
	CompressionZstd = 1
)

// Header extension types.
const (
	extEnd           = 0x00000000
	extBackingFormat = 0xE2792ACA
	extDataFile      = 0x44415441
	extLUKS          = 0x0537BE77
)

// Bounds. Where QEMU has one, it is QEMU's, so anything QEMU opens passes.
const (
	v2HeaderLength = 72
	v3HeaderLength = 104 // up to and including header_length
	// fixedMax is the most of the header the inspector ever buffers:
	// through the compression type byte. Later header bytes (a longer
	// header_length) and extension data are skipped, not stored.
	fixedMax = 105

	minClusterBits = 9
	maxClusterBits = 21 // 2 MiB
	// minExtL2ClusterBits: extended L2 splits a cluster into 32
	// subclusters, which QEMU requires to be at least 512 bytes.
	minExtL2ClusterBits = 14
	maxRefcountOrder    = 6
	// maxL1Bytes is QEMU's QCOW_MAX_L1_SIZE.
	maxL1Bytes = 32 << 20
	// maxRefcountTableBytes is QEMU's QCOW_MAX_REFTABLE_SIZE: with 64 KiB
	// clusters, 128 reftable clusters, enough for petabytes of image.
	maxRefcountTableBytes = 8 << 20
	// maxSnapshots is QEMU's QCOW_MAX_SNAPSHOTS.
	maxSnapshots = 65536
)

var magic = [4]byte{'Q', 'F', 'I', 0xfb}

// parseFixed decides what it can from b, the first bytes of the stream.
// It returns a reject, or the length of prefix it needs before it can go
// on, or (need 0) the complete fixed header. Checks run in stream order,
// each as soon as its bytes are there, so the verdict depends only on the
// bytes and never on how the stream was chunked.
func parseFixed(b []byte, l Limits) (*Header, int, *Reject) {
	h := &Header{}
	// Each part reads the fields of its stretch of the header, in order,
	// and stops at the first byte it still lacks.
	for _, part := range []func([]byte, *Header, Limits) (int, *Reject){parseIdentity, parseGeometry, parseTables} {
		if need, r := part(b, h, l); r != nil || need > 0 {
			return nil, need, r
		}
	}
	if h.Version == 2 {
		h.RefcountOrder = 4
		h.HeaderLength = v2HeaderLength
		if r := checkL1(h); r != nil {
			return nil, 0, r
		}
		return h, 0, nil
	}
	return parseV3(b, h)
}

// parseIdentity reads bytes 0-7: the magic, decided byte by byte, and the
// version.
func parseIdentity(b []byte, h *Header, _ Limits) (int, *Reject) {
	for i := 0; i < len(magic) && i < len(b); i++ {
		if b[i] != magic[i] {
			return 0, reject(ReasonNotQcow2, "not a QCOW2 image: bad magic at byte %d", i)
		}
	}
	if len(b) < len(magic) {
		return len(b) + 1, nil // a wrong magic is decided byte by byte
	}
	if len(b) < 8 {
		return 8, nil
	}
	h.Version = binary.BigEndian.Uint32(b[4:])
	if h.Version != 2 && h.Version != 3 {
		return 0, reject(ReasonNotQcow2, "unsupported QCOW2 version %d (want 2 or 3)", h.Version)
	}
	return 0, nil
}

// parseGeometry reads bytes 8-35, what the image is made of: no backing
// file, the cluster size, the virtual size and no encryption.
func parseGeometry(b []byte, h *Header, l Limits) (int, *Reject) {
	be := binary.BigEndian
	if len(b) < 20 {
		return 20, nil
	}
	if off, n := be.Uint64(b[8:]), be.Uint32(b[16:]); off != 0 || n != 0 {
		return 0, reject(ReasonBackingFile, "image has a backing file (offset %d, name length %d); upload a standalone image (qemu-img convert)", off, n)
	}
	if len(b) < 24 {
		return 24, nil
	}
	h.ClusterBits = be.Uint32(b[20:])
	if h.ClusterBits < minClusterBits || h.ClusterBits > maxClusterBits {
		return 0, reject(ReasonBadHeader, "cluster_bits %d outside %d..%d", h.ClusterBits, minClusterBits, maxClusterBits)
	}
	if len(b) < 32 {
		return 32, nil
	}
	h.VirtualSize = be.Uint64(b[24:])
	if h.VirtualSize == 0 {
		return 0, reject(ReasonBadHeader, "virtual size is 0")
	}
	if h.VirtualSize > l.MaxVirtualSize {
		return 0, reject(ReasonVirtualSizeTooLarge, "virtual size %d bytes exceeds the limit of %d bytes", h.VirtualSize, l.MaxVirtualSize)
	}
	if len(b) < 36 {
		return 36, nil
	}
	if m := be.Uint32(b[32:]); m != 0 {
		return 0, reject(ReasonEncrypted, "image is encrypted (crypt_method %d)", m)
	}
	return 0, nil
}

// parseTables reads bytes 36-71, where the tables are: L1, refcount and
// snapshots, each cluster-aligned and within QEMU's bounds.
func parseTables(b []byte, h *Header, _ Limits) (int, *Reject) {
	be := binary.BigEndian
	cs := h.ClusterSize()
	if len(b) < 48 {
		return 48, nil
	}
	h.L1Size = be.Uint32(b[36:]) // checked by checkL1, once extended L2 is known
	h.L1TableOffset = be.Uint64(b[40:])
	if h.L1TableOffset%cs != 0 {
		return 0, reject(ReasonBadHeader, "L1 table offset %d is not cluster-aligned", h.L1TableOffset)
	}
	if len(b) < 60 {
		return 60, nil
	}
	h.RefcountTableOffset = be.Uint64(b[48:])
	if h.RefcountTableOffset%cs != 0 {
		return 0, reject(ReasonBadHeader, "refcount table offset %d is not cluster-aligned", h.RefcountTableOffset)
	}
	h.RefcountTableClusters = be.Uint32(b[56:])
	// < 2^32 clusters of <= 2^21 bytes: the product fits in 64 bits.
	if rt := uint64(h.RefcountTableClusters) * cs; rt == 0 || rt > maxRefcountTableBytes {
		return 0, reject(ReasonBadHeader, "refcount table of %d clusters (%d bytes) outside 1 cluster..%d bytes", h.RefcountTableClusters, rt, maxRefcountTableBytes)
	}
	if len(b) < 72 {
		return 72, nil
	}
	h.NbSnapshots = be.Uint32(b[60:])
	if h.NbSnapshots > maxSnapshots {
		return 0, reject(ReasonBadHeader, "%d snapshots exceed the limit of %d", h.NbSnapshots, maxSnapshots)
	}
	h.SnapshotsOffset = be.Uint64(b[64:])
	if h.SnapshotsOffset%cs != 0 {
		return 0, reject(ReasonBadHeader, "snapshot table offset %d is not cluster-aligned", h.SnapshotsOffset)
	}
	return 0, nil
}

// parseV3 goes on from byte 72 of a version 3 header.
func parseV3(b []byte, h *Header) (*Header, int, *Reject) {
	be := binary.BigEndian
	if len(b) < 80 {
		return nil, 80, nil
	}
	h.IncompatibleFeatures = be.Uint64(b[72:])
	f := h.IncompatibleFeatures
	switch {
	case f&IncompatDataFile != 0:
		return nil, 0, reject(ReasonExternalDataFile, "image keeps its data in an external file")
	case f&IncompatCorrupt != 0:
		return nil, 0, reject(ReasonCorrupt, "image is marked corrupt")
	case f&^incompatKnown != 0:
		return nil, 0, reject(ReasonBadHeader, "unknown incompatible features %#x", f&^incompatKnown)
	case f&IncompatExtendedL2 != 0 && h.ClusterBits < minExtL2ClusterBits:
		return nil, 0, reject(ReasonBadHeader, "extended L2 entries need clusters of at least %d bytes", 1<<minExtL2ClusterBits)
	}
	if r := checkL1(h); r != nil {
		return nil, 0, r
	}
	if len(b) < 96 {
		return nil, 96, nil
	}
	h.CompatibleFeatures = be.Uint64(b[80:])
	h.AutoclearFeatures = be.Uint64(b[88:])
	if h.AutoclearFeatures&AutoclearDataFileRaw != 0 {
		return nil, 0, reject(ReasonExternalDataFile, "image declares a raw external data file")
	}
	if len(b) < v3HeaderLength {
		return nil, v3HeaderLength, nil
	}
	h.RefcountOrder = be.Uint32(b[96:])
	if h.RefcountOrder > maxRefcountOrder {
		return nil, 0, reject(ReasonBadHeader, "refcount_order %d exceeds %d", h.RefcountOrder, maxRefcountOrder)
	}
	h.HeaderLength = be.Uint32(b[100:])
	if h.HeaderLength < v3HeaderLength || h.HeaderLength%8 != 0 || uint64(h.HeaderLength) > h.ClusterSize() {
		return nil, 0, reject(ReasonBadHeader, "header_length %d: want a multiple of 8 in %d..%d", h.HeaderLength, v3HeaderLength, h.ClusterSize())
	}
	if h.HeaderLength > v3HeaderLength {
		if len(b) < v3HeaderLength+1 {
			return nil, v3HeaderLength + 1, nil
		}
		h.CompressionType = b[v3HeaderLength]
	}
	// As QEMU: zlib is the default and must not set the bit; anything
	// else must set it, so old readers refuse what they cannot decompress.
	switch ct, bit := h.CompressionType, f&IncompatCompression != 0; {
	case ct != CompressionZlib && ct != CompressionZstd:
		return nil, 0, reject(ReasonBadHeader, "unknown compression type %d", ct)
	case ct == CompressionZlib && bit:
		return nil, 0, reject(ReasonBadHeader, "compression-type feature bit set for zlib")
	case ct != CompressionZlib && !bit:
		return nil, 0, reject(ReasonBadHeader, "compression type %d without the compression-type feature bit", ct)
	}
	return h, 0, nil
}

// checkL1 checks that the L1 table covers the virtual size and stays
// within QEMU's bound.
func checkL1(h *Header) *Reject {
	cs := h.ClusterSize()
	entrySize := uint64(8)
	if h.IncompatibleFeatures&IncompatExtendedL2 != 0 {
		entrySize = 16
	}
	// One L1 entry maps one L2 table of cs/entrySize entries of cs bytes:
	// at most 2^21 * 2^18 = 2^39 bytes, no overflow.
	perL1 := cs * (cs / entrySize)
	need := h.VirtualSize / perL1
	if h.VirtualSize%perL1 != 0 {
		need++
	}
	if uint64(h.L1Size) < need {
		return reject(ReasonBadHeader, "L1 table of %d entries is too small for a virtual size of %d bytes (needs %d)", h.L1Size, h.VirtualSize, need)
	}
	if uint64(h.L1Size)*8 > maxL1Bytes {
		return reject(ReasonBadHeader, "L1 table of %d entries exceeds %d bytes", h.L1Size, maxL1Bytes)
	}
	return nil
}

// String is for logs and `vmshelf check`.
func (h *Header) String() string {
	return fmt.Sprintf("qcow2 v%d, virtual size %d, cluster size %d, %d snapshots, incompatible %#x, compatible %#x, autoclear %#x, compression %d",
		h.Version, h.VirtualSize, h.ClusterSize(), h.NbSnapshots,
		h.IncompatibleFeatures, h.CompatibleFeatures, h.AutoclearFeatures, h.CompressionType)
}
