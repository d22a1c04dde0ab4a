package sqlstore

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/vmshelf/vmshelf/imagestore"
)

// The store's last write outcome, for Ping.
const (
	writeOK int32 = iota
	writeNoSpace
	writeUnwritable
)

// Health is what the store learnt of itself from the calls it answered.
type Health struct {
	damaged   atomic.Bool  // a damaged page was met: sticky until restart
	lastWrite atomic.Int32 // writeOK, writeNoSpace, writeUnwritable
}

// Note remembers what err says of the store: damage for good, the outcome
// of a write until the next write.
func (h *Health) Note(err error, write bool) {
	if errors.Is(err, imagestore.ErrDamaged) {
		h.damaged.Store(true)
	}
	if !write {
		return
	}
	switch {
	case errors.Is(err, imagestore.ErrNoSpace):
		h.lastWrite.Store(writeNoSpace)
	case errors.Is(err, imagestore.ErrUnwritable):
		h.lastWrite.Store(writeUnwritable)
	default:
		h.lastWrite.Store(writeOK)
	}
}

// State is Ping's verdict from what the store learnt.
func (h *Health) State(name string) error {
	switch {
	case h.damaged.Load():
		return fmt.Errorf("%s: %w: a damaged page was met; restore the database from a backup", name, imagestore.ErrDamaged)
	case h.lastWrite.Load() == writeNoSpace:
		return fmt.Errorf("%s: %w: the last write failed for lack of disk space", name, imagestore.ErrNoSpace)
	case h.lastWrite.Load() == writeUnwritable:
		return fmt.Errorf("%s: %w: the last write failed", name, imagestore.ErrUnwritable)
	}
	return nil
}
