package postgres_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/postgres"
)

// TestStoreTimeouts: every connection of the pool runs under the store's
// statement and lock timeouts, the migration's connection too once Open
// handed it back (it lifts them for the migration).
func TestStoreTimeouts(t *testing.T) {
	s := open(t, cluster.NewDatabase(t))
	defer s.Close()
	for name, want := range map[string]time.Duration{
		"statement_timeout": postgres.StatementTimeout,
		"lock_timeout":      postgres.LockTimeout,
	} {
		got, err := s.TimeSetting(t.Context(), name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got != want {
			t.Errorf("%s = %v on the store's connection, want %v", name, got, want)
		}
	}
}

// TestStatementTimeoutEndsStatement: a statement that runs past the
// statement timeout is cut by PostgreSQL and the store reports it as its
// own error, a store that did not answer in time
// (imagestore.ErrStoreUnavailable); one that ends just within it runs.
func TestStatementTimeoutEndsStatement(t *testing.T) {
	const limit = 300 * time.Millisecond
	s, err := postgres.OpenWithTimeouts(t.Context(), cluster.NewDatabase(t), limit, limit)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	if err := s.ReadStatement(t.Context(), `SELECT pg_sleep(0.05)`); err != nil {
		t.Fatalf("a statement within the timeout: %v", err)
	}
	start := time.Now()
	err = s.ReadStatement(t.Context(), `SELECT pg_sleep(5)`)
	took := time.Since(start)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" || !strings.Contains(err.Error(), "postgres: test statement: ") ||
		!errors.Is(err, imagestore.ErrStoreUnavailable) {
		t.Fatalf("a statement past the timeout: %v; want the store's error, PostgreSQL's query_canceled (57014), unavailable", err)
	}
	if took < limit || took > 4*time.Second {
		t.Errorf("the statement ended after %v, want soon after the timeout %v", took, limit)
	}
}
