package gateway

import (
	"bufio"
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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobfs"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
)

// env is one gateway on loopback over a real store in a temp dir.
type env struct {
	t       *testing.T
	g       *Gateway
	st      *sqlite.Store
	blobs   *blobfs.FS
	dir     string // vm-images
	base    string // http://127.0.0.1:port
	reg     *prometheus.Registry
	clock   *clock
	tenant  imagestore.Tenant
	mu      sync.Mutex
	endings chan string // direction of every transfer that gave its slot back
	stop    func()      // shuts the gateway down and closes the store; idempotent
	db      string      // the store's path
}

// clock is a settable time source; it starts at the real time so that
// deadlines set from it on sockets are sane.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
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
	e := &env{t: t, st: st, blobs: blobs, dir: dir, db: dbPath, reg: prometheus.NewRegistry(), clock: &clock{}, endings: make(chan string, 64)}
	cfg := Config{
		UploadMax:       1 << 30,
		MaxVirtualSize:  512 << 30,
		IdleTimeout:     5 * time.Second,
		MaxTransfers:    4,
		ImagesPerTenant: 3,
		Headroom:        1 << 20,
		Now:             e.clock.now,
		Log:             slog.New(slog.NewTextHandler(testLogOut(), nil)),
	}
	if mod != nil {
		mod(&cfg)
	}
	e.g, err = New(cfg, st, blobs, e.reg)
	if err != nil {
		t.Fatal(err)
	}
	e.g.onSlotFreed = func(dir string) { e.endings <- dir }
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
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			e.g.Shutdown(ctx)
			<-done
			st.Close()
		})
	}
	t.Cleanup(e.stop)
	e.tenant, err = st.Tenant(ctx, "box")
	if errors.Is(err, imagestore.ErrNotFound) {
		e.tenant, err = st.CreateTenant(ctx, imagestore.Tenant{Name: "box", Sharing: true, InMesh: true}, imagestore.HashSecret(imagestore.NewSecret()))
	}
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// ticket issues an upload ticket straight in the store and returns its
// upload URL and upload id.
func (e *env) ticket() (string, string) {
	e.t.Helper()
	secret := imagestore.NewSecret()
	id := imagestore.NewUploadID()
	now := e.clock.now()
	err := e.st.CreateTicket(context.Background(), imagestore.Ticket{
		UploadID: id, TenantID: e.tenant.ID, Name: "disk", CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}, imagestore.HashSecret(secret), 100)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.base + uploadPrefix + secret, id
}

// fetchURL mints a fetch token for an image.
func (e *env) fetchURL(uploadID string, ttl time.Duration) string {
	e.t.Helper()
	secret := imagestore.NewSecret()
	err := e.st.CreateFetchToken(context.Background(), imagestore.HashSecret(secret),
		imagestore.FetchToken{UploadID: uploadID, ExpiresAt: e.clock.now().Add(ttl)})
	if err != nil {
		e.t.Fatal(err)
	}
	return e.base + fetchPrefix + secret
}

// waitSlotFreed waits for a transfer to give its slot back; bounded.
func (e *env) waitSlotFreed(dir string) {
	e.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case d := <-e.endings:
			if d == dir {
				return
			}
		case <-timeout:
			e.t.Fatalf("no %s transfer gave its slot back within 10s", dir)
		}
	}
}

// assertNothingLeft checks that no partial file remains and that only the
// given images are stored.
func (e *env) assertNothingLeft(stored ...string) {
	e.t.Helper()
	partials, err := os.ReadDir(filepath.Join(e.dir, ".partial"))
	if err != nil {
		e.t.Fatal(err)
	}
	if len(partials) != 0 {
		e.t.Errorf("partial files left behind: %v", partials)
	}
	ids, err := e.blobs.List(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	if fmt.Sprint(sortedCopy(ids)) != fmt.Sprint(sortedCopy(stored)) {
		e.t.Errorf("stored image files %v, want %v", ids, stored)
	}
	if n := testutil.ToFloat64(e.g.metrics.inFlight.WithLabelValues(dirUpload)); n != 0 {
		e.t.Errorf("%v uploads still in flight", n)
	}
	if len(e.g.slots) != 0 {
		e.t.Errorf("%d transfer slots still held", len(e.g.slots))
	}
}

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	for i := range c {
		for j := i + 1; j < len(c); j++ {
			if c[j] < c[i] {
				c[i], c[j] = c[j], c[i]
			}
		}
	}
	return c
}

// needTool skips a test whose peer is missing, except in CI, where a
// missing tool is a failure.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is needed and missing (CI=true)", name)
		}
		t.Skipf("%s not installed", name)
	}
	return p
}

// qemuImg runs qemu-img and fails the test on error.
func qemuImg(t *testing.T, args ...string) {
	t.Helper()
	needTool(t, "qemu-img")
	out, err := exec.Command("qemu-img", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
	}
}

// qemuIO writes data into an image so that it has allocated clusters.
func qemuIO(t *testing.T, img string, cmds ...string) {
	t.Helper()
	needTool(t, "qemu-io")
	args := []string{"-f", "qcow2"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := exec.Command("qemu-io", append(args, img)...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-io %v: %v\n%s", cmds, err, out)
	}
}

// makeImage creates a qcow2 image with data in a few places.
func makeImage(t *testing.T, size string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", p, size)
	qemuIO(t, p, "write -q -P 0xab 0 1M", "write -q -P 0xcd 5M 64k", "write -q -P 0x11 20M 512k")
	return p
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

// rawRequest sends head (request line and headers, without the blank line)
// and then body on a fresh connection, and returns the response.
func rawRequest(t *testing.T, base, head string, body io.Reader) (*http.Response, net.Conn) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, head+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if body != nil {
		go io.Copy(conn, body)
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	return resp, conn
}

// testLogOut is where the gateway under test logs: nowhere, unless
// VMSHELF_TEST_LOG=1.
func testLogOut() io.Writer {
	if os.Getenv("VMSHELF_TEST_LOG") == "1" {
		return os.Stderr
	}
	return io.Discard
}
