package sqlite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// fill writes n rows into tickets and fetch_tokens (with their indexes) in
// one transaction: a store of a busy edge, made quickly.
func fill(t testing.TB, s *Store, n int) {
	t.Helper()
	ctx := context.Background()
	tn, err := s.CreateTenant(ctx, imagestore.Tenant{Name: "filler"}, imagestore.HashSecret("filler"))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for i := range n {
		h := imagestore.HashSecret(fmt.Sprint("ticket", i))
		if _, err := tx.ExecContext(ctx, `INSERT INTO tickets (hash, upload_id, tenant_id, name, efi, created_at, expires_at)
			VALUES (?, ?, ?, 'disk', 0, ?, ?)`, h[:], fmt.Sprintf("%024x", i), tn.ID, i, i+3600); err != nil {
			t.Fatal(err)
		}
		f := imagestore.HashSecret(fmt.Sprint("token", i))
		if _, err := tx.ExecContext(ctx, `INSERT INTO fetch_tokens (hash, upload_id, order_id, expires_at)
			VALUES (?, ?, '', ?)`, f[:], fmt.Sprintf("%024x", i), i+3600); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyDamagedPage overwrites one page in the middle of the file, as
// a bad sector or a stray write would: Open still succeeds (the header
// page is intact) and Verify reports the damage.
func TestVerifyDamagedPage(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "vmshelf.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, s, 2000)
	if err := s.Verify(ctx); err != nil {
		t.Fatalf("Verify of a sound store: %v", err)
	}
	if err := s.Close(); err != nil { // the last close checkpoints the WAL into the file
		t.Fatal(err)
	}
	damagePage(t, path)

	s, err = Open(ctx, path)
	if err != nil {
		t.Fatalf("Open of a store damaged in the middle: %v (expected to open; Verify finds it)", err)
	}
	defer s.Close()
	if err := s.Verify(ctx); !errors.Is(err, imagestore.ErrDamaged) {
		t.Fatalf("Verify of a damaged store: %v, want ErrDamaged", err)
	}
}

// damagePage overwrites the page in the middle of the database file with
// a pattern no SQLite page starts with.
func damagePage(t *testing.T, path string) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	pages := st.Size() / pageSize
	if pages < 8 {
		t.Fatalf("database has %d pages; the test needs a middle page to damage", pages)
	}
	damagePageNo(t, path, pages/2+1)
}

// pageSize is SQLite's default, which the store keeps.
const pageSize = 4096

// damagePageNo overwrites page number n (1-based, as SQLite counts).
func damagePageNo(t *testing.T, path string, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, pageSize)
	for i := range junk {
		junk[i] = 0xa5
	}
	if _, err := f.WriteAt(junk, (n-1)*pageSize); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkVerify100k is the start-up cost of the integrity check on a
// store of 100 000 tickets and 100 000 fetch tokens (docs/operations.md).
func BenchmarkVerify100k(b *testing.B) {
	path := filepath.Join(b.TempDir(), "vmshelf.db")
	s, err := Open(b.Context(), path)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	fill(b, s, 100_000)
	if _, err := s.wdb.ExecContext(b.Context(), "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if err := s.Verify(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
	if st, err := os.Stat(path); err == nil {
		b.ReportMetric(float64(st.Size())/1e6, "db-MB") // after the loop: ResetTimer drops metrics
	}
}
