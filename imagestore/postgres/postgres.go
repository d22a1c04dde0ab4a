// Package postgres is the imagestore.Store on PostgreSQL, for an edge that
// runs several `vmshelf serve` replicas over one database: selected by
// VMSHELF_STORE_URL=postgres://… (an environment variable, never a flag:
// the URL may carry a password).
//
// The records are imagestore/sqlstore's, the very statements the embedded
// SQLite store runs. What SQLite gets from its single writer (every write
// transaction runs alone, so a count and the insert it admits can never be
// raced) PostgreSQL gets from SERIALIZABLE: a write transaction that could
// have seen another's effect is refused with a serialization failure and
// run again here, so quotas, capacity and single use hold across any
// number of replicas. Reads run in REPEATABLE READ READ ONLY snapshots.
package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlstore"
)

// maxConns bounds the connections of one replica: each serves one
// transaction at a time, and PostgreSQL's default max_connections (100)
// is shared by every replica.
const maxConns = 16

// statementTimeout bounds every statement on the store's connections
// (PostgreSQL's statement_timeout, set as each connection starts): the
// records' statements touch a handful of rows and end in milliseconds, so
// one still running after this is wedged, and its caller gets the store's
// error instead of waiting for ever. It matches the default deadline of a
// whole call (sqlstore.DefaultCallTimeout), which cuts it client-side
// first when it is shorter (--store-timeout), and it
// fits several times into the market's bounds on the work it does for
// Stripe (market's webhookBound and checkoutBound, a minute).
const statementTimeout = 10 * time.Second

// lockTimeout bounds a statement's wait for a lock another transaction
// holds (lock_timeout): shorter than statementTimeout, so that a wait
// behind a stuck transaction is reported as such (lock_not_available)
// rather than as a slow statement.
const lockTimeout = 5 * time.Second

// Serialization failures are retried this many times: a write transaction
// here is a handful of single-row statements, so more conflicts than this
// in a row mean a wedge, not contention.
const maxAttempts = 30

// Store is an imagestore.Store backed by PostgreSQL. It is safe for
// concurrent use, by any number of processes on the same database.
type Store struct {
	*sqlstore.Store
	db *sql.DB
	// probe is Ping's own connection, beside the pool. Ping asks whether
	// the server answers; in the pool it would wait in line behind every
	// request queued there, and after an outage that line is long (each
	// client retrying at once): readiness would come back seconds after
	// the server did.
	probe  *sql.DB
	health sqlstore.Health
}

var _ imagestore.Store = (*Store)(nil)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Open connects to the database at url and brings its schema up to date,
// under an advisory lock so that replicas starting together never race.
// A database migrated by a newer binary is refused. The password, if url
// holds one, appears in no error. opts are the records' (sqlstore's
// CallTimeout).
func Open(ctx context.Context, url string, opts ...sqlstore.Option) (*Store, error) {
	return open(ctx, url, statementTimeout, lockTimeout, opts...)
}

// open is Open with the timeouts given (tests shorten them).
func open(ctx context.Context, url string, statement, lock time.Duration, opts ...sqlstore.Option) (*Store, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		// pgx's own message repeats the URL (with its password masked);
		// say only what is wrong.
		return nil, errors.New("postgres: not a valid PostgreSQL connection URL")
	}
	// Runtime parameters of the connection's start-up: every connection
	// of the pool has them, also one opened again after a failure.
	cfg.RuntimeParams["statement_timeout"] = millis(statement)
	cfg.RuntimeParams["lock_timeout"] = millis(lock)
	db := stdlib.OpenDB(*cfg)
	probe := stdlib.OpenDB(*cfg)
	probe.SetMaxOpenConns(1)
	probe.SetMaxIdleConns(1)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	steps, err := migrations()
	if err != nil {
		_ = errors.Join(db.Close(), probe.Close())
		return nil, err
	}
	if err := migrate(ctx, db, steps); err != nil {
		_ = errors.Join(db.Close(), probe.Close())
		return nil, fmt.Errorf("postgres: open: %w", withFault(err))
	}
	s := &Store{db: db, probe: probe}
	s.Store = sqlstore.New(engine{s}, opts...)
	return s, nil
}

// millis is d as PostgreSQL reads a time setting without a unit.
func millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// Close closes the pool and Ping's connection.
func (s *Store) Close() error {
	if err := errors.Join(s.db.Close(), s.probe.Close()); err != nil {
		return fmt.Errorf("postgres: close: %w", err)
	}
	return nil
}

// Ping reads the schema version, then reports what the store learnt of its
// health from the calls it answered (see imagestore.Store).
func (s *Store) Ping(ctx context.Context) error {
	var v int
	if err := s.probe.QueryRowContext(ctx, `SELECT version FROM vmshelf_schema`).Scan(&v); err != nil {
		err = sqlstore.Unanswered(ctx, withFault(fmt.Errorf("postgres: ping: %w", err)))
		s.health.Note(err, false)
		return err
	}
	return s.health.State("postgres")
}

// tables are the records' tables, which Verify reads through.
var tables = []string{"tenants", "tickets", "images", "fetch_tokens", "upload_sessions", "listings", "orders", "webhook_events", "replica_states", "leases"}

// Verify checks that the schema is the one this binary knows and reads
// every table through: a damaged page is refused by PostgreSQL with
// data_corrupted, reported as ErrDamaged. (PostgreSQL checks page
// checksums and keeps its own integrity; there is no quick_check to run.)
func (s *Store) Verify(ctx context.Context) error {
	steps, err := migrations()
	if err != nil {
		return err
	}
	var v int
	if err := s.db.QueryRowContext(ctx, `SELECT version FROM vmshelf_schema`).Scan(&v); err != nil {
		return withFault(fmt.Errorf("postgres: verify: %w", err))
	}
	if v != len(steps) {
		return fmt.Errorf("postgres: verify: schema version %d, this binary knows %d", v, len(steps))
	}
	for _, t := range tables {
		var n int64
		// t is one of the constant names above, not input.
		if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM `+t).Scan(&n); err != nil {
			err = withFault(fmt.Errorf("postgres: verify %s: %w", t, err))
			s.health.Note(err, false)
			return err
		}
	}
	return nil
}

// engine runs the records' transactions.
type engine struct{ s *Store }

var dialect = &sqlstore.Dialect{
	Rebind:     (&sqlstore.DollarRebind{}).Rebind,
	Unique:     func(err error) bool { return pgCode(err) == "23505" },
	ForeignKey: func(err error) bool { return pgCode(err) == "23503" },
}

// Write runs fn in a SERIALIZABLE transaction, again (bounded) while
// PostgreSQL refuses it for a conflict with a concurrent one: fn must
// therefore do nothing outside the transaction, which the records don't.
func (e engine) Write(ctx context.Context, op string, fn func(tx *sqlstore.Tx) error) error {
	var err error
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if attempt > 0 {
			if werr := backoff(ctx, attempt); werr != nil {
				break
			}
		}
		err = e.s.tx(ctx, op, &sql.TxOptions{Isolation: sql.LevelSerializable}, fn)
		if !retryable(err) {
			break
		}
	}
	e.s.health.Note(err, true)
	return err
}

// Read runs fn in a read-only snapshot.
func (e engine) Read(ctx context.Context, op string, fn func(tx *sqlstore.Tx) error) error {
	err := e.s.tx(ctx, op, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}, fn)
	e.s.health.Note(err, false)
	return err
}

func (s *Store) tx(ctx context.Context, op string, opts *sql.TxOptions, fn func(tx *sqlstore.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return withFault(fmt.Errorf("postgres: %s: begin: %w", op, err))
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(sqlstore.NewTx(ctx, tx, dialect)); err != nil {
		return withFault(fmt.Errorf("postgres: %s: %w", op, err))
	}
	if err := tx.Commit(); err != nil {
		return withFault(fmt.Errorf("postgres: %s: commit: %w", op, err))
	}
	return nil
}

// backoff waits a little, more with each attempt and at random, so that
// two transactions that conflicted do not meet again in lock step.
func backoff(ctx context.Context, attempt int) error {
	d := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// retryable: a serialization failure or a deadlock, which PostgreSQL asks
// the client to run again.
func retryable(err error) bool {
	c := pgCode(err)
	return c == "40001" || c == "40P01"
}

func pgCode(err error) string {
	var e *pgconn.PgError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// storageFault names the storage failure behind err: ErrDamaged,
// ErrNoSpace or ErrUnwritable; nil for no error or an error of the data.
func storageFault(err error) error {
	c := pgCode(err)
	switch {
	case c == "XX001" || c == "XX002": // data_corrupted, index_corrupted
		return imagestore.ErrDamaged
	case c == "53100": // disk_full
		return imagestore.ErrNoSpace
	case c == "58030" || c == "25006": // io_error, read_only_sql_transaction
		return imagestore.ErrUnwritable
	}
	return nil
}

// withFault wraps err in the imagestore error that names what it says of
// the store: a storage failure (storageFault), or a server that could not
// be reached or asked (unreachable).
func withFault(err error) error {
	if f := storageFault(err); f != nil {
		return fmt.Errorf("%w: %w", f, err)
	}
	if unreachable(err) && !errors.Is(err, imagestore.ErrStoreUnavailable) {
		return fmt.Errorf("%w: %w", imagestore.ErrStoreUnavailable, err)
	}
	return err
}

// unreachable is an error that says the server could not be asked or
// could not answer, rather than that it refused the request: no
// connection (refused, reset, closed under the call, a socket that is
// not there), a server shutting down, restarting or starting up, or
// statements it cut or let wait past their bounds (statement_timeout,
// lock_timeout: a wedge, not an answer). All of them pass by themselves,
// and the client may retry. A refusal of ours to log in (a password, a
// missing database) is a misconfiguration, not one of them, and neither
// is a context the caller cancelled.
func unreachable(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false
	}
	if code := pgCode(err); code != "" {
		switch code {
		case "57P01", "57P02", "57P03", // admin_shutdown, crash_shutdown, cannot_connect_now
			"57014", "55P03", // query_canceled (statement_timeout), lock_not_available (lock_timeout)
			"53300": // too_many_connections
			return true
		}
		return strings.HasPrefix(code, "08") // connection_exception and its kinds
	}
	var (
		connect *pgconn.ConnectError
		netErr  net.Error
	)
	return errors.As(err, &connect) || errors.As(err, &netErr) || pgconn.Timeout(err) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, context.DeadlineExceeded)
}
