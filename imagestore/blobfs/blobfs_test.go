package blobfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

func openTemp(t *testing.T) (*FS, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "vm-images")
	f, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return f, dir
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

// put writes and commits one blob.
func put(t *testing.T, f *FS, id string, data []byte) {
	t.Helper()
	w, err := f.Create(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// procFDs is where the kernel lists the process's open descriptors.
const procFDs = "/proc/self/fd"

// needProcFDs is the first call of every test that uses openFDsUnder: it
// decides before the test does anything whether the descriptor checks can
// run. Without procfs the test fails under CI=true and is skipped, saying
// so, elsewhere; it never skips halfway, after some checks passed.
func needProcFDs(t *testing.T) {
	t.Helper()
	if _, err := os.ReadDir(procFDs); err != nil {
		msg := fmt.Sprintf("%s is unreadable (%v): this test proves descriptors are closed by listing them there; "+
			"mount procfs (mount -t proc proc /proc) or run it on a Linux host that has it", procFDs, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// openFDsUnder lists the process's open descriptors pointing under dir, to
// prove that Commit and Abort close their file. The test called
// needProcFDs first, so a failure to list them here is a failure.
func openFDsUnder(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(procFDs)
	if err != nil {
		t.Fatalf("listing open descriptors: %v", err)
	}
	var out []string
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(procFDs, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // closed since ReadDir (ReadDir's own descriptor, for one)
		}
		if err != nil {
			t.Fatalf("reading descriptor %s: %v", e.Name(), err)
		}
		if strings.HasPrefix(target, dir+"/") {
			out = append(out, target)
		}
	}
	return out
}

func TestOpenModes(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "vm-images")
	// Pre-existing, too open directories are tightened.
	if err := os.MkdirAll(filepath.Join(dir, ".partial"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, ".partial"), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Join(dir, ".partial")} {
		if m := mode(t, d); m != 0o700 {
			t.Errorf("%s: mode %o, want 700", d, m)
		}
	}

	id := imagestore.NewUploadID()
	w, err := f.Create(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if m := mode(t, filepath.Join(dir, ".partial", id)); m != 0o600 {
		t.Errorf("partial mode %o, want 600", m)
	}
	if err := w.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, filepath.Join(dir, id+".qcow2")); m != 0o600 {
		t.Errorf("blob mode %o, want 600", m)
	}

	// A fresh directory is created 0700 too.
	fresh := filepath.Join(base, "fresh", "vm-images")
	if _, err := Open(fresh); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, fresh); m != 0o700 {
		t.Errorf("fresh dir mode %o", m)
	}
	if m := mode(t, filepath.Join(fresh, ".partial")); m != 0o700 {
		t.Errorf("fresh partial mode %o", m)
	}

	// A file where the directory should be is an error.
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(file); err == nil {
		t.Error("Open on a file succeeded")
	}
}

func TestCommitLifecycle(t *testing.T) {
	needProcFDs(t)
	ctx := context.Background()
	f, dir := openTemp(t)
	id := imagestore.NewUploadID()
	data := bytes.Repeat([]byte("vmshelf!"), 1000)

	w, err := f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data[:3000]); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data[3000:]); err != nil {
		t.Fatal(err)
	}

	// Invisible until Commit.
	if _, err := f.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Fatalf("Open before commit: %v, want ErrNotFound", err)
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("List before commit = %v, %v; want none", ids, err)
	}

	// ReadAt reads the partial file back, with io.EOF at the end.
	got := make([]byte, 16)
	if n, err := w.ReadAt(got, 8); err != nil || n != 16 || !bytes.Equal(got, data[8:24]) {
		t.Fatalf("ReadAt = %d, %v, %q", n, err, got)
	}
	if n, err := w.ReadAt(got, int64(len(data))-4); err != io.EOF || n != 4 || !bytes.Equal(got[:4], data[len(data)-4:]) {
		t.Fatalf("ReadAt across the end = %d, %v; want the last 4 bytes and io.EOF", n, err)
	}

	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if fds := openFDsUnder(t, dir); len(fds) != 0 {
		t.Errorf("descriptors left open after Commit: %v", fds)
	}
	// Abort after a successful Commit is a no-op; writes are refused.
	if err := w.Abort(); err != nil {
		t.Errorf("Abort after Commit: %v", err)
	}
	if _, err := w.Write([]byte("x")); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Write after Commit: %v", err)
	}
	if err := w.Commit(ctx); err == nil {
		t.Error("second Commit succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, ".partial", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("partial file after commit: %v", err)
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
	if _, err := b.ReadAt(all, 0); err != nil || !bytes.Equal(all, data) {
		t.Fatalf("ReadAt: %v", err)
	}
	if ids, err := f.List(ctx); err != nil || len(ids) != 1 || ids[0] != id {
		t.Fatalf("List = %v, %v", ids, err)
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
}

func TestAbort(t *testing.T) {
	needProcFDs(t)
	ctx := context.Background()
	f, dir := openTemp(t)
	id := imagestore.NewUploadID()
	w, err := f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("half an image")); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // idempotent
		if err := w.Abort(); err != nil {
			t.Fatalf("Abort #%d: %v", i, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ".partial", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("partial file after Abort: %v", err)
	}
	if fds := openFDsUnder(t, dir); len(fds) != 0 {
		t.Errorf("descriptors left open after Abort: %v", fds)
	}
	if err := w.Commit(ctx); err == nil {
		t.Error("Commit after Abort succeeded")
	}
	if _, err := f.Open(ctx, id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Open after Abort: %v", err)
	}
	// The id can be used again after an abort.
	put(t, f, id, []byte("second try"))
}

func TestNoOverwrite(t *testing.T) {
	needProcFDs(t)
	ctx := context.Background()
	f, dir := openTemp(t)
	id := imagestore.NewUploadID()

	// Two writers for one id: the second Create is refused (O_EXCL).
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
	// Create of a committed id is refused.
	if _, err := f.Create(ctx, id); !errors.Is(err, imagestore.ErrExists) {
		t.Fatalf("Create of committed id: %v, want ErrExists", err)
	}

	// A partial that races past Create's check still cannot replace the
	// committed blob at Commit; Abort then cleans up.
	final := filepath.Join(dir, id+".qcow2")
	if err := os.Rename(final, final+".aside"); err != nil {
		t.Fatal(err)
	}
	w2, err := f.Create(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w2.Write([]byte("second")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(final+".aside", final); err != nil {
		t.Fatal(err)
	}
	if err := w2.Commit(ctx); !errors.Is(err, imagestore.ErrExists) {
		t.Fatalf("Commit over existing blob: %v, want ErrExists", err)
	}
	if fds := openFDsUnder(t, dir); len(fds) != 0 {
		t.Errorf("descriptors left open after failed Commit: %v", fds)
	}
	if err := w2.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".partial", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("partial after failed Commit + Abort: %v", err)
	}
	got, err := os.ReadFile(final)
	if err != nil || string(got) != "first" {
		t.Fatalf("committed blob = %q, %v; want it untouched", got, err)
	}
}

func TestCommitCanceled(t *testing.T) {
	needProcFDs(t)
	f, dir := openTemp(t)
	id := imagestore.NewUploadID()
	w, err := f.Create(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Commit(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Commit with canceled ctx: %v", err)
	}
	if fds := openFDsUnder(t, dir); len(fds) != 0 {
		t.Errorf("descriptors left open: %v", fds)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if n, err := f.RemovePartials(context.Background(), nil); err != nil || n != 0 {
		t.Errorf("RemovePartials after Abort = %d, %v; want 0 left behind", n, err)
	}
}

func TestInvalidIDs(t *testing.T) {
	ctx := context.Background()
	f, _ := openTemp(t)
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
	}
}

func TestListIgnoresStrangers(t *testing.T) {
	ctx := context.Background()
	f, dir := openTemp(t)
	a, b := "aaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbb"
	put(t, f, b, []byte("b"))
	put(t, f, a, []byte("a"))
	for _, name := range []string{"README", "x.qcow2", "AAAAAAAAAAAAAAAAAAAAAAAA.qcow2", a + ".qcow2.tmp"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "cccccccccccccccccccccccc.qcow2"), 0o700); err != nil {
		t.Fatal(err)
	}
	// An unfinished write is not listed either.
	w, err := f.Create(ctx, "dddddddddddddddddddddddd")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	ids, err := f.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids[0] != a || ids[1] != b {
		t.Fatalf("List = %v, want [%s %s]", ids, a, b)
	}
}

func TestRemovePartialsAfterCrash(t *testing.T) {
	ctx := context.Background()
	f, dir := openTemp(t)
	kept := imagestore.NewUploadID()
	put(t, f, kept, []byte("kept"))

	// A "crash": writers that are never committed nor aborted, plus debris.
	for range 3 {
		w, err := f.Create(ctx, imagestore.NewUploadID())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte("unfinished")); err != nil {
			t.Fatal(err)
		}
		if err := w.(*writer).closeFile(); err != nil { // the process died; its descriptor went with it
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, ".partial", "junk", "deeper"), 0o700); err != nil {
		t.Fatal(err)
	}

	// The next start-up.
	f2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	n, err := f2.RemovePartials(ctx, nil)
	if err != nil || n != 4 {
		t.Fatalf("RemovePartials = %d, %v; want 4", n, err)
	}
	left, err := os.ReadDir(filepath.Join(dir, ".partial"))
	if err != nil || len(left) != 0 {
		t.Fatalf(".partial after RemovePartials: %v, %v", left, err)
	}
	if n, err := f2.RemovePartials(ctx, nil); err != nil || n != 0 {
		t.Fatalf("second RemovePartials = %d, %v", n, err)
	}
	if ids, err := f2.List(ctx); err != nil || len(ids) != 1 || ids[0] != kept {
		t.Fatalf("committed blobs after RemovePartials = %v, %v; want [%s]", ids, err, kept)
	}
}

func TestSection(t *testing.T) {
	ctx := context.Background()
	f, _ := openTemp(t)
	id := imagestore.NewUploadID()
	data := make([]byte, 100000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	put(t, f, id, data)
	b, err := f.Open(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	for _, c := range []struct{ off, n int64 }{{0, 100000}, {12345, 1000}, {99999, 1}, {100000, 0}, {0, 0}} {
		r, err := b.Section(c.off, c.n)
		if err != nil {
			t.Fatalf("Section(%d, %d): %v", c.off, c.n, err)
		}
		// The HTTP server unwraps exactly this shape for sendfile.
		lr, ok := r.(*io.LimitedReader)
		if !ok {
			t.Fatalf("Section returned %T, want *io.LimitedReader", r)
		}
		if _, ok := lr.R.(*os.File); !ok || lr.N != c.n {
			t.Fatalf("LimitedReader{%T, %d}, want *os.File, %d", lr.R, lr.N, c.n)
		}
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, data[c.off:c.off+c.n]) {
			t.Fatalf("Section(%d, %d) read %d bytes, %v", c.off, c.n, len(got), err)
		}
	}
	for _, c := range []struct{ off, n int64 }{{-1, 1}, {0, -1}, {100001, 0}, {99999, 2}, {1, 1 << 62}} {
		if _, err := b.Section(c.off, c.n); err == nil {
			t.Errorf("Section(%d, %d) succeeded", c.off, c.n)
		}
	}
}

func TestWritebackWindows(t *testing.T) {
	ctx := context.Background()
	f, _ := openTemp(t)
	type call struct{ off, n int64 }
	var calls []call
	f.syncRange = func(file *os.File, off, n int64) error {
		calls = append(calls, call{off, n})
		return startWriteback(file, off, n) // the real call must work too
	}
	w, err := f.Create(ctx, imagestore.NewUploadID())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	chunk := make([]byte, 3<<20+17) // windows end mid-chunk
	total := 0
	for total < 70<<20 {
		n, err := w.Write(chunk)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	want := []call{{0, 32 << 20}, {32 << 20, 32 << 20}}
	if len(calls) != len(want) || calls[0] != want[0] || calls[1] != want[1] {
		t.Fatalf("writeback calls %v, want %v", calls, want)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestWritebackErrors(t *testing.T) {
	ctx := context.Background()
	f, _ := openTemp(t)
	big := make([]byte, writebackWindow)

	// Not supported: ignored, and not asked again.
	calls := 0
	f.syncRange = func(*os.File, int64, int64) error { calls++; return syscall.ENOSYS }
	w, err := f.Create(ctx, imagestore.NewUploadID())
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := w.Write(big); err != nil {
			t.Fatalf("Write with unsupported writeback: %v", err)
		}
	}
	if calls != 1 {
		t.Errorf("syncRange called %d times after ENOSYS, want 1", calls)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}

	// A real I/O error surfaces, matchable.
	f.syncRange = func(*os.File, int64, int64) error { return syscall.EIO }
	w, err = f.Create(ctx, imagestore.NewUploadID())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	if _, err := w.Write(big); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Write with failing writeback: %v, want EIO", err)
	}
	if err := w.Commit(ctx); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Commit after failed writeback: %v, want EIO", err)
	}
}

// TestENOSPC fills a 2 MiB tmpfs and checks that the full disk surfaces as
// syscall.ENOSPC through the writer's wrapping.
func TestENOSPC(t *testing.T) {
	ctx := context.Background()
	mnt := t.TempDir()
	out, err := mountCmd(t, "mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", mnt)
	if err != nil {
		msg := "cannot mount a 2 MiB tmpfs (" + err.Error() + ": " + strings.TrimSpace(string(out)) +
			"): run the test as root (sudo -E go test -run '^TestENOSPC$' ./imagestore/blobfs), " +
			"or in a container with CAP_SYS_ADMIN"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	// Registered after TempDir's cleanup, so it runs before it.
	t.Cleanup(func() {
		if out, err := mountCmd(t, "umount", mnt); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})

	f, err := Open(filepath.Join(mnt, "vm-images"))
	if err != nil {
		t.Fatal(err)
	}
	// tmpfs charges file pages only, not directories: all 2 MiB are free.
	const size = 2 << 20
	if avail, err := f.Available(ctx); err != nil || avail != size {
		t.Fatalf("Available = %d, %v; want the tmpfs's %d bytes", avail, err, size)
	}
	w, err := f.Create(ctx, imagestore.NewUploadID())
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 256<<10)
	var werr error
	for range 16 { // 4 MiB into 2 MiB
		if _, werr = w.Write(chunk); werr != nil {
			break
		}
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("writing past a full disk: %v, want ENOSPC", werr)
	}
	// The blob is incomplete: it can never be committed.
	if _, err := w.Write([]byte("x")); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Write after ENOSPC: %v", err)
	}
	if err := w.Commit(ctx); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Commit after ENOSPC: %v", err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	// The space is back once the partial is gone: all of it.
	if avail, err := f.Available(ctx); err != nil || avail != size {
		t.Fatalf("Available after Abort = %d, %v; want all %d bytes back", avail, err, size)
	}
}

// mountCmd runs mount or umount, bounded: a mount stuck in the kernel
// fails the test, naming the command, instead of hanging the package.
func mountCmd(t *testing.T, name string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s %s did not finish within 30s", name, strings.Join(args, " "))
	}
	return out, err
}

func TestAvailable(t *testing.T) {
	f, _ := openTemp(t)
	n, err := f.Available(context.Background())
	if err != nil || n <= 0 {
		t.Fatalf("Available = %d, %v", n, err)
	}
}
