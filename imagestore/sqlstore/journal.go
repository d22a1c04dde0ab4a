package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// The journal (imagestore.Journal): the store's identity in the one row of
// store_meta, and the intents of file moves in progress in blob_intents,
// one row per upload id.

// StoreID returns the identity of the records, "" if they have none.
func (s *Store) StoreID(ctx context.Context) (string, error) {
	var id string
	err := s.read(ctx, "store id", func(tx *Tx) error {
		err := tx.QueryRowContext(ctx, `SELECT id FROM store_meta WHERE one = 1`).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			id = ""
			return nil
		}
		return err
	})
	return id, err
}

// InitStoreID stores id unless the records have an identity already, and
// returns the one they have.
func (s *Store) InitStoreID(ctx context.Context, id string) (string, error) {
	if !imagestore.ValidStoreID(id) {
		return "", fmt.Errorf("init store id: %q is not a store id", id)
	}
	var got string
	err := s.write(ctx, "init store id", func(tx *Tx) error {
		if _, err := tx.ExecContext(ctx, `
INSERT INTO store_meta (one, id, created_at) VALUES (1, ?, ?) ON CONFLICT (one) DO NOTHING`,
			id, time.Now().UnixNano()); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, `SELECT id FROM store_meta WHERE one = 1`).Scan(&got)
	})
	return got, err
}

// IntendCommit writes uploadID's commit intent.
func (s *Store) IntendCommit(ctx context.Context, uploadID string, at time.Time) error {
	n, err := nanos("at", at)
	if err != nil {
		return fmt.Errorf("intend commit: %w", err)
	}
	return s.write(ctx, "intend commit", func(tx *Tx) error {
		return intend(ctx, tx, uploadID, imagestore.IntentCommit, n)
	})
}

// intend writes an intent, replacing uploadID's earlier one.
func intend(ctx context.Context, tx *Tx, uploadID string, kind imagestore.IntentKind, at int64) error {
	_, err := tx.ExecContext(ctx, `
INSERT INTO blob_intents (upload_id, kind, at) VALUES (?, ?, ?)
ON CONFLICT (upload_id) DO UPDATE SET kind = excluded.kind, at = excluded.at`, uploadID, string(kind), at)
	return err
}

// Intents lists every intent, sorted by upload id.
func (s *Store) Intents(ctx context.Context) ([]imagestore.Intent, error) {
	var all []imagestore.Intent
	err := s.read(ctx, "intents", func(tx *Tx) (err error) {
		all, err = queryAll(ctx, tx, func(r scanner) (imagestore.Intent, error) {
			var (
				in   imagestore.Intent
				kind string
				at   int64
			)
			err := r.Scan(&in.UploadID, &kind, &at)
			in.Kind, in.At = imagestore.IntentKind(kind), fromNanos(at)
			return in, err
		}, `SELECT upload_id, kind, at FROM blob_intents ORDER BY upload_id`)
		return err
	})
	return all, err
}

// EndIntent deletes uploadID's intent of kind, if there is one.
func (s *Store) EndIntent(ctx context.Context, uploadID string, kind imagestore.IntentKind) error {
	_, err := s.execCount(ctx, "end intent", `DELETE FROM blob_intents WHERE upload_id = ? AND kind = ?`, uploadID, string(kind))
	return err
}
