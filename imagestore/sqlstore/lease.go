package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// A lease is one row per name, kept after its release (expires_at set to
// 0, the far past): the row carries the last token, so that the name's
// next term counts on from it and a token is never handed out twice.

// acquireSQL is the whole decision of AcquireLease in one statement: a
// new name is inserted with token 1; an existing row is taken over only
// where it is expired at now (?4) or already the holder's, and its token
// stays only where the holder renews its own unexpired lease. The SET
// expressions read the row as it was (leases.*), the proposal as excluded.*.
// Where the WHERE refuses, the statement changes nothing and RETURNING
// returns no row. SQLite (3.35+) and PostgreSQL read it alike.
const acquireSQL = `
INSERT INTO leases (name, holder, token, expires_at) VALUES (?1, ?2, 1, ?3)
ON CONFLICT (name) DO UPDATE SET
	token = CASE WHEN leases.holder = excluded.holder AND leases.expires_at > ?4
		THEN leases.token ELSE leases.token + 1 END,
	holder = excluded.holder,
	expires_at = excluded.expires_at
WHERE leases.expires_at <= ?4 OR leases.holder = excluded.holder
RETURNING holder, token, expires_at`

// leaseArgs checks what every taking of a lease needs and returns now and
// now+ttl as nanoseconds.
func leaseArgs(name, holder string, ttl time.Duration, now time.Time) (int64, int64, error) {
	if name == "" || holder == "" {
		return 0, 0, fmt.Errorf("name %q and holder %q must not be empty", name, holder)
	}
	if ttl <= 0 {
		return 0, 0, fmt.Errorf("ttl %v is not positive", ttl)
	}
	n, err := nanos("now", now)
	if err != nil {
		return 0, 0, err
	}
	until, err := nanos("expiry", now.Add(ttl))
	if err != nil {
		return 0, 0, err
	}
	return n, until, nil
}

func scanLease(name string, r scanner) (imagestore.Lease, error) {
	l := imagestore.Lease{Name: name}
	var until int64
	if err := r.Scan(&l.Holder, &l.Token, &until); err != nil {
		return imagestore.Lease{}, err
	}
	l.ExpiresAt = fromNanos(until)
	return l, nil
}

// AcquireLease takes or renews name for holder; see imagestore.Leases.
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (imagestore.Lease, error) {
	n, until, err := leaseArgs(name, holder, ttl, now)
	if err != nil {
		return imagestore.Lease{}, fmt.Errorf("acquire lease: %w", err)
	}
	var (
		l    imagestore.Lease
		held bool
	)
	err = s.write(ctx, "acquire lease", func(tx *Tx) error {
		held = false
		l, err = scanLease(name, tx.QueryRowContext(ctx, acquireSQL, name, holder, until, n))
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		// Refused: say whose it is, read in the same transaction.
		held = true
		l, err = scanLease(name, tx.QueryRowContext(ctx, `SELECT holder, token, expires_at FROM leases WHERE name = ?`, name))
		return err
	})
	switch {
	case err != nil:
		return imagestore.Lease{}, err
	case held:
		return l, fmt.Errorf("lease %q: held by %q until %s: %w", name, l.Holder, l.ExpiresAt.Format(time.RFC3339Nano), imagestore.ErrLeaseHeld)
	}
	return l, nil
}

// RenewLease extends holder's unexpired term; see imagestore.Leases.
func (s *Store) RenewLease(ctx context.Context, name, holder string, token int64, ttl time.Duration, now time.Time) (imagestore.Lease, error) {
	n, until, err := leaseArgs(name, holder, ttl, now)
	if err != nil {
		return imagestore.Lease{}, fmt.Errorf("renew lease: %w", err)
	}
	var l imagestore.Lease
	err = s.write(ctx, "renew lease", func(tx *Tx) error {
		l, err = scanLease(name, tx.QueryRowContext(ctx, `
UPDATE leases SET expires_at = ?1
WHERE name = ?2 AND holder = ?3 AND token = ?4 AND expires_at > ?5
RETURNING holder, token, expires_at`, until, name, holder, token, n))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return imagestore.Lease{}, fmt.Errorf("renew lease %q: token %d: %w", name, token, imagestore.ErrLeaseLost)
	}
	if err != nil {
		return imagestore.Lease{}, err
	}
	return l, nil
}

// ReleaseLease ends holder's term with token; see imagestore.Leases.
func (s *Store) ReleaseLease(ctx context.Context, name, holder string, token int64) error {
	return s.write(ctx, "release lease", func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE leases SET expires_at = 0 WHERE name = ? AND holder = ? AND token = ?`, name, holder, token)
		return err
	})
}

// CheckLease is the writers' fence; see imagestore.Leases.
func (s *Store) CheckLease(ctx context.Context, name string, token int64, now time.Time) error {
	n, err := nanos("now", now)
	if err != nil {
		return fmt.Errorf("check lease: %w", err)
	}
	var current bool
	err = s.read(ctx, "check lease", func(tx *Tx) error {
		return tx.QueryRowContext(ctx, `
SELECT EXISTS (SELECT 1 FROM leases WHERE name = ? AND token = ? AND expires_at > ?)`, name, token, n).Scan(&current)
	})
	switch {
	case err != nil:
		return err
	case !current:
		return fmt.Errorf("lease %q: token %d: %w", name, token, imagestore.ErrLeaseLost)
	}
	return nil
}

// ForgetLeases deletes ended leases under prefix in one statement. The
// prefix is matched with substr, not LIKE: an upload id's characters are
// no wildcards, but a prefix's might be.
func (s *Store) ForgetLeases(ctx context.Context, prefix string, endedBefore time.Time) (int, error) {
	if prefix == "" {
		return 0, errors.New("forget leases: an empty prefix would name every lease")
	}
	before, err := nanos("endedBefore", endedBefore)
	if err != nil {
		return 0, fmt.Errorf("forget leases: %w", err)
	}
	return s.execCount(ctx, "forget leases", `DELETE FROM leases WHERE substr(name, 1, ?1) = ?2 AND expires_at < ?3`,
		len(prefix), prefix, before)
}
