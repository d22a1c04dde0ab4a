package sqlite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/testdisk"
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
