package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

	"github.com/vmshelf/vmshelf/imagestore/sqlstore"
)

// migrationFiles is the schema, one step a file, as PostgreSQL's is: a
// step's comment says why its tables are as they are.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrations returns the embedded steps in order: migrations/0001_….sql is
// step 1, and the database's user_version counts the steps applied.
// Steps are only ever appended: a released step is history, and editing it
// would leave existing databases on a schema no binary describes.
func migrations() ([]string, error) {
	steps, err := sqlstore.Migrations(migrationFiles)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	return steps, nil
}

// migrate applies the steps the database has not seen yet, one transaction
// each. The version is re-read inside each write transaction, so two
// processes opening a new database at once apply every step exactly once.
func migrate(ctx context.Context, db *sql.DB, steps []string) error {
	var v int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > len(steps) {
		return fmt.Errorf("database schema version %d is newer than this binary supports (%d)", v, len(steps))
	}
	for i := v; i < len(steps); i++ {
		if err := migrateStep(ctx, db, steps, i); err != nil {
			return err
		}
	}
	return nil
}

func migrateStep(ctx context.Context, db *sql.DB, steps []string, i int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migration %d: %w", i+1, err)
	}
	defer func() { _ = tx.Rollback() }()

	var v int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("migration %d: read schema version: %w", i+1, err)
	}
	switch {
	case v > len(steps):
		return fmt.Errorf("database schema version %d is newer than this binary supports (%d)", v, len(steps))
	case v > i:
		return nil // another process got here first
	}
	if _, err := tx.ExecContext(ctx, steps[i]); err != nil {
		return fmt.Errorf("migration %d: %w", i+1, err)
	}
	// PRAGMA takes no bound parameters; i+1 is an int, not input.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", i+1)); err != nil {
		return fmt.Errorf("migration %d: set schema version: %w", i+1, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migration %d: commit: %w", i+1, err)
	}
	return nil
}
