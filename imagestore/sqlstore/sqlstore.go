// Package sqlstore holds the records of imagestore.Store as SQL, once, for
// every SQL engine: the embedded SQLite store (imagestore/sqlite) and the
// PostgreSQL store of a scaled-out edge (imagestore/postgres) run the same
// statements, so a rule of the quota or of single use is written and
// tested in one place.
//
// The statements keep to what both engines read alike: times are integer
// Unix nanoseconds in UTC, booleans 0/1 integers, hashes byte strings,
// placeholders SQLite's ? and ?N (an Engine may rebind them; PostgreSQL
// wants $N). Each method is one transaction; the Engine decides what makes
// its write transactions serial with each other (SQLite: one writer,
// BEGIN IMMEDIATE; PostgreSQL: SERIALIZABLE and a retry), so that a
// count-then-insert in one of them can never be raced, in this process or
// in another.
//
// A quota passed to CreateTicket or AddImage that is zero or negative means
// no limit.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Engine is what the records need of a SQL database.
type Engine interface {
	// Write runs fn in one write transaction, serial with every other
	// write transaction on the same database (whatever process runs it),
	// and wraps a failure with op.
	Write(ctx context.Context, op string, fn func(tx *Tx) error) error
	// Read runs fn in one read-only transaction.
	Read(ctx context.Context, op string, fn func(tx *Tx) error) error
}

// StatementReader is an Engine that can also run a read of a single
// statement without a transaction around it: the statement is as
// consistent alone (SQLite reads it in a snapshot of its own), and for a
// short select the BEGIN and COMMIT cost as much as the select (over a
// quarter of a tenant's authentication).
type StatementReader interface {
	// ReadStatement runs fn, which runs one statement on tx (a second
	// fails), and wraps a failure with op.
	ReadStatement(ctx context.Context, op string, fn func(tx *Tx) error) error
}

// Dialect is how one engine's driver differs from SQLite's.
type Dialect struct {
	// Rebind rewrites SQLite's placeholders for the driver; nil keeps
	// them.
	Rebind func(query string) string
	// Unique and ForeignKey recognise the driver's constraint errors.
	Unique     func(error) bool
	ForeignKey func(error) bool
}

// Errors the Tx wraps around a driver's constraint errors, so that the
// records test them with errors.Is whichever engine answered.
var (
	errUnique     = errors.New("unique constraint")
	errForeignKey = errors.New("foreign key constraint")
)

func isUnique(err error) bool     { return errors.Is(err, errUnique) }
func isForeignKey(err error) bool { return errors.Is(err, errForeignKey) }

// Tx is a transaction as the records see it: SQLite's placeholders,
// booleans as integers, constraint errors recognisable. Engines make one
// with NewTx.
type Tx struct {
	tx    *sql.Tx // nil: one statement on db, see NewStatement
	db    *sql.DB
	d     *Dialect
	stmts *Stmts // nil: every statement parsed anew
	ran   bool   // without tx: the one statement has run
	// ctx is what every statement runs under: the context the engine
	// began the transaction with, which carries the store call's
	// deadline. The records' closures pass their method's context, which
	// has none of its own; a statement under it would outlive the
	// deadline (database/sql ends a transaction whose context is done
	// only once its running statement returns).
	ctx context.Context
}

// NewTx wraps tx, begun under ctx, for the records.
func NewTx(ctx context.Context, tx *sql.Tx, d *Dialect) *Tx { return &Tx{ctx: ctx, tx: tx, d: d} }

// NewStatement is a Tx without a transaction, for StatementReader: it
// runs one statement on db under ctx, and refuses a second, which would
// not read the same snapshot as the first.
func NewStatement(ctx context.Context, db *sql.DB, d *Dialect) *Tx {
	return &Tx{ctx: ctx, db: db, d: d}
}

// within is the context a statement of t runs under (see Tx.ctx).
func (t *Tx) within(ctx context.Context) context.Context {
	if t.ctx != nil {
		return t.ctx
	}
	return ctx
}

// errSecondStatement refuses a second statement of a Tx made by
// NewStatement: a read that needs two needs a transaction (Engine.Read).
var errSecondStatement = errors.New("sqlstore: a second statement in a read of one statement")

// errOtherDatabase refuses to run a statement without a transaction on
// a database its prepared statements do not belong to.
var errOtherDatabase = errors.New("sqlstore: prepared statements of another database")

// on returns what t's next statement runs on, st prepared there if st is
// not nil.
func (t *Tx) on(ctx context.Context, st *sql.Stmt) (querier, *sql.Stmt, error) {
	if t.tx != nil {
		if st != nil {
			st = t.tx.StmtContext(ctx, st)
		}
		return t.tx, st, nil
	}
	if t.ran {
		return nil, nil, errSecondStatement
	}
	t.ran = true
	if t.stmts != nil && t.stmts.db != t.db {
		// database/sql would run st on a connection of st's database,
		// silently: a read on the single writer's, behind every write.
		return nil, nil, errOtherDatabase
	}
	return t.db, st, nil
}

// querier is *sql.Tx or *sql.DB.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// WithStmts makes t run the statements c has prepared as such, and note
// the others in c; tx must be a transaction of c's database.
func (t *Tx) WithStmts(c *Stmts) *Tx {
	t.stmts = c
	return t
}

func (t *Tx) classify(err error) error {
	switch {
	case err == nil:
		return nil
	case t.d.Unique != nil && t.d.Unique(err):
		return fmt.Errorf("%w: %w", errUnique, err)
	case t.d.ForeignKey != nil && t.d.ForeignKey(err):
		return fmt.Errorf("%w: %w", errForeignKey, err)
	}
	return err
}

func (t *Tx) query(q string) string {
	if t.d.Rebind == nil {
		return q
	}
	return t.d.Rebind(q)
}

// args turns booleans into 0/1: SQLite's driver does so itself, but a
// PostgreSQL integer column refuses a Go bool.
func args(a []any) []any {
	for i, v := range a {
		if b, ok := v.(bool); ok {
			if b {
				a[i] = int64(1)
			} else {
				a[i] = int64(0)
			}
		}
	}
	return a
}

// ExecContext runs a statement that returns no rows.
func (t *Tx) ExecContext(ctx context.Context, q string, a ...any) (sql.Result, error) {
	ctx, q = t.within(ctx), t.query(q)
	on, st, err := t.on(ctx, t.stmts.stmt(q))
	if err != nil {
		return nil, err
	}
	var res sql.Result
	if st != nil {
		res, err = st.ExecContext(ctx, args(a)...)
	} else {
		res, err = on.ExecContext(ctx, q, args(a)...)
	}
	return res, t.classify(err)
}

// QueryContext runs a query.
func (t *Tx) QueryContext(ctx context.Context, q string, a ...any) (*sql.Rows, error) {
	ctx, q = t.within(ctx), t.query(q)
	on, st, err := t.on(ctx, t.stmts.stmt(q))
	if err != nil {
		return nil, err
	}
	var rows *sql.Rows
	if st != nil {
		rows, err = st.QueryContext(ctx, args(a)...)
	} else {
		rows, err = on.QueryContext(ctx, q, args(a)...)
	}
	return rows, t.classify(err)
}

// QueryRowContext runs a query of at most one row.
func (t *Tx) QueryRowContext(ctx context.Context, q string, a ...any) *Row {
	ctx, q = t.within(ctx), t.query(q)
	on, st, err := t.on(ctx, t.stmts.stmt(q))
	switch {
	case err != nil:
		return &Row{err: err, t: t}
	case st != nil:
		return &Row{r: st.QueryRowContext(ctx, args(a)...), t: t}
	}
	return &Row{r: on.QueryRowContext(ctx, q, args(a)...), t: t}
}

// Row is one row of QueryRowContext; its Scan reports constraint errors
// as the records recognise them (an INSERT ... RETURNING fails there).
type Row struct {
	r   *sql.Row
	err error // instead of r: the statement was refused
	t   *Tx
}

// Scan copies the row's columns into dest.
func (r *Row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	return r.t.classify(r.r.Scan(dest...))
}

// DollarRebind rewrites SQLite's ?N and ? placeholders as PostgreSQL's $N
// (a bare ? takes the next number). The statements hold no ? inside a
// string literal, so no quoting is parsed. Results are kept: the records'
// statements are constants, a few dozen of them.
type DollarRebind struct{ cache sync.Map }

// Rebind returns q with $N placeholders.
func (d *DollarRebind) Rebind(q string) string {
	if v, ok := d.cache.Load(q); ok {
		return v.(string)
	}
	var b strings.Builder
	next := 1
	for i := 0; i < len(q); i++ {
		if q[i] != '?' {
			b.WriteByte(q[i])
			continue
		}
		j := i + 1
		for j < len(q) && q[j] >= '0' && q[j] <= '9' {
			j++
		}
		b.WriteByte('$')
		if j > i+1 {
			b.WriteString(q[i+1 : j])
		} else {
			b.WriteString(strconv.Itoa(next))
			next++
		}
		i = j - 1
	}
	d.cache.Store(q, b.String())
	return b.String()
}

// Store is the records of imagestore.Store over an Engine; an engine's
// package embeds it and adds Ping, Verify and Close.
type Store struct {
	e       Engine
	timeout time.Duration // of every call: see CallTimeout
	grouped bool          // GroupCommit
	group   *group        // nil without GroupCommit
}

// Option configures New.
type Option func(*Store)

// GroupCommit runs the writes that benefit from it (see writeGrouped)
// several to one transaction when they arrive together: for an engine
// with one writer, where every commit waits for its own fsync in turn.
// The Store then owns a goroutine, which Close stops.
func GroupCommit() Option {
	return func(s *Store) { s.grouped = true }
}

// DefaultCallTimeout is CallTimeout's default: a store call's statements
// touch a handful of rows and end in milliseconds, so one that has not
// answered in 10 s is facing a store that does not answer, and the
// request waiting for it had better hear so while its client (and any
// proxy before it, most of which give up after 30 to 60 s) still waits.
const DefaultCallTimeout = 10 * time.Second

// CallTimeout bounds every call of the records, its retries and its wait
// for a connection included: a call still unanswered after d fails with
// an error wrapping imagestore.ErrStoreUnavailable. d <= 0 keeps
// DefaultCallTimeout.
func CallTimeout(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.timeout = d
		}
	}
}

// New returns the records over e.
func New(e Engine, opts ...Option) *Store {
	s := &Store{e: e, timeout: DefaultCallTimeout}
	for _, o := range opts {
		o(s)
	}
	if s.grouped {
		s.group = newGroup(s.e, s.timeout)
	}
	return s
}

// Timeout is the deadline of every call (CallTimeout).
func (s *Store) Timeout() time.Duration { return s.timeout }

// bound gives one call of the records its deadline.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// Unanswered is err, from a call made under ctx, marked as the store's
// passing outage (imagestore.ErrStoreUnavailable) if ctx's deadline
// passed first: a store that did not answer in time, whatever the
// driver made of the cut (SQLite: "interrupted", PostgreSQL: a closed
// connection). A refusal the records gave (a quota, a missing row) stays
// what it is, and so does a call its caller cancelled. The engines use it
// for the calls they make outside the records (Ping).
func Unanswered(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, imagestore.ErrStoreUnavailable) || refusal(err) ||
		!errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w in time: %w", imagestore.ErrStoreUnavailable, err)
}

// Close stops the group commit, if any: grouped writes still queued fail,
// the batch being committed finishes first. An engine's Close calls it
// before closing its database.
func (s *Store) Close() {
	if s.group != nil {
		s.group.close()
	}
}

func (s *Store) write(ctx context.Context, op string, fn func(tx *Tx) error) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return Unanswered(ctx, s.e.Write(ctx, op, fn))
}

// writeGrouped is write for a short write that many callers make at once
// (a ticket per upload): with GroupCommit it shares a transaction and its
// commit with the writes queued beside it, each in a savepoint of its own,
// so that a refusal (ErrQuota, ErrExists, ErrNotFound, ...) undoes and
// answers only its own work. fn gets the context to run its statements
// with, which is not ctx once the work has been taken into a batch.
func (s *Store) writeGrouped(ctx context.Context, op string, fn func(ctx context.Context, tx *Tx) error) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if s.group == nil {
		return Unanswered(ctx, s.e.Write(ctx, op, func(tx *Tx) error { return fn(ctx, tx) }))
	}
	return Unanswered(ctx, s.group.do(ctx, op, fn))
}

func (s *Store) read(ctx context.Context, op string, fn func(tx *Tx) error) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return Unanswered(ctx, s.e.Read(ctx, op, fn))
}

// readStatement is read for fn that runs one statement: without a
// transaction around it where the engine can (StatementReader).
func (s *Store) readStatement(ctx context.Context, op string, fn func(tx *Tx) error) error {
	r, ok := s.e.(StatementReader)
	if !ok {
		return s.read(ctx, op, fn)
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return Unanswered(ctx, r.ReadStatement(ctx, op, fn))
}

// queryAll runs a query and scans every row with scan.
func queryAll[T any](ctx context.Context, tx *Tx, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var all []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		all = append(all, v)
	}
	return all, rows.Err()
}

// queryOne runs a query of at most one row and scans it with scan, as
// queryAll scans each of its rows; no row is ErrNotFound, naming what
// (never the key: keys may be secret hashes).
func queryOne[T any](ctx context.Context, tx *Tx, what string, scan func(scanner) (T, error), query string, args ...any) (T, error) {
	v, err := scan(tx.QueryRowContext(ctx, query, args...))
	return v, notFound(what, err)
}

// readOne is queryOne in a read transaction of its own, named op.
func readOne[T any](ctx context.Context, s *Store, op, what string, scan func(scanner) (T, error), query string, args ...any) (T, error) {
	var v T
	err := s.readStatement(ctx, op, func(tx *Tx) (err error) {
		v, err = queryOne(ctx, tx, what, scan, query, args...)
		return err
	})
	return v, err
}

// absent is nil if query finds no row, and ErrExists, naming what, if it
// finds one: a retried insert hears that its row is there already.
func absent(ctx context.Context, tx *Tx, what, query string, args ...any) error {
	_, err := queryOne(ctx, tx, what, scanValue[int], query, args...)
	switch {
	case err == nil:
		return fmt.Errorf("%s: %w", what, imagestore.ErrExists)
	case errors.Is(err, imagestore.ErrNotFound):
		return nil
	}
	return err
}

// scanValue scans a row of one column.
func scanValue[T any](r scanner) (T, error) {
	var v T
	err := r.Scan(&v)
	return v, err
}

// execCount runs one statement in a write transaction and returns how
// many rows it changed.
func (s *Store) execCount(ctx context.Context, op, query string, args ...any) (int, error) {
	var n int64
	err := s.write(ctx, op, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, query, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, err
	}
	return int(n), nil
}

// Pieces of the records' statements, for an engine's tests of its query
// plans.
const (
	ListingCols = listingCols
	OrderCols   = orderCols
	HoldsSQL    = holdsSQL
)
