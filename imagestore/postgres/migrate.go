package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"

	"github.com/vmshelf/vmshelf/imagestore/sqlstore"
)

// migrationLock is the advisory lock key every vmshelf replica takes
// while it migrates ("vmsh" in ASCII): replicas starting together queue
// for it instead of racing CREATE TABLE.
const migrationLock = 0x766d7368

// migrations returns the embedded steps in order: migrations/0001_….sql is
// step 1, and the database's vmshelf_schema.version counts the steps
// applied.
func migrations() ([]string, error) {
	steps, err := sqlstore.Migrations(migrationFiles)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return steps, nil
}

// migrate applies the steps the database lacks, each in a transaction of
// its own, holding the advisory lock on one connection throughout.
func migrate(ctx context.Context, db *sql.DB, steps []string) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	// The store's statement and lock timeouts are for the records' quick
	// statements: waiting for another replica's migration, or a step
	// that rewrites a large table, may take longer. Off on this
	// connection, and back to the connection's own before the pool
	// hands it out again.
	if _, err := conn.ExecContext(ctx, `SET statement_timeout = 0; SET lock_timeout = 0`); err != nil {
		return fmt.Errorf("lift the timeouts for the migration: %w", err)
	}
	defer func() {
		if _, err := conn.ExecContext(context.WithoutCancel(ctx), `RESET statement_timeout; RESET lock_timeout`); err != nil {
			// Not back to the store's timeouts: not back to the pool either.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, migrationLock); err != nil {
		return fmt.Errorf("take the migration lock: %w", err)
	}
	// A session lock ends with its session; unlocking explicitly hands it
	// to the next replica without waiting for the pool to drop this
	// connection.
	defer func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, migrationLock)
	}()
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS vmshelf_schema (
	one     BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
	version INTEGER NOT NULL
)`); err != nil {
		return fmt.Errorf("create the schema table: %w", err)
	}
	if _, err := conn.ExecContext(ctx, `INSERT INTO vmshelf_schema (version) VALUES (0) ON CONFLICT DO NOTHING`); err != nil {
		return fmt.Errorf("create the schema table: %w", err)
	}
	var v int
	if err := conn.QueryRowContext(ctx, `SELECT version FROM vmshelf_schema`).Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > len(steps) {
		return fmt.Errorf("database schema version %d is newer than this binary supports (%d)", v, len(steps))
	}
	for i := v; i < len(steps); i++ {
		if err := migrateStep(ctx, conn, steps[i], i+1); err != nil {
			return err
		}
	}
	return nil
}

func migrateStep(ctx context.Context, conn *sql.Conn, step string, version int) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migration %d: %w", version, err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, step); err != nil {
		return fmt.Errorf("migration %d: %w", version, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE vmshelf_schema SET version = $1`, version); err != nil {
		return fmt.Errorf("migration %d: set schema version: %w", version, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migration %d: commit: %w", version, err)
	}
	return nil
}
