package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// RemoveTenant counts what the tenant holds and deletes it only if that
// is nothing, in one write transaction: a ticket, image, listing or order
// made for the tenant meanwhile is either counted or refused by the
// foreign key once the tenant is gone. Ended tickets and closed listings
// go first, since they still name the tenant (a closed listing that has
// orders is not reached: its orders name the tenant as host).
func (s *Store) RemoveTenant(ctx context.Context, name string, now time.Time) error {
	at, err := nanos("now", now)
	if err != nil {
		return fmt.Errorf("remove tenant: %w", err)
	}
	return s.write(ctx, "remove tenant", func(tx *Tx) error {
		id, err := queryOne(ctx, tx, "tenant", scanValue[int64], `SELECT id FROM tenants WHERE name = ?`, name)
		if err != nil {
			return err
		}
		var h imagestore.TenantInUse
		err = tx.QueryRowContext(ctx, `
SELECT (SELECT count(*) FROM images WHERE tenant_id = ?1),
       (SELECT count(*) FROM tickets WHERE tenant_id = ?1 AND used_at IS NULL AND expires_at > ?2),
       (SELECT count(*) FROM tickets WHERE tenant_id = ?1 AND put_running = 1),
       (SELECT count(*) FROM upload_sessions WHERE tenant_id = ?1),
       (SELECT count(*) FROM listings WHERE host_id = ?1 AND closed_at IS NULL),
       (SELECT count(*) FROM orders WHERE buyer_id = ?1 OR host_id = ?1)`, id, at).
			Scan(&h.Images, &h.Tickets, &h.Uploads, &h.Sessions, &h.Listings, &h.Orders)
		if err != nil {
			return err
		}
		if h != (imagestore.TenantInUse{}) {
			return &h
		}
		for _, q := range []string{
			`DELETE FROM tickets WHERE tenant_id = ?`,
			`DELETE FROM listings WHERE host_id = ?`,
			`DELETE FROM tenants WHERE id = ?`,
		} {
			if _, err := tx.ExecContext(ctx, q, id); err != nil {
				return err
			}
		}
		return nil
	})
}
