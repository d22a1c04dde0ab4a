package blobfs

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// blob is a committed blob open for reading.
//
// ReadAt (pread) may be used from several goroutines, but Section moves
// the file's offset: one Blob serves one Section reader at a time. Open
// the blob once per download.
type blob struct {
	f    *os.File
	size int64
	mod  time.Time
}

var _ imagestore.Blob = (*blob)(nil)

func (b *blob) ReadAt(p []byte, off int64) (int, error) {
	n, err := b.f.ReadAt(p, off)
	if err != nil && err != io.EOF {
		return n, fmt.Errorf("blobfs: read: %w", err)
	}
	return n, err
}

func (b *blob) Close() error {
	if err := b.f.Close(); err != nil {
		return fmt.Errorf("blobfs: close: %w", err)
	}
	return nil
}

// Size is the size at Open; blobs are immutable once committed.
func (b *blob) Size() int64 { return b.size }

func (b *blob) ModTime() time.Time { return b.mod }

// Section returns exactly *io.LimitedReader{R: *os.File}: net/http's
// response writer unwraps that shape to send the file with sendfile(2).
// It seeks the shared file offset, hence one reader at a time per Blob.
func (b *blob) Section(off, n int64) (io.Reader, error) {
	if off < 0 || n < 0 || off > b.size || n > b.size-off {
		return nil, fmt.Errorf("blobfs: section [%d, +%d) outside blob of %d bytes", off, n, b.size)
	}
	if _, err := b.f.Seek(off, io.SeekStart); err != nil {
		return nil, fmt.Errorf("blobfs: section: %w", err)
	}
	return &io.LimitedReader{R: b.f, N: n}, nil
}
