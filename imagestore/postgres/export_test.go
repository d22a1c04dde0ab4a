package postgres

import (
	"context"
	"time"

	"github.com/vmshelf/vmshelf/imagestore/sqlstore"
)

// OpenWithTimeouts is Open with the statement and lock timeouts given.
func OpenWithTimeouts(ctx context.Context, url string, statement, lock time.Duration) (*Store, error) {
	return open(ctx, url, statement, lock)
}

// ReadStatement runs q as the records' reads run: in a read transaction
// taken from the pool, its error the store's.
func (s *Store) ReadStatement(ctx context.Context, q string) error {
	return engine{s}.Read(ctx, "test statement", func(tx *sqlstore.Tx) error {
		_, err := tx.ExecContext(ctx, q)
		return err
	})
}

// TimeSetting is the value of PostgreSQL's time setting name on a
// connection of the pool.
func (s *Store) TimeSetting(ctx context.Context, name string) (time.Duration, error) {
	var ms int64
	err := s.db.QueryRowContext(ctx, `SELECT (extract(epoch FROM current_setting($1)::interval) * 1000)::bigint`, name).Scan(&ms)
	return time.Duration(ms) * time.Millisecond, err
}

// StatementTimeout and LockTimeout are the store's timeouts.
const StatementTimeout, LockTimeout = statementTimeout, lockTimeout
