package blobfs

import (
	"bytes"
	"context"
	"crypto/sha256"
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
)

// pattern returns n bytes that differ from seed's, so that a misplaced or
// repeated chunk shows in the final hash.
func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i*31+i>>8)
	}
	return b
}

// partialFile writes data to a new partial blob id and closes the writer
// without committing, as an upload request that ends early does.
func partialFile(t *testing.T, f *FS, id string, data []byte) {
	t.Helper()
	w, err := f.Create(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// committed returns the committed blob's bytes.
func committed(t *testing.T, f *FS, id string) []byte {
	t.Helper()
	b, err := f.Open(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r, err := b.Section(0, b.Size())
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestSyncCloseResume(t *testing.T) {
	needProcFDs(t)
	ctx := context.Background()
	f, dir := openTemp(t)
	id := imagestore.NewUploadID()
	first, second := pattern(1, 10000), pattern(2, 7777)
	partial := filepath.Join(dir, ".partial", id)

	w, err := f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(first); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	for i := range 2 { // idempotent
		if err := w.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i, err)
		}
	}
	if fds := openFDsUnder(t, dir); len(fds) != 0 {
		t.Errorf("descriptors left open after Close: %v", fds)
	}
	// The partial is kept, whole, and still invisible.
	if got, err := os.ReadFile(partial); err != nil || !bytes.Equal(got, first) {
		t.Fatalf("partial after Close: %d bytes, %v; want the %d written", len(got), err, len(first))
	}
	if _, err := f.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Open of a closed partial: %v, want ErrNotFound", err)
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("List after Close = %v, %v; want none", ids, err)
	}
	// The closed writer is done.
	if _, err := w.Write([]byte("x")); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Write after Close: %v, want os.ErrClosed", err)
	}
	if err := w.Sync(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Sync after Close: %v, want os.ErrClosed", err)
	}
	if err := w.Commit(ctx); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Commit after Close: %v, want os.ErrClosed", err)
	}
	if _, err := w.ReadAt(make([]byte, 1), 0); !errors.Is(err, os.ErrClosed) {
		t.Errorf("ReadAt after Close: %v, want os.ErrClosed", err)
	}
	if got, err := os.ReadFile(partial); err != nil || !bytes.Equal(got, first) {
		t.Fatalf("refused calls after Close touched the partial: %d bytes, %v", len(got), err)
	}

	w2, err := f.Resume(ctx, id, int64(len(first)))
	if err != nil {
		t.Fatalf("Resume: %v", err)
	}
	// ReadAt sees the bytes of the earlier writer.
	buf := make([]byte, 100)
	if n, err := w2.ReadAt(buf, 50); err != nil || n != 100 || !bytes.Equal(buf, first[50:150]) {
		t.Fatalf("ReadAt after Resume = %d, %v", n, err)
	}
	if _, err := w2.Write(second[:5000]); err != nil {
		t.Fatal(err)
	}
	if _, err := w2.Write(second[5000:]); err != nil {
		t.Fatal(err)
	}
	if err := w2.Commit(ctx); err != nil {
		t.Fatalf("Commit after Resume: %v", err)
	}
	want := sha256.Sum256(append(slices.Clone(first), second...))
	if got := sha256.Sum256(committed(t, f, id)); got != want {
		t.Errorf("committed sha256 %x, want %x", got, want)
	}
	if fds := openFDsUnder(t, dir); len(fds) != 0 {
		t.Errorf("descriptors left open after Commit: %v", fds)
	}
	if _, err := os.Stat(partial); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("partial after Commit: %v", err)
	}
	// The first writer's Close/Abort have nothing left to do.
	if err := w.Close(); err != nil {
		t.Errorf("Close of the old writer: %v", err)
	}
	if err := w2.Close(); err != nil {
		t.Errorf("Close after Commit: %v", err)
	}
	if _, err := f.Resume(ctx, id, 0); !errors.Is(err, imagestore.ErrExists) {
		t.Errorf("Resume of a committed blob: %v, want ErrExists", err)
	}
}

func TestResumeCutsTail(t *testing.T) {
	needProcFDs(t)
	ctx := context.Background()
	f, dir := openTemp(t)
	prefix, junk, rest := pattern(3, 5000), pattern(4, 3000), pattern(5, 4321)
	partial := func(id string) string { return filepath.Join(dir, ".partial", id) }

	tests := []struct {
		name   string
		offset int64
	}{
		{"mid-file", int64(len(prefix))},
		{"at the end", int64(len(prefix) + len(junk))},
		{"from zero", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := imagestore.NewUploadID()
			// Synced prefix, then bytes that were never recorded.
			partialFile(t, f, id, append(slices.Clone(prefix), junk...))
			whole := append(slices.Clone(prefix), junk...)

			w, err := f.Resume(ctx, id, tc.offset)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Abort()
			// Cut at once, on disk, before any write.
			st, err := os.Stat(partial(id))
			if err != nil || st.Size() != tc.offset {
				t.Fatalf("partial after Resume: %v, %v; want %d bytes", st, err, tc.offset)
			}
			buf := make([]byte, 20)
			if n, err := w.ReadAt(buf, tc.offset); n != 0 || err != io.EOF {
				t.Errorf("ReadAt at the offset = %d, %v; want 0, io.EOF", n, err)
			}
			if _, err := w.Write(rest); err != nil {
				t.Fatal(err)
			}
			if err := w.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			want := sha256.Sum256(append(slices.Clone(whole[:tc.offset]), rest...))
			if got := sha256.Sum256(committed(t, f, id)); got != want {
				t.Errorf("committed sha256 %x, want %x (prefix + new bytes)", got, want)
			}
		})
	}
	if fds := openFDsUnder(t, dir); len(fds) != 0 {
		t.Errorf("descriptors left open: %v", fds)
	}
}

func TestResumeErrors(t *testing.T) {
	needProcFDs(t)
	ctx := context.Background()
	f, dir := openTemp(t)
	id := imagestore.NewUploadID()
	data := pattern(6, 1000)
	partialFile(t, f, id, data)
	untouched := func(when string) {
		t.Helper()
		if got, err := os.ReadFile(filepath.Join(dir, ".partial", id)); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: partial is %d bytes, %v; want it untouched", when, len(got), err)
		}
		if fds := openFDsUnder(t, dir); len(fds) != 0 {
			t.Errorf("%s: descriptors left open: %v", when, fds)
		}
	}

	if _, err := f.Resume(ctx, imagestore.NewUploadID(), 0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Resume of a missing partial: %v, want ErrNotFound", err)
	}
	for _, off := range []int64{int64(len(data)) + 1, 1 << 40, -1} {
		_, err := f.Resume(ctx, id, off)
		if err == nil {
			t.Fatalf("Resume at %d of %d bytes succeeded", off, len(data))
		}
		if errors.Is(err, imagestore.ErrNotFound) {
			t.Errorf("Resume at %d: %v, must not look like a missing partial", off, err)
		}
		untouched(fmt.Sprintf("Resume at %d", off))
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := f.Resume(canceled, id, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Resume with a canceled context: %v", err)
	}
	untouched("Resume canceled")

	// A directory where a partial should be is not resumable.
	odd := imagestore.NewUploadID()
	if err := os.Mkdir(filepath.Join(dir, ".partial", odd), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Resume(ctx, odd, 0); err == nil || errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Resume of a directory: %v", err)
	}

	// After all that, the partial still resumes.
	w, err := f.Resume(ctx, id, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Resume(ctx, id, 0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Resume after Abort: %v, want ErrNotFound", err)
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
	partialFile(t, f, id, nil)
	// A sparse 40 MiB partial: the bytes' content does not matter here.
	const offset = 40 << 20
	if err := os.Truncate(filepath.Join(dir, ".partial", id), offset); err != nil {
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

func TestSyncAfterFailedWrite(t *testing.T) {
	needProcFDs(t)
	ctx := context.Background()
	f, dir := openTemp(t)
	f.syncRange = func(*os.File, int64, int64) error { return syscall.EIO }
	id := imagestore.NewUploadID()
	w, err := f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(make([]byte, writebackWindow)); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Write with failing writeback: %v, want EIO", err)
	}
	// The failed write is final: Sync must not report the bytes durable.
	for i := range 2 {
		if err := w.Sync(); !errors.Is(err, syscall.EIO) {
			t.Fatalf("Sync #%d after a failed write: %v, want EIO", i, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Sync after Close: %v, want os.ErrClosed", err)
	}
	// Abort after Close removes the partial.
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".partial", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("partial after Close + Abort: %v", err)
	}
	if fds := openFDsUnder(t, dir); len(fds) != 0 {
		t.Errorf("descriptors left open: %v", fds)
	}
}

func TestCloseAfterEnd(t *testing.T) {
	needProcFDs(t)
	ctx := context.Background()
	f, dir := openTemp(t)

	// Close after Abort: nothing to keep, nothing recreated.
	id := imagestore.NewUploadID()
	w, err := f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close after Abort: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".partial", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("partial after Abort + Close: %v", err)
	}

	// Close after a failed Commit leaves Abort's cleanup possible.
	id = imagestore.NewUploadID()
	w, err = f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := w.Commit(canceled); err == nil {
		t.Fatal("Commit with a canceled context succeeded")
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close after a failed Commit: %v", err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".partial", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("partial after failed Commit + Close + Abort: %v", err)
	}
	if fds := openFDsUnder(t, dir); len(fds) != 0 {
		t.Errorf("descriptors left open: %v", fds)
	}
}

func TestRemovePartial(t *testing.T) {
	ctx := context.Background()
	f, dir := openTemp(t)
	id, other := imagestore.NewUploadID(), imagestore.NewUploadID()
	partialFile(t, f, id, []byte("unfinished"))
	partialFile(t, f, other, []byte("other"))

	for i := range 2 { // a missing one is fine
		if err := f.RemovePartial(ctx, id); err != nil {
			t.Fatalf("RemovePartial #%d: %v", i, err)
		}
	}
	if _, err := f.Resume(ctx, id, 0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Resume after RemovePartial: %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".partial", other)); err != nil {
		t.Errorf("RemovePartial removed another id's partial: %v", err)
	}
	// It never touches committed blobs.
	done := imagestore.NewUploadID()
	put(t, f, done, []byte("done"))
	if err := f.RemovePartial(ctx, done); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, f, done); string(got) != "done" {
		t.Errorf("committed blob after RemovePartial of its id: %q", got)
	}
}

func TestRemovePartialsKeep(t *testing.T) {
	needProcFDs(t)
	ctx := context.Background()
	f, dir := openTemp(t)
	pdir := filepath.Join(dir, ".partial")
	live, dead := imagestore.NewUploadID(), imagestore.NewUploadID()
	liveDir := imagestore.NewUploadID() // named like a live upload, but a directory
	partialFile(t, f, live, []byte("live upload"))
	partialFile(t, f, dead, []byte("dead upload"))
	if err := os.MkdirAll(filepath.Join(pdir, liveDir, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	strangers := []string{"junk", strings.ToUpper(live), live + ".tmp"}
	for _, name := range strangers {
		if err := os.WriteFile(filepath.Join(pdir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	put(t, f, imagestore.NewUploadID(), []byte("committed"))

	// keep says yes to all but one id; that saves neither the directory
	// nor the strangers, which are not resumable uploads at all.
	var asked []string
	keep := func(id string) bool {
		asked = append(asked, id)
		return id != dead
	}
	n, err := f.RemovePartials(ctx, keep)
	if err != nil || n != 5 {
		t.Fatalf("RemovePartials = %d, %v; want 5 removed", n, err)
	}
	for _, id := range asked {
		if !imagestore.ValidUploadID(id) {
			t.Errorf("keep asked about %q, not an upload id", id)
		}
	}
	left, err := os.ReadDir(pdir)
	if err != nil || len(left) != 1 || left[0].Name() != live {
		t.Fatalf(".partial after RemovePartials = %v, %v; want only the live upload", left, err)
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 1 {
		t.Errorf("committed blobs after RemovePartials = %v, %v; want the one committed", ids, err)
	}
	// The survivor resumes with its bytes.
	w, err := f.Resume(ctx, live, int64(len("live upload")))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	// keep nil keeps nothing.
	if n, err := f.RemovePartials(ctx, nil); err != nil || n != 1 {
		t.Fatalf("RemovePartials(nil) = %d, %v; want 1", n, err)
	}
	// Emptied, not removed: Create needs the directory.
	if left, err := os.ReadDir(pdir); err != nil || len(left) != 0 {
		t.Errorf(".partial after RemovePartials(nil) = %v, %v; want an empty directory", left, err)
	}
	put(t, f, imagestore.NewUploadID(), []byte("after the sweep"))
	if fds := openFDsUnder(t, dir); len(fds) != 0 {
		t.Errorf("descriptors left open: %v", fds)
	}
}
