package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestBackgroundCheckpoint: the writer checkpoints only past
// walLimitPages; the store's own rounds do it otherwise, and each
// restarts the WAL, so that after a round the next commit writes the WAL
// from its start: the WAL holds about one round's commits, never the
// writer's bound. (Without the RESTART, commits arriving during the copy
// keep the WAL from restarting and it grows.)
func TestBackgroundCheckpoint(t *testing.T) {
	ctx := t.Context()
	s := openRounds(t, time.Hour) // no round on its own: the test runs them
	var auto int
	if err := s.wdb.QueryRowContext(ctx, "PRAGMA wal_autocheckpoint").Scan(&auto); err != nil {
		t.Fatal(err)
	}
	if auto != walLimitPages {
		t.Errorf("the writer's wal_autocheckpoint = %d, want %d", auto, walLimitPages)
	}
	tenant, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "box"}, imagestore.HashSecret(imagestore.NewSecret()))
	if err != nil {
		t.Fatal(err)
	}
	ticket := func() {
		t.Helper()
		now := time.Now()
		tk := imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: tenant.ID, Name: "x", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := s.CreateTicket(ctx, tk, imagestore.HashSecret(imagestore.NewSecret()), 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	// walFrames is the WAL's length in frames, which a PASSIVE checkpoint
	// answers (no round of the store's runs beside it here).
	walFrames := func() int {
		t.Helper()
		var busy, log, done int
		if err := s.db.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &log, &done); err != nil || busy != 0 {
			t.Fatalf("PRAGMA wal_checkpoint(PASSIVE) = busy %d, %v", busy, err)
		}
		return log
	}
	// A ticket's commit writes several pages: 400 of them take the WAL
	// past SQLite's default autocheckpoint (1 000 pages), which the writer
	// must not run.
	const many = 400
	for range many {
		ticket()
	}
	if n := walFrames(); n <= 1000 {
		t.Fatalf("the WAL holds %d frames after %d commits; want more than 1 000 (the writer checkpointed at SQLite's default)", n, many)
	}
	// The round's PASSIVE checkpoint meets a reader of an older snapshot,
	// as it meets the requests under load, and copies only up to it;
	// commits after that snapshot stay in the WAL, and no commit restarts
	// a WAL whose frames are not all copied. The reader ends before the
	// RESTART, which copies the rest.
	reader, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback()
	var n int
	if err := reader.QueryRowContext(ctx, "SELECT count(*) FROM tickets").Scan(&n); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		ticket()
	}
	before := walFrames() // copies nothing while the reader reads
	s.afterPassive = func() { _ = reader.Rollback() }
	s.checkpointRound()
	ticket()
	if n := walFrames(); n >= before {
		t.Errorf("the WAL holds %d frames after a checkpoint round and one commit, %d before; want it restarted (one commit's frames)", n, before)
	}
}

// TestCheckpointRounds: the store runs the rounds on its own, every
// checkpointEvery, and Close ends them.
func TestCheckpointRounds(t *testing.T) {
	s := openRounds(t, 10*time.Millisecond)
	waitRounds(t, s, 2)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.stopped:
	default:
		t.Fatal("Close returned with the checkpoint rounds still running")
	}
}

// openRounds opens a store on a new file whose checkpoint rounds come
// every every; the test's end closes it (again, if the test did).
func openRounds(t *testing.T, every time.Duration) *Store {
	t.Helper()
	s, err := Open(t.Context(), tempPath(t), func(s *Store) { s.checkpointEvery = every })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// waitRounds waits, bounded, until n more checkpoint rounds have run.
func waitRounds(t *testing.T, s *Store, n int64) {
	t.Helper()
	want := s.checkpoints.Load() + n
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for s.checkpoints.Load() < want {
		select {
		case <-ctx.Done():
			t.Fatalf("waited 30s for %d checkpoint rounds; %d ran", n, s.checkpoints.Load()-(want-n))
		case <-tick.C:
		}
	}
}

// TestCheckpointLeavesLongReaders: RESTART waits for the readers of the
// WAL with the writers held back, so a round waits for them only
// checkpointWait, never busy_timeout: with a read transaction open on an
// old snapshot, the round ends (well within busy_timeout) while the
// reader still reads, and a write goes through after it.
func TestCheckpointLeavesLongReaders(t *testing.T) {
	ctx := t.Context()
	s := openRounds(t, time.Hour)
	tenant := func(name string) {
		t.Helper()
		if _, err := s.CreateTenant(ctx, imagestore.Tenant{Name: name}, imagestore.HashSecret(imagestore.NewSecret())); err != nil {
			t.Fatal(err)
		}
	}
	tenant("before")
	reader, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback()
	var n int
	if err := reader.QueryRowContext(ctx, "SELECT count(*) FROM tenants").Scan(&n); err != nil {
		t.Fatal(err)
	}
	tenant("after") // past the reader's snapshot
	done := make(chan struct{})
	go func() { s.checkpointRound(); close(done) }()
	select {
	case <-done:
	case <-time.After(busyTimeout / 2):
		t.Fatalf("the checkpoint round still waits for the reader after %v", busyTimeout/2)
	}
	tenant("later")
	if err := reader.QueryRowContext(ctx, "SELECT count(*) FROM tenants").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the reader's snapshot: %d tenants, %v; want the 1 it began with", n, err)
	}
}

// TestCheckpointOnEmptiedFile: the db file emptied under the running
// store (truncated to 0) and the checkpointer's connection opened then
// (its first round, or a reopen after an error): opening runs the DSN's
// journal_mode(WAL), which on an empty file must write and waits for the
// other connections' locks. The round waits checkpointWait for them,
// never busy_timeout, so that Close, which waits for the round, returns
// (serve outlived its SIGTERM when a round waited 10 s per statement).
func TestCheckpointOnEmptiedFile(t *testing.T) {
	ctx := t.Context()
	s := openRounds(t, time.Hour)
	if _, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "box"}, imagestore.HashSecret(imagestore.NewSecret())); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TenantByToken(ctx, imagestore.HashSecret("no such token")); !errors.Is(err, imagestore.ErrNotFound) {
		t.Fatalf("a read before the truncation: %v", err) // a reader's connection is open
	}
	if err := os.Truncate(s.path, 0); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.checkpointRound(); _ = s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(busyTimeout / 2):
		t.Fatalf("a checkpoint round and Close on the emptied file still wait after %v", busyTimeout/2)
	}
}
