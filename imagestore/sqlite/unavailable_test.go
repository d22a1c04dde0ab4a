package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestLockedIsNotUnreachable: SQLite's answer to a lock that another
// process holds (SQLITE_BUSY, after half the call deadline) is no outage
// of the store: it is not imagestore.ErrStoreUnavailable, and it comes
// before the deadline. A call that gets no answer within the deadline
// (here: queued behind a writer of this process that does not finish) is.
func TestLockedIsNotUnreachable(t *testing.T) {
	const deadline = time.Second
	path := tempPath(t)
	s, err := Open(t.Context(), path, WithCallTimeout(deadline))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	write := func() (time.Duration, error) {
		start := time.Now()
		_, err := s.CreateTenant(context.Background(), imagestore.Tenant{Name: "box" + time.Now().Format("150405.000000000")},
			imagestore.HashSecret(time.Now().String()))
		return time.Since(start), err
	}

	// Another process's lock: a second connection of its own, in a
	// write transaction it does not end.
	other, err := sql.Open("sqlite", dsn(s.path, true, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`UPDATE store_meta SET id = id`); err != nil {
		t.Fatal(err)
	}
	took, err := write()
	if err == nil || errors.Is(err, imagestore.ErrStoreUnavailable) {
		t.Errorf("a write behind another process's lock: %v; want SQLite's own busy error, not the store's outage", err)
	}
	if took >= deadline {
		t.Errorf("the busy write failed after %v, want before the %v deadline", took, deadline)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	// A writer of this process that does not finish: the call behind it
	// waits for the one writer connection until its deadline.
	held, err := s.wdb.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	took, err = write()
	if !errors.Is(err, imagestore.ErrStoreUnavailable) {
		t.Errorf("a write that got no answer within its deadline: %v; want ErrStoreUnavailable", err)
	}
	if took < deadline || took > deadline+2*time.Second {
		t.Errorf("it failed after %v, want at its %v deadline", took, deadline)
	}
	held.Close()
	if _, err := write(); err != nil {
		t.Errorf("a write once the writer is free: %v", err)
	}
}
