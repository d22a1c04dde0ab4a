package sqlite

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlstore"
	"github.com/vmshelf/vmshelf/imagestore/storetest"
)

func tempPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "vmshelf.db")
}

func mustOpen(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) imagestore.Store {
		return mustOpen(t, tempPath(t))
	})
}

// TestStoreWithTokenCache: the token cache in front of the store changes
// no answer the suite can see.
func TestStoreWithTokenCache(t *testing.T) {
	storetest.Run(t, func(t *testing.T) imagestore.Store {
		return imagestore.CacheTokens(mustOpen(t, tempPath(t)), imagestore.TokenCacheTTL)
	})
}

func TestFileMode(t *testing.T) {
	path := tempPath(t)
	s := mustOpen(t, path)
	defer s.Close()
	// A write makes SQLite create the -wal and -shm files, which must not
	// be more open than the database.
	if _, err := s.CreateTenant(t.Context(), imagestore.Tenant{Name: "a"}, imagestore.HashSecret("a")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.Mode().Perm(); m != 0o600 {
			t.Errorf("%s: mode %v, want 0600", filepath.Base(p), m)
		}
	}
}

func TestPathWithQueryCharacters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a?b#c%d e.db")
	s := mustOpen(t, path)
	defer s.Close()
	if _, err := s.CreateTenant(t.Context(), imagestore.Tenant{Name: "a"}, imagestore.HashSecret("a")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() == 0 {
		t.Errorf("%s is empty: the data went elsewhere", path)
	}
}

func TestOpenMissingDirectory(t *testing.T) {
	_, err := Open(t.Context(), filepath.Join(t.TempDir(), "no", "such", "dir", "x.db"))
	if err == nil {
		t.Fatal("Open in a missing directory succeeded")
	}
}

func TestPragmas(t *testing.T) {
	s := mustOpen(t, tempPath(t))
	defer s.Close()
	ctx := t.Context()
	// Several connections at once, so that the pool has to open more than
	// one: every connection must carry the settings.
	var conns []*sql.Conn
	for range 3 {
		c, err := s.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		for _, p := range []struct {
			pragma string
			want   string
		}{
			{"journal_mode", "wal"},
			{"foreign_keys", "1"},
			{"synchronous", "2"},     // FULL
			{"busy_timeout", "5000"}, // half the default call deadline of 10 s
			{"cache_size", "-512"},   // KiB: see dsn
		} {
			var got string
			if err := c.QueryRowContext(ctx, "PRAGMA "+p.pragma).Scan(&got); err != nil {
				t.Fatalf("conn %d: PRAGMA %s: %v", i, p.pragma, err)
			}
			if got != p.want {
				t.Errorf("conn %d: %s = %s, want %s", i, p.pragma, got, p.want)
			}
		}
	}
	for _, c := range conns {
		c.Close()
	}
	// The writer's connection too.
	var cache string
	if err := s.wdb.QueryRowContext(ctx, "PRAGMA cache_size").Scan(&cache); err != nil {
		t.Fatal(err)
	}
	if cache != "-512" {
		t.Errorf("writer: cache_size = %s, want -512", cache)
	}
}

func userVersion(t *testing.T, s *Store) int {
	t.Helper()
	var v int
	if err := s.db.QueryRowContext(t.Context(), "PRAGMA user_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestReopen(t *testing.T) {
	ctx := t.Context()
	path := tempPath(t)
	s := mustOpen(t, path)
	if got, want := userVersion(t, s), len(schema(t)); got != want {
		t.Errorf("user_version = %d, want %d", got, want)
	}
	a, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "alpha", StripeAccount: "acct"}, imagestore.HashSecret("tok"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = mustOpen(t, path)
	got, err := s.TenantByToken(ctx, imagestore.HashSecret("tok"))
	if err != nil {
		t.Fatalf("after reopen: %v", err)
	}
	if got != a {
		t.Errorf("after reopen: %+v, want %+v", got, a)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Applied steps are not run again: the first one is replaced by SQL that
	// would fail, and the open still succeeds. A new step is applied once.
	steps := append([]string{"this is not SQL"}, schema(t)[1:]...)
	steps = append(steps, "CREATE TABLE extra (x INTEGER) STRICT")
	for i := range 2 {
		s, err := open(ctx, path, steps)
		if err != nil {
			t.Fatalf("open %d with a new step: %v", i, err)
		}
		if got := userVersion(t, s); got != len(steps) {
			t.Errorf("open %d: user_version = %d, want %d", i, got, len(steps))
		}
		if _, err := s.db.ExecContext(ctx, "INSERT INTO extra VALUES (1)"); err != nil {
			t.Errorf("open %d: new step not applied: %v", i, err)
		}
		if _, err := s.Tenant(ctx, "alpha"); err != nil {
			t.Errorf("open %d: %v", i, err)
		}
		s.Close()
	}
}

// TestMigrateFromVersion1 opens a database written by the first released
// schema (user_version 1, before upload sessions) and checks that it is
// brought to the current version with its data intact and usable.
func TestMigrateFromVersion1(t *testing.T) {
	ctx := t.Context()
	path := tempPath(t)
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)

	old, err := open(ctx, path, schema(t)[:1])
	if err != nil {
		t.Fatal(err)
	}
	if got := userVersion(t, old); got != 1 {
		t.Fatalf("old database: user_version = %d, want 1", got)
	}
	a, err := old.CreateTenant(ctx, imagestore.Tenant{Name: "alpha", StripeAccount: "acct"}, imagestore.HashSecret("tok"))
	if err != nil {
		t.Fatal(err)
	}
	tk := imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: a.ID, Name: "img", EFI: true, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := old.CreateTicket(ctx, tk, imagestore.HashSecret("ticket"), 0); err != nil {
		t.Fatal(err)
	}
	// Written as the version 1 binary did: today's AddImage also touches
	// columns later steps added.
	img := imagestore.Image{UploadID: imagestore.NewUploadID(), TenantID: a.ID, Name: "done", Size: 7, VirtualSize: 8, SHA256: "ab", CreatedAt: now}
	if _, err := old.wdb.ExecContext(ctx, `
INSERT INTO images (upload_id, tenant_id, name, efi, size, virtual_size, sha256, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		img.UploadID, img.TenantID, img.Name, img.EFI, img.Size, img.VirtualSize, img.SHA256, now.UnixNano()); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := old.db.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema WHERE name = 'upload_sessions'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("step 1 alone created upload_sessions: the test no longer builds a version 1 database")
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	s := mustOpen(t, path)
	defer s.Close()
	if got, want := userVersion(t, s), len(schema(t)); got != want || want < 2 {
		t.Errorf("after migration: user_version = %d, want %d (>= 2)", got, want)
	}
	if got, err := s.Tenant(ctx, "alpha"); err != nil || got != a {
		t.Errorf("tenant after migration = %+v, %v; want %+v", got, err, a)
	}
	if got, err := s.Image(ctx, img.UploadID); err != nil || got != img {
		t.Errorf("image after migration = %+v, %v; want %+v", got, err, img)
	}
	// The ticket issued before the upgrade starts a session after it.
	us, err := s.StartSession(ctx, imagestore.HashSecret("ticket"), imagestore.HashSecret("session"),
		imagestore.UploadSession{Length: 7, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, now)
	if err != nil {
		t.Fatalf("StartSession on a pre-upgrade ticket: %v", err)
	}
	if us.UploadID != tk.UploadID || us.TenantID != a.ID || us.Name != "img" || !us.EFI {
		t.Errorf("session = %+v, want the ticket's attributes", us)
	}
	if ids, err := s.SessionUploadIDs(ctx); err != nil || len(ids) != 1 || ids[0] != tk.UploadID {
		t.Errorf("SessionUploadIDs = %v, %v", ids, err)
	}
}

// TestSessionsTable checks what the schema itself guarantees: STRICT, the
// offset bounds, and that a nil hash state is stored rather than refused.
func TestSessionsTable(t *testing.T) {
	ctx := t.Context()
	s := mustOpen(t, tempPath(t))
	defer s.Close()
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	a, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "alpha"}, imagestore.HashSecret("tok"))
	if err != nil {
		t.Fatal(err)
	}
	var strict int
	if err := s.db.QueryRowContext(ctx, "SELECT strict FROM pragma_table_list WHERE name = 'upload_sessions'").Scan(&strict); err != nil {
		t.Fatal(err)
	}
	if strict != 1 {
		t.Error("upload_sessions is not STRICT")
	}
	// ExpireSessions runs periodically; it must not scan the table.
	var plan []string
	rows, err := s.db.QueryContext(ctx, "EXPLAIN QUERY PLAN DELETE FROM upload_sessions WHERE expires_at <= 5")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, parent, notUsed int
		var detail string
		if err := rows.Scan(&id, &parent, &notUsed, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if p := strings.Join(plan, "; "); !strings.Contains(p, "upload_sessions_expires_at") {
		t.Errorf("expiry sweep plan %q does not use the expires_at index", p)
	}

	tk := imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: a.ID, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := s.CreateTicket(ctx, tk, imagestore.HashSecret("t1"), 0); err != nil {
		t.Fatal(err)
	}
	us, err := s.StartSession(ctx, imagestore.HashSecret("t1"), imagestore.HashSecret("s1"),
		imagestore.UploadSession{Length: 100, HashState: nil, ExpiresAt: now.Add(time.Hour)}, now)
	if err != nil {
		t.Fatalf("StartSession with a nil hash state: %v", err)
	}
	if len(us.HashState) != 0 {
		t.Errorf("HashState = %x, want empty", us.HashState)
	}
	// A zero CreatedAt means now, as for the other records.
	if us.CreatedAt.IsZero() {
		t.Error("zero CreatedAt stored as the zero time")
	}
	if err := s.SaveProgress(ctx, us.UploadID, 100, nil, now.Add(time.Hour)); err != nil {
		t.Errorf("SaveProgress at the length with a nil state: %v", err)
	}
	for _, off := range []int64{101, -1} {
		if err := s.SaveProgress(ctx, us.UploadID, off, []byte{1}, now.Add(2*time.Hour)); err == nil {
			t.Errorf("SaveProgress(offset %d) past a length of 100 succeeded", off)
		}
	}
	got, err := s.Session(ctx, imagestore.HashSecret("s1"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Offset != 100 || !got.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Errorf("refused SaveProgress changed the session: %+v", got)
	}

	// Offsets that do not describe an upload are refused before the
	// ticket is touched.
	tk2 := imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: a.ID, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := s.CreateTicket(ctx, tk2, imagestore.HashSecret("t2"), 0); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []imagestore.UploadSession{
		{Length: -1, ExpiresAt: now.Add(time.Hour)},
		{Length: 10, Offset: 11, ExpiresAt: now.Add(time.Hour)},
		{Length: 10, Offset: -1, ExpiresAt: now.Add(time.Hour)},
		{Length: 10}, // no expiry
	} {
		if _, err := s.StartSession(ctx, imagestore.HashSecret("t2"), imagestore.HashSecret("s2"), bad, now); err == nil {
			t.Errorf("StartSession(%+v) succeeded", bad)
		}
	}
	if got, err := s.Ticket(ctx, imagestore.HashSecret("t2")); err != nil || !got.UsedAt.IsZero() {
		t.Errorf("refused StartSession used the ticket: %+v, %v", got, err)
	}
}

func TestFailedMigrationRollsBack(t *testing.T) {
	ctx := t.Context()
	path := tempPath(t)
	steps := append(schema(t), "CREATE TABLE half (x INTEGER); this is not SQL")
	if _, err := open(ctx, path, steps); err == nil {
		t.Fatal("open with a broken step succeeded")
	}
	s := mustOpen(t, path) // the good steps stayed applied
	defer s.Close()
	if got, want := userVersion(t, s), len(schema(t)); got != want {
		t.Errorf("user_version = %d, want %d", got, want)
	}
	var n int
	if err := s.db.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema WHERE name = 'half'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Error("the broken step left its table behind")
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	path := tempPath(t)
	s := mustOpen(t, path)
	future := len(schema(t)) + 1
	if _, err := s.db.ExecContext(t.Context(), "PRAGMA user_version = "+strconv.Itoa(future)); err != nil {
		t.Fatal(err)
	}
	s.Close()

	_, err := Open(t.Context(), path)
	if err == nil {
		t.Fatal("Open of a newer database succeeded")
	}
	if !strings.Contains(err.Error(), "newer") {
		t.Errorf("error %q does not say the database is newer", err)
	}
}

// TestTwoHandles stands in for `vmshelf tenant` running beside `serve`: two
// independent Opens of one file, each with its own pool, writing at once.
func TestTwoHandles(t *testing.T) {
	ctx := t.Context()
	path := tempPath(t)
	s1 := mustOpen(t, path)
	defer s1.Close()
	s2 := mustOpen(t, path)
	defer s2.Close()

	t.Run("blocked writer waits", func(t *testing.T) {
		// s1 holds the write lock; s2's write must wait for it, not fail.
		tx, err := s1.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `
INSERT INTO tenants (name, token_hash, in_mesh, sharing, hosts_vms, appliance, stripe_account, created_at)
VALUES ('holder', x'00', 0, 0, 0, '', '', 0)`); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := s2.CreateTenant(ctx, imagestore.Tenant{Name: "waiter"}, imagestore.HashSecret("waiter"))
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("second handle finished while the first held the write lock: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("second handle: %v", err)
		}
		for _, s := range []*Store{s1, s2} {
			for _, name := range []string{"holder", "waiter"} {
				if _, err := s.Tenant(ctx, name); err != nil {
					t.Errorf("Tenant %s: %v", name, err)
				}
			}
		}
	})

	t.Run("concurrent writers", func(t *testing.T) {
		const perHandle = 20
		var wg sync.WaitGroup
		errs := make(chan error, 2*perHandle)
		for h, s := range []*Store{s1, s2} {
			for i := range perHandle {
				wg.Go(func() {
					name := fmt.Sprintf("w%d-%d", h, i)
					tn, err := s.CreateTenant(ctx, imagestore.Tenant{Name: name}, imagestore.HashSecret(name))
					if err != nil {
						errs <- err
						return
					}
					// AddImage reads before it writes: with a deferred BEGIN
					// the read lock's upgrade would fail at once with
					// SQLITE_BUSY instead of waiting.
					errs <- s.AddImage(ctx, imagestore.Image{UploadID: imagestore.NewUploadID(), TenantID: tn.ID, CreatedAt: time.Now()}, 1)
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		ts, err := s1.Tenants(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) != 2+2*perHandle {
			t.Errorf("%d tenants, want %d", len(ts), 2+2*perHandle)
		}
	})

	t.Run("ticket consumed once across handles", func(t *testing.T) {
		a, err := s1.Tenant(ctx, "holder")
		if err != nil {
			t.Fatal(err)
		}
		now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
		tk := imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: a.ID, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := s1.CreateTicket(ctx, tk, imagestore.HashSecret("x"), 0); err != nil {
			t.Fatal(err)
		}
		const n = 8
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			s := []*Store{s1, s2}[i%2]
			wg.Go(func() { _, errs[i] = s.ConsumeTicket(ctx, imagestore.HashSecret("x"), now) })
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, imagestore.ErrTicketUsed):
				t.Errorf("ConsumeTicket: %v", err)
			}
		}
		if ok != 1 {
			t.Errorf("%d successes, want 1", ok)
		}
	})
}

func TestErrorsCarryNoSecrets(t *testing.T) {
	s := mustOpen(t, tempPath(t))
	defer s.Close()
	ctx := t.Context()
	h := imagestore.HashSecret("secret")
	hexed := hex.EncodeToString(h[:])
	_, err1 := s.TenantByToken(ctx, h)
	_, err2 := s.ConsumeTicket(ctx, h, time.Now())
	_, _, err3 := s.ImageForToken(ctx, h, time.Now())
	_, err4 := s.Session(ctx, h)
	_, err5 := s.StartSession(ctx, h, h, imagestore.UploadSession{ExpiresAt: time.Now()}, time.Now())
	for _, err := range []error{err1, err2, err3, err4, err5} {
		if err == nil {
			t.Fatal("lookup of an unknown hash succeeded")
		}
		if strings.Contains(strings.ToLower(err.Error()), hexed[:16]) {
			t.Errorf("error %q contains the hash", err)
		}
	}
}

func TestCanceledContext(t *testing.T) {
	s := mustOpen(t, tempPath(t))
	defer s.Close()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "a"}, imagestore.HashSecret("a")); !errors.Is(err, context.Canceled) {
		t.Errorf("CreateTenant with a canceled context: %v, want context.Canceled", err)
	}
}

// TestQueryPlans: the queries that run on every request, or filter the
// tables that grow without bound, use their indexes instead of a scan.
func TestQueryPlans(t *testing.T) {
	s := mustOpen(t, tempPath(t))
	defer s.Close()
	tests := []struct {
		name, query, index string
	}{
		{"running uploads counted by the quota", `SELECT count(*) FROM tickets WHERE tenant_id = 1 AND put_running = 1`, "tickets_put_running"},
		{"running uploads ended at start-up", `UPDATE tickets SET put_running = 0 WHERE put_running = 1`, "tickets_put_running"},
		{"a listing's counts", `SELECT ` + sqlstore.ListingCols + ` FROM listings l WHERE l.id = 'l'`, "COVERING INDEX orders_listing"},
		{"a host's listings", `SELECT ` + sqlstore.ListingCols + ` FROM listings l WHERE l.host_id = 1 ORDER BY l.created_at, l.id`, "listings_host"},
		{"open listings", `SELECT ` + sqlstore.ListingCols + ` FROM listings l WHERE l.closed_at IS NULL ORDER BY l.created_at, l.id`, "listings_open"},
		{"a buyer's orders", `SELECT ` + sqlstore.OrderCols + ` FROM orders WHERE buyer_id = 1 ORDER BY created_at DESC, id DESC`, "orders_buyer"},
		{"orders in a state", `SELECT ` + sqlstore.OrderCols + ` FROM orders WHERE state = 'paid' ORDER BY created_at, id`, "orders_state"},
		{"overdue orders", `SELECT ` + sqlstore.OrderCols + ` FROM orders WHERE state = 'awaitingPayment' AND reserve_until <= 5 ORDER BY created_at, id`, "orders_state"},
		{"due refunds", `SELECT ` + sqlstore.OrderCols + ` FROM orders WHERE state IN ('refunding', 'refundFailed') AND refund_next_at <= 5 AND disputed_at IS NULL ORDER BY created_at, id`, "orders_state"},
		{"the order of a PaymentIntent", `SELECT ` + sqlstore.OrderCols + ` FROM orders WHERE payment_intent = 'pi_1' AND payment_intent <> ''`, "orders_payment_intent"},
		{"orders of an upload", `SELECT EXISTS (SELECT 1 FROM orders WHERE image_kind = 'upload' AND image = 'x' AND ` + sqlstore.HoldsSQL + `)`, "orders_upload"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if p := queryPlan(t, s, tc.query); !strings.Contains(p, tc.index) {
				t.Errorf("plan %q does not use %s", p, tc.index)
			}
		})
	}
}

// queryPlan returns EXPLAIN QUERY PLAN's details for query, joined.
func queryPlan(t *testing.T, s *Store, query string) string {
	t.Helper()
	rows, err := s.db.QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notUsed int
		var detail string
		if err := rows.Scan(&id, &parent, &notUsed, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "; ")
}

// TestMarketTables checks what the schema guarantees beside the suite:
// STRICT tables, the state CHECKs that tie times to states, and that a
// replayed webhook event keeps its first record.
func TestMarketTables(t *testing.T) {
	ctx := t.Context()
	s := mustOpen(t, tempPath(t))
	defer s.Close()
	for _, table := range []string{"listings", "orders", "webhook_events"} {
		var strict int
		if err := s.db.QueryRowContext(ctx, "SELECT strict FROM pragma_table_list WHERE name = ?", table).Scan(&strict); err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		if strict != 1 {
			t.Errorf("%s is not STRICT", table)
		}
	}

	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	h, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "host", StripeAccount: "acct_h"}, imagestore.HashSecret("h"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "buyer"}, imagestore.HashSecret("b"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateListing(ctx, imagestore.Listing{ID: "l1", HostID: h.ID, UnitPrice: 600, Currency: "eur", Capacity: 5, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	o := imagestore.Order{ID: "o1", ListingID: "l1", BuyerID: b.ID, HostID: h.ID, Quantity: 2, ImageKind: imagestore.ImageCatalogue,
		Image: "debian-13", Name: "web", UnitPrice: 600, Total: 1200, Fee: 600, Currency: "eur", Destination: "acct_h",
		ReserveUntil: now.Add(time.Hour), CreatedAt: now}
	if err := s.CreateOrder(ctx, o, "", 0); err != nil {
		t.Fatal(err)
	}
	// A state change that forgot its time is refused by the schema.
	for _, bad := range []string{
		`UPDATE orders SET state = 'paid' WHERE id = 'o1'`,
		`UPDATE orders SET state = 'cancelled' WHERE id = 'o1'`,
		`UPDATE orders SET state = 'lost' WHERE id = 'o1'`,
		`UPDATE orders SET paid_at = 1 WHERE id = 'o1'`,
		`UPDATE orders SET total = 1 WHERE id = 'o1'`,
		`UPDATE orders SET fee = 1201 WHERE id = 'o1'`,
		// A dispute's decision without a time, or without a dispute.
		`UPDATE orders SET dispute_status = 'lost' WHERE id = 'o1'`,
		`UPDATE orders SET dispute_status = 'lost', dispute_closed_at = 1 WHERE id = 'o1'`,
		`UPDATE orders SET dispute_status = 'needs_response', dispute_closed_at = 1, disputed_at = 1 WHERE id = 'o1'`,
	} {
		if _, err := s.wdb.ExecContext(ctx, bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	got, err := s.Order(ctx, "o1")
	if err != nil || got.State != imagestore.OrderAwaitingPayment || got.Total != 1200 || got.Fee != 600 || !got.PaidAt.IsZero() {
		t.Errorf("order after refused updates = %+v, %v", got, err)
	}

	first := imagestore.WebhookEvent{ID: "evt_1", Type: "checkout.session.completed", Result: "paid", At: now}
	if err := s.RecordWebhookEvent(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordWebhookEvent(ctx, imagestore.WebhookEvent{ID: "evt_1", Type: "other", Result: "replayed", At: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	var ev imagestore.WebhookEvent
	var at int64
	if err := s.db.QueryRowContext(ctx, `SELECT id, type, result, at FROM webhook_events`).Scan(&ev.ID, &ev.Type, &ev.Result, &at); err != nil {
		t.Fatal(err)
	}
	ev.At = time.Unix(0, at).UTC()
	if ev != first {
		t.Errorf("webhook event after a replay = %+v, want the first %+v", ev, first)
	}
}

// TestMarketErrorsCarryNoUserData: a refused order's error names the
// field, never the user data it came with.
func TestMarketErrorsCarryNoUserData(t *testing.T) {
	ctx := t.Context()
	s := mustOpen(t, tempPath(t))
	defer s.Close()
	const ud = "#cloud-config\npassword: hunter2-user-data\n"
	for _, o := range []imagestore.Order{
		{ID: "o1", ListingID: "unknown", Quantity: 1, ImageKind: imagestore.ImageCatalogue, Image: "x", UnitPrice: 1, Total: 1, Destination: "a", ReserveUntil: time.Now()},
		{ID: "o2", ListingID: "unknown", Quantity: 1, ImageKind: imagestore.ImageCatalogue, Image: "x", UnitPrice: 1, Total: 2, Destination: "a", ReserveUntil: time.Now()},
	} {
		err := s.CreateOrder(ctx, o, ud, 0)
		if err == nil {
			t.Fatalf("CreateOrder(%+v) succeeded", o)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error %q carries the user data", err)
		}
	}
}

// oldMarket opens the database at path with the schema's first before
// steps, as a binary of that time wrote it, with a host (Stripe account
// acct_host) whose listing l1 has 3 replicas at 6.00 EUR, and a buyer.
func oldMarket(t *testing.T, path string, before int, now time.Time) (old *Store, host, buyer imagestore.Tenant) {
	t.Helper()
	ctx := t.Context()
	old, err := open(ctx, path, schema(t)[:before])
	if err != nil {
		t.Fatal(err)
	}
	if host, err = old.CreateTenant(ctx, imagestore.Tenant{Name: "host", StripeAccount: "acct_host"}, imagestore.HashSecret("h")); err != nil {
		t.Fatal(err)
	}
	if buyer, err = old.CreateTenant(ctx, imagestore.Tenant{Name: "buyer"}, imagestore.HashSecret("b")); err != nil {
		t.Fatal(err)
	}
	if _, err := old.CreateListing(ctx, imagestore.Listing{ID: "l1", HostID: host.ID, UnitPrice: 600, Currency: "eur", Capacity: 3, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	return old, host, buyer
}

// oldOrder places order id of quantity debian-13 replicas of oldMarket's
// listing with userData.
func oldOrder(t *testing.T, old *Store, host, buyer imagestore.Tenant, id string, quantity int, userData string, now time.Time) {
	t.Helper()
	total := 600 * int64(quantity)
	o := imagestore.Order{ID: id, ListingID: "l1", BuyerID: buyer.ID, HostID: host.ID, Quantity: quantity,
		ImageKind: imagestore.ImageCatalogue, Image: "debian-13", Name: "web", UnitPrice: 600, Total: total, Fee: total / 2,
		Currency: "eur", Destination: "acct_host", ReserveUntil: now.Add(time.Hour), CreatedAt: now}
	if err := old.CreateOrder(t.Context(), o, userData, 0); err != nil {
		t.Fatal(err)
	}
}

// migrated closes old, the database at path of the schema's first before
// steps, and opens it again with the whole schema, which migrates it. The
// store closes when the test ends.
func migrated(t *testing.T, old *Store, path string, before int) *Store {
	t.Helper()
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	s := mustOpen(t, path)
	t.Cleanup(func() { _ = s.Close() })
	if got, want := userVersion(t, s), len(schema(t)); got != want || want <= before {
		t.Errorf("after migration: user_version = %d, want %d (> %d)", got, want, before)
	}
	return s
}

// TestMigrateOrdersToNotes opens a database written before the
// provisioner's step (orders, no note, no replica states) and checks that
// its orders come through with an empty note and take notes, replica
// states and token revocations afterwards.
func TestMigrateOrdersToNotes(t *testing.T) {
	ctx := t.Context()
	path := tempPath(t)
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	const before = 5 // the market's step; the provisioner's came after it

	old, host, buyer := oldMarket(t, path, before, now)
	oldOrder(t, old, host, buyer, "o1", 2, "", now)
	if _, err := old.PayOrder(ctx, "o1", now, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}

	s := migrated(t, old, path, before)
	got, err := s.Order(ctx, "o1")
	if err != nil || got.State != imagestore.OrderPaid || got.Note != "" || got.Quantity != 2 {
		t.Fatalf("order after migration = %+v, %v; want paid, 2 replicas, no note", got, err)
	}
	if err := s.SetOrderNote(ctx, "o1", "noted"); err != nil {
		t.Fatal(err)
	}
	rs := []imagestore.ReplicaState{{Index: 1, Name: "vm-o1-1", State: imagestore.ReplicaRunning, Detail: "Running", ObservedAt: now}}
	if err := s.SetReplicaStates(ctx, "o1", rs); err != nil {
		t.Fatal(err)
	}
	states, err := s.ReplicaStates(ctx, "o1")
	if err != nil || len(states) != 1 || states[0].Name != "vm-o1-1" {
		t.Errorf("replica states after migration = %+v, %v", states, err)
	}
	if got, err := s.Order(ctx, "o1"); err != nil || got.Note != "noted" {
		t.Errorf("note after migration = %q, %v", got.Note, err)
	}
	if n, err := s.RevokeOrderTokens(ctx, "o1", now); err != nil || n != 0 {
		t.Errorf("RevokeOrderTokens after migration = %d, %v; want 0", n, err)
	}
}

// TestMigrateOrdersToRefunds: the step that rebuilds the orders table for
// the refund states keeps every order and replica state, its foreign keys
// and indexes, and the database consistent.
func TestMigrateOrdersToRefunds(t *testing.T) {
	ctx := t.Context()
	path := tempPath(t)
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	const before = 9 // the step before the refunds'

	old, host, buyer := oldMarket(t, path, before, now)
	for _, id := range []string{"o1", "o2"} {
		oldOrder(t, old, host, buyer, id, 1, "#cloud-config\n", now)
	}
	if _, err := old.PayOrder(ctx, "o1", now, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := old.CancelOrder(ctx, "o2", "checkoutExpired", now); err != nil {
		t.Fatal(err)
	}
	rs := []imagestore.ReplicaState{{Index: 0, Name: "vm-o1-0", State: imagestore.ReplicaImporting, Detail: "ImportInProgress", ObservedAt: now}}
	if err := old.SetReplicaStates(ctx, "o1", rs); err != nil {
		t.Fatal(err)
	}

	s := migrated(t, old, path, before)
	for _, check := range []string{"PRAGMA integrity_check", "PRAGMA foreign_key_check"} {
		var res sql.NullString
		err := s.db.QueryRowContext(ctx, check).Scan(&res)
		if check == "PRAGMA foreign_key_check" && errors.Is(err, sql.ErrNoRows) {
			continue // no violation
		}
		if err != nil || res.String != "ok" {
			t.Errorf("%s after migration: %q, %v", check, res.String, err)
		}
	}
	o1, err := s.Order(ctx, "o1")
	if err != nil || o1.State != imagestore.OrderPaid || !o1.PaidAt.Equal(now) || o1.RefundFrom != "" {
		t.Fatalf("o1 after migration = %+v, %v", o1, err)
	}
	if o2, err := s.Order(ctx, "o2"); err != nil || o2.State != imagestore.OrderCancelled || o2.Reason != "checkoutExpired" {
		t.Fatalf("o2 after migration = %+v, %v", o2, err)
	}
	if ud, err := s.OrderUserData(ctx, "o1"); err != nil || ud != "#cloud-config\n" {
		t.Errorf("user data after migration = %q, %v", ud, err)
	}
	if got, err := s.ReplicaStates(ctx, "o1"); err != nil || len(got) != 1 || got[0].Name != "vm-o1-0" {
		t.Errorf("replica states after migration = %+v, %v", got, err)
	}
	if l, err := s.Listing(ctx, "l1"); err != nil || l.Running != 1 {
		t.Errorf("listing after migration = %+v, %v; want 1 running", l, err)
	}
	// The rebuilt table's foreign keys hold: a replica state of no order
	// is refused.
	if err := s.SetReplicaStates(ctx, "o-none", rs); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("replica states of no order: %v, want ErrNotFound", err)
	}
	if _, err := s.wdb.ExecContext(ctx, `INSERT INTO replica_states VALUES ('o-none', 0, 'x', 'running', '', '', 1)`); err == nil {
		t.Error("the rebuilt replica_states takes a row of no order: its foreign key is gone")
	}
	if err := s.SetOrderPaymentIntent(ctx, "o1", "pi_1"); err != nil {
		t.Fatal(err)
	}
	if moved, err := s.StartRefund(ctx, "o1", imagestore.RefundNotProvisioned, now); err != nil || !moved {
		t.Errorf("StartRefund after migration = %v, %v", moved, err)
	}
}

// TestMigrateOrdersToDisputeOutcome opens a database written before the
// disputes' decisions, holding what the binaries before it left: a
// disputed order whose refund kept failing (refundFailed, retried against
// the dispute) and an undisputed one. The migration holds the first
// refund (refunding, due never) and leaves the second; afterwards a
// disputed order cannot be refundFailed, and decisions are recorded.
func TestMigrateOrdersToDisputeOutcome(t *testing.T) {
	ctx := t.Context()
	path := tempPath(t)
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	const before = 12 // the step before the decisions'

	old, host, buyer := oldMarket(t, path, before, now)
	for _, id := range []string{"o1", "o2"} {
		oldOrder(t, old, host, buyer, id, 1, "", now)
		if _, err := old.PayOrder(ctx, id, now, now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if err := old.SetOrderPaymentIntent(ctx, id, "pi_"+id); err != nil {
			t.Fatal(err)
		}
		if _, err := old.StartRefund(ctx, id, imagestore.RefundNotProvisioned, now); err != nil {
			t.Fatal(err)
		}
		if err := old.SettleRefund(ctx, id, imagestore.RefundOutcome{Error: "Stripe: charge_disputed", RetryAt: now}, now); err != nil {
			t.Fatal(err)
		}
	}
	// What the binaries before marked: the dispute, the refund left failing.
	if _, err := old.wdb.ExecContext(ctx, `UPDATE orders SET dispute_id = 'du_1', disputed_at = ? WHERE id = 'o1'`, now.UnixNano()); err != nil {
		t.Fatal(err)
	}

	s := migrated(t, old, path, before)
	o1, err := s.Order(ctx, "o1")
	if err != nil || o1.State != imagestore.OrderRefunding || !o1.RefundHeld() || o1.DisputeStatus != "" || !o1.DisputeClosedAt.IsZero() {
		t.Fatalf("the disputed order after migration = %+v, %v; want its refund held", o1, err)
	}
	if o2, err := s.Order(ctx, "o2"); err != nil || o2.State != imagestore.OrderRefundFailed {
		t.Fatalf("the undisputed order after migration = %+v, %v; want refundFailed still", o2, err)
	}
	if due, err := s.DueRefunds(ctx, now.Add(time.Hour)); err != nil || len(due) != 1 || due[0].ID != "o2" {
		t.Errorf("DueRefunds after migration = %+v, %v; want only o2", due, err)
	}
	if _, err := s.wdb.ExecContext(ctx, `UPDATE orders SET state = 'refundFailed' WHERE id = 'o1'`); err == nil {
		t.Error("a disputed order was made refundFailed: the schema does not hold its refund")
	}
	if moved, err := s.CloseOrderDispute(ctx, "o1", imagestore.DisputeLost, now); err != nil || !moved {
		t.Errorf("CloseOrderDispute after migration = %v, %v", moved, err)
	}
}

// TestPreparedWrites: the write statements run once are prepared for the
// next transactions, which answer through them as the first did,
// refusals included (a unique or foreign key error is still recognised),
// and run again they are not prepared a second time.
func TestPreparedWrites(t *testing.T) {
	s := mustOpen(t, tempPath(t))
	defer s.Close()
	ctx := t.Context()
	a, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "a"}, imagestore.HashSecret("a"))
	if err != nil {
		t.Fatal(err)
	}
	ticket := func(secret string, id int, tenant int64) error {
		return s.CreateTicket(ctx, imagestore.Ticket{UploadID: fmt.Sprintf("%024x", id), TenantID: tenant, Name: secret,
			CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}, imagestore.HashSecret(secret), 10)
	}
	if err := ticket("first", 1, a.ID); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		secret string
		tenant int64
		want   error
	}{
		{"passes", "new", a.ID, nil},
		{"duplicate hash", "first", a.ID, imagestore.ErrExists},
		{"unknown tenant", "nobody's", a.ID + 1000, imagestore.ErrNotFound},
		{"passes after refusals", "newer", a.ID, nil},
	}
	prepared := 0
	for round := range 2 {
		for i, tc := range tests {
			t.Run(fmt.Sprintf("%s, round %d", tc.name, round+1), func(t *testing.T) {
				secret := tc.secret
				if tc.want == nil {
					secret = fmt.Sprintf("%s %d", secret, round)
				}
				err := ticket(secret, 10*(round+1)+i, tc.tenant)
				switch {
				case tc.want == nil && err != nil:
					t.Fatalf("CreateTicket: %v", err)
				case tc.want != nil && !errors.Is(err, tc.want):
					t.Fatalf("CreateTicket: %v, want %v", err, tc.want)
				}
				if tc.want == nil {
					if _, err := s.Ticket(ctx, imagestore.HashSecret(secret)); err != nil {
						t.Errorf("Ticket: %v", err)
					}
				}
			})
		}
		switch n := s.wstmts.Prepared(); {
		case round == 0 && n == 0:
			t.Fatal("no write statement prepared after the tickets")
		case round == 1 && n != prepared:
			t.Errorf("%d statements prepared after the second round, %d after the first: they should be reused", n, prepared)
		default:
			prepared = n
		}
	}
}

// TestPreparedReads: the read statements run once are prepared for the
// next transactions and not a second time, and answer through them what
// was committed since: a token replaced, or its tenant removed, stops
// authenticating at the very next lookup (no cached answer, no snapshot
// kept by a statement left open).
func TestPreparedReads(t *testing.T) {
	s := mustOpen(t, tempPath(t))
	defer s.Close()
	ctx := t.Context()
	a, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "a", Sharing: true}, imagestore.HashSecret("a"))
	if err != nil {
		t.Fatal(err)
	}
	reads := func() {
		t.Helper()
		if got, err := s.TenantByToken(ctx, imagestore.HashSecret("a")); err != nil || got.ID != a.ID {
			t.Fatalf("TenantByToken = %+v, %v; want tenant %d", got, err, a.ID)
		}
		if _, err := s.TenantByToken(ctx, imagestore.HashSecret("nobody")); !errors.Is(err, imagestore.ErrNotFound) {
			t.Fatalf("TenantByToken of an unknown token: %v, want ErrNotFound", err)
		}
		if imgs, err := s.Images(ctx, a.ID); err != nil || len(imgs) != 0 {
			t.Fatalf("Images = %v, %v", imgs, err)
		}
		if tks, err := s.UnusedTickets(ctx, a.ID, time.Now()); err != nil || len(tks) != 0 {
			t.Fatalf("UnusedTickets = %v, %v", tks, err)
		}
	}
	reads()
	prepared := s.rstmts.Prepared()
	if prepared == 0 {
		t.Fatal("no read statement prepared after the reads")
	}
	reads()
	if n := s.rstmts.Prepared(); n != prepared {
		t.Errorf("%d read statements prepared after the second round, %d after the first: they should be reused", n, prepared)
	}

	if err := s.SetTenantToken(ctx, "a", imagestore.HashSecret("a2")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TenantByToken(ctx, imagestore.HashSecret("a")); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("TenantByToken of the replaced token: %v, want ErrNotFound", err)
	}
	if got, err := s.TenantByToken(ctx, imagestore.HashSecret("a2")); err != nil || got.ID != a.ID {
		t.Errorf("TenantByToken of the new token = %+v, %v", got, err)
	}
	if err := s.RemoveTenant(ctx, "a", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TenantByToken(ctx, imagestore.HashSecret("a2")); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("TenantByToken of a removed tenant's token: %v, want ErrNotFound", err)
	}
}

// TestReadStatementAlone: a read without a transaction runs one
// statement, and refuses a second (it would read another snapshot) and
// statements prepared on another database (database/sql would run them
// there: on the single writer's connection, behind every write).
func TestReadStatementAlone(t *testing.T) {
	s := mustOpen(t, tempPath(t))
	defer s.Close()
	ctx := t.Context()
	one := func(tx *sqlstore.Tx) error {
		var n int
		return tx.QueryRowContext(ctx, `SELECT count(*) FROM tenants`).Scan(&n)
	}
	tests := []struct {
		name  string
		stmts *sqlstore.Stmts
		fn    func(tx *sqlstore.Tx) error
		ok    bool
	}{
		{"one statement", s.rstmts, one, true},
		{"two statements", s.rstmts, func(tx *sqlstore.Tx) error {
			if err := one(tx); err != nil {
				return err
			}
			return one(tx)
		}, false},
		{"the writer's statements", s.wstmts, one, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for round := range 2 { // unprepared, then prepared
				err := tc.fn(sqlstore.NewStatement(ctx, s.db, dialect).WithStmts(tc.stmts))
				if (err == nil) != tc.ok {
					t.Fatalf("round %d: err = %v, want ok %v", round+1, err, tc.ok)
				}
				tc.stmts.PrepareNoted(ctx)
			}
		})
	}
}
