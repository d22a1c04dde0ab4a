package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// UnusedTickets returns the tenant's tickets with used_at unset and
// expires_at > now, by creation time and upload id: exactly the tickets
// checkReservations counts.
func (s *Store) UnusedTickets(ctx context.Context, tenantID int64, now time.Time) ([]imagestore.Ticket, error) {
	at, err := nanos("now", now)
	if err != nil {
		return nil, fmt.Errorf("unused tickets: %w", err)
	}
	var out []imagestore.Ticket
	err = s.readStatement(ctx, "unused tickets", func(tx *Tx) (err error) {
		out, err = queryAll(ctx, tx, scanTicket, `SELECT `+ticketCols+` FROM tickets
WHERE tenant_id = ? AND used_at IS NULL AND expires_at > ?
ORDER BY created_at, upload_id`, tenantID, at)
		return err
	})
	return out, err
}

// CancelTicket ends the tenant's unused, unexpired ticket: used_at and
// cancelled_at both become now. Setting used_at is what makes the
// cancellation exclusive with consumeTicket: both are one conditional
// UPDATE on "used_at IS NULL" in serial write transactions, so whichever
// runs second changes nothing, and a cancelled ticket is out of every
// count of unused tickets without another condition. cancelled_at tells a
// cancelled ticket from a used one afterwards; only a loser reads it.
func (s *Store) CancelTicket(ctx context.Context, tenantID int64, uploadID string, now time.Time) error {
	at, err := nanos("now", now)
	if err != nil {
		return fmt.Errorf("cancel ticket: %w", err)
	}
	return s.write(ctx, "cancel ticket", func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `
UPDATE tickets SET used_at = ?1, cancelled_at = ?1
WHERE tenant_id = ?2 AND upload_id = ?3 AND used_at IS NULL AND expires_at > ?1`,
			at, tenantID, uploadID)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			return err
		}
		var used, cancelled sql.NullInt64
		err = tx.QueryRowContext(ctx, `SELECT used_at, cancelled_at FROM tickets WHERE tenant_id = ? AND upload_id = ?`,
			tenantID, uploadID).Scan(&used, &cancelled)
		switch {
		case err != nil:
			return notFound("ticket", err)
		case cancelled.Valid:
			return imagestore.ErrTicketCancelled
		case used.Valid:
			return imagestore.ErrTicketUsed
		default:
			return imagestore.ErrTicketExpired
		}
	})
}
