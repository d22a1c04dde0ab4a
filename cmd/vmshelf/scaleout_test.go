package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore/postgres/pgtest"
)

// Serve over PostgreSQL (VMSHELF_STORE_URL) instead of the embedded
// SQLite file: the records live in the database, nothing in --data-dir
// but the images, and a restart finds everything again.

// TestE2EPostgresStore: tenant, ticket, upload, fetch-url and fetch all go
// through a real PostgreSQL 15; the URL's password reaches no log line.
func TestE2EPostgresStore(t *testing.T) {
	cluster := pgtest.Start(t)
	const password = "pw-9f3c51d2-never-logged"
	// The cluster trusts its socket, so any password is accepted: what
	// matters is that serve never repeats it.
	url := strings.Replace(cluster.NewDatabase(t), "postgres:///", "postgres://postgres:"+password+"@/", 1)
	env := []string{storeURLEnv + "=" + url}
	dir := filepath.Join(t.TempDir(), "data")
	s := startServe(t, dir, nil, env...)
	s.secret(password)
	if _, err := os.Stat(filepath.Join(dir, dbFile)); !os.IsNotExist(err) {
		t.Errorf("serve over PostgreSQL left %s in the data dir (stat: %v)", dbFile, err)
	}

	file, data := makeImage(t, t.TempDir(), "pg.qcow2")
	tk := s.ticket(t, "pg")
	img := s.upload(t, tk, file, data)
	u := s.fetchURL(t, img.UploadID)
	if n, sum := fetchAll(t, u, 20*time.Second); n != int64(len(data)) || sum != sha256hex(data) {
		t.Fatalf("fetched %d bytes, sha256 %s; want %d, %s", n, sum, len(data), sha256hex(data))
	}

	// The tenant CLI works on the same database.
	r := runCmd(t, env, binPath, "tenant", "add", "box2", "--data-dir", dir)
	if r.code != 0 {
		t.Fatalf("tenant add over PostgreSQL: exit %d: %s", r.code, r.stderr)
	}
	s.secret(strings.TrimSpace(r.stdout))
	r = runCmd(t, env, binPath, "tenant", "list", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "box2") || !strings.Contains(r.stdout, "dev") {
		t.Fatalf("tenant list over PostgreSQL: exit %d: %s %s", r.code, r.stdout, r.stderr)
	}

	// A restart: the image is still recorded, its fetch URL still works.
	s.terminate(t)
	s2 := startServeAt(t, dir, s.dataAddr, s.ctlAddr, nil, env...)
	s2.secret(password)
	if n, sum := fetchAll(t, u, 20*time.Second); n != int64(len(data)) || sum != sha256hex(data) {
		t.Fatalf("after a restart: fetched %d bytes, sha256 %s; want %d, %s", n, sum, len(data), sha256hex(data))
	}
}

// TestE2EPostgresUnreachable: a store URL that cannot be reached stops
// serve at start with a clear line that never holds the password.
func TestE2EPostgresUnreachable(t *testing.T) {
	const password = "pw-0b7e-never-printed"
	url := "postgres://postgres:" + password + "@/vmshelf?host=" + t.TempDir() + "&connect_timeout=5"
	dir := filepath.Join(t.TempDir(), "data")
	r := runWithin(t, 30*time.Second, []string{storeURLEnv + "=" + url}, binPath,
		"serve", "--data-dir", dir, "--data-addr", freeAddr(t), "--control-addr", freeAddr(t))
	if r.code != 1 {
		t.Fatalf("serve with an unreachable store: exit %d, want 1; stderr:\n%s", r.code, r.stderr)
	}
	if strings.Contains(r.stdout+r.stderr, password) {
		t.Errorf("serve printed the store URL's password:\n%s", r.stderr)
	}
	if !strings.Contains(r.stderr, storeURLEnv) {
		t.Errorf("the refusal does not name %s:\n%s", storeURLEnv, r.stderr)
	}
	r = runWithin(t, 30*time.Second, []string{storeURLEnv + "=postgres://u:" + password + "@[::1"}, binPath,
		"tenant", "list", "--data-dir", dir)
	if r.code == 0 || strings.Contains(r.stdout+r.stderr, password) || !strings.Contains(r.stderr, storeURLEnv) {
		t.Errorf("tenant list with a malformed store URL: exit %d, output:\n%s%s", r.code, r.stdout, r.stderr)
	}
}
