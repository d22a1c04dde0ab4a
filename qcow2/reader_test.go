package qcow2_test

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/lima-vm/go-qcow2reader/image"
	lq "github.com/lima-vm/go-qcow2reader/image/qcow2"
	qlog "github.com/lima-vm/go-qcow2reader/log"

	"github.com/vmshelf/vmshelf/qcow2"
)

// go-qcow2reader is the second reader: whatever the gate accepts, it must
// open and read without panicking and without touching another file. It
// is never the gate (see the package doc of qcow2 for why).

func init() {
	// go-qcow2reader keeps its decompressors and its warning sink in
	// package variables; set them once, before any test runs. It has
	// deflate built in and no zstd: register klauspost's, bounded (a
	// cluster is at most 2 MiB, so is a frame's window).
	lq.SetDecompressor(lq.CompressionTypeZstd, func(r io.Reader) (io.ReadCloser, error) {
		d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(4<<20), zstd.WithDecoderMaxMemory(8<<20))
		if err != nil {
			return nil, err
		}
		return eofAfterData{d.IOReadCloser()}, nil
	})
	lq.SetDecompressor(lq.CompressionTypeZlib, func(r io.Reader) (io.ReadCloser, error) {
		return eofAfterData{flate.NewReader(r)}, nil
	})
	// Extended L2 support is "experimental" and says so on every open.
	qlog.SetWarnFunc(func(string) {})
}

// eofAfterData holds back an io.EOF that comes with data until the next
// Read. go-qcow2reader v0.7.0 reads a compressed cluster with a single
// Read and takes (n, io.EOF) for a failure, though io.Reader allows it;
// compress/flate returns exactly that for the final block of streams
// such as Go's own (QEMU's zlib streams happen not to trigger it).
type eofAfterData struct{ io.ReadCloser }

func (e eofAfterData) Read(p []byte) (int, error) {
	n, err := e.ReadCloser.Read(p)
	if n > 0 && err == io.EOF {
		return n, nil // the next Read returns 0, io.EOF: both readers keep it
	}
	return n, err
}

// openSecond opens an accepted image with go-qcow2reader. The opener it
// passes fails the test if the library tries to open a backing file.
func openSecond(t testing.TB, ra io.ReaderAt) *lq.Qcow2 {
	t.Helper()
	opener := func(io.ReaderAt, image.Type) (image.Image, error) {
		t.Errorf("go-qcow2reader tried to open a backing file")
		return nil, errors.New("no backing files")
	}
	img, err := lq.Open(ra, opener)
	if err != nil {
		t.Fatalf("go-qcow2reader: open: %v", err)
	}
	if err := img.Readable(); err != nil {
		t.Fatalf("go-qcow2reader: not readable: %v", err)
	}
	if img.BackingFile != "" || img.BackingFileFullPath != "" {
		t.Fatalf("go-qcow2reader found backing file %q (%q)", img.BackingFile, img.BackingFileFullPath)
	}
	return img
}

// qemuFile reads a file as QEMU's block layer does: zeros past its end.
// qemu-img leaves files ending inside their last cluster, which the gate
// accepts; go-qcow2reader would report the short read as an error.
type qemuFile struct{ r *bytes.Reader }

func (f qemuFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.r.ReadAt(p, off)
	if err == io.EOF {
		clear(p[n:])
		return len(p), nil
	}
	return n, err
}

// readSecond reads [off, off+len(p)) of the virtual disk through img.
func readSecond(img *lq.Qcow2, p []byte, off int64) error {
	n, err := img.ReadAt(p, off)
	if n == len(p) && (err == nil || err == io.EOF) {
		return nil
	}
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// How much of an accepted image agreeWithQemu reads through go-qcow2reader
// and compares with `qemu-img convert` (docs/image-safety.md,
// "go-qcow2reader, carefully"): the whole virtual disk up to wholeDiskMax,
// or up to wholeDiskMaxExtL2 with extended L2 entries, which
// go-qcow2reader v0.7 re-reads for every cluster (slow under -race).
const (
	wholeDiskMax      = 2 << 30
	wholeDiskMaxExtL2 = 64 << 20
)

// readsWhole reports whether agreeWithQemu reads h's whole virtual disk.
func readsWhole(h *qcow2.Header) bool {
	if h.IncompatibleFeatures&qcow2.IncompatExtendedL2 != 0 {
		return h.VirtualSize <= wholeDiskMaxExtL2
	}
	return h.VirtualSize <= wholeDiskMax
}

// readMapped reads, through img, the first and the last cluster of an
// accepted image (data, with header h) and every cluster its active L1
// and L2 tables map. Each read must return all its bytes without an
// error. It needs no tool, and costs what the image holds, not what its
// virtual size claims. It returns how many clusters it read.
func readMapped(t testing.TB, img *lq.Qcow2, data []byte, h *qcow2.Header) int {
	t.Helper()
	vsize, cs := int64(h.VirtualSize), int64(h.ClusterSize())
	// No cap: there are at most as many mapped clusters as L2 entries fit
	// in the file.
	offs := append(mappedClusters(data, h, len(data)), 0, (vsize-1)&^(cs-1))
	buf := make([]byte, cs)
	for _, off := range offs {
		if err := readSecond(img, buf[:min(cs, vsize-off)], off); err != nil {
			t.Fatalf("go-qcow2reader: reading the cluster at %d: %v", off, err)
		}
	}
	return len(offs)
}

// mappedClusters returns up to max guest offsets the active layer of an
// accepted image maps (any nonzero L2 entry), found from its L1 and L2
// tables directly: reading only there keeps the fuzz target's reads
// bounded whatever the virtual size, and still reaches every kind of
// cluster it could hold.
func mappedClusters(data []byte, h *qcow2.Header, max int) []int64 {
	be := binary.BigEndian
	cs := h.ClusterSize()
	entry := uint64(8)
	if h.IncompatibleFeatures&qcow2.IncompatExtendedL2 != 0 {
		entry = 16
	}
	var out []int64
	for i := uint64(0); i < uint64(h.L1Size) && len(out) < max; i++ {
		l2 := be.Uint64(data[h.L1TableOffset+8*i:]) & 0x00fffffffffffe00 // inside: the gate said so
		if l2 == 0 {
			continue
		}
		for j := uint64(0); j < cs/entry && len(out) < max; j++ {
			if be.Uint64(data[l2+entry*j:]) != 0 || (entry == 16 && be.Uint64(data[l2+entry*j+8:]) != 0) {
				if g := (i*(cs/entry) + j) * cs; g < h.VirtualSize {
					out = append(out, int64(g))
				}
			}
		}
	}
	return out
}
