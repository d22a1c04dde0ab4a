// Package datadir prepares a service's data directory: created or
// tightened to 0700 and proved writable before anything else uses it, and
// locked so that a second process cannot work on it at the same time.
package datadir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ErrInUse is Lock's answer when another process holds the lock.
var ErrInUse = errors.New("data dir in use by another process")

// Prepare creates dir (0700), tightens an existing one and its
// directories inside (names relative to dir) to 0700, and proves dir
// writable, so that a bad data dir is refused before any port is opened.
// Its errors are one line each, naming the directory.
func Prepare(dir string, inside ...string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data dir %s: %w", dir, err)
	}
	dirs := []string{dir}
	for _, in := range inside {
		dirs = append(dirs, filepath.Join(dir, in))
	}
	for _, d := range dirs {
		if err := tighten(d); err != nil {
			return err
		}
	}
	probe, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return fmt.Errorf("data dir %s is not writable: %w", dir, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	return nil
}

// tighten makes an existing directory d 0700: the db, the tokens' hashes
// and the images are no one else's business. A directory that is missing
// is left to be created (0700); one that cannot be tightened (not ours) is
// refused.
func tighten(d string) error {
	st, err := os.Stat(d)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("data dir: %s is not a directory", d)
	}
	if st.Mode().Perm()&0o077 == 0 {
		return nil
	}
	if err := os.Chmod(d, 0o700); err != nil {
		return fmt.Errorf("data dir: %s is mode %04o and cannot be made 0700: %w", d, st.Mode().Perm(), err)
	}
	return nil
}

// Lock takes the lock file name in dir (created 0600), held until the
// returned file is closed; the lock goes with the process, however it
// ends. Another process holding it is ErrInUse.
func Lock(dir, name string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: %w", ErrInUse, err)
	}
	return f, nil
}
