package main

// The crash windows over PostgreSQL and S3, and a removal while S3 cannot
// be reached: the record goes, the object stays, and neither a restart
// nor the removal of the tenant's other image may then make start-up take
// the database for lost.

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore/postgres/pgtest"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
	"github.com/vmshelf/vmshelf/internal/crashpoint"
)

// s3Edge is a PostgreSQL cluster and a versitygw that serve reaches
// through a proxy the test can cut.
type s3Edge struct {
	cluster *pgtest.Cluster
	bucket  *s3test.Server
	proxy   *cutProxy
}

func newS3Edge(t *testing.T) *s3Edge {
	t.Helper()
	e := &s3Edge{cluster: pgtest.Start(t), bucket: s3test.StartServer(t)}
	e.proxy = startCutProxy(t, strings.TrimPrefix(e.bucket.Config.Endpoint, "http://"))
	return e
}

// env is serve's environment over database db.
func (e *s3Edge) env(db string) []string {
	c := e.bucket.Config
	return []string{
		storeURLEnv + "=" + db,
		"AWS_ENDPOINT_URL=http://" + e.proxy.addr,
		"AWS_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=" + string(c.AccessKeyID),
		"AWS_SECRET_ACCESS_KEY=" + string(c.SecretAccessKey),
	}
}

// args puts the images under prefix in the bucket.
func (e *s3Edge) args(prefix string) []string {
	return []string{"--blobs", "s3://" + s3test.Bucket + "/" + prefix, "--blob-capacity-gib", "4"}
}

// object is the file versitygw keeps key under prefix in.
func (e *s3Edge) object(prefix, key string) string {
	return filepath.Join(e.bucket.Dir, s3test.Bucket, prefix, key)
}

// start starts serve (bin) on a data dir of its own.
func (e *s3Edge) start(t *testing.T, bin, db, prefix string, extra ...string) *server {
	t.Helper()
	return e.startBeside(t, nil, bin, db, prefix, extra...)
}

// startBeside starts one more replica beside first (nil: the first),
// with first's dev token so that --dev keeps it.
func (e *s3Edge) startBeside(t *testing.T, first *server, bin, db, prefix string, extra ...string) *server {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	if first != nil {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, devToken), []byte(first.token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := startServeWith(t, bin, dir, e.args(prefix), append(e.env(db), extra...))
	s.secret(string(e.bucket.Config.SecretAccessKey))
	return s
}

// refused runs serve over db and prefix, which must refuse to start
// (exit 2), and returns its line.
func (e *s3Edge) refused(t *testing.T, db, prefix string) string {
	t.Helper()
	args := append([]string{"serve", "--dev", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--data-addr", freeAddr(t), "--control-addr", freeAddr(t)}, e.args(prefix)...)
	return refusal(t, runWithin(t, 30*time.Second, e.env(db), binPath, args...), 2)
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Stat(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestE2ECrashInCommitOrRemovalS3: as TestE2ECrashInCommitOrRemoval, over
// PostgreSQL and S3. A committed object the crash left unrecorded is kept
// (younger than the replicas' grace, it is left where it is: another
// replica might be about to record it); a removed image's object is gone
// after the restart; a new database beside the bucket is still refused.
func TestE2ECrashInCommitOrRemovalS3(t *testing.T) {
	bin := crashBinary(t)
	e := newS3Edge(t)
	file, data := makeImage(t, t.TempDir(), "disk.qcow2")
	for _, tc := range crashCases {
		t.Run(tc.step, func(t *testing.T) {
			db, prefix := e.cluster.NewDatabase(t), tc.step
			var victim string
			if tc.removal {
				s := e.start(t, binPath, db, prefix)
				victim = s.upload(t, s.ticket(t, "last"), file, data).UploadID
				s.terminate(t)
			}
			s := e.start(t, bin, db, prefix, crashpoint.Env+"="+tc.step)
			if tc.removal {
				s.removeCut(t, victim)
			} else {
				tk := s.ticket(t, "first")
				victim = tk.UploadID
				s.uploadCut(t, tk, file)
			}
			s.crashed(t, tc.step)

			s = e.start(t, binPath, db, prefix)
			if n := len(s.status(t, s.token).Images); n != 0 {
				t.Errorf("after the crash the tenant has %d images, want none", n)
			}
			marker, bytes := e.object(prefix, "committed/"+victim), e.object(prefix, "images/"+victim+".qcow2")
			switch {
			case tc.committed:
				if !exists(t, marker) || !exists(t, bytes) || fileSHA256(t, bytes) != sha256hex(data) {
					t.Errorf("the cut-off upload's object is not kept whole (marker %v, bytes %v)", exists(t, marker), exists(t, bytes))
				}
			case tc.removal:
				if exists(t, marker) || exists(t, bytes) {
					t.Errorf("the removed image's object is still there (marker %v, bytes %v)", exists(t, marker), exists(t, bytes))
				}
			default:
				if exists(t, marker) {
					t.Errorf("an upload cut off before its commit has a marker")
				}
			}
			s.upload(t, s.ticket(t, "after"), file, data)
			s.terminate(t)
			if line := e.refused(t, e.cluster.NewDatabase(t), prefix); !strings.Contains(line, "no store id") {
				t.Errorf("the refusal of a new database beside the bucket does not say it has no store id: %q", line)
			}
		})
	}
}

// TestE2ERemovalWhileS3Down: a removal while S3 cannot be reached answers
// 200 (the record is gone) and leaves the object; once the tenant's other
// image is removed too, no image record is left. Before the journal every
// replica's restart then refused with exit 2 ("holds no image record …
// restore from a backup"); now the restart finishes the removal: the
// object is deleted, and the store is still refused when its database is
// replaced.
func TestE2ERemovalWhileS3Down(t *testing.T) {
	e := newS3Edge(t)
	db, prefix := e.cluster.NewDatabase(t), "down"
	file, data := makeImage(t, t.TempDir(), "disk.qcow2")
	s := e.start(t, binPath, db, prefix)
	first := s.upload(t, s.ticket(t, "first"), file, data).UploadID
	other := s.upload(t, s.ticket(t, "other"), file, data).UploadID

	e.proxy.cut(true)
	s.remove(t, first) // 200 although the object could not be deleted
	e.proxy.cut(false)
	if !exists(t, e.object(prefix, "committed/"+first)) {
		t.Fatalf("the object of the removal made while S3 was down is gone already: the test did not cut S3 off")
	}
	if !strings.Contains(s.logs(), "upload_id="+first) {
		t.Errorf("serve's log does not name the object it could not delete:\n%s", s.logs())
	}
	s.remove(t, other)
	if exists(t, e.object(prefix, "committed/"+other)) {
		t.Errorf("the object of the removal made with S3 up is still there")
	}
	s.terminate(t)

	s = e.start(t, binPath, db, prefix)
	if exists(t, e.object(prefix, "committed/"+first)) || exists(t, e.object(prefix, "images/"+first+".qcow2")) {
		t.Errorf("the restart did not finish the removal made while S3 was down")
	}
	if !strings.Contains(s.logs(), "removals_finished=1") {
		t.Errorf("the restart does not report the removal it finished:\n%s", s.logs())
	}
	s.upload(t, s.ticket(t, "kept"), file, data)
	s.terminate(t)
	if line := e.refused(t, e.cluster.NewDatabase(t), prefix); !strings.Contains(line, "restore the PostgreSQL database from a backup") {
		t.Errorf("the refusal of a replaced database does not say to restore it: %q", line)
	}
}

// TestE2ERemovalWhileS3DownSwept: the removal S3 was down for is
// finished without restarting the replica that serves on: the leader's
// sweep deletes the object once S3 answers (here: the replica that takes
// the lead when the first one stops, and sweeps at once).
func TestE2ERemovalWhileS3DownSwept(t *testing.T) {
	e := newS3Edge(t)
	db, prefix := e.cluster.NewDatabase(t), "swept"
	file, data := makeImage(t, t.TempDir(), "disk.qcow2")
	a := e.start(t, binPath, db, prefix)
	b := e.startBeside(t, a, binPath, db, prefix)
	id := a.upload(t, a.ticket(t, "disk"), file, data).UploadID
	e.proxy.cut(true)
	b.remove(t, id)
	e.proxy.cut(false)
	marker := e.object(prefix, "committed/"+id)
	if !exists(t, marker) {
		t.Fatalf("the object of the removal made while S3 was down is gone already: the test did not cut S3 off")
	}
	a.terminate(t) // B leads within the lease's retry (5 s) and sweeps
	deadline := time.Now().Add(30 * time.Second)
	for exists(t, marker) || exists(t, e.object(prefix, "images/"+id+".qcow2")) {
		if time.Now().After(deadline) {
			t.Fatalf("the object is still there 30 s after S3 came back and the lead changed; B's log:\n%s", b.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The sweep writes its line after the last delete it made: a loaded
	// machine may show the objects gone before the line is written.
	deadline = time.Now().Add(10 * time.Second)
	for !strings.Contains(b.logs(), "image removals finished") {
		if time.Now().After(deadline) {
			t.Fatalf("the sweep does not report the removal it finished:\n%s", b.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cutProxy forwards TCP connections to an S3 server until cut: then it
// drops every connection it carries and every new one at once, as a
// server that went away.
type cutProxy struct {
	addr string
	to   string
	ln   net.Listener

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
}

func startCutProxy(t *testing.T, to string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: ln.Addr().String(), to: to, ln: ln, conns: map[net.Conn]bool{}}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); p.cut(true); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(c) })
		}
	})
	return p
}

// cut drops every connection and refuses new ones (true), or forwards
// again (false).
func (p *cutProxy) cut(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			c.Close()
		}
	}
}

// track notes c unless the proxy is cut, which closes c instead.
func (p *cutProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = true
	}
	return true
}

func (p *cutProxy) serve(c net.Conn) {
	up, err := net.DialTimeout("tcp", p.to, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, up) {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) { _, _ = io.Copy(dst, src); done <- struct{}{} }
	go pipe(up, c)
	go pipe(c, up)
	<-done
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}
