// Package blobtest is the one suite every imagestore.Blobs passes (blobfs
// on files, s3 on an object store): the behaviour the gateway relies on,
// stated once. Each implementation's own tests add what only it has
// (descriptors, fsync windows; parts, replicas).
//
// Resume is asked only at offsets a Sync made durable (or 0), as the
// gateway does: it records an offset only after Sync. blobfs resumes at any
// offset up to its file's size; s3 cannot read back a part it sent, so it
// resumes only where a Sync kept the part's tail, and the suite holds both
// to the narrower contract.
package blobtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Target is one Blobs under test.
type Target struct {
	// Blobs is fresh and empty.
	Blobs imagestore.Blobs
	// Reopen opens the same storage again, as the next process (or
	// another replica) would.
	Reopen func(t *testing.T) imagestore.Blobs
	// Unit is the size at which the implementation's write path changes
	// gear (S3's part size; any for files): blobs are sized around it.
	Unit int
	// Capacity, if not zero, is what Available answers for the empty
	// store, and Available is checked to move by the bytes stored. Zero:
	// Available is a disk's free space, shared with others, and only
	// checked to answer.
	Capacity int64
	// Break, if set, makes the storage fail every write from now on
	// (true) or work again (false).
	Break func(broken bool)
}

// Run runs the suite; open is called once per subtest.
func Run(t *testing.T, open func(t *testing.T) Target) {
	tests := []struct {
		name string
		fn   func(t *testing.T, tg Target)
	}{
		{"CommitLifecycle", testCommitLifecycle},
		{"EmptyBlob", testEmptyBlob},
		{"Abort", testAbort},
		{"NoOverwrite", testNoOverwrite},
		{"CommitCanceled", testCommitCanceled},
		{"InvalidIDs", testInvalidIDs},
		{"List", testList},
		{"Section", testSection},
		{"SyncCloseResume", testSyncCloseResume},
		{"ResumeReadsHead", testResumeReadsHead},
		{"ResumeCuts", testResumeCuts},
		{"ResumeErrors", testResumeErrors},
		{"FailedWriteIsFinal", testFailedWriteIsFinal},
		{"CloseAfterEnd", testCloseAfterEnd},
		{"RemovePartial", testRemovePartial},
		{"RemovePartialsKeep", testRemovePartialsKeep},
		{"Quarantine", testQuarantine},
		{"QuarantinedEmpty", testQuarantinedEmpty},
		{"Available", testAvailable},
		{"StoreID", testStoreID},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t)) })
	}
}

// Pattern returns n bytes that differ from another seed's, so that a
// misplaced or repeated chunk shows in a hash.
func Pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i*31+i>>8) ^ byte(i>>16)
	}
	return b
}

// Put writes and commits one blob.
func Put(t *testing.T, b imagestore.Blobs, id string, data []byte) {
	t.Helper()
	ctx := context.Background()
	w, err := b.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// Partial writes data to a new blob, syncs it and closes the writer, as an
// upload request that ends early does.
func Partial(t *testing.T, b imagestore.Blobs, id string, data []byte) {
	t.Helper()
	w, err := b.Create(context.Background(), id)
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

// Committed returns the committed blob's bytes, read with one Section.
func Committed(t *testing.T, b imagestore.Blobs, id string) []byte {
	t.Helper()
	bl, err := b.Open(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Close()
	r, err := bl.Section(0, bl.Size())
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func sum(parts ...[]byte) [32]byte {
	return sha256.Sum256(slices.Concat(parts...))
}

func testCommitLifecycle(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
	id := imagestore.NewUploadID()
	data := Pattern(9, 2*tg.Unit+1234)

	w, err := f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// Writes of every size, crossing the unit.
	for _, cut := range [][2]int{{0, 3000}, {3000, tg.Unit + 1}, {tg.Unit + 1, len(data)}} {
		if n, err := w.Write(data[cut[0]:cut[1]]); err != nil || n != cut[1]-cut[0] {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	// Invisible until Commit.
	if _, err := f.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Fatalf("Open before commit: %v, want ErrNotFound", err)
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("List before commit = %v, %v; want none", ids, err)
	}
	// ReadAt after the last byte reads it back, with io.EOF at the end.
	got := make([]byte, 16)
	if n, err := w.ReadAt(got, 8); err != nil || n != 16 || !bytes.Equal(got, data[8:24]) {
		t.Fatalf("ReadAt = %d, %v, %q", n, err, got)
	}
	if n, err := w.ReadAt(got, int64(len(data))-4); err != io.EOF || n != 4 || !bytes.Equal(got[:4], data[len(data)-4:]) {
		t.Fatalf("ReadAt across the end = %d, %v; want the last 4 bytes and io.EOF", n, err)
	}
	if n, err := w.ReadAt(got, int64(len(data))); err != io.EOF || n != 0 {
		t.Fatalf("ReadAt at the end = %d, %v; want 0, io.EOF", n, err)
	}
	whole := make([]byte, len(data))
	if n, err := w.ReadAt(whole, 0); err != nil || n != len(data) || !bytes.Equal(whole, data) {
		t.Fatalf("ReadAt of everything = %d, %v", n, err)
	}
	if _, err := f.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Fatalf("Open after ReadAt, before commit: %v, want ErrNotFound", err)
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("List after ReadAt, before commit = %v, %v; want none", ids, err)
	}

	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(); err != nil {
		t.Errorf("Abort after Commit: %v", err)
	}
	if _, err := w.Write([]byte("x")); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Write after Commit: %v", err)
	}
	if err := w.Commit(ctx); err == nil {
		t.Error("second Commit succeeded")
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close after Commit: %v", err)
	}

	b, err := f.Open(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Size() != int64(len(data)) {
		t.Errorf("Size = %d, want %d", b.Size(), len(data))
	}
	if b.ModTime().IsZero() {
		t.Error("zero ModTime")
	}
	all := make([]byte, len(data))
	if n, err := b.ReadAt(all, 0); err != nil || n != len(data) || !bytes.Equal(all, data) {
		t.Fatalf("ReadAt = %d, %v", n, err)
	}
	if n, err := b.ReadAt(got, int64(len(data))-3); err != io.EOF || n != 3 {
		t.Fatalf("ReadAt across the end = %d, %v", n, err)
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 1 || ids[0] != id {
		t.Fatalf("List = %v, %v", ids, err)
	}
	// Another process sees it the same.
	if tg.Reopen != nil {
		if got := Committed(t, tg.Reopen(t), id); !bytes.Equal(got, data) {
			t.Fatalf("reopened store reads %d other bytes", len(got))
		}
	}

	if err := f.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := f.Delete(ctx, id); err != nil {
		t.Fatalf("Delete of a missing blob: %v", err)
	}
	if _, err := f.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Fatalf("Open after Delete: %v", err)
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("List after Delete = %v, %v", ids, err)
	}
}

func testEmptyBlob(t *testing.T, tg Target) {
	ctx := context.Background()
	id := imagestore.NewUploadID()
	w, err := tg.Blobs.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.ReadAt(make([]byte, 1), 0); n != 0 || err != io.EOF {
		t.Fatalf("ReadAt of an empty blob = %d, %v; want 0, io.EOF", n, err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := tg.Blobs.Open(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Size() != 0 {
		t.Errorf("Size = %d", b.Size())
	}
	r, err := b.Section(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(r); err != nil || len(got) != 0 {
		t.Errorf("Section(0, 0) read %d bytes, %v", len(got), err)
	}
}

func testAbort(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
	id := imagestore.NewUploadID()
	w, err := f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(Pattern(1, tg.Unit+10)); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // idempotent
		if err := w.Abort(); err != nil {
			t.Fatalf("Abort #%d: %v", i, err)
		}
	}
	if err := w.Commit(ctx); err == nil {
		t.Error("Commit after Abort succeeded")
	}
	if _, err := f.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Open after Abort: %v", err)
	}
	if _, err := f.Resume(ctx, id, 0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Resume after Abort: %v, want ErrNotFound", err)
	}
	if n, err := f.RemovePartials(ctx, nil); err != nil || n != 0 {
		t.Errorf("RemovePartials after Abort = %d, %v; want nothing left behind", n, err)
	}
	// The id can be used again after an abort.
	Put(t, f, id, []byte("second try"))
	if got := Committed(t, f, id); string(got) != "second try" {
		t.Errorf("after abort and retry: %q", got)
	}
}

func testNoOverwrite(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
	id := imagestore.NewUploadID()
	w1, err := f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Create(ctx, id); !errors.Is(err, imagestore.ErrExists) {
		t.Fatalf("second Create: %v, want ErrExists", err)
	}
	if _, err := w1.Write([]byte("first")); err != nil {
		t.Fatal(err)
	}
	if err := w1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Create(ctx, id); !errors.Is(err, imagestore.ErrExists) {
		t.Fatalf("Create of committed id: %v, want ErrExists", err)
	}
	if _, err := f.Resume(ctx, id, 0); !errors.Is(err, imagestore.ErrExists) {
		t.Fatalf("Resume of committed id: %v, want ErrExists", err)
	}
	if got := Committed(t, f, id); string(got) != "first" {
		t.Fatalf("committed blob = %q; want it untouched", got)
	}
}

func testCommitCanceled(t *testing.T, tg Target) {
	f := tg.Blobs
	id := imagestore.NewUploadID()
	w, err := f.Create(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("bytes")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Commit(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Commit with canceled ctx: %v", err)
	}
	if err := w.Commit(context.Background()); err == nil {
		t.Fatal("Commit after a failed Commit succeeded")
	}
	if _, err := f.Open(context.Background(), id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Fatalf("Open after a failed Commit: %v", err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if n, err := f.RemovePartials(context.Background(), nil); err != nil || n != 0 {
		t.Errorf("RemovePartials after Abort = %d, %v; want 0 left behind", n, err)
	}
}

func testInvalidIDs(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
	for _, id := range []string{
		"", "../../../../etc/passwd", "0123456789abcdef0123456/",
		"0123456789ABCDEF01234567", "0123456789abcdef012345678",
		"0123456789abcdef0123456", ".partial", "0123456789abcdef0123456\x00",
	} {
		if _, err := f.Create(ctx, id); err == nil || !strings.Contains(err.Error(), "invalid upload id") {
			t.Errorf("Create(%q) = %v", id, err)
		}
		if _, err := f.Open(ctx, id); err == nil || errors.Is(err, imagestore.ErrNotFound) {
			t.Errorf("Open(%q) = %v, want invalid-id error", id, err)
		}
		if err := f.Delete(ctx, id); err == nil {
			t.Errorf("Delete(%q) succeeded", id)
		}
		if _, err := f.Resume(ctx, id, 0); err == nil || !strings.Contains(err.Error(), "invalid upload id") {
			t.Errorf("Resume(%q) = %v", id, err)
		}
		if err := f.RemovePartial(ctx, id); err == nil || !strings.Contains(err.Error(), "invalid upload id") {
			t.Errorf("RemovePartial(%q) = %v", id, err)
		}
		if err := f.Quarantine(ctx, id); err == nil || errors.Is(err, imagestore.ErrNotFound) {
			t.Errorf("Quarantine(%q) = %v", id, err)
		}
	}
}

func testList(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
	a, b := "aaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbb"
	Put(t, f, b, []byte("b"))
	Put(t, f, a, []byte("a"))
	// Unfinished writes are not listed: open, synced and closed, read back.
	w, err := f.Create(ctx, "dddddddddddddddddddddddd")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	if _, err := w.Write([]byte("open")); err != nil {
		t.Fatal(err)
	}
	Partial(t, f, "eeeeeeeeeeeeeeeeeeeeeeee", []byte("closed"))
	w2, err := f.Create(ctx, "ffffffffffffffffffffffff")
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Abort()
	if _, err := w2.Write([]byte("staged")); err != nil {
		t.Fatal(err)
	}
	if _, err := w2.ReadAt(make([]byte, 6), 0); err != nil {
		t.Fatal(err)
	}
	ids, err := f.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids[0] != a || ids[1] != b {
		t.Fatalf("List = %v, want [%s %s]", ids, a, b)
	}
}

func testSection(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
	id := imagestore.NewUploadID()
	size := int64(tg.Unit + 100000)
	data := Pattern(7, int(size))
	Put(t, f, id, data)
	b, err := f.Open(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []struct{ off, n int64 }{{0, size}, {12345, 1000}, {size - 1, 1}, {size, 0}, {0, 0}, {int64(tg.Unit) - 10, 20}} {
		r, err := b.Section(c.off, c.n)
		if err != nil {
			t.Fatalf("Section(%d, %d): %v", c.off, c.n, err)
		}
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, data[c.off:c.off+c.n]) {
			t.Fatalf("Section(%d, %d) read %d bytes, %v", c.off, c.n, len(got), err)
		}
	}
	for _, c := range []struct{ off, n int64 }{{-1, 1}, {0, -1}, {size + 1, 0}, {size - 1, 2}, {1, 1 << 62}} {
		if _, err := b.Section(c.off, c.n); err == nil {
			t.Errorf("Section(%d, %d) succeeded", c.off, c.n)
		}
	}
}

func testSyncCloseResume(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
	id := imagestore.NewUploadID()
	first, second := Pattern(1, tg.Unit+10000), Pattern(2, tg.Unit+7777)

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
	if err := w.Sync(); err != nil { // nothing new: fine
		t.Fatalf("second Sync: %v", err)
	}
	for i := range 2 { // idempotent
		if err := w.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i, err)
		}
	}
	if _, err := f.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Open of a closed partial: %v, want ErrNotFound", err)
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("List after Close = %v, %v; want none", ids, err)
	}
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

	// The next process resumes it.
	g := f
	if tg.Reopen != nil {
		g = tg.Reopen(t)
	}
	w2, err := g.Resume(ctx, id, int64(len(first)))
	if err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if _, err := w2.Write(second[:5000]); err != nil {
		t.Fatal(err)
	}
	if _, err := w2.Write(second[5000:]); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	if n, err := w2.ReadAt(buf, 50); err != nil || n != 100 || !bytes.Equal(buf, first[50:150]) {
		t.Fatalf("ReadAt after Resume = %d, %v", n, err)
	}
	if err := w2.Commit(ctx); err != nil {
		t.Fatalf("Commit after Resume: %v", err)
	}
	if got := sha256.Sum256(Committed(t, f, id)); got != sum(first, second) {
		t.Errorf("committed sha256 %x, want %x", got, sum(first, second))
	}
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

// testResumeReadsHead: a resumed writer (another process) reads back the
// head of the blob, its first 64 KiB, as the gateway does to re-inspect
// the QCOW2 header, and writing then goes on: reading the head must not
// end the write. Before the first part's end and after it.
func testResumeReadsHead(t *testing.T, tg Target) {
	ctx := context.Background()
	for _, size := range []int{tg.Unit / 2, tg.Unit + 4321} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			id := imagestore.NewUploadID()
			first, second := Pattern(3, size), Pattern(4, 3000)
			w, err := tg.Blobs.Create(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(first); err != nil {
				t.Fatal(err)
			}
			if err := w.Sync(); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			g := tg.Blobs
			if tg.Reopen != nil {
				g = tg.Reopen(t)
			}
			w2, err := g.Resume(ctx, id, int64(len(first)))
			if err != nil {
				t.Fatalf("Resume: %v", err)
			}
			head := make([]byte, 64<<10)
			if n, err := w2.ReadAt(head, 0); err != nil || n != len(head) || !bytes.Equal(head, first[:len(head)]) {
				t.Fatalf("ReadAt of the head after Resume = %d, %v", n, err)
			}
			if _, err := w2.Write(second); err != nil {
				t.Fatalf("Write after reading the head: %v", err)
			}
			if err := w2.Commit(ctx); err != nil {
				t.Fatalf("Commit: %v", err)
			}
			if got := sha256.Sum256(Committed(t, tg.Blobs, id)); got != sum(first, second) {
				t.Errorf("committed sha256 %x, want %x", got, sum(first, second))
			}
		})
	}
}

// testResumeCuts: a writer syncs twice and writes on without syncing;
// Resume at either synced offset (or 0) keeps exactly the bytes below it,
// and what lay past it is gone for good.
func testResumeCuts(t *testing.T, tg Target) {
	ctx := context.Background()
	u := tg.Unit
	a, b, junk, rest := Pattern(3, u+u/2), Pattern(4, u), Pattern(5, u/2+77), Pattern(6, u+4321)
	o1, o2 := int64(len(a)), int64(len(a)+len(b))
	whole := slices.Concat(a, b, junk)
	for _, tc := range []struct {
		name   string
		offset int64
	}{
		{"at the first sync", o1},
		{"at the last sync", o2},
		{"from zero", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tg.Blobs
			id := imagestore.NewUploadID()
			w, err := f.Create(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range [][]byte{a, nil, b, nil, junk} {
				if p == nil {
					if err := w.Sync(); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if _, err := w.Write(p); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			g := f
			if tg.Reopen != nil {
				g = tg.Reopen(t)
			}
			w2, err := g.Resume(ctx, id, tc.offset)
			if err != nil {
				t.Fatal(err)
			}
			if err := w2.Close(); err != nil {
				t.Fatal(err)
			}
			// The cut holds: nothing past the offset can be resumed.
			if tc.offset < o2 {
				if _, err := g.Resume(ctx, id, o2); err == nil || errors.Is(err, imagestore.ErrNotFound) {
					t.Fatalf("Resume at %d after a cut at %d: %v; want an error, not ErrNotFound", o2, tc.offset, err)
				}
			}
			w3, err := g.Resume(ctx, id, tc.offset)
			if err != nil {
				t.Fatal(err)
			}
			defer w3.Abort()
			if _, err := w3.Write(rest); err != nil {
				t.Fatal(err)
			}
			if err := w3.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if got := sha256.Sum256(Committed(t, f, id)); got != sum(whole[:tc.offset], rest) {
				t.Errorf("committed sha256 %x, want %x (the bytes below %d, then the new ones)", got, sum(whole[:tc.offset], rest), tc.offset)
			}
		})
	}
}

func testResumeErrors(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
	id := imagestore.NewUploadID()
	data := Pattern(6, tg.Unit+1000)
	Partial(t, f, id, data)

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
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := f.Resume(canceled, id, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Resume with a canceled context: %v", err)
	}
	// After all that, the partial still resumes, whole.
	w, err := f.Resume(ctx, id, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := Committed(t, f, id); !bytes.Equal(got, data) {
		t.Fatalf("refused Resumes changed the partial: %d bytes differ", len(got))
	}
	// Abort after Resume removes it.
	id = imagestore.NewUploadID()
	Partial(t, f, id, data)
	w, err = f.Resume(ctx, id, int64(len(data)))
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

func testFailedWriteIsFinal(t *testing.T, tg Target) {
	if tg.Break == nil {
		t.Skip("this Blobs cannot be made to fail")
	}
	ctx := context.Background()
	f := tg.Blobs
	id := imagestore.NewUploadID()
	w, err := f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	tg.Break(true)
	broken := true
	defer func() {
		if broken {
			tg.Break(false)
		}
	}()
	chunk := Pattern(8, 1<<20)
	var werr error
	for written := 0; written < max(4*tg.Unit, 64<<20) && werr == nil; written += len(chunk) {
		_, werr = w.Write(chunk)
	}
	if werr == nil {
		t.Fatal("writes to broken storage never failed")
	}
	tg.Break(false)
	broken = false
	// The storage works again; the writer does not: a byte may be missing.
	if _, err := w.Write([]byte("x")); err == nil {
		t.Error("Write after a failed Write succeeded")
	}
	for i := range 2 {
		if err := w.Sync(); err == nil {
			t.Fatalf("Sync #%d after a failed Write succeeded", i)
		}
	}
	if err := w.Commit(ctx); err == nil {
		t.Fatal("Commit after a failed Write succeeded")
	}
	if _, err := f.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Open after a failed write: %v", err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Resume(ctx, id, 0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Resume after Abort: %v, want ErrNotFound", err)
	}
}

func testCloseAfterEnd(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
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
	if _, err := f.Resume(ctx, id, 0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Resume after Abort + Close: %v, want ErrNotFound", err)
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
	if _, err := f.Resume(ctx, id, 0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Resume after failed Commit + Close + Abort: %v, want ErrNotFound", err)
	}
}

func testRemovePartial(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
	id, other := imagestore.NewUploadID(), imagestore.NewUploadID()
	Partial(t, f, id, Pattern(1, tg.Unit+5))
	Partial(t, f, other, []byte("other"))
	for i := range 2 { // a missing one is fine
		if err := f.RemovePartial(ctx, id); err != nil {
			t.Fatalf("RemovePartial #%d: %v", i, err)
		}
	}
	if _, err := f.Resume(ctx, id, 0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Resume after RemovePartial: %v, want ErrNotFound", err)
	}
	w, err := f.Resume(ctx, other, 5)
	if err != nil {
		t.Fatalf("RemovePartial removed another id's partial: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// It never touches committed blobs.
	done := imagestore.NewUploadID()
	Put(t, f, done, []byte("done"))
	if err := f.RemovePartial(ctx, done); err != nil {
		t.Fatal(err)
	}
	if got := Committed(t, f, done); string(got) != "done" {
		t.Errorf("committed blob after RemovePartial of its id: %q", got)
	}
}

func testRemovePartialsKeep(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
	live, dead := imagestore.NewUploadID(), imagestore.NewUploadID()
	liveData := Pattern(2, tg.Unit+3)
	Partial(t, f, live, liveData)
	Partial(t, f, dead, []byte("dead upload"))
	done := imagestore.NewUploadID()
	Put(t, f, done, []byte("committed"))

	// The next start-up.
	g := f
	if tg.Reopen != nil {
		g = tg.Reopen(t)
	}
	var asked []string
	keep := func(id string) bool {
		asked = append(asked, id)
		return id != dead
	}
	n, err := g.RemovePartials(ctx, keep)
	if err != nil || n != 1 {
		t.Fatalf("RemovePartials = %d, %v; want 1 removed", n, err)
	}
	for _, id := range asked {
		if !imagestore.ValidUploadID(id) {
			t.Errorf("keep asked about %q, not an upload id", id)
		}
	}
	if _, err := g.Resume(ctx, dead, 0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Resume of the removed partial: %v, want ErrNotFound", err)
	}
	if ids, err := g.List(ctx); err != nil || len(ids) != 1 || ids[0] != done {
		t.Errorf("committed blobs after RemovePartials = %v, %v; want [%s]", ids, err, done)
	}
	// The survivor resumes with its bytes.
	w, err := g.Resume(ctx, live, int64(len(liveData)))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := g.RemovePartials(ctx, nil); err != nil || n != 1 {
		t.Fatalf("RemovePartials(nil) = %d, %v; want 1", n, err)
	}
	if n, err := g.RemovePartials(ctx, nil); err != nil || n != 0 {
		t.Fatalf("second RemovePartials(nil) = %d, %v; want 0", n, err)
	}
	if got := Committed(t, g, done); string(got) != "committed" {
		t.Errorf("committed blob after the sweeps: %q", got)
	}
	Put(t, g, imagestore.NewUploadID(), []byte("after the sweep"))
}

func testQuarantine(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
	id := imagestore.NewUploadID()
	data := Pattern(3, tg.Unit+999)
	Put(t, f, id, data)

	if err := f.Quarantine(ctx, imagestore.NewUploadID()); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Quarantine of a missing blob: %v, want ErrNotFound", err)
	}
	// An unfinished blob is not committed: nothing to quarantine.
	unfinished := imagestore.NewUploadID()
	Partial(t, f, unfinished, []byte("in flight"))
	if err := f.Quarantine(ctx, unfinished); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Quarantine of an unfinished blob: %v, want ErrNotFound", err)
	}
	if w, err := f.Resume(ctx, unfinished, 9); err != nil {
		t.Errorf("the unfinished blob after Quarantine's refusal: %v", err)
	} else {
		w.Close()
	}

	if err := f.Quarantine(ctx, id); err != nil {
		t.Fatalf("Quarantine: %v", err)
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("List after Quarantine = %v, %v; want nothing", ids, err)
	}
	if _, err := f.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Open after Quarantine: %v, want ErrNotFound", err)
	}
	q, err := f.Quarantined(ctx)
	if err != nil || len(q) != 1 || q[0].ID != id || q[0].Size != int64(len(data)) || q[0].QuarantinedAt.IsZero() {
		t.Fatalf("Quarantined = %+v, %v; want %s of %d bytes", q, err, id, len(data))
	}

	// A second blob with the same id never replaces the first.
	Put(t, f, id, []byte("other"))
	if err := f.Quarantine(ctx, id); !errors.Is(err, imagestore.ErrExists) {
		t.Errorf("second Quarantine of %s: %v, want ErrExists", id, err)
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 1 {
		t.Errorf("the second blob must stay where it was: List = %v, %v", ids, err)
	}
	if q, err := f.Quarantined(ctx); err != nil || len(q) != 1 || q[0].Size != int64(len(data)) {
		t.Errorf("the first quarantined blob was replaced: %+v, %v", q, err)
	}

	if err := f.RemoveQuarantined(ctx, imagestore.NewUploadID()); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("RemoveQuarantined of a missing blob: %v, want ErrNotFound", err)
	}
	if err := f.RemoveQuarantined(ctx, id); err != nil {
		t.Fatalf("RemoveQuarantined: %v", err)
	}
	if q, err := f.Quarantined(ctx); err != nil || len(q) != 0 {
		t.Errorf("Quarantined after removal = %+v, %v", q, err)
	}
	if got := Committed(t, f, id); string(got) != "other" {
		t.Errorf("the second blob after RemoveQuarantined: %q", got)
	}
}

func testQuarantinedEmpty(t *testing.T, tg Target) {
	if q, err := tg.Blobs.Quarantined(context.Background()); err != nil || len(q) != 0 {
		t.Errorf("Quarantined = %v, %v; want empty", q, err)
	}
}

func testAvailable(t *testing.T, tg Target) {
	ctx := context.Background()
	f := tg.Blobs
	avail := func(when string) int64 {
		t.Helper()
		n, err := f.Available(ctx)
		if err != nil || n <= 0 {
			t.Fatalf("Available %s = %d, %v", when, n, err)
		}
		return n
	}
	if tg.Capacity == 0 {
		avail("")
		return
	}
	c := tg.Capacity
	if got := avail("when empty"); got != c {
		t.Fatalf("Available of the empty store = %d, want the capacity %d", got, c)
	}
	id := imagestore.NewUploadID()
	data := Pattern(1, 2*tg.Unit+10)
	Put(t, f, id, data)
	n := int64(len(data))
	if got := avail("after a commit"); got != c-n {
		t.Fatalf("Available after committing %d bytes = %d, want %d", n, got, c-n)
	}
	// Unfinished bytes count too, the ones in flight included.
	w, err := f.Create(ctx, imagestore.NewUploadID())
	if err != nil {
		t.Fatal(err)
	}
	part := Pattern(2, tg.Unit+tg.Unit/2)
	if _, err := w.Write(part); err != nil {
		t.Fatal(err)
	}
	if got := avail("while writing"); got > c-n-int64(len(part)) {
		t.Fatalf("Available with %d bytes being written = %d, want at most %d", len(part), got, c-n-int64(len(part)))
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := avail("after a sync"); got > c-n-int64(len(part)) {
		t.Fatalf("Available with %d bytes synced = %d, want at most %d", len(part), got, c-n-int64(len(part)))
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if got := avail("after Abort"); got != c-n {
		t.Fatalf("Available after Abort = %d, want %d back", got, c-n)
	}
	// Quarantined bytes are still stored.
	if err := f.Quarantine(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := avail("after Quarantine"); got != c-n {
		t.Fatalf("Available after Quarantine = %d, want %d", got, c-n)
	}
	if err := f.RemoveQuarantined(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := avail("after RemoveQuarantined"); got != c {
		t.Fatalf("Available after RemoveQuarantined = %d, want all %d", got, c)
	}
}

// testStoreID: fresh blobs carry no store id; one written is read back by
// the next process, replaces the one before, is no image (List, the
// partials' sweep and quarantine leave it alone), and a malformed one is
// refused.
func testStoreID(t *testing.T, tg Target) {
	ctx := context.Background()
	b := tg.Blobs
	if id, err := b.StoreID(ctx); err != nil || id != "" {
		t.Fatalf("StoreID of fresh blobs = %q, %v; want none", id, err)
	}
	if err := b.SetStoreID(ctx, "../not-an-id"); err == nil {
		t.Errorf("SetStoreID of a malformed id: no error")
	}
	first, second := imagestore.NewStoreID(), imagestore.NewStoreID()
	if err := b.SetStoreID(ctx, first); err != nil {
		t.Fatalf("SetStoreID: %v", err)
	}
	if err := b.SetStoreID(ctx, second); err != nil {
		t.Fatalf("SetStoreID again: %v", err)
	}
	if _, err := b.RemovePartials(ctx, nil); err != nil {
		t.Fatal(err)
	}
	again := tg.Reopen(t)
	if id, err := again.StoreID(ctx); err != nil || id != second {
		t.Errorf("StoreID after a reopen = %q, %v; want the last written %q", id, err, second)
	}
	if ids, err := again.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("List beside a store id = %v, %v; want no image", ids, err)
	}
	if q, err := again.Quarantined(ctx); err != nil || len(q) != 0 {
		t.Errorf("Quarantined beside a store id = %v, %v; want none", q, err)
	}
}
