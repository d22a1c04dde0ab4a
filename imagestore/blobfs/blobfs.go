// Package blobfs is the filesystem implementation of imagestore.Blobs.
//
// Layout under the directory given to Open (normally <data-dir>/vm-images):
//
//	<id>.qcow2          committed blobs, mode 0600
//	.partial/<id>       blobs being written, invisible to Open and List
//	.quarantine/<id>.qcow2  blobs set aside (Quarantine)
//	.store-id           the store's identity (imagestore.StoreIdentity), 0600
//
// A blob becomes visible by one rename from .partial into place, so a
// reader never sees a half-written image, and a crash leaves at most
// files under .partial, which RemovePartials clears at start-up except
// those of live resumable uploads, which Resume reopens. Both
// directories are 0700: the images belong to tenants, not to whoever
// else has an account on the host.
package blobfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmshelf/vmshelf/imagestore"
)

const (
	dirMode    = 0o700
	fileMode   = 0o600
	partialDir = ".partial"
	blobExt    = ".qcow2"
)

// FS stores blobs as files in one directory. It is safe for concurrent
// use; each BlobWriter and Blob it returns is used by one goroutine.
type FS struct {
	dir     string
	partial string
	// syncRange starts writeback of a file range; a field rather than a
	// direct call so that tests can observe the windows and inject errors.
	syncRange func(f *os.File, off, n int64) error
	health    *imagestore.HealthProbe
}

// A readiness probe's check of the directory is kept for pingTTL; a disk
// that does not answer within pingTimeout is unready.
const (
	pingTimeout = 2 * time.Second
	pingTTL     = time.Second
)

var _ imagestore.Blobs = (*FS)(nil)

// Open returns the store rooted at dir, creating dir and dir/.partial with
// mode 0700 and tightening them to 0700 if they exist with group or other
// permissions.
func Open(dir string) (*FS, error) {
	f := &FS{
		dir:       dir,
		partial:   filepath.Join(dir, partialDir),
		syncRange: startWriteback,
	}
	f.health = &imagestore.HealthProbe{Check: f.ping, Timeout: pingTimeout, TTL: pingTTL}
	for _, d := range []string{f.dir, f.partial} {
		if err := ensureDir(d); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// ensureDir makes d a directory no one but the owner can enter.
func ensureDir(d string) error {
	if err := os.MkdirAll(d, dirMode); err != nil {
		return fmt.Errorf("blobfs: create %s: %w", d, err)
	}
	st, err := os.Stat(d)
	if err != nil {
		return fmt.Errorf("blobfs: stat %s: %w", d, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("blobfs: %s is not a directory", d)
	}
	// MkdirAll leaves an existing directory as it is (and umask may have
	// widened nothing, but an operator may have): tighten it.
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(d, dirMode); err != nil {
			return fmt.Errorf("blobfs: chmod %s: %w", d, err)
		}
	}
	return nil
}

// checkID refuses anything that is not an upload id before it can become
// part of a path ("../x", "a/b", "" and the like).
func checkID(id string) error {
	if !imagestore.ValidUploadID(id) {
		return fmt.Errorf("blobfs: invalid upload id %q: want 24 lower-case hex characters", id)
	}
	return nil
}

func (f *FS) finalPath(id string) string   { return filepath.Join(f.dir, id+blobExt) }
func (f *FS) partialPath(id string) string { return filepath.Join(f.partial, id) }

// Create starts a new blob under .partial. It fails if a partial file for
// id exists (O_EXCL: two uploads never share a file) or if id is already
// committed.
func (f *FS) Create(ctx context.Context, id string) (imagestore.BlobWriter, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("blobfs: create %s: %w", id, err)
	}
	// Early, friendly refusal; Commit's no-replace rename is the real guard.
	if _, err := os.Lstat(f.finalPath(id)); err == nil {
		return nil, fmt.Errorf("blobfs: create %s: %w", id, imagestore.ErrExists)
	}
	file, err := os.OpenFile(f.partialPath(id), os.O_RDWR|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("blobfs: create %s: partial file: %w", id, imagestore.ErrExists)
		}
		return nil, fmt.Errorf("blobfs: create %s: %w", id, err)
	}
	return newWriter(f, id, file, 0), nil
}

// Resume reopens .partial/<id> to continue writing at offset: the file is
// cut to offset (bytes past it were never recorded as durable, so they may
// be garbage after a crash), the cut is fsynced, and writing continues
// there. The error wraps imagestore.ErrNotFound if there is no partial
// file, and imagestore.ErrExists if id is already committed. An offset
// below zero or past the file's size is refused and the file left alone:
// the caller's record and the file disagree, and guessing could corrupt
// the image.
//
// Resume does not lock: two writers on one id (two Resumes, or a Resume
// beside the Create that is still writing) would interleave their bytes.
// The caller serializes them; the gateway holds a per-session lock.
func (f *FS) Resume(ctx context.Context, id string, offset int64) (imagestore.BlobWriter, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("blobfs: resume %s: %w", id, err)
	}
	if offset < 0 {
		return nil, fmt.Errorf("blobfs: resume %s: negative offset %d", id, offset)
	}
	// A committed blob never has a partial file, except the second name
	// renameNoReplace's link fallback may leave behind; writing through it
	// would change a committed image in place.
	if _, err := os.Lstat(f.finalPath(id)); err == nil {
		return nil, fmt.Errorf("blobfs: resume %s: %w", id, imagestore.ErrExists)
	}
	file, err := os.OpenFile(f.partialPath(id), os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("blobfs: resume %s: partial file: %w", id, imagestore.ErrNotFound)
		}
		return nil, fmt.Errorf("blobfs: resume %s: %w", id, err)
	}
	if err := reposition(file, offset); err != nil {
		file.Close()
		return nil, fmt.Errorf("blobfs: resume %s: %w", id, err)
	}
	return newWriter(f, id, file, offset), nil
}

// reposition cuts file to offset, makes the cut durable and moves the file
// offset there. It refuses, before changing anything, a file that is not
// regular or is shorter than offset.
func reposition(file *os.File, offset int64) error {
	st, err := file.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return errors.New("partial is not a regular file")
	}
	if offset > st.Size() {
		return fmt.Errorf("offset %d is past the %d bytes written", offset, st.Size())
	}
	if err := file.Truncate(offset); err != nil {
		return err
	}
	// Make the cut durable before anything new is written after it:
	// otherwise a crash before the next Sync could leave the old tail
	// with new bytes written over part of it, a file that is neither what
	// was recorded nor what was sent. (Resume would cut it again, but an
	// operator or a check reading the partial would be misled.)
	if err := file.Sync(); err != nil {
		return fmt.Errorf("fsync: %w", err)
	}
	if _, err := file.Seek(offset, io.SeekStart); err != nil {
		return err
	}
	return nil
}

// Open opens a committed blob; the error wraps imagestore.ErrNotFound if
// there is none.
func (f *FS) Open(ctx context.Context, id string) (imagestore.Blob, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	file, err := os.Open(f.finalPath(id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("blobfs: open %s: %w", id, imagestore.ErrNotFound)
		}
		return nil, fmt.Errorf("blobfs: open %s: %w", id, err)
	}
	st, err := file.Stat()
	if err != nil {
		file.Close()
		return nil, fmt.Errorf("blobfs: stat %s: %w", id, err)
	}
	if !st.Mode().IsRegular() {
		file.Close()
		return nil, fmt.Errorf("blobfs: open %s: not a regular file", id)
	}
	return &blob{f: file, size: st.Size(), mod: st.ModTime()}, nil
}

// Delete removes a committed blob; a missing one is not an error.
func (f *FS) Delete(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	err := os.Remove(f.finalPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("blobfs: delete %s: %w", id, err)
	}
	// Make the removal durable so a crash cannot bring back a blob whose
	// record is already gone.
	if err := syncDir(f.dir); err != nil {
		return fmt.Errorf("blobfs: delete %s: %w", id, err)
	}
	return nil
}

// List returns the ids of the committed blobs, sorted. Files that are not
// <valid id>.qcow2 regular files are ignored: the directory is ours, but an
// operator's stray file must not turn into an id.
func (f *FS) List(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(f.dir)
	if err != nil {
		return nil, fmt.Errorf("blobfs: list: %w", err)
	}
	ids := []string{}
	for _, e := range entries {
		stem, ok := strings.CutSuffix(e.Name(), blobExt)
		if !ok || !e.Type().IsRegular() || !imagestore.ValidUploadID(stem) {
			continue
		}
		ids = append(ids, stem)
	}
	return ids, nil
}

// RemovePartial removes .partial/<id>; a missing one is not an error. The
// caller makes sure no writer holds it (a writer would go on writing to an
// unlinked file and fail only at Commit).
func (f *FS) RemovePartial(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	err := os.Remove(f.partialPath(id))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blobfs: remove partial %s: %w", id, err)
	}
	// No directory fsync: a partial that comes back after a crash has no
	// session any more, and RemovePartials clears it at start-up.
	return nil
}

// RemovePartials removes everything under .partial except the regular
// files named by a valid upload id for which keep returns true (a nil keep
// keeps nothing), and returns how many entries it removed. keep is only
// ever asked about valid ids. It must run before any Create or Resume: it
// would pull the file from under a live writer.
func (f *FS) RemovePartials(ctx context.Context, keep func(id string) bool) (int, error) {
	entries, err := os.ReadDir(f.partial)
	if err != nil {
		return 0, fmt.Errorf("blobfs: remove partials: %w", err)
	}
	n := 0
	for _, e := range entries {
		name := e.Name()
		if keep != nil && e.Type().IsRegular() && imagestore.ValidUploadID(name) && keep(name) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(f.partial, name)); err != nil {
			return n, fmt.Errorf("blobfs: remove partials: %w", err)
		}
		n++
	}
	return n, nil
}

// Ping says whether the image directory answers: a stat of its partial
// directory, which a hung disk holds up and a lost mount fails. The
// syscall cannot be interrupted, so it runs aside (HealthProbe) and a
// probe waits for it only as long as its context allows.
func (f *FS) Ping(ctx context.Context) error { return f.health.Ping(ctx) }

func (f *FS) ping(context.Context) error {
	st, err := os.Stat(f.partial)
	if err != nil {
		return fmt.Errorf("blobfs: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("blobfs: %s is not a directory", f.partial)
	}
	return nil
}

// Available returns the bytes an unprivileged writer may still use on the
// filesystem holding the blobs (f_bavail, not f_bfree: root's reserve is
// not ours to plan with).
func (f *FS) Available(ctx context.Context) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(f.dir, &st); err != nil {
		return 0, fmt.Errorf("blobfs: statfs %s: %w", f.dir, err)
	}
	if st.Bsize <= 0 {
		return 0, nil
	}
	bsize := uint64(st.Bsize)
	if st.Bavail > math.MaxInt64/bsize {
		return math.MaxInt64, nil
	}
	return int64(st.Bavail * bsize), nil
}

// syncDir makes the directory entries in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir for sync: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}
