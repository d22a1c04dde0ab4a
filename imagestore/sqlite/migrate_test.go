package sqlite

import (
	"database/sql"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// schema is the embedded migrations, which the tests cut and extend to
// make databases of older or broken schemas.
func schema(t *testing.T) []string {
	t.Helper()
	steps, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	return steps
}

// fixtureV13 is a data dir's database made by the binary whose schema was
// a Go function of 13 steps, before the steps became migrations/*.sql
// (testdata/README.md says what it holds).
const fixtureV13 = "testdata/v13.db"

// copyFixture copies a checked-in database into a temporary directory, so
// that opening it (WAL, migrations) never writes testdata.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "vmshelf.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// schemaObject is one row of sqlite_schema: a table or an index with the
// statement SQLite keeps for it.
type schemaObject struct{ Type, Name, Table, SQL string }

func schemaObjects(t *testing.T, db *sql.DB) []schemaObject {
	t.Helper()
	rows, err := db.QueryContext(t.Context(),
		`SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_schema ORDER BY type, name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var objs []schemaObject
	for rows.Next() {
		var o schemaObject
		if err := rows.Scan(&o.Type, &o.Name, &o.Table, &o.SQL); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestFreshSchemaIsTheOld: a database created by the migration files has
// exactly the tables, columns, constraints and indexes, statement for
// statement, that the old binary's 13 steps gave a data dir, and the same
// schema version, so neither kind of database knows it is the other.
func TestFreshSchemaIsTheOld(t *testing.T) {
	old := copyFixture(t, fixtureV13)
	o, err := Open(t.Context(), old)
	if err != nil {
		t.Fatalf("Open the old data dir: %v", err)
	}
	t.Cleanup(func() { _ = o.Close() })
	s := mustOpen(t, tempPath(t))
	t.Cleanup(func() { _ = s.Close() })

	if got, want := userVersion(t, s), userVersion(t, o); got != want {
		t.Errorf("fresh user_version = %d, the old data dir's %d", got, want)
	}
	want, got := schemaObjects(t, o.db), schemaObjects(t, s.db)
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("a fresh database has %s %s, which the old data dir has not (or not so):\n%s", g.Type, g.Name, g.SQL)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("a fresh database lacks the old data dir's %s %s (or has it otherwise):\n%s", w.Type, w.Name, w.SQL)
		}
	}
}

// TestOldDataDirOpens: the database of a data dir made by the binary
// before the migration files opens unchanged (no step applied again, none
// missing) and every kind of record in it reads back and changes as the
// contract says.
func TestOldDataDirOpens(t *testing.T) {
	ctx := t.Context()
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	s := mustOpen(t, copyFixture(t, fixtureV13))
	t.Cleanup(func() { _ = s.Close() })
	if got, want := userVersion(t, s), len(schema(t)); got != want {
		t.Fatalf("user_version = %d, want %d", got, want)
	}
	if err := s.Verify(ctx); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	host, err := s.TenantByToken(ctx, imagestore.HashSecret("host-token"))
	check("TenantByToken host", err)
	if !host.StripeOnboarded || !host.StripeChargesEnabled || host.StripeAccount != "acct_host" || !host.HostsVMs {
		t.Errorf("host = %+v, want onboarded acct_host with charges, hosting VMs", host)
	}
	buyer, err := s.TenantByToken(ctx, imagestore.HashSecret("buyer-token"))
	check("TenantByToken buyer", err)

	const imageID = "bbbbbbbbbbbbbbbbbbbbbbbb"
	img, err := s.Image(ctx, imageID)
	check("Image", err)
	if img.TenantID != buyer.ID || img.Size != 1<<20 || !img.EFI || !img.CreatedAt.Equal(now.Add(2*time.Minute)) {
		t.Errorf("image = %+v", img)
	}
	got, _, err := s.ImageForToken(ctx, imagestore.HashSecret("fetch"), now)
	check("ImageForToken", err)
	if got.UploadID != imageID {
		t.Errorf("the fetch token names %s, want %s", got.UploadID, imageID)
	}
	unused, err := s.UnusedTickets(ctx, buyer.ID, now)
	check("UnusedTickets", err)
	if len(unused) != 1 || unused[0].UploadID != "aaaaaaaaaaaaaaaaaaaaaaaa" {
		t.Errorf("unused tickets = %+v, want aaaa…'s alone", unused)
	}
	us, err := s.Session(ctx, imagestore.HashSecret("session"))
	check("Session", err)
	if us.Offset != 1024 || us.Length != 4096 || string(us.HashState) != "state1" {
		t.Errorf("session = %+v, want 1024 of 4096 bytes with state1", us)
	}
	o, err := s.Order(ctx, "o-refund")
	check("Order o-refund", err)
	if o.State != imagestore.OrderRefunding || o.DisputeID != "dp_1" || o.DisputeStatus != "won" || o.PaymentIntent != "pi_refund" {
		t.Errorf("o-refund = %+v, want refunding, disputed dp_1, won", o)
	}
	rs, err := s.ReplicaStates(ctx, "o-active")
	check("ReplicaStates", err)
	if len(rs) != 2 || rs[0].State != "running" || rs[1].Progress != "40%" {
		t.Errorf("replica states = %+v", rs)
	}
	id, err := s.StoreID(ctx)
	check("StoreID", err)
	if id != "0123456789abcdef0123456789abcdef" {
		t.Errorf("store id = %q", id)
	}
	intents, err := s.Intents(ctx)
	check("Intents", err)
	if len(intents) != 1 || intents[0].UploadID != "ffffffffffffffffffffffff" {
		t.Errorf("intents = %+v, want ffff…'s commit alone", intents)
	}

	// Writes of every kind go on where the old binary left off.
	_, err = s.ConsumeTicket(ctx, imagestore.HashSecret("ticket-unused"), now.Add(time.Minute))
	check("ConsumeTicket of the old unused ticket", err)
	if _, err := s.ConsumeTicket(ctx, imagestore.HashSecret("ticket-cancelled"), now.Add(time.Minute)); err == nil {
		t.Error("ConsumeTicket of the old cancelled ticket succeeded")
	}
	check("CreateTicket", s.CreateTicket(ctx, imagestore.Ticket{UploadID: "999999999999999999999999", TenantID: buyer.ID,
		Name: "new", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, imagestore.HashSecret("ticket-new"), 10))
	moved, err := s.PayOrder(ctx, "o-awaiting", now.Add(time.Minute), now.Add(30*24*time.Hour))
	check("PayOrder", err)
	if !moved {
		t.Error("PayOrder of the old order awaiting payment did not move it")
	}
	ct, err := s.ConsumeConsoleTicket(ctx, imagestore.HashSecret("console"), now)
	check("ConsumeConsoleTicket", err)
	if ct.OrderID != "o-active" || ct.Replica != 1 {
		t.Errorf("console ticket = %+v", ct)
	}
	if _, err := s.AcquireLease(ctx, "leader", "replica-b", time.Minute, now); err == nil {
		t.Error("another holder took the old unexpired lease")
	}
	if _, err := s.SweepTickets(ctx, now.Add(30*24*time.Hour), time.Hour); err != nil {
		t.Fatalf("SweepTickets: %v", err)
	}
	if err := s.RemoveTenant(ctx, "host", now); err == nil {
		t.Error("RemoveTenant of the old host with orders succeeded")
	}
}
