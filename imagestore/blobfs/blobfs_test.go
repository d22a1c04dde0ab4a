package blobfs

import (
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
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
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

func TestListIgnoresStrangers(t *testing.T) {
	ctx := context.Background()
	f, dir := openTemp(t)
	a, b := "aaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbb"
	blobtest.Put(t, f, b, []byte("b"))
	blobtest.Put(t, f, a, []byte("a"))
	for _, name := range []string{"README", "x.qcow2", "AAAAAAAAAAAAAAAAAAAAAAAA.qcow2", a + ".qcow2.tmp"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "cccccccccccccccccccccccc.qcow2"), 0o700); err != nil {
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

func TestRemovePartialsAfterCrash(t *testing.T) {
	ctx := context.Background()
	f, dir := openTemp(t)
	kept := imagestore.NewUploadID()
	blobtest.Put(t, f, kept, []byte("kept"))

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

// TestSectionSendfile: a Section of a blob is an *io.LimitedReader around
// its *os.File, the shape the HTTP server unwraps to send the bytes with
// sendfile(2) instead of copying them through user space. The suite
// checks the bytes a Section reads and the ranges it refuses.
func TestSectionSendfile(t *testing.T) {
	ctx := context.Background()
	f, _ := openTemp(t)
	id := imagestore.NewUploadID()
	const size = 100000
	blobtest.Put(t, f, id, blobtest.Pattern(7, size))
	b, err := f.Open(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []struct{ off, n int64 }{{0, size}, {12345, 1000}, {size - 1, 1}, {size, 0}} {
		r, err := b.Section(c.off, c.n)
		if err != nil {
			t.Fatalf("Section(%d, %d): %v", c.off, c.n, err)
		}
		lr, ok := r.(*io.LimitedReader)
		if !ok {
			t.Fatalf("Section returned %T, want *io.LimitedReader", r)
		}
		if _, ok := lr.R.(*os.File); !ok || lr.N != c.n {
			t.Fatalf("LimitedReader{%T, %d}, want *os.File, %d", lr.R, lr.N, c.n)
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
	// The failed write is final, and says why: Sync must not report the
	// bytes durable.
	for i := range 2 {
		if err := w.Sync(); !errors.Is(err, syscall.EIO) {
			t.Fatalf("Sync #%d after a failed write: %v, want EIO", i, err)
		}
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
