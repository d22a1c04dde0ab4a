package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/postgres"
	"github.com/vmshelf/vmshelf/imagestore/postgres/pgtest"
	"github.com/vmshelf/vmshelf/imagestore/sqlstore"
)

// callTimeout is the deadline of the stores of these tests: short, so
// that a stall costs little, long enough for a loaded machine's calls.
const callTimeout = time.Second

// unavailableBound is how long a call may take to fail on a server that
// is stopped, killed or stalled: its deadline and some slack.
const unavailableBound = callTimeout + 2*time.Second

// TestUnavailableServer: a server that stops (pg_ctl stop -m fast), is
// killed (SIGKILL of its postmaster) or stalls (SIGSTOP of every process)
// fails every call with imagestore.ErrStoreUnavailable within the call's
// deadline, never with an error that reads as a fault of ours or as an
// answer ("not found"); and the store works again once the server is
// back, with the same pool.
func TestUnavailableServer(t *testing.T) {
	c := pgtest.StartDurable(t)
	s, err := postgres.Open(t.Context(), c.NewDatabase(t), sqlstore.CallTimeout(callTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	tn, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "box"}, imagestore.HashSecret("token"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := s.CreateTicket(ctx, imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: tn.ID, Name: "x",
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, imagestore.HashSecret("ticket"), 0); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"Ping": func() error {
			pctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			return s.Ping(pctx)
		},
		"TenantByToken": func() error { _, err := s.TenantByToken(ctx, imagestore.HashSecret("token")); return err },
		"Ticket":        func() error { _, err := s.Ticket(ctx, imagestore.HashSecret("ticket")); return err },
		"CreateTicket": func() error {
			now := time.Now()
			return s.CreateTicket(ctx, imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: tn.ID, Name: "x",
				CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, imagestore.HashSecret(imagestore.NewSecret()), 0)
		},
	}
	works := func(when string) {
		t.Helper()
		for name, call := range calls {
			// The pool may hold connections the outage broke: each is
			// found out by one call, never by more than the pool holds.
			var err error
			for range 20 {
				if err = call(); err == nil || !errors.Is(err, imagestore.ErrStoreUnavailable) {
					break
				}
			}
			if err != nil {
				t.Fatalf("%s %s: %v", name, when, err)
			}
		}
	}
	fails := func(when string) {
		t.Helper()
		for name, call := range calls {
			start := time.Now()
			// A call that does not answer at all is waited for no
			// longer than twice its bound: the test says so, and does
			// not hang with the server.
			answer := make(chan error, 1)
			go func() { answer <- call() }()
			var err error
			select {
			case err = <-answer:
			case <-time.After(2 * unavailableBound):
				t.Errorf("%s %s: no answer within %v; want imagestore.ErrStoreUnavailable within %v", name, when, 2*unavailableBound, unavailableBound)
				continue
			}
			took := time.Since(start)
			if !errors.Is(err, imagestore.ErrStoreUnavailable) {
				t.Errorf("%s %s: %v; want imagestore.ErrStoreUnavailable", name, when, err)
			}
			if took > unavailableBound {
				t.Errorf("%s %s failed after %v; want within %v", name, when, took, unavailableBound)
			}
		}
	}
	works("at first")

	c.Stall(t)
	fails("with the server stalled")
	t.Logf("the stalled server answered %v after it was resumed", c.Resume(t))
	works("once the stalled server resumed")

	c.Down(t)
	fails("with the server stopped")
	c.Up(t)
	works("once the stopped server is back")

	c.Kill(t)
	fails("with the server killed")
	c.Up(t)
	works("once the killed server is back")
}

// TestWithdrawAfterLateCommit: the hard case of a ticket whose answer
// never reached its client. CreateTicket's INSERT has run and its COMMIT
// waits (for a synchronous standby that does not exist: the server holds
// the commit back, as a stalled server would) past the call's deadline:
// the call fails with ErrStoreUnavailable, yet the commit lands once the
// server lets it go. WithdrawTicket, run after it, leaves the ticket
// cancelled whichever of the two the server finishes first.
func TestWithdrawAfterLateCommit(t *testing.T) {
	c := pgtest.StartDurable(t)
	url := c.NewDatabase(t)
	s, err := postgres.Open(t.Context(), url, sqlstore.CallTimeout(callTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	tn, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "box"}, imagestore.HashSecret("token"))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	// holdCommits makes the server hold every commit back (a synchronous
	// standby that is not there) or lets them go; it returns once the
	// server's processes act on it: a reload is taken up asynchronously.
	holdCommits := func(on bool) {
		t.Helper()
		q := `ALTER SYSTEM SET synchronous_standby_names = 'nobody'`
		if !on {
			q = `ALTER SYSTEM RESET synchronous_standby_names`
		}
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; {
			probe, err := pgx.Connect(ctx, c.URL("postgres"))
			if err != nil {
				t.Fatal(err)
			}
			pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err = probe.Exec(pctx, `CREATE TABLE IF NOT EXISTS held_commits_probe (n int)`)
			cancel()
			probe.Close(context.Background())
			if held := err != nil; held == on {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the server did not take up synchronous_standby_names within 30 s (hold %v)", on)
			}
		}
	}
	now := time.Now().UTC()
	secret := imagestore.NewSecret()
	tk := imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: tn.ID, Name: "late", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}

	holdCommits(true)
	err = s.CreateTicket(ctx, tk, imagestore.HashSecret(secret), 3)
	if !errors.Is(err, imagestore.ErrStoreUnavailable) {
		t.Fatalf("CreateTicket whose commit is held: %v; want ErrStoreUnavailable", err)
	}
	holdCommits(false) // the held commit lands now, or soon

	withdrawn := now.Add(time.Second)
	for range 20 { // the first try may meet a connection the deadline closed
		if err = s.WithdrawTicket(ctx, tk, imagestore.HashSecret(secret), withdrawn); !errors.Is(err, imagestore.ErrStoreUnavailable) {
			break
		}
	}
	if err != nil {
		t.Fatalf("WithdrawTicket: %v", err)
	}
	// Whatever the server did with the held commit, it is decided once
	// no session of the database is left in the middle of it.
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		var busy int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state <> 'idle' AND pid <> pg_backend_pid()`).Scan(&busy); err != nil {
			t.Fatal(err)
		}
		if busy == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions still busy 30 s after the commits were let go", busy)
		}
		time.Sleep(20 * time.Millisecond)
	}
	got, err := s.Ticket(ctx, imagestore.HashSecret(secret))
	if err != nil {
		t.Fatalf("Ticket: %v", err)
	}
	if !got.UsedAt.Equal(withdrawn) {
		t.Errorf("the ticket whose answer was lost: used at %v, want cancelled at %v", got.UsedAt, withdrawn)
	}
	if unused, err := s.UnusedTickets(ctx, tn.ID, withdrawn); err != nil || len(unused) != 0 {
		t.Errorf("UnusedTickets: %+v, %v; want none", unused, err)
	}
}
