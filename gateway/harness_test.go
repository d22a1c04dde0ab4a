package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobfs"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
	"github.com/vmshelf/vmshelf/internal/testkit/fakeclock"
)

// Bounds of the waits in these tests. They are generous: they only decide
// how long a broken test takes to say what it waited for, never whether a
// working one passes, on 2 loaded cores under -race.
const (
	waitBound   = 30 * time.Second // one event, one answer, one condition
	clientBound = 2 * time.Minute  // one whole HTTP exchange
)

// testClient is the HTTP client of every test here: a hang is a failure
// that names the request, not the package's 9-minute limit.
var testClient = &http.Client{Timeout: clientBound}

// env is one gateway on loopback over a real store in a temp dir.
type env struct {
	t      *testing.T
	g      *Gateway
	st     *sqlite.Store
	blobs  *blobfs.FS
	dir    string // vm-images
	base   string // http://127.0.0.1:port
	reg    *prometheus.Registry
	clock  *clock
	tenant imagestore.Tenant
	freed  *slotEvents // transfers that gave their slot back
	log    *logSink    // everything the gateway logged
	stop   func()      // shuts the gateway down and closes the store; idempotent
	db     string      // the store's path

	mu      sync.Mutex
	secrets []string // capabilities handed out: tickets, fetch tokens, session ids
}

// clock is the gateway's time: the real time, moved ahead by the test, so
// that deadlines set from it on sockets are sane.
type clock = fakeclock.Ahead

// slotEvents counts, by direction, the transfers that gave their slot
// back. The gateway calls record from releaseSlot: it takes a mutex for a
// moment and never waits for the test, so a test that stops listening
// cannot block the server.
type slotEvents struct {
	mu      sync.Mutex
	freed   map[string]int
	taken   map[string]int // events already consumed by waitSlotFreed
	changed chan struct{}  // closed and replaced on every event
}

func newSlotEvents() *slotEvents {
	return &slotEvents{freed: map[string]int{}, taken: map[string]int{}, changed: make(chan struct{})}
}

func (s *slotEvents) record(dir string) {
	s.mu.Lock()
	s.freed[dir]++
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// logSink keeps what the gateway logs for the tests to read, and echoes
// it to stderr with VMSHELF_TEST_LOG=1.
type logSink struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	echo bool
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.echo {
		os.Stderr.Write(p)
	}
	return s.buf.Write(p)
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func newEnv(t *testing.T, mod func(*Config)) *env {
	t.Helper()
	return newEnvAt(t, t.TempDir(), mod)
}

func newEnvAt(t *testing.T, dataDir string, mod func(*Config)) *env {
	t.Helper()
	return newEnvFull(t, dataDir, filepath.Join(t.TempDir(), "vmshelf.db"), mod)
}

// newEnvFull opens the store at dbPath and the images under dataDir; a
// second env on the same paths is the gateway after a restart.
func newEnvFull(t *testing.T, dataDir, dbPath string, mod func(*Config)) *env {
	t.Helper()
	return startEnv(t, dataDir, dbPath, mod, nil)
}

// startEnv is newEnvFull whose gateway sees the store through wrap, if
// set: a test's seam around one store call.
func startEnv(t *testing.T, dataDir, dbPath string, mod func(*Config), wrap func(imagestore.Store) imagestore.Store) *env {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	dir := filepath.Join(dataDir, "vm-images")
	blobs, err := blobfs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, st: st, blobs: blobs, dir: dir, db: dbPath, reg: prometheus.NewRegistry(), clock: &clock{},
		freed: newSlotEvents(), log: &logSink{echo: os.Getenv("VMSHELF_TEST_LOG") == "1"}}
	cfg := Config{
		UploadMax:       1 << 30,
		MaxVirtualSize:  512 << 30,
		IdleTimeout:     5 * time.Second,
		MaxTransfers:    4,
		ImagesPerTenant: 3,
		Headroom:        1 << 20,
		Now:             e.clock.Now,
		// Debug too: range fetches log there, and no level may leak.
		Log: slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&cfg)
	}
	var gst imagestore.Store = st
	if wrap != nil {
		gst = wrap(st)
	}
	e.g, err = New(cfg, gst, blobs, e.reg)
	if err != nil {
		t.Fatal(err)
	}
	e.g.onSlotFreed = e.freed.record
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.base = "http://" + ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- e.g.Serve(ln) }()
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := e.g.Shutdown(ctx); err != nil {
				t.Errorf("gateway shutdown: %v", err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("gateway Serve: %v", err)
				}
			case <-time.After(waitBound):
				t.Errorf("gateway Serve did not return within %v of Shutdown", waitBound)
			}
			st.Close()
		})
	}
	// After the shutdown, the whole log (shutdown lines too) is checked
	// for capabilities.
	t.Cleanup(func() { e.stop(); e.assertLogClean() })
	e.tenant, err = st.Tenant(ctx, "box")
	if errors.Is(err, imagestore.ErrNotFound) {
		e.tenant, err = st.CreateTenant(ctx, imagestore.Tenant{Name: "box", Sharing: true, InMesh: true}, imagestore.HashSecret(imagestore.NewSecret()))
	}
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// remember notes a capability handed out, for assertLogClean.
func (e *env) remember(secret string) {
	e.mu.Lock()
	e.secrets = append(e.secrets, secret)
	e.mu.Unlock()
}

// ticket issues an upload ticket straight in the store and returns its
// upload URL and upload id.
func (e *env) ticket() (string, string) {
	e.t.Helper()
	secret := imagestore.NewSecret()
	id := imagestore.NewUploadID()
	now := e.clock.Now()
	err := e.st.CreateTicket(context.Background(), imagestore.Ticket{
		UploadID: id, TenantID: e.tenant.ID, Name: "disk", CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}, imagestore.HashSecret(secret), 100)
	if err != nil {
		e.t.Fatal(err)
	}
	e.remember(secret)
	return e.base + uploadPrefix + secret, id
}

// fetchURL mints a fetch token for an image.
func (e *env) fetchURL(uploadID string, ttl time.Duration) string {
	e.t.Helper()
	secret := imagestore.NewSecret()
	err := e.st.CreateFetchToken(context.Background(), imagestore.HashSecret(secret),
		imagestore.FetchToken{UploadID: uploadID, ExpiresAt: e.clock.Now().Add(ttl)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.remember(secret)
	return e.base + fetchPrefix + secret
}

// waitSlotFreed waits, bounded, for one more transfer of direction dir to
// give its slot back than the calls before it have seen.
func (e *env) waitSlotFreed(dir string) {
	e.t.Helper()
	timeout := time.NewTimer(waitBound)
	defer timeout.Stop()
	s := e.freed
	for {
		s.mu.Lock()
		if s.freed[dir] > s.taken[dir] {
			s.taken[dir]++
			s.mu.Unlock()
			return
		}
		changed := s.changed
		n := s.taken[dir]
		s.mu.Unlock()
		select {
		case <-changed:
		case <-timeout.C:
			e.t.Fatalf("waited %v for %s transfer number %d to give its slot back", waitBound, dir, n+1)
		}
	}
}

// assertNothingLeft checks that no partial file remains, that exactly the
// given images are stored (files and records), that no slot is held, and
// that every upload session left is one of a stored image (a finished
// session stays until it expires, for a client whose last answer was
// lost).
func (e *env) assertNothingLeft(stored ...string) {
	e.t.Helper()
	e.assertLeft(stored, nil)
}

// assertLeft is assertNothingLeft where the sessions of the upload ids in
// open are expected to be open still.
func (e *env) assertLeft(stored, open []string) {
	e.t.Helper()
	ctx := context.Background()
	partials, err := os.ReadDir(filepath.Join(e.dir, ".partial"))
	if err != nil {
		e.t.Fatal(err)
	}
	var keep []string
	for _, p := range partials {
		keep = append(keep, p.Name())
	}
	if want := sortedCopy(open); fmt.Sprint(sortedCopy(keep)) != fmt.Sprint(want) {
		e.t.Errorf("partial files %v, want those of the open sessions %v", keep, want)
	}
	ids, err := e.blobs.List(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	if fmt.Sprint(sortedCopy(ids)) != fmt.Sprint(sortedCopy(stored)) {
		e.t.Errorf("stored image files %v, want %v", ids, stored)
	}
	recs, err := e.st.ImageIDs(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	if fmt.Sprint(sortedCopy(recs)) != fmt.Sprint(sortedCopy(stored)) {
		e.t.Errorf("image records %v, want %v", recs, stored)
	}
	sessions, err := e.st.SessionUploadIDs(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	allowed := map[string]bool{}
	for _, id := range append(append([]string(nil), stored...), open...) {
		allowed[id] = true
	}
	live := map[string]bool{}
	for _, id := range sessions {
		live[id] = true
		if !allowed[id] {
			e.t.Errorf("upload session of %s left behind (stored %v, open %v)", id, stored, open)
		}
	}
	for _, id := range open {
		if !live[id] {
			e.t.Errorf("upload session of %s ended, want it open", id)
		}
	}
	for _, d := range []string{dirUpload, dirFetch} {
		if n := testutil.ToFloat64(e.g.metrics.inFlight.WithLabelValues(d)); n != 0 {
			e.t.Errorf("%v %s transfers still in flight", n, d)
		}
	}
	if len(e.g.slots) != 0 {
		e.t.Errorf("%d transfer slots still held", len(e.g.slots))
	}
}

// assertTicket checks the store's state of the ticket in an upload URL:
// used (consumed by a transfer that started) or not.
func (e *env) assertTicket(uploadURL string, used bool) {
	e.t.Helper()
	tk, err := e.st.Ticket(context.Background(), imagestore.HashSecret(capabilityOf(uploadURL)))
	if err != nil {
		e.t.Fatalf("ticket of %s: %v", uploadURL[len(e.base):][:30], err)
	}
	if got := !tk.UsedAt.IsZero(); got != used {
		e.t.Errorf("ticket used = %v (used at %v), want %v", got, tk.UsedAt, used)
	}
}

// capabilityOf is the last path segment of a data-plane URL.
func capabilityOf(u string) string { return u[strings.LastIndexByte(u, '/')+1:] }

// hexRun is a capability's shape anywhere in a log line.
var hexRun = regexp.MustCompile(`[0-9a-fA-F]{64}`)

// assertLogClean checks that the gateway logged no capability: no 64-hex
// run at all, and no half of a capability this env handed out.
func (e *env) assertLogClean() {
	e.t.Helper()
	e.mu.Lock()
	secrets := append([]string(nil), e.secrets...)
	e.mu.Unlock()
	for _, line := range strings.Split(e.log.String(), "\n") {
		if hexRun.MatchString(line) {
			e.t.Errorf("a log line holds a capability: %s", line)
			continue
		}
		for _, s := range secrets {
			if strings.Contains(line, s[:32]) || strings.Contains(line, s[32:]) {
				e.t.Errorf("a log line holds half of a capability: %s", line)
			}
		}
	}
}

// logHas waits, bounded, until the gateway logged a line holding every
// one of parts, and returns it.
func (e *env) logHas(parts ...string) string {
	e.t.Helper()
	var found string
	waitFor(e.t, "a log line with "+strings.Join(parts, " and "), func() bool {
	lines:
		for _, line := range strings.Split(e.log.String(), "\n") {
			for _, p := range parts {
				if !strings.Contains(line, p) {
					continue lines
				}
			}
			found = line
			return true
		}
		return false
	})
	return found
}

func sortedCopy(s []string) []string {
	c := append([]string{}, s...)
	sort.Strings(c)
	return c
}

// installHint is the command that installs a tool the tests use.
var installHint = map[string]string{
	"qemu-img":  "apt-get install qemu-utils",
	"qemu-io":   "apt-get install qemu-utils",
	"curl":      "apt-get install curl",
	"nbdkit":    "apt-get install nbdkit",
	"sfdisk":    "apt-get install fdisk",
	"mkfs.vfat": "apt-get install dosfstools",
}

// needTool skips a test whose peer is missing, except in CI, where a
// missing tool is a failure. A test calls it first, before it did
// anything.
func needTool(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, err := exec.LookPath(name); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is needed and missing (CI=true): %s", name, installHint[name])
			}
			t.Skipf("%s missing: %s", name, installHint[name])
		}
	}
}

// needQemu is needTool for makeImage's tools.
func needQemu(t *testing.T) { t.Helper(); needTool(t, "qemu-img", "qemu-io") }

// qemuImg runs qemu-img and fails the test on error.
func qemuImg(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientBound)
	defer cancel()
	out, err := exec.CommandContext(ctx, "qemu-img", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
	}
}

// qemuIO writes data into an image so that it has allocated clusters.
func qemuIO(t *testing.T, img string, cmds ...string) {
	t.Helper()
	args := []string{"-f", "qcow2"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clientBound)
	defer cancel()
	out, err := exec.CommandContext(ctx, "qemu-io", append(args, img)...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-io %v: %v\n%s", cmds, err, out)
	}
}

// makeImage creates a qcow2 image with data in a few places. The test
// must have called needQemu first.
func makeImage(t *testing.T, size string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", p, size)
	qemuIO(t, p, "write -q -P 0xab 0 1M", "write -q -P 0xcd 5M 64k", "write -q -P 0x11 20M 512k")
	return p
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func fileSHA256(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
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

// rawConn is one client connection written by hand: requests whose body
// stalls, stops or lies, and answers read with a deadline.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

// openRaw dials the gateway and sends head (request line and headers,
// without the blank line).
func openRaw(t *testing.T, base, head string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), waitBound)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := &rawConn{t: t, c: c, br: bufio.NewReader(c)}
	r.send([]byte(head+"\r\n\r\n"), "the request head")
	return r
}

// write sends b within waitBound; for a goroutine (no t.Fatal there).
func (r *rawConn) write(b []byte) error {
	if err := r.c.SetWriteDeadline(time.Now().Add(waitBound)); err != nil {
		return err
	}
	_, err := r.c.Write(b)
	return err
}

// send is write for the test goroutine: what names the bytes.
func (r *rawConn) send(b []byte, what string) {
	r.t.Helper()
	if err := r.write(b); err != nil {
		r.t.Fatalf("sending %s (%d bytes): %v", what, len(b), err)
	}
}

// answer reads the next response and its whole body within waitBound;
// what names the request for the failure message.
func (r *rawConn) answer(what string) (*http.Response, []byte) {
	r.t.Helper()
	resp, body, err := r.readAnswer()
	if err != nil {
		r.t.Fatalf("no answer to %s within %v: %v", what, waitBound, err)
	}
	return resp, body
}

func (r *rawConn) readAnswer() (*http.Response, []byte, error) {
	if err := r.c.SetReadDeadline(time.Now().Add(waitBound)); err != nil {
		return nil, nil, err
	}
	resp, err := http.ReadResponse(r.br, nil)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

// rawRequest sends head and then body (in the background) on a fresh
// connection and returns the answer and its body.
func rawRequest(t *testing.T, base, head string, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	r := openRaw(t, base, head)
	if body != nil {
		go func() {
			_ = r.c.SetWriteDeadline(time.Now().Add(waitBound))
			_, _ = io.Copy(r.c, body) // the server may answer and close before the end
		}()
	}
	return r.answer(strings.SplitN(head, "\r\n", 2)[0])
}

// waitFor polls a condition, bounded, for states that have no event to
// wait on; what names the condition when it gives up.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", waitBound, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// within receives from ch, bounded; what names the value awaited.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitBound):
		t.Fatalf("waited %v for %s", waitBound, what)
		panic("unreachable")
	}
}

// do sends req with testClient and returns the answer with its body read.
func do(t *testing.T, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path[:min(len(req.URL.Path), 40)], err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: reading the answer: %v", req.Method, err)
	}
	return resp, b
}

func newRequest(t *testing.T, method, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// counterSum is the sum of a metric family's series (0 if it has none).
func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
