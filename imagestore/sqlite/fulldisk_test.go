package sqlite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/testkit/testdisk"
)

// storeWithImages opens a store on dir with reserve bytes of emergency
// space (0: none) holding n images of one tenant.
func storeWithImages(t *testing.T, dir string, reserve int64, n int) (*Store, imagestore.Tenant, []string) {
	t.Helper()
	ctx := t.Context()
	var opts []Option
	if reserve > 0 {
		opts = append(opts, WithReserve(reserve))
	}
	s, err := Open(ctx, filepath.Join(dir, "vmshelf.db"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	tn, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "box"}, imagestore.HashSecret("box"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range n {
		id := imagestore.NewUploadID()
		if err := s.AddImage(ctx, imagestore.Image{UploadID: id, TenantID: tn.ID, Name: "disk", CreatedAt: time.Now()}, 0); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return s, tn, ids
}

// TestFullDiskRemoveCommits: with the disk full, a remove still commits
// (the reserve is released for it), further writes fail with ErrNoSpace
// and Ping says so, and once space is back the reserve is taken again and
// Ping is clear.
func TestFullDiskRemoveCommits(t *testing.T) {
	ctx := t.Context()
	dir := testdisk.Mount(t, "tmpfs", 16)
	s, tn, ids := storeWithImages(t, dir, 2<<20, 3)
	if st, err := os.Stat(filepath.Join(dir, "vmshelf.db-reserve")); err != nil || st.Size() != 2<<20 {
		t.Fatalf("reserve file: %v, %v; want 2 MiB", st, err)
	}
	filler := testdisk.Fill(t, dir)

	if err := s.RemoveImage(ctx, tn.ID, ids[0]); err != nil {
		t.Fatalf("RemoveImage on a full disk: %v", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping after a write that committed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "vmshelf.db-reserve")); !os.IsNotExist(err) {
		t.Errorf("the reserve is still there after it was needed: %v", err)
	}
	// The freed reserve is soon used up; then writes fail as what they are.
	var werr error
	for i := 0; i < 100_000 && werr == nil; i++ {
		werr = s.CreateTicket(ctx, imagestore.Ticket{UploadID: fmt.Sprintf("%024x", i), TenantID: tn.ID, Name: "disk",
			CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}, imagestore.HashSecret(fmt.Sprint(i)), 0)
	}
	if !errors.Is(werr, imagestore.ErrNoSpace) {
		t.Fatalf("a write on a full disk without reserve: %v, want ErrNoSpace", werr)
	}
	if err := s.Ping(ctx); !errors.Is(err, imagestore.ErrNoSpace) {
		t.Errorf("Ping after a write failed for space: %v, want ErrNoSpace", err)
	}
	if err := s.RefillReserve(); !errors.Is(err, imagestore.ErrNoSpace) {
		t.Errorf("RefillReserve on a full disk: %v, want ErrNoSpace", err)
	}
	if _, err := s.ImageIDs(ctx); err != nil {
		t.Errorf("reads on a full disk: %v", err)
	}

	// Space comes back: the reserve is taken again, writes work, Ping is clear.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := s.RefillReserve(); err != nil {
		t.Fatalf("RefillReserve with room: %v", err)
	}
	if err := s.RemoveImage(ctx, tn.ID, ids[1]); err != nil {
		t.Fatalf("RemoveImage after space came back: %v", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping after space came back: %v", err)
	}
}

// TestFullDiskWithoutReserve is the failure the reserve exists for: on a
// full disk SQLite cannot even commit a delete (its WAL must grow).
func TestFullDiskWithoutReserve(t *testing.T) {
	ctx := t.Context()
	dir := testdisk.Mount(t, "tmpfs", 16)
	s, tn, ids := storeWithImages(t, dir, 0, 3)
	testdisk.Fill(t, dir)
	if err := s.RemoveImage(ctx, tn.ID, ids[0]); !errors.Is(err, imagestore.ErrNoSpace) {
		t.Fatalf("RemoveImage on a full disk without reserve: %v, want ErrNoSpace", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, imagestore.ErrNoSpace) {
		t.Errorf("Ping: %v, want ErrNoSpace", err)
	}
}

// TestDamagedPageAtRuntime: a read that meets a damaged page fails with
// ErrDamaged, and from then on Ping says the store is damaged.
func TestDamagedPageAtRuntime(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "vmshelf.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, 2000)
	// A leaf page of the tickets table, which Ticket lookups read.
	var page int64
	if err := s.db.QueryRowContext(ctx, `SELECT pageno FROM dbstat WHERE name = 'tickets' AND pagetype = 'leaf'
		ORDER BY pageno LIMIT 1 OFFSET 10`).Scan(&page); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	damagePageNo(t, path, page)
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping before any read met the damage: %v", err)
	}
	var rerr error
	for i := 0; i < 2000 && rerr == nil; i++ {
		_, rerr = s.Ticket(ctx, imagestore.HashSecret(fmt.Sprint("ticket", i)))
	}
	if !errors.Is(rerr, imagestore.ErrDamaged) {
		t.Fatalf("reading every ticket of a damaged store: %v, want ErrDamaged", rerr)
	}
	if err := s.Ping(ctx); !errors.Is(err, imagestore.ErrDamaged) {
		t.Errorf("Ping after the damage was met: %v, want ErrDamaged", err)
	}
}

// TestFullDiskMarketWrites: the market's writes go through the store's
// one write path, so a full disk is ErrNoSpace for them too (not an
// opaque SQLite error), nothing half-written stays, and reads go on.
func TestFullDiskMarketWrites(t *testing.T) {
	ctx := t.Context()
	dir := testdisk.Mount(t, "tmpfs", 16)
	s, buyer, _ := storeWithImages(t, dir, 0, 0)
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	host, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "host", StripeAccount: "acct_h"}, imagestore.HashSecret("host"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateListing(ctx, imagestore.Listing{ID: "l1", HostID: host.ID, UnitPrice: 600, Currency: "eur", Capacity: 50, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	order := func(id string) imagestore.Order {
		return imagestore.Order{ID: id, ListingID: "l1", BuyerID: buyer.ID, HostID: host.ID, Quantity: 1, ImageKind: imagestore.ImageCatalogue,
			Image: "debian-13", Name: id, UnitPrice: 600, Total: 600, Fee: 300, Currency: "eur", Destination: "acct_h",
			ReserveUntil: now.Add(time.Hour), CreatedAt: now}
	}
	for _, id := range []string{"awaiting", "paid", "active"} {
		if err := s.CreateOrder(ctx, order(id), "", 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.PayOrder(ctx, "paid", now, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PayOrder(ctx, "active", now, now); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkOrderActive(ctx, "active"); err != nil {
		t.Fatal(err)
	}
	before, err := s.OrderCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testdisk.Fill(t, dir)

	writes := []struct {
		name string
		call func() error
	}{
		{"CreateListing", func() error {
			_, err := s.CreateListing(ctx, imagestore.Listing{ID: "l2", HostID: host.ID, UnitPrice: 1, Currency: "eur", Capacity: 1, CreatedAt: now})
			return err
		}},
		{"CloseListing", func() error { return s.CloseListing(ctx, host.ID, "l1", now) }},
		{"CreateOrder", func() error { return s.CreateOrder(ctx, order("new"), "#cloud-config\n", 0) }},
		{"SetCheckout", func() error { return s.SetCheckout(ctx, "awaiting", "cs_1", "https://checkout.example/1") }},
		{"PayOrder", func() error { _, err := s.PayOrder(ctx, "awaiting", now, now); return err }},
		{"CancelOrder", func() error { return s.CancelOrder(ctx, "awaiting", "checkoutExpired", now) }},
		{"MarkOrderActive", func() error { return s.MarkOrderActive(ctx, "paid") }},
		{"ExpireOrder", func() error { return s.ExpireOrder(ctx, "active", now) }},
		{"RecordWebhookEvent", func() error {
			return s.RecordWebhookEvent(ctx, imagestore.WebhookEvent{ID: "evt_1", Type: "t", Result: "r", At: now})
		}},
	}
	for _, w := range writes {
		if err := w.call(); !errors.Is(err, imagestore.ErrNoSpace) {
			t.Errorf("%s on a full disk: %v, want ErrNoSpace", w.name, err)
		}
	}
	if err := s.Ping(ctx); !errors.Is(err, imagestore.ErrNoSpace) {
		t.Errorf("Ping: %v, want ErrNoSpace", err)
	}
	after, err := s.OrderCounts(ctx)
	if err != nil {
		t.Fatalf("OrderCounts on a full disk: %v", err)
	}
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("order counts after refused writes = %v, want %v", after, before)
	}
	if l, err := s.Listing(ctx, "l1"); err != nil || !l.Open() || l.Reserved != 1 || l.Running != 2 {
		t.Errorf("listing after refused writes = %+v, %v; want open, 1 reserved, 2 running", l, err)
	}
	if seen, err := s.WebhookEventSeen(ctx, "evt_1"); err != nil || seen {
		t.Errorf("WebhookEventSeen after a refused record = %v, %v", seen, err)
	}
}
