package main

// What start-up does with a store that no longer matches the image files:
// it never deletes an image because a record is missing.

import (
	"bytes"
	"database/sql"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite" // to find a page of the db by name (dbstat)
)

// populated is a data dir whose serve stored three images, then stopped
// cleanly; wal is a copy of the db's write-ahead log taken while serve ran.
type populated struct {
	dir    string
	wal    []byte
	images map[string]string // upload id -> sha256 of the file
}

func populate(t *testing.T) populated {
	t.Helper()
	work := t.TempDir()
	p := populated{dir: filepath.Join(work, "data"), images: map[string]string{}}
	s := startServe(t, p.dir, nil)
	disk, diskBytes := makeImage(t, work, "disk.qcow2")
	for i := range 3 {
		img := s.upload(t, s.ticket(t, "disk "+string(rune('a'+i))), disk, diskBytes)
		p.images[img.UploadID] = img.SHA256
	}
	var err error
	if p.wal, err = os.ReadFile(filepath.Join(p.dir, dbFile+"-wal")); err != nil || len(p.wal) == 0 {
		t.Fatalf("the running store has no WAL to copy (%d bytes, %v)", len(p.wal), err)
	}
	s.stop()
	return p
}

// copyDir gives each case its own copy of the populated data dir.
func (p populated) copyDir(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "data")
	if out, err := exec.Command("cp", "-a", p.dir, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v %s", err, out)
	}
	return dst
}

// assertImagesIntact checks that every image file is where it was, byte
// for byte.
func (p populated) assertImagesIntact(t *testing.T, dir string) {
	t.Helper()
	for id, sum := range p.images {
		b, err := os.ReadFile(filepath.Join(dir, imagesDir, id+".qcow2"))
		if err != nil {
			t.Errorf("image %s: %v", id, err)
			continue
		}
		if got := sha256hex(b); got != sum {
			t.Errorf("image %s changed: sha256 %s, want %s", id, got, sum)
		}
	}
}

// refusedStart runs serve on dir, which must refuse to start (exit 2, one
// line naming the data dir), and returns that line.
func refusedStart(t *testing.T, dir string) string {
	t.Helper()
	da, ca := freeAddr(t), freeAddr(t)
	r := runWithin(t, 20*time.Second, nil, binPath, "serve", "--dev", "--data-dir", dir, "--data-addr", da, "--control-addr", ca)
	line := refusal(t, r, 2)
	if strings.Count(strings.TrimRight(r.stderr, "\n"), "\n") != 0 {
		t.Errorf("stderr has more than one line:\n%s", r.stderr)
	}
	if !strings.Contains(line, dir) {
		t.Errorf("the refusal %q does not name the data dir %s", line, dir)
	}
	return line
}

// TestE2EStoreLostRefusesToStart: a missing, emptied or replaced vmshelf.db
// beside stored images stops serve before it touches a file.
func TestE2EStoreLostRefusesToStart(t *testing.T) {
	p := populate(t)
	db := func(dir string) string { return filepath.Join(dir, dbFile) }
	for _, tc := range []struct {
		name    string
		breakIt func(t *testing.T, dir string)
	}{
		{"db missing", func(t *testing.T, dir string) {
			for _, suffix := range []string{"", "-wal", "-shm"} {
				if err := os.Remove(db(dir) + suffix); err != nil && !os.IsNotExist(err) {
					t.Fatal(err)
				}
			}
		}},
		{"db empty", func(t *testing.T, dir string) {
			if err := os.Truncate(db(dir), 0); err != nil {
				t.Fatal(err)
			}
		}},
		{"db empty with a stale WAL", func(t *testing.T, dir string) {
			if err := os.Truncate(db(dir), 0); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(db(dir)+"-wal", p.wal, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"db's tables emptied", func(t *testing.T, dir string) {
			emptyTables(t, db(dir), "")
		}},
		{"db's images table emptied", func(t *testing.T, dir string) {
			emptyTables(t, db(dir), "images")
		}},
		{"db of another store", func(t *testing.T, dir string) {
			other := filepath.Join(t.TempDir(), "data")
			startServe(t, other, nil).stop()
			for _, suffix := range []string{"", "-wal", "-shm"} {
				if err := os.Remove(db(dir) + suffix); err != nil && !os.IsNotExist(err) {
					t.Fatal(err)
				}
			}
			b, err := os.ReadFile(db(other))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(db(dir), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := p.copyDir(t)
			tc.breakIt(t, dir)
			line := refusedStart(t, dir)
			for _, want := range []string{"3 image files", "restore " + dbFile, "from a backup"} {
				if !strings.Contains(line, want) {
					t.Errorf("the refusal %q does not say %q", line, want)
				}
			}
			p.assertImagesIntact(t, dir)
			if q, err := os.ReadDir(filepath.Join(dir, imagesDir, ".quarantine")); err == nil && len(q) > 0 {
				t.Errorf("a refused start quarantined %d files", len(q))
			}
			// Refused again on the next try: the refusal changed nothing.
			refusedStart(t, dir)
			p.assertImagesIntact(t, dir)
		})
	}
}

// emptyTables deletes every row of the db's table only, or of all its
// tables if only is "", as a botched cleanup or restore would.
func emptyTables(t *testing.T, path, only string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tables := []string{only}
	if only == "" {
		rows, err := db.Query(`SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`)
		if err != nil {
			t.Fatal(err)
		}
		tables = nil
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				t.Fatal(err)
			}
			tables = append(tables, name)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range tables {
		// The names come from the db's own schema, not from input.
		if _, err := db.Exec(`DELETE FROM "` + name + `"`); err != nil {
			t.Fatalf("emptying %s: %v", name, err)
		}
	}
}

// TestE2EStoreZeroFilled: a vmshelf.db overwritten with zeros (a failed
// disk, a botched copy) is refused like every other start-up refusal
// (exit 2, one line) with the advice to restore it, the images untouched.
func TestE2EStoreZeroFilled(t *testing.T) {
	p := populate(t)
	dir := p.copyDir(t)
	path := filepath.Join(dir, dbFile)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, make([]byte, st.Size()), 0o600); err != nil {
		t.Fatal(err)
	}
	line := refusedStart(t, dir)
	for _, want := range []string{"not a vmshelf database", "backup of " + dbFile} {
		if !strings.Contains(line, want) {
			t.Errorf("the refusal %q does not say %q", line, want)
		}
	}
	p.assertImagesIntact(t, dir)
}

// TestE2EStoreTruncatedWhileRunning: the db emptied under a running serve
// (a bad restore, a full disk's mishap), then a normal restart: refused,
// every image kept.
func TestE2EStoreTruncatedWhileRunning(t *testing.T) {
	p := populate(t)
	dir := p.copyDir(t)
	s := startServe(t, dir, nil)
	if err := os.Truncate(filepath.Join(dir, dbFile), 0); err != nil {
		t.Fatal(err)
	}
	s.stop()
	refusedStart(t, dir)
	p.assertImagesIntact(t, dir)
}

// TestE2EStoreDamaged: a page in the middle of the db overwritten (a bad
// sector): serve refuses to start with one line, instead of serving 500s.
func TestE2EStoreDamaged(t *testing.T) {
	p := populate(t)
	dir := p.copyDir(t)
	path := filepath.Join(dir, dbFile)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	const page = 4096
	pages := st.Size() / page
	if pages < 4 {
		t.Fatalf("the db has %d pages; need one past the header to damage", pages)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := []byte(strings.Repeat("\xa5", page))
	if _, err := f.WriteAt(junk, (pages/2)*page); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	line := refusedStart(t, dir)
	if !strings.Contains(line, "damaged") || !strings.Contains(line, "restore") {
		t.Errorf("the refusal %q does not say the db is damaged and to restore it", line)
	}
	p.assertImagesIntact(t, dir)
}

// TestE2EOrphanQuarantined: an image file no record names (its record lost
// with an older db backup) is set aside, counted, listed, and removed only
// on the operator's word.
func TestE2EOrphanQuarantined(t *testing.T) {
	p := populate(t)
	dir := p.copyDir(t)
	var some string
	for id := range p.images {
		some = id
		break
	}
	orphan := "0123456789abcdef01234567"
	orphanBytes, err := os.ReadFile(filepath.Join(dir, imagesDir, some+".qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, imagesDir, orphan+".qcow2"), orphanBytes, 0o600); err != nil {
		t.Fatal(err)
	}

	s := startServe(t, dir, nil)
	if !strings.Contains(s.logs(), "upload_id="+orphan) || !strings.Contains(s.logs(), "files_quarantined=1") {
		t.Errorf("serve's log does not report the quarantined file:\n%s", s.logs())
	}
	if v, ok := metricValue(s.scrape(t), "vmshelf_quarantined_image_files", nil); !ok || v != 1 {
		t.Errorf("vmshelf_quarantined_image_files = %v (present %v), want 1", v, ok)
	}
	if n := len(s.status(t, s.token).Images); n != 3 {
		t.Errorf("status lists %d images, want the 3 recorded", n)
	}
	p.assertImagesIntact(t, dir)
	qfile := filepath.Join(dir, imagesDir, ".quarantine", orphan+".qcow2")
	if b, err := os.ReadFile(qfile); err != nil || sha256hex(b) != sha256hex(orphanBytes) {
		t.Fatalf("quarantined file: %v (sha256 match %v)", err, err == nil && sha256hex(b) == sha256hex(orphanBytes))
	}

	// The operator's view while serve runs.
	r := vmshelf(t, "quarantine", "list", "--data-dir", dir)
	if r.code != 0 {
		t.Fatalf("quarantine list: exit %d: %s", r.code, r.stderr)
	}
	fields := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\t")
	if len(fields) != 3 || fields[0] != orphan || fields[1] != strconv.Itoa(len(orphanBytes)) {
		t.Errorf("quarantine list printed %q, want %s<TAB>%d<TAB><time>", r.stdout, orphan, len(orphanBytes))
	}
	if r := vmshelf(t, "quarantine", "rm", "--data-dir", dir); r.code != 2 {
		t.Errorf("quarantine rm without ids: exit %d, want 2", r.code)
	}
	if r := vmshelf(t, "quarantine", "rm", some, "--data-dir", dir); r.code != 1 {
		t.Errorf("quarantine rm of an id that is not quarantined: exit %d, want 1 (%s)", r.code, r.stderr)
	}
	p.assertImagesIntact(t, dir)
	if r := vmshelf(t, "quarantine", "rm", orphan, "--data-dir", dir); r.code != 0 || r.stdout != "removed "+orphan+"\n" {
		t.Fatalf("quarantine rm: exit %d, stdout %q, stderr %s", r.code, r.stdout, r.stderr)
	}
	if _, err := os.Stat(qfile); !os.IsNotExist(err) {
		t.Errorf("quarantined file after rm: %v", err)
	}
	if v, ok := metricValue(s.scrape(t), "vmshelf_quarantined_image_files", nil); !ok || v != 0 {
		t.Errorf("vmshelf_quarantined_image_files after rm = %v (present %v), want 0", v, ok)
	}
	if r := vmshelf(t, "quarantine", "list", "--data-dir", dir); r.code != 0 || r.stdout != "" {
		t.Errorf("quarantine list after rm: exit %d, stdout %q", r.code, r.stdout)
	}
	es := dirEntries(t, filepath.Join(dir, imagesDir))
	slices.Sort(es)
	if len(es) != 6 { // .partial, .quarantine, .store-id and the three images
		t.Errorf("vm-images holds %v, want .partial, .quarantine, .store-id and the 3 images", es)
	}
}

// TestE2EStoreDamagedAtRuntime: a page of the running serve's db goes bad
// (a bad sector). The request that meets it fails, and from then on
// /readyz answers 503 storeCorrupt, so that the edge is taken out of
// service instead of answering 500 to every tenant.
func TestE2EStoreDamagedAtRuntime(t *testing.T) {
	p := populate(t)
	dir := p.copyDir(t)
	path := filepath.Join(dir, dbFile)
	// The images table's page, found while no serve runs (the clean stop
	// folded the WAL into the file).
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	var page int64
	err = db.QueryRow(`SELECT pageno FROM dbstat WHERE name = 'images' ORDER BY pageno LIMIT 1`).Scan(&page)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("finding the images table's page: %v", err)
	}

	s := startServe(t, dir, nil)
	if code, body := curl(t, s.ctlBase+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before the damage: %d %s", code, body)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xa5}, 4096), (page-1)*4096); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Another process writes (another table): every connection of serve
	// then drops its page cache and reads the damaged page from the file.
	if r := vmshelf(t, "tenant", "add", "other", "--data-dir", dir); r.code != 0 {
		t.Fatalf("tenant add: exit %d: %s", r.code, r.stderr)
	}
	s.secret(strings.TrimSpace(vmshelf(t, "tenant", "token", "other", "--data-dir", dir).stdout))

	code, body := s.ctl(t, "/market/vms/status", s.token, "")
	if code != http.StatusInternalServerError {
		t.Errorf("status on a damaged images page: %d %s, want 500", code, body)
	}
	code, body = curl(t, s.ctlBase+"/readyz")
	wantError(t, "/readyz after a damaged page was met", code, body, http.StatusServiceUnavailable, "storeCorrupt")
	p.assertImagesIntact(t, dir)
}
