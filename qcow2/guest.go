package qcow2

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
)

// Guest reads the virtual disk of an image the gate accepted: what a
// machine started from it would see. It is for a few sectors at a time
// (the boot check reads the partition tables): it keeps nothing between
// reads and holds at most two clusters while it reads one.
//
// It trusts what CheckStructure proved (every table and data cluster
// inside the file, no reserved bits, compressed extents in bounds) and
// must not be given an image that did not pass it. It is our own code,
// not go-qcow2reader's, for the reasons the package doc gives and because
// that library keeps its decompressors in package variables.
type Guest struct {
	r     io.ReaderAt
	h     *Header
	fsize uint64
	cs    uint64
	extL2 bool
	l2N   uint64
}

// NewGuest returns the virtual disk of the accepted image r of size
// bytes with header h.
func NewGuest(r io.ReaderAt, size int64, h *Header) (*Guest, error) {
	if h == nil || size < 0 {
		return nil, errors.New("qcow2: guest: no header or negative size")
	}
	if rej := saneHeader(h); rej != nil {
		return nil, rej
	}
	g := &Guest{r: r, h: h, fsize: uint64(size), cs: h.ClusterSize(), l2N: h.ClusterSize() / 8}
	if h.IncompatibleFeatures&IncompatExtendedL2 != 0 {
		g.extL2, g.l2N = true, g.cs/16
	}
	return g, nil
}

// Size is the virtual disk's size in bytes.
func (g *Guest) Size() int64 { return int64(g.h.VirtualSize) }

// ReadAt reads the virtual disk; unallocated and zero clusters read as
// zeros (an accepted image has no backing file). A read that ends past
// the virtual size returns what it could with io.EOF.
func (g *Guest) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("qcow2: guest: negative offset %d", off)
	}
	n := 0
	for n < len(p) {
		at := uint64(off) + uint64(n)
		if at >= g.h.VirtualSize {
			return n, io.EOF
		}
		in := at % g.cs
		k := int(min(uint64(len(p)-n), g.cs-in, g.h.VirtualSize-at))
		if err := g.readCluster(p[n:n+k], at-in, in); err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}

// readCluster fills p with the bytes at in inside the guest cluster that
// starts at guest.
func (g *Guest) readCluster(p []byte, guest, in uint64) error {
	l1i := guest / g.cs / g.l2N
	l2i := guest / g.cs % g.l2N
	if l1i >= uint64(g.h.L1Size) {
		clear(p)
		return nil
	}
	var l1e [8]byte
	if err := g.readFile(l1e[:], g.h.L1TableOffset+l1i*8); err != nil {
		return fmt.Errorf("qcow2: guest: read L1 entry %d: %w", l1i, err)
	}
	table := binary.BigEndian.Uint64(l1e[:]) & l2OffsetMask
	if table == 0 {
		clear(p)
		return nil
	}
	var l2e [16]byte
	entry := l2e[:8]
	if g.extL2 {
		entry = l2e[:]
	}
	if err := g.readFile(entry, table+l2i*uint64(len(entry))); err != nil {
		return fmt.Errorf("qcow2: guest: read L2 entry %d/%d: %w", l1i, l2i, err)
	}
	e := binary.BigEndian.Uint64(l2e[:8])
	if e&oflagCompressed != 0 {
		return g.readCompressed(p, e, in)
	}
	host := e & l2OffsetMask
	if !g.extL2 {
		if host == 0 || e&oflagZero != 0 {
			clear(p)
			return nil
		}
		return g.readFile(p, host+in)
	}
	return g.readSubclusters(p, host, binary.BigEndian.Uint64(l2e[8:]), in)
}

// readSubclusters reads an extended L2 entry's cluster: each 1/32 of it
// is allocated at host, zero, or unallocated (zeros, with no backing).
func (g *Guest) readSubclusters(p []byte, host, bitmap, in uint64) error {
	sub := g.cs / subclustersPerEntry
	for len(p) > 0 {
		s := in / sub
		k := min(uint64(len(p)), sub-in%sub)
		if bitmap&(1<<s) != 0 {
			if err := g.readFile(p[:k], host+in); err != nil {
				return err
			}
		} else {
			clear(p[:k])
		}
		p, in = p[k:], in+k
	}
	return nil
}

// readCompressed inflates the compressed cluster of L2 entry e and
// copies its bytes from in into p.
func (g *Guest) readCompressed(p []byte, e, in uint64) error {
	// At most a cluster and a sector; the file may end inside it.
	off, end := compressedExtent(e, g.h.ClusterBits)
	end = min(end, g.fsize)
	raw := make([]byte, end-off)
	if err := g.readFile(raw, off); err != nil {
		return fmt.Errorf("qcow2: guest: read compressed cluster at %d: %w", off, err)
	}
	var dec io.ReadCloser
	switch g.h.CompressionType {
	case CompressionZlib:
		dec = flate.NewReader(bytes.NewReader(raw))
	case CompressionZstd:
		// A cluster is at most 2 MiB, and so is any window that makes
		// one; a frame that asks for more is not a cluster.
		d, err := zstd.NewReader(bytes.NewReader(raw), zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(4<<20), zstd.WithDecoderMaxMemory(8<<20))
		if err != nil {
			return fmt.Errorf("qcow2: guest: zstd: %w", err)
		}
		dec = d.IOReadCloser()
	default:
		return fmt.Errorf("qcow2: guest: compression type %d", g.h.CompressionType)
	}
	defer dec.Close()
	// QEMU inflates into one cluster and stops there: trailing bytes of
	// the last sector are not part of the stream.
	cluster := make([]byte, g.cs)
	if _, err := io.ReadFull(dec, cluster); err != nil {
		return fmt.Errorf("qcow2: guest: inflate the cluster at %d: %w", off, err)
	}
	copy(p, cluster[in:])
	return nil
}

// readFile reads len(p) bytes of the file at off; past the file's end
// it reads zeros, as QEMU does (qemu-img leaves files ending inside
// their last cluster).
func (g *Guest) readFile(p []byte, off uint64) error {
	if off >= g.fsize {
		clear(p)
		return nil
	}
	inFile := min(uint64(len(p)), g.fsize-off)
	if err := readFull(g.r, p[:inFile], int64(off)); err != nil {
		return err
	}
	clear(p[inFile:])
	return nil
}
