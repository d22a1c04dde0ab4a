package blobfs

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
)

// TestBlobtest runs the suite every Blobs passes. Break fails the
// writeback the writer starts every 32 MiB, the way a failing disk would.
func TestBlobtest(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blobtest.Target {
		dir := filepath.Join(t.TempDir(), "vm-images")
		f, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		var broken atomic.Bool
		f.syncRange = func(file *os.File, off, n int64) error {
			if broken.Load() {
				return syscall.EIO
			}
			return startWriteback(file, off, n)
		}
		return blobtest.Target{
			Blobs: f,
			Reopen: func(t *testing.T) imagestore.Blobs {
				g, err := Open(dir)
				if err != nil {
					t.Fatal(err)
				}
				return g
			},
			Unit:  1 << 20,
			Break: broken.Store,
		}
	})
}
