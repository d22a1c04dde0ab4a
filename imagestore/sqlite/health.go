package sqlite

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Option configures Open.
type Option func(*Store)

// WithCallTimeout bounds every call of the records (sqlstore.CallTimeout).
// A call that waits for the one writer connection while another write
// holds it waits within it too; one whose statement SQLite itself gave up
// on (another process held the file's lock for the whole busy timeout)
// is not the store's passing outage but a lock held by one of ours.
func WithCallTimeout(d time.Duration) Option {
	return func(s *Store) { s.callTimeout = d }
}

// WithReserve keeps n bytes of emergency space in a file beside the
// database (<db>-reserve). A write that fails because the disk is full
// releases it and runs once more: a full disk is the normal state of a
// small home server, and the write that frees space (removing an image)
// must be able to commit. RefillReserve takes the space back.
func WithReserve(n int64) Option {
	return func(s *Store) { s.reserve = &reserve{path: s.path + "-reserve", size: n} }
}

// reserve is the emergency space file; held tells whether its blocks are
// allocated now.
type reserve struct {
	path string
	size int64
	mu   sync.Mutex
	held bool
}

// take allocates the reserve if it is not held. On a disk without room it
// leaves no partial file and returns an error wrapping ErrNoSpace.
func (r *reserve) take() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held {
		return nil
	}
	f, err := os.OpenFile(r.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("sqlite: reserve: %w", err)
	}
	err = allocate(f, r.size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(r.path)
		if errors.Is(err, unix.ENOSPC) {
			return fmt.Errorf("sqlite: reserve %d bytes: %w", r.size, imagestore.ErrNoSpace)
		}
		return fmt.Errorf("sqlite: reserve: %w", err)
	}
	r.held = true
	return nil
}

// allocate gives f size bytes of real blocks: fallocate where the file
// system has it, zeros written otherwise.
func allocate(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros[:min(int64(len(zeros)), size-off)], off); err != nil {
			return err
		}
	}
	return nil
}

// release frees the reserve's blocks; false if it was not held.
func (r *reserve) release() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held {
		return false
	}
	r.held = false
	_ = os.Remove(r.path) // if this fails, the second try fails as the first did
	return true
}

// RefillReserve takes the emergency space back after a full disk released
// it; serve calls it right after every deletion of a file (the space a
// remove freed) and every minute. Without WithReserve it does nothing.
func (s *Store) RefillReserve() error {
	if s.reserve == nil {
		return nil
	}
	return s.reserve.take()
}

// storageFault names the storage failure behind err: ErrDamaged,
// ErrNoSpace or ErrUnwritable; nil for no error or an error of the data
// (a constraint, not found, a quota).
func storageFault(err error) error {
	switch errCode(err) & 0xff {
	case sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
		return imagestore.ErrDamaged
	case sqlite3.SQLITE_FULL:
		return imagestore.ErrNoSpace
	case sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM:
		return imagestore.ErrUnwritable
	}
	return nil
}
