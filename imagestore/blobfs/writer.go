package blobfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vmshelf/vmshelf/imagestore"
)

// writebackWindow is how often the writer asks the kernel to start writing
// dirty pages out. Uploads come from servers that never fsync; without this
// the whole image would sit dirty in the page cache until Commit's fsync,
// which would then stall for as long as the disk needs to write gigabytes
// (and starve other writers meanwhile).
const writebackWindow = 32 << 20

// writer is a blob being written to .partial/<id>, from Create or Resume.
// Its methods lock, so an Abort or Close from another goroutine (say, on
// shutdown) is safe, but the bytes of one blob come from one goroutine.
type writer struct {
	mu      sync.Mutex
	fs      *FS
	id      string
	file    *os.File // nil once closed
	life    imagestore.WriterLife
	written int64
	// flushed is where the next writeback window starts.
	flushed int64
	// noWriteback is set once the filesystem refuses sync_file_range.
	noWriteback bool
	// leftover is a committed path that a failed Commit could not take
	// back; Abort removes it.
	leftover string
	// werr is the first write or sync error: the file has a hole or a
	// short tail from then on, or pages the kernel may have dropped, so
	// later Writes, Syncs and Commit refuse.
	werr error
}

var _ imagestore.BlobWriter = (*writer)(nil)

// newWriter returns a writer whose file is positioned at off, the number
// of bytes already in it (0 for Create).
func newWriter(f *FS, id string, file *os.File, off int64) *writer {
	return &writer{
		fs:      f,
		id:      id,
		file:    file,
		life:    imagestore.NewWriterLife("blobfs", id),
		written: off,
		// Whole windows before off were written out by the writer that
		// wrote them (or by the fsync Resume relies on); the window off
		// falls in is started again from its beginning, which is cheap
		// for pages that are already clean.
		flushed: off - off%writebackWindow,
	}
}

// Write appends p. Errors wrap the underlying *fs.PathError, so
// errors.Is(err, syscall.ENOSPC) holds on a full disk. A failed write is
// final: the file may now end short, so later Writes and Commit return
// the same error and only Abort is left.
func (w *writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.life.Usable("write"); err != nil {
		return 0, err
	}
	if w.werr != nil {
		return 0, w.werr
	}
	n, err := w.file.Write(p)
	w.written += int64(n)
	if err != nil {
		w.werr = fmt.Errorf("blobfs: write %s: %w", w.id, err)
		return n, w.werr
	}
	if err := w.writeback(); err != nil {
		w.werr = err
		return n, err
	}
	return n, nil
}

// writeback starts writeout of every full window written since the last
// call, without waiting for it.
func (w *writer) writeback() error {
	for !w.noWriteback && w.written-w.flushed >= writebackWindow {
		err := w.fs.syncRange(w.file, w.flushed, writebackWindow)
		if unsupported(err) {
			// Some filesystems (and seccomp profiles) lack the call; the
			// final fsync still makes the data durable, only later.
			w.noWriteback = true
			return nil
		}
		if err != nil {
			return fmt.Errorf("blobfs: write %s: start writeback at %d: %w", w.id, w.flushed, err)
		}
		w.flushed += writebackWindow
	}
	return nil
}

func unsupported(err error) bool {
	return errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ESPIPE)
}

// startWriteback is sync_file_range(SYNC_FILE_RANGE_WRITE) on f: start
// writing the range out, do not wait.
func startWriteback(f *os.File, off, n int64) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SyncFileRange(int(fd), off, n, unix.SYNC_FILE_RANGE_WRITE)
	}); err != nil {
		return err
	}
	return serr
}

// Sync makes everything written so far durable (fsync) without ending the
// write; a resumable upload records an offset only after Sync returns. It
// refuses after a failed Write with that error, and a failed fsync is final
// too: Linux may drop the dirty pages it could not write and mark them
// clean, so a later fsync could succeed over lost bytes.
func (w *writer) Sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.life.Usable("sync"); err != nil {
		return err
	}
	if w.werr != nil {
		return w.werr
	}
	if err := w.file.Sync(); err != nil {
		w.werr = fmt.Errorf("blobfs: sync %s: %w", w.id, err)
		return w.werr
	}
	return nil
}

// Close ends the writer and releases its descriptor but keeps the partial
// file, for Resume. It does not fsync: bytes since the last Sync may be
// lost in a crash, which is fine because Resume cuts the file back to the
// offset recorded after that Sync. Close is idempotent and a no-op after
// Commit or Abort; after a failed Commit it leaves Abort's cleanup to do.
// After Close, Write, Sync and Commit fail with os.ErrClosed, and Abort
// still removes the partial file.
func (w *writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.life.Close() {
		return nil
	}
	if err := w.closeFile(); err != nil {
		return fmt.Errorf("blobfs: close %s: %w", w.id, err)
	}
	return nil
}

// ReadAt reads back the partial file (for the structure check before
// Commit). io.EOF is returned as is, as io.ReaderAt callers expect.
func (w *writer) ReadAt(p []byte, off int64) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.file == nil {
		return 0, w.life.Refused("read")
	}
	n, err := w.file.ReadAt(p, off)
	if err != nil && err != io.EOF {
		return n, fmt.Errorf("blobfs: read %s: %w", w.id, err)
	}
	return n, err
}

// Commit makes the blob durable and visible: fsync the file, close it,
// rename it into place without replacing anything, fsync the directory.
// Any failure is final: the writer is closed and Abort removes what is
// left. The error wraps imagestore.ErrExists if the id is already taken.
func (w *writer) Commit(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.life.StartCommit(); err != nil {
		return err
	}
	return w.life.EndCommit(w.commit(ctx))
}

func (w *writer) commit(ctx context.Context) error {
	if w.werr != nil {
		w.closeFile()
		return fmt.Errorf("earlier write or sync failed: %w", w.werr)
	}
	if err := ctx.Err(); err != nil {
		w.closeFile()
		return err
	}
	syncErr := w.file.Sync()
	closeErr := w.closeFile()
	if syncErr != nil {
		return fmt.Errorf("fsync: %w", syncErr)
	}
	if closeErr != nil {
		return fmt.Errorf("close: %w", closeErr)
	}
	final := w.fs.finalPath(w.id)
	if err := renameNoReplace(w.fs.partialPath(w.id), final); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%w: %w", imagestore.ErrExists, err)
		}
		return err
	}
	if err := syncDir(w.fs.dir); err != nil {
		// The name may not survive a crash, and a failed Commit must not
		// leave a visible blob behind that no record points to.
		if rerr := os.Remove(final); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			w.leftover = final
		}
		return err
	}
	return nil
}

// closeFile closes the file once; later calls return nil.
func (w *writer) closeFile() error {
	if w.file == nil {
		return nil
	}
	err := w.file.Close()
	w.file = nil
	return err
}

// renameNoReplace moves from to to, failing with EEXIST rather than
// replacing an existing blob: an id is written once, never overwritten.
func renameNoReplace(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if err == nil {
		return nil
	}
	if !unsupported(err) {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	// A filesystem without RENAME_NOREPLACE: link(2) also refuses to
	// replace. If dropping the partial name fails, the blob is committed
	// all the same and RemovePartials drops the extra name at start-up.
	if err := os.Link(from, to); err != nil {
		return err
	}
	_ = os.Remove(from)
	return nil
}

// Abort ends the blob without making it visible and removes its partial
// file (and whatever a failed Commit left), also after Close. It is
// idempotent, and a no-op after a successful Commit, so `defer w.Abort()`
// is safe.
func (w *writer) Abort() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.life.AbortNeeded() {
		return nil
	}
	// A close error means nothing here: the bytes are being thrown away.
	_ = w.closeFile()
	var errs []error
	if err := os.Remove(w.fs.partialPath(w.id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if w.leftover != "" {
		if err := os.Remove(w.leftover); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		} else {
			w.leftover = ""
		}
	}
	// A failed Abort stays to be done: a retry can finish the job.
	return w.life.EndAbort(errors.Join(errs...))
}
