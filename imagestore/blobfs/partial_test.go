package blobfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
)

// TestWriterEndsOnDisk: however a writer ends, its descriptor is closed,
// and its partial file is what the end says: gone after a commit or an
// abort, kept whole after a close, for Resume. The suite (blobtest) checks
// what the Blobs answer; the descriptors and the files are blobfs's own.
func TestWriterEndsOnDisk(t *testing.T) {
	needProcFDs(t)
	data := blobtest.Pattern(1, 10000)
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, f *FS, dir, id string, w imagestore.BlobWriter)
		// kept: the partial file stays, holding data.
		kept bool
	}{
		{"Commit", func(t *testing.T, f *FS, dir, id string, w imagestore.BlobWriter) {
			if err := w.Commit(t.Context()); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"Abort", func(t *testing.T, f *FS, dir, id string, w imagestore.BlobWriter) {
			for i := range 3 { // idempotent
				if err := w.Abort(); err != nil {
					t.Fatalf("Abort #%d: %v", i, err)
				}
			}
		}, false},
		{"Close", func(t *testing.T, f *FS, dir, id string, w imagestore.BlobWriter) {
			if err := w.Sync(); err != nil {
				t.Fatal(err)
			}
			for i := range 2 { // idempotent
				if err := w.Close(); err != nil {
					t.Fatalf("Close #%d: %v", i, err)
				}
			}
			// Calls the closed writer refuses leave the file alone.
			_, _ = w.Write([]byte("x"))
			_ = w.Sync()
			_ = w.Commit(t.Context())
		}, true},
		{"Close, Resume, Commit", func(t *testing.T, f *FS, dir, id string, w imagestore.BlobWriter) {
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			w2, err := f.Resume(t.Context(), id, int64(len(data)))
			if err != nil {
				t.Fatal(err)
			}
			if err := w2.Commit(t.Context()); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"Abort, Close", func(t *testing.T, f *FS, dir, id string, w imagestore.BlobWriter) {
			if err := w.Abort(); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"failed Commit, Close, Abort", func(t *testing.T, f *FS, dir, id string, w imagestore.BlobWriter) {
			canceled, cancel := context.WithCancel(t.Context())
			cancel()
			if err := w.Commit(canceled); !errors.Is(err, context.Canceled) {
				t.Fatalf("Commit with a canceled context: %v", err)
			}
			if fds := openFDsUnder(t, dir); len(fds) != 0 {
				t.Errorf("descriptors left open after the failed Commit: %v", fds)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if err := w.Abort(); err != nil {
				t.Fatal(err)
			}
		}, false},
		// Another writer's blob committed after this one's Create checked
		// (a race past O_EXCL): Commit must not replace it (a rename that
		// refuses to replace, or a link), and Abort cleans up.
		{"Commit over a blob committed meanwhile, Abort", func(t *testing.T, f *FS, dir, id string, w imagestore.BlobWriter) {
			final := filepath.Join(dir, id+blobExt)
			if err := os.WriteFile(final, []byte("first"), fileMode); err != nil {
				t.Fatal(err)
			}
			if err := w.Commit(t.Context()); !errors.Is(err, imagestore.ErrExists) {
				t.Fatalf("Commit over an existing blob: %v, want ErrExists", err)
			}
			if fds := openFDsUnder(t, dir); len(fds) != 0 {
				t.Errorf("descriptors left open after the failed Commit: %v", fds)
			}
			if err := w.Abort(); err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(final); err != nil || string(got) != "first" {
				t.Fatalf("committed blob = %q, %v; want it untouched", got, err)
			}
		}, false},
		{"failed write, Close, Abort", func(t *testing.T, f *FS, dir, id string, w imagestore.BlobWriter) {
			f.syncRange = func(*os.File, int64, int64) error { return syscall.EIO }
			if _, err := w.Write(make([]byte, writebackWindow)); !errors.Is(err, syscall.EIO) {
				t.Fatalf("Write with failing writeback: %v, want EIO", err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if err := w.Sync(); !errors.Is(err, os.ErrClosed) {
				t.Errorf("Sync after Close: %v, want os.ErrClosed", err)
			}
			if err := w.Abort(); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, dir := openTemp(t)
			id := imagestore.NewUploadID()
			w, err := f.Create(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(data); err != nil {
				t.Fatal(err)
			}
			tc.end(t, f, dir, id, w)
			if fds := openFDsUnder(t, dir); len(fds) != 0 {
				t.Errorf("descriptors left open: %v", fds)
			}
			got, err := os.ReadFile(filepath.Join(dir, partialDir, id))
			switch {
			case tc.kept && (err != nil || !bytes.Equal(got, data)):
				t.Errorf("partial file: %d bytes, %v; want the %d written", len(got), err, len(data))
			case !tc.kept && !errors.Is(err, os.ErrNotExist):
				t.Errorf("partial file left: %d bytes, %v", len(got), err)
			}
		})
	}
}

// TestResumeOnDisk: Resume cuts the partial file at its offset at once,
// before any write; a Resume it refuses leaves the file as it was and no
// descriptor open; and a directory where the file should be is refused,
// not taken for a missing partial.
func TestResumeOnDisk(t *testing.T) {
	needProcFDs(t)
	ctx := t.Context()
	f, dir := openTemp(t)
	id := imagestore.NewUploadID()
	prefix, junk := blobtest.Pattern(3, 5000), blobtest.Pattern(4, 3000)
	data := slices.Concat(prefix, junk)
	blobtest.Partial(t, f, id, data)
	partial := filepath.Join(dir, partialDir, id)
	untouched := func(when string) {
		t.Helper()
		if got, err := os.ReadFile(partial); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: partial is %d bytes, %v; want it untouched", when, len(got), err)
		}
		if fds := openFDsUnder(t, dir); len(fds) != 0 {
			t.Errorf("%s: descriptors left open: %v", when, fds)
		}
	}
	for _, off := range []int64{int64(len(data)) + 1, 1 << 40, -1} {
		if _, err := f.Resume(ctx, id, off); err == nil {
			t.Fatalf("Resume at %d of %d bytes succeeded", off, len(data))
		}
		untouched(fmt.Sprintf("Resume at %d", off))
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := f.Resume(canceled, id, 0); err == nil {
		t.Fatal("Resume with a canceled context succeeded")
	}
	untouched("Resume canceled")

	odd := imagestore.NewUploadID()
	if err := os.Mkdir(filepath.Join(dir, partialDir, odd), dirMode); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Resume(ctx, odd, 0); err == nil || errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Resume of a directory: %v, want an error other than ErrNotFound", err)
	}

	w, err := f.Resume(ctx, id, int64(len(prefix)))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	if st, err := os.Stat(partial); err != nil || st.Size() != int64(len(prefix)) {
		t.Fatalf("partial after Resume: %v, %v; want %d bytes before any write", st, err, len(prefix))
	}
	// A file reads back at once where it was cut. (Not the suite's: an S3
	// writer reads past the head only after the last byte, and a read
	// there ends its writing.)
	if n, err := w.ReadAt(make([]byte, 20), int64(len(prefix))); n != 0 || err != io.EOF {
		t.Errorf("ReadAt at the offset after Resume = %d, %v; want 0, io.EOF", n, err)
	}
}

// TestResumeWriteback checks that a resumed writer starts writeback at the
// window its offset falls in, not at 0 (which would re-ask for everything
// before) nor at the offset (which would leave the window's start dirty).
func TestResumeWriteback(t *testing.T) {
	ctx := context.Background()
	f, dir := openTemp(t)
	type call struct{ off, n int64 }
	var calls []call
	f.syncRange = func(file *os.File, off, n int64) error {
		calls = append(calls, call{off, n})
		return startWriteback(file, off, n)
	}
	id := imagestore.NewUploadID()
	blobtest.Partial(t, f, id, nil)
	// A sparse 40 MiB partial: the bytes' content does not matter here.
	const offset = 40 << 20
	if err := os.Truncate(filepath.Join(dir, partialDir, id), offset); err != nil {
		t.Fatal(err)
	}
	w, err := f.Resume(ctx, id, offset)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	chunk := make([]byte, 1<<20+3)
	for written := offset; written < 70<<20; {
		n, err := w.Write(chunk)
		if err != nil {
			t.Fatal(err)
		}
		written += n
	}
	if want := []call{{32 << 20, 32 << 20}}; !slices.Equal(calls, want) {
		t.Fatalf("writeback calls %v, want %v", calls, want)
	}
}

// TestRemovePartialsDirectory: what .partial holds besides resumable
// uploads (a directory named like one, names that are no upload id) goes
// whatever keep says, and RemovePartials(nil) empties the directory but
// keeps it, since Create needs it.
func TestRemovePartialsDirectory(t *testing.T) {
	needProcFDs(t)
	ctx := t.Context()
	f, dir := openTemp(t)
	pdir := filepath.Join(dir, partialDir)
	live := imagestore.NewUploadID()
	liveDir := imagestore.NewUploadID() // named like a live upload, but a directory
	blobtest.Partial(t, f, live, []byte("live upload"))
	if err := os.MkdirAll(filepath.Join(pdir, liveDir, "x"), dirMode); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"junk", strings.ToUpper(live), live + ".tmp"} {
		if err := os.WriteFile(filepath.Join(pdir, name), nil, fileMode); err != nil {
			t.Fatal(err)
		}
	}
	n, err := f.RemovePartials(ctx, func(string) bool { return true })
	if err != nil || n != 4 {
		t.Fatalf("RemovePartials keeping every id = %d, %v; want the 4 that are no upload removed", n, err)
	}
	left, err := os.ReadDir(pdir)
	if err != nil || len(left) != 1 || left[0].Name() != live {
		t.Fatalf(".partial after RemovePartials = %v, %v; want only the live upload", left, err)
	}

	if n, err := f.RemovePartials(ctx, nil); err != nil || n != 1 {
		t.Fatalf("RemovePartials(nil) = %d, %v; want 1", n, err)
	}
	if left, err := os.ReadDir(pdir); err != nil || len(left) != 0 {
		t.Errorf(".partial after RemovePartials(nil) = %v, %v; want an empty directory", left, err)
	}
	blobtest.Put(t, f, imagestore.NewUploadID(), []byte("after the sweep"))
	if fds := openFDsUnder(t, dir); len(fds) != 0 {
		t.Errorf("descriptors left open: %v", fds)
	}
}
