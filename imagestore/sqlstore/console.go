package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// CreateConsoleTicket stores a console ticket; see imagestore.ConsoleStore.
func (s *Store) CreateConsoleTicket(ctx context.Context, ticket imagestore.Hash, ct imagestore.ConsoleTicket) error {
	fail := func(err error) error { return fmt.Errorf("create console ticket: %w", err) }
	if ct.Kind != imagestore.ConsoleVNC && ct.Kind != imagestore.ConsoleSerial {
		return fail(fmt.Errorf("kind %q", ct.Kind))
	}
	created, err := createdNanos(ct.CreatedAt)
	if err != nil {
		return fail(err)
	}
	expires, err := nanos("expires_at", ct.ExpiresAt)
	if err != nil {
		return fail(err)
	}
	return s.write(ctx, "create console ticket", func(tx *Tx) error {
		if err := boughtBy(ctx, tx, ct.OrderID, ct.TenantID); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `
INSERT INTO console_tickets (hash, tenant_id, order_id, replica, kind, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			ticket[:], ct.TenantID, ct.OrderID, ct.Replica, string(ct.Kind), created, expires)
		return err
	})
}

// ConsumeConsoleTicket uses a console ticket once; see
// imagestore.ConsoleStore.
func (s *Store) ConsumeConsoleTicket(ctx context.Context, ticket imagestore.Hash, now time.Time) (imagestore.ConsoleTicket, error) {
	at, err := nanos("now", now)
	if err != nil {
		return imagestore.ConsoleTicket{}, fmt.Errorf("consume console ticket: %w", err)
	}
	var ct imagestore.ConsoleTicket
	err = s.write(ctx, "consume console ticket", func(tx *Tx) error {
		var (
			kind             string
			created, expires int64
		)
		err := tx.QueryRowContext(ctx, `
UPDATE console_tickets SET used_at = ?1
WHERE hash = ?2 AND used_at IS NULL AND expires_at > ?1
RETURNING tenant_id, order_id, replica, kind, created_at, expires_at`, at, ticket[:]).
			Scan(&ct.TenantID, &ct.OrderID, &ct.Replica, &kind, &created, &expires)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("console ticket: %w", imagestore.ErrNotFound)
		}
		if err != nil {
			return err
		}
		ct.Kind, ct.CreatedAt, ct.ExpiresAt = imagestore.ConsoleKind(kind), fromNanos(created), fromNanos(expires)
		return nil
	})
	if err != nil {
		return imagestore.ConsoleTicket{}, err
	}
	return ct, nil
}

// boughtBy is nil if order orderID is tenant's, ErrNotFound if not (its
// host's, another's, or no order): what a buyer's capability of one of
// its orders is made for.
func boughtBy(ctx context.Context, tx *Tx, orderID string, tenant int64) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM orders WHERE id = ? AND buyer_id = ?`, orderID, tenant).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("order %s of tenant %d: %w", orderID, tenant, imagestore.ErrNotFound)
	}
	return nil
}
