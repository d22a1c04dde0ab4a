// Package sqlite is the embedded imagestore.Store: one SQLite file, opened
// through the pure-Go modernc.org/sqlite driver, so the binary needs no cgo.
//
// Several processes may open the same file at once (the `vmshelf tenant`
// CLI runs beside `serve`). WAL lets readers proceed during a write, every
// write transaction takes the write lock up front (BEGIN IMMEDIATE) so two
// writers never deadlock upgrading a read lock, and busy_timeout makes the
// loser wait instead of failing.
//
// The records themselves (every method but Ping, Verify and Close) are
// imagestore/sqlstore's, shared with the PostgreSQL store.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlstore"
)

// busyTimeout bounds how long a statement waits for another connection's
// lock. A write transaction here is a handful of single-row statements, so
// a writer waiting this long means something is wedged, not busy.
const busyTimeout = 10 * time.Second

// lockWait is the busy timeout under a call deadline of callTimeout (0:
// sqlstore's default): busyTimeout, or half the deadline where that is
// shorter. A lock another process of ours holds (the tenant CLI, a
// backup) is then reported as such by SQLite (SQLITE_BUSY: a fault to look
// at, 500), before the deadline, which stays for a store that does not
// answer at all (a hung disk: imagestore.ErrStoreUnavailable, 503).
func lockWait(callTimeout time.Duration) time.Duration {
	if callTimeout <= 0 {
		callTimeout = sqlstore.DefaultCallTimeout
	}
	return min(busyTimeout, callTimeout/2)
}

// Store is an imagestore.Store backed by one SQLite database file. It is
// safe for concurrent use.
type Store struct {
	*sqlstore.Store // the records, the same SQL as PostgreSQL's

	db      *sql.DB         // reads: a pool, deferred BEGIN
	cdb     *sql.DB         // checkpoints: one connection of their own
	wdb     *sql.DB         // writes: one connection, BEGIN IMMEDIATE
	wstmts  *sqlstore.Stmts // the writes' statements, prepared on wdb
	rstmts  *sqlstore.Stmts // the reads' statements, prepared on db
	path    string
	reserve *reserve // nil without WithReserve
	// callTimeout bounds every call (WithCallTimeout); 0: sqlstore's
	// default.
	callTimeout time.Duration
	health      sqlstore.Health
	// The background checkpoint (see checkpointEvery): closing stop ends
	// it, stopped is closed once it has.
	stop, stopped   chan struct{}
	stopOnce        sync.Once
	checkpointEvery time.Duration
	checkpoints     atomic.Int64 // rounds run, for tests
	afterPassive    func()       // tests: runs between a round's two checkpoints
}

// Checkpoints. In WAL mode a commit that leaves the WAL longer than
// wal_autocheckpoint pages (1 000 by default) copies the WAL into the
// database file and fsyncs it before the commit returns, with the write
// lock held. A ticket's commit writes about 6 pages, so at 500 tickets a
// second that was a stall every third of a second, and every request
// queued behind it waited for the copy and a second fsync. Instead a
// goroutine checkpoints every checkpointEvery on a connection of its
// own: first PASSIVE, which copies the WAL beside the writer and takes
// no lock a commit waits for; then RESTART, which holds the writers back
// only while it copies what was committed meanwhile (a few commits'
// pages) and waits for the readers, so that the next commit writes the
// WAL from its start again (without it, commits arriving during the copy
// kept the WAL from ever being restarted, and it grew to the writer's own
// bound). RESTART waits for a running commit and for readers of the WAL
// at most checkpointWait, not busy_timeout: it holds the writers back
// while it waits, and a long read must not stall the writes; a round that
// gives up has still copied what it could. The writer checkpoints itself
// past walLimitPages (64 MiB): the bound, should the rounds fall behind
// or fail.
const (
	checkpointEvery = time.Second
	checkpointWait  = 10 * time.Millisecond
	walLimitPages   = 16384
)

var _ imagestore.Store = (*Store)(nil)

// Open opens the database at path, creating it with mode 0600 if it does
// not exist (the parent directory must), and brings its schema up to date.
// A database written by a newer binary is refused.
func Open(ctx context.Context, path string, opts ...Option) (*Store, error) {
	steps, err := migrations()
	if err != nil {
		return nil, err
	}
	return open(ctx, path, steps, opts...)
}

func open(ctx context.Context, path string, steps []string, opts ...Option) (*Store, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	// SQLite would create a missing file with the process umask, typically
	// 0644; the file holds token hashes and billing ids, so it is created
	// here with 0600 first. SQLite gives its -wal and -shm files the mode of
	// the database file.
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	s := &Store{path: abs, stop: make(chan struct{}), stopped: make(chan struct{}), checkpointEvery: checkpointEvery}
	for _, o := range opts {
		o(s)
	}
	busy := lockWait(s.callTimeout)

	// Writers go through one connection, so that concurrent writes queue
	// in Go (FIFO, no sleeping) instead of in SQLite's busy handler, whose
	// backoff sleeps (up to 100 ms each) made the ticket route's p99 jump
	// under load. Reads use a pool and never wait for the writer (WAL).
	// Other processes (the tenant CLI) still meet busy_timeout.
	wdb, err := sql.Open("sqlite", dsn(abs, true, busy))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	wdb.SetMaxOpenConns(1)
	wdb.SetMaxIdleConns(1)
	wdb.SetConnMaxIdleTime(0)
	if err := migrate(ctx, wdb, steps); err != nil {
		_ = wdb.Close()
		// A file that is no database (zero-filled, overwritten) is
		// damage, as Verify would say of a damaged page.
		return nil, fmt.Errorf("sqlite: open: %w", withFault(err))
	}
	db, err := sql.Open("sqlite", dsn(abs, false, busy))
	if err != nil {
		_ = wdb.Close()
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	// Keep idle read connections: a fetch looks its token up per request
	// (CDI's importers send thousands of small range reads), and opening a
	// SQLite connection per lookup showed in the benchmark's profile.
	db.SetMaxIdleConns(16)
	// The checkpointer's connection waits checkpointWait, from its first
	// statement on: the pool reopens it after an error, and a reopen runs
	// the DSN's pragmas, journal_mode(WAL) among them, which on a file
	// emptied under the running store must write and so waits for the
	// other connections' locks. With busy_timeout it waited 10 s per
	// statement of the round, and Close waits for the round (serve then
	// outlived its SIGTERM in the e2e test of a db truncated under it).
	cdb, err := sql.Open("sqlite", dsn(abs, false, checkpointWait))
	if err != nil {
		_ = wdb.Close()
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	cdb.SetMaxOpenConns(1)
	// Reads are prepared too: a tenant's every request authenticates
	// (TenantByToken) and a status runs half a dozen selects, and each
	// was parsed anew, some twice (see sqlstore.Stmts).
	s.db, s.cdb, s.wdb, s.wstmts, s.rstmts = db, cdb, wdb, sqlstore.NewStmts(wdb), sqlstore.NewStmts(db)
	// One writer: concurrent tickets share a commit (see
	// sqlstore.GroupCommit).
	s.Store = sqlstore.New(engine{s}, sqlstore.GroupCommit(), sqlstore.CallTimeout(s.callTimeout))
	go s.checkpoint()
	// A disk already full at start leaves the store without its reserve
	// for now; RefillReserve takes it once there is room.
	if err := s.RefillReserve(); err != nil && !errors.Is(err, imagestore.ErrNoSpace) {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// checkpoint checkpoints the WAL every s.checkpointEvery until Close (see
// checkpointEvery). Its errors are not the store's: a checkpoint that
// failed (a full disk) leaves the WAL longer, and the next one, or the
// writer's own past walLimitPages, does the work.
func (s *Store) checkpoint() {
	defer close(s.stopped)
	t := time.NewTicker(s.checkpointEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.checkpointRound()
		s.checkpoints.Add(1)
	}
}

// checkpointRound is one round of checkpoint: PASSIVE, then RESTART.
func (s *Store) checkpointRound() {
	ctx, cancel := context.WithTimeout(context.Background(), busyTimeout)
	defer cancel()
	// cdb's connections wait checkpointWait for a lock (its DSN), also
	// when the pool has just reopened one.
	if _, err := s.cdb.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)"); err != nil {
		return
	}
	if s.afterPassive != nil {
		s.afterPassive()
	}
	_, _ = s.cdb.ExecContext(ctx, "PRAGMA wal_checkpoint(RESTART)")
}

// dsn builds the driver name for the file at abs, whose connections wait
// up to busy for another connection's lock. The pragmas are per
// connection, so they go in the DSN rather than being run once: the
// database/sql pool opens connections whenever it likes.
func dsn(abs string, writer bool, busy time.Duration) string {
	q := url.Values{}
	// mode=rw: the file was created above with the right mode; if it has
	// vanished since, fail rather than let SQLite recreate it with umask.
	q.Set("mode", "rw")
	// First: the pragmas after it may already wait for a lock.
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()))
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "journal_mode(WAL)")
	// FULL, not WAL's usual NORMAL: NORMAL may lose the last commits on power
	// loss, and a lost AddImage would leave a blob no record owns while a
	// lost ConsumeTicket would make a ticket usable twice.
	q.Add("_pragma", "synchronous(FULL)")
	// SQLite's page cache, per connection, is kept in memory outside Go's
	// heap for as long as the connection lives: up to 2 MiB by default,
	// for the writer and each of up to 16 idle readers. The file is in the
	// kernel's page cache anyway, a reader's cache is emptied by every
	// commit it then sees (WAL), and an edge's store is a few MB: 512 KiB
	// holds the pages a request walks. Measured: a serve on the bench's
	// store (2.3 MB, 100 tenants, thousands of tickets) started 3.4 MiB
	// larger than on an empty one with the default, 1 MiB with this.
	q.Add("_pragma", "cache_size(-512)")
	if writer {
		// The writer checkpoints only past the bound: see checkpointEvery.
		q.Add("_pragma", fmt.Sprintf("wal_autocheckpoint(%d)", walLimitPages))
		// BEGIN IMMEDIATE: take the write lock at the start, never
		// upgrade a read lock later (which can fail with SQLITE_BUSY
		// without waiting).
		q.Set("_txlock", "immediate")
	}
	// A file: URI, so that a path containing '?' or '#' survives; the path is
	// percent-encoded and SQLite decodes it.
	return "file:" + (&url.URL{Path: abs}).EscapedPath() + "?" + q.Encode()
}

// Close closes the database.
func (s *Store) Close() error {
	s.Store.Close() // the last grouped commit, before the database goes
	// Close may be called again: the rounds are stopped once.
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.stopped
	if err := errors.Join(s.wstmts.Close(), s.rstmts.Close(), s.cdb.Close(), s.db.Close(), s.wdb.Close()); err != nil {
		return fmt.Errorf("sqlite: close: %w", err)
	}
	return nil
}

// Ping reads the schema version, which touches the database file itself,
// not just the connection, then reports what the store learnt of its
// health from the calls it answered (see imagestore.Store).
func (s *Store) Ping(ctx context.Context) error {
	var v int
	if err := s.db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		err = sqlstore.Unanswered(ctx, withFault(fmt.Errorf("sqlite: ping: %w", err)))
		s.health.Note(err, false)
		return err
	}
	return s.health.State("sqlite")
}

// Verify runs PRAGMA quick_check: every page and index entry of the file
// is read and checked for consistency (quick: indexes are not compared
// with their tables' content). A damaged file answers with one line per
// problem instead of "ok"; the first few go into the error.
func (s *Store) Verify(ctx context.Context) error {
	rows, err := s.db.QueryContext(ctx, "PRAGMA quick_check(5)")
	if err != nil {
		return fmt.Errorf("sqlite: quick_check: %w", err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return fmt.Errorf("sqlite: quick_check: %w", err)
		}
		if line != "ok" { // SQLite's lines may hold newlines; callers print one line
			problems = append(problems, strings.Join(strings.Fields(line), " "))
		}
	}
	if err := rows.Err(); err != nil {
		err = withFault(fmt.Errorf("sqlite: quick_check: %w", err))
		s.health.Note(err, false)
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("sqlite: quick_check: %w: %s", imagestore.ErrDamaged, strings.Join(problems, "; "))
	}
	return nil
}

// engine runs the records' transactions on the two pools.
type engine struct{ s *Store }

// dialect: the records' statements are SQLite's own.
var dialect = &sqlstore.Dialect{Unique: isUnique, ForeignKey: isForeignKey}

// Write runs fn in a write transaction (BEGIN IMMEDIATE, from the DSN, on
// the one writer connection: serial with every other write, in this
// process or another). A write the full disk refused runs once more after
// releasing the reserve (WithReserve), so that a remove can still free
// space.
func (e engine) Write(ctx context.Context, op string, fn func(tx *sqlstore.Tx) error) error {
	s := e.s
	err := s.tx(ctx, s.wdb, op, nil, s.wstmts, fn)
	if errors.Is(err, imagestore.ErrNoSpace) && s.reserve != nil && s.reserve.release() {
		err = s.tx(ctx, s.wdb, op, nil, s.wstmts, fn)
	}
	s.health.Note(err, true)
	// Out of the transaction, which held the one writer connection.
	s.wstmts.PrepareNoted(ctx)
	return err
}

// Read runs fn in a read transaction: a plain deferred BEGIN, so that reads
// never queue for the write lock.
func (e engine) Read(ctx context.Context, op string, fn func(tx *sqlstore.Tx) error) error {
	s := e.s
	err := s.tx(ctx, s.db, op, &sql.TxOptions{ReadOnly: true}, s.rstmts, fn)
	s.health.Note(err, false)
	// Out of the transaction: preparing takes a connection of the pool.
	s.rstmts.PrepareNoted(ctx)
	return err
}

// ReadStatement runs fn's one statement on the read pool without a
// transaction around it (sqlstore.StatementReader): SQLite reads a
// statement in a snapshot of its own, and a BEGIN and COMMIT, each parsed
// anew by the driver, cost as much as a short select.
func (e engine) ReadStatement(ctx context.Context, op string, fn func(tx *sqlstore.Tx) error) error {
	s := e.s
	err := fn(sqlstore.NewStatement(ctx, s.db, dialect).WithStmts(s.rstmts))
	if err != nil {
		err = withFault(fmt.Errorf("sqlite: %s: %w", op, err))
	}
	s.health.Note(err, false)
	s.rstmts.PrepareNoted(ctx)
	return err
}

// withFault wraps err in the imagestore error naming its storage failure,
// if it has one.
func withFault(err error) error {
	if f := storageFault(err); f != nil {
		return fmt.Errorf("%w: %w", f, err)
	}
	return err
}

func (s *Store) tx(ctx context.Context, db *sql.DB, op string, opts *sql.TxOptions, stmts *sqlstore.Stmts, fn func(tx *sqlstore.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return withFault(fmt.Errorf("sqlite: %s: begin: %w", op, err))
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(sqlstore.NewTx(ctx, tx, dialect).WithStmts(stmts)); err != nil {
		return withFault(fmt.Errorf("sqlite: %s: %w", op, err))
	}
	if err := tx.Commit(); err != nil {
		return withFault(fmt.Errorf("sqlite: %s: commit: %w", op, err))
	}
	return nil
}

// errCode returns the extended SQLite result code of err, or 0.
func errCode(err error) int {
	var e *msqlite.Error
	if errors.As(err, &e) {
		return e.Code()
	}
	return 0
}

func isUnique(err error) bool {
	c := errCode(err)
	return c == sqlite3.SQLITE_CONSTRAINT_UNIQUE || c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}

func isForeignKey(err error) bool {
	return errCode(err) == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}
