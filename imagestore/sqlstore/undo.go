package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Undoing writes whose answer never reached the client. A write sent to a
// server that then stalls may land long after its caller gave up on it
// and answered its client an error; "could not ask" is not "not done".
// The callers therefore write, once the store answers again, what makes
// the records agree with the answer they gave. Each undo below is one
// write that holds whichever order it meets the late write in: it either
// finds what that write did, or makes the late write fail.

// withdrawSQL inserts tk as a cancelled ticket, or cancels the unused row
// of its upload id. A CreateTicket of tk that lands later meets the row
// and fails on the upload id's uniqueness (PostgreSQL waits for one still
// in flight, then takes the row it wrote); a used ticket is left alone.
const withdrawSQL = `
INSERT INTO tickets (hash, upload_id, tenant_id, name, efi, created_at, expires_at, used_at, cancelled_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)
ON CONFLICT (upload_id) DO UPDATE SET used_at = ?8, cancelled_at = ?8 WHERE tickets.used_at IS NULL`

// WithdrawTicket cancels tk whatever became of its CreateTicket; see
// imagestore.Store.
func (s *Store) WithdrawTicket(ctx context.Context, tk imagestore.Ticket, ticket imagestore.Hash, now time.Time) error {
	created, err := createdNanos(tk.CreatedAt)
	if err != nil {
		return fmt.Errorf("withdraw ticket: %w", err)
	}
	expires, err := nanos("expires_at", tk.ExpiresAt)
	if err != nil {
		return fmt.Errorf("withdraw ticket: %w", err)
	}
	at, err := nanos("now", now)
	if err != nil {
		return fmt.Errorf("withdraw ticket: %w", err)
	}
	return s.write(ctx, "withdraw ticket", func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, withdrawSQL, ticket[:], tk.UploadID, tk.TenantID, tk.Name, tk.EFI, created, expires, at)
		if isForeignKey(err) {
			return fmt.Errorf("tenant: %w", imagestore.ErrNotFound)
		}
		return err
	})
}

// UndoUpload takes back what the upload's start at startedAt led to; see
// imagestore.Store. The ticket's used_at is the start's mark: only the
// start that failed is undone, never a later one of the same ticket that
// a retry made once the ticket was given back.
func (s *Store) UndoUpload(ctx context.Context, uploadID string, startedAt time.Time) (bool, error) {
	at, err := nanos("startedAt", startedAt)
	if err != nil {
		return false, fmt.Errorf("undo upload: %w", err)
	}
	removeBlob := false
	err = s.write(ctx, "undo upload", func(tx *Tx) error {
		removeBlob = false // the engine may run the transaction again
		var used sql.NullInt64
		err := tx.QueryRowContext(ctx, `SELECT used_at FROM tickets WHERE upload_id = ? AND cancelled_at IS NULL`, uploadID).Scan(&used)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return nil // swept, or never written
		case err != nil:
			return err
		case !used.Valid || used.Int64 != at:
			return nil // given back already, or started again since
		}
		dropped, err := dropImage(ctx, tx, `upload_id = ?`, time.Now().UnixNano(), uploadID)
		if err != nil {
			return err
		}
		var kind sql.NullString
		err = tx.QueryRowContext(ctx, `SELECT kind FROM blob_intents WHERE upload_id = ?`, uploadID).Scan(&kind)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if dropped || kind.String == string(imagestore.IntentCommit) {
			// The blob may have been committed: it is explained by its
			// removal from now on, as a removed image's is.
			if err := intend(ctx, tx, uploadID, imagestore.IntentRemove, time.Now().UnixNano()); err != nil {
				return err
			}
			removeBlob = true
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM upload_sessions WHERE upload_id = ?`, uploadID); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE tickets SET used_at = NULL, put_running = 0 WHERE upload_id = ?`, uploadID)
		return err
	})
	if err != nil {
		return false, err
	}
	return removeBlob, nil
}

// dropImage deletes the image record where (a condition on images that
// names at most one, whose arguments are args), if there is one, and
// revokes its fetch tokens at revoked; ErrInUse, the delete undone with
// the transaction, if an order that holds capacity names it: its
// replicas import it from the edge, and an import that fails starts over.
func dropImage(ctx context.Context, tx *Tx, where string, revoked int64, args ...any) (bool, error) {
	var uploadID string
	err := tx.QueryRowContext(ctx, `DELETE FROM images WHERE `+where+` RETURNING upload_id`, args...).Scan(&uploadID)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	}
	var inUse bool
	err = tx.QueryRowContext(ctx, `
SELECT EXISTS (SELECT 1 FROM orders WHERE image_kind = 'upload' AND image = ? AND `+holdsSQL+`)`, uploadID).Scan(&inUse)
	if err != nil {
		return false, err
	}
	if inUse {
		return false, fmt.Errorf("image: %w", imagestore.ErrInUse)
	}
	_, err = tx.ExecContext(ctx, `UPDATE fetch_tokens SET revoked_at = ? WHERE upload_id = ? AND revoked_at IS NULL`, revoked, uploadID)
	return true, err
}
