package traefiktest

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/testkit/gobin"
	"github.com/vmshelf/vmshelf/internal/testkit/selfsigned"
)

// Version is the Traefik the tests run: the newest release whose module
// the Go module proxy serves whole (v3.7's need modules it refuses).
// .ci/deps builds the same.
const Version = "v3.6.12"

// Binary is the name .ci/deps gives its build: one per version, so that
// a binary of another version is never taken for it.
const Binary = "traefik-" + Version

// Install is how a developer gets it.
const Install = "bash .ci/deps (it builds Traefik " + Version + " from its module, as " + Binary +
	" where go install puts programs: about 9 minutes on 2 cores, once)"

// startWithin bounds the wait for Traefik to route.
const startWithin = 30 * time.Second

// Path finds the Traefik .ci/deps builds. Missing, it fails the test under
// CI=true and skips it loudly elsewhere.
func Path(t testing.TB) string {
	t.Helper()
	return gobin.Need(t, Binary, "the real Traefik docs/deploy's settings are tried through", Install)
}

// Config is what one Traefik runs with.
type Config struct {
	// Args are its static arguments besides those Start gives: the
	// entry points web and websecure (as the chart names them) on
	// loopback ports, TLS on websecure, ping, the file provider holding
	// HTTP, and no calls home. The kit's (Values.Args) and the test's own.
	Args []string
	// HTTP is what it routes (Routes).
	HTTP HTTP
	// Names are the public names its certificate holds besides
	// loopback's: the hosts the routes match.
	Names []string
	// From is the loopback address the clients connect from (Client,
	// Dial); 127.0.0.1 when zero.
	From netip.Addr
	// Ready is a URL whose 200, through websecure, says that the routes
	// are in place: Traefik takes the file's routers in at once.
	Ready string
}

// Traefik is one running Traefik.
type Traefik struct {
	// Web and Websecure are the entry points' addresses.
	Web, Websecure string
	// Cert is its default certificate, for Config.Names and loopback.
	Cert selfsigned.Cert

	from netip.Addr
	cmd  *exec.Cmd
	done chan struct{}
	out  *lockedBuffer
}

// Start runs Traefik for the test, stopped at its end.
func Start(t testing.TB, cfg Config) *Traefik {
	t.Helper()
	bin := Path(t)
	dir := t.TempDir()
	cert, err := selfsigned.Write(dir, cfg.Names...)
	if err != nil {
		t.Fatal(err)
	}
	dynamic := filepath.Join(dir, "dynamic.yaml")
	b, err := json.Marshal(map[string]any{
		"http": cfg.HTTP,
		"tls": map[string]any{"stores": map[string]any{"default": map[string]any{
			"defaultCertificate": map[string]string{"certFile": cert.CertFile, "keyFile": cert.KeyFile}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// JSON is YAML: the file provider reads it by its .yaml name.
	if err := os.WriteFile(dynamic, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if !cfg.From.IsValid() {
		cfg.From = netip.MustParseAddr("127.0.0.1")
	}
	// The ports are the kernel's pick, closed and handed over: another
	// process may take one in between, so a start that found one taken is
	// tried again.
	for attempt := 1; ; attempt++ {
		tr, err := start(bin, dynamic, cert, cfg)
		if err == nil {
			t.Cleanup(tr.stop)
			return tr
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("starting Traefik: %v", err)
		}
	}
}

func start(bin, dynamic string, cert selfsigned.Cert, cfg Config) (*Traefik, error) {
	tr := &Traefik{Web: freeAddr(), Websecure: freeAddr(), Cert: cert, from: cfg.From,
		done: make(chan struct{}), out: &lockedBuffer{max: 256 << 10}}
	args := append([]string{
		"--entryPoints.web.address=" + tr.Web,
		"--entryPoints.websecure.address=" + tr.Websecure,
		"--entryPoints.websecure.http.tls=true",
		"--entryPoints.traefik.address=" + freeAddr(),
		"--ping=true",
		"--providers.file.filename=" + dynamic,
		"--global.checkNewVersion=false",
		"--global.sendAnonymousUsage=false",
	}, cfg.Args...)
	tr.cmd = exec.Command(bin, args...)
	tr.cmd.Stdout, tr.cmd.Stderr = tr.out, tr.out
	// If the test binary dies (a timeout's panic skips cleanups), so does
	// Traefik.
	tr.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := tr.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = tr.cmd.Wait(); close(tr.done) }()

	client := tr.Client(false)
	defer client.CloseIdleConnections()
	deadline := time.NewTimer(startWithin)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if resp, err := client.Get(cfg.Ready); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return tr, nil
			}
		}
		select {
		case <-tr.done:
			return nil, fmt.Errorf("traefik %s ended before it routed %s:\n%s", args, cfg.Ready, tr.out.String())
		case <-deadline.C:
			tr.stop()
			return nil, fmt.Errorf("traefik %s did not route %s within %v:\n%s", args, cfg.Ready, startWithin, tr.out.String())
		case <-tick.C:
		}
	}
}

// Output is what Traefik wrote on stdout and stderr (its own log; the
// access log too unless it has a file).
func (tr *Traefik) Output() string { return tr.out.String() }

// stop kills Traefik and waits for it.
func (tr *Traefik) stop() {
	_ = tr.cmd.Process.Kill()
	<-tr.done
}

// Client reaches every URL's host through websecure, from Config.From,
// trusting Traefik's certificate alone: over HTTP/2 if h2 (ALPN), else
// HTTP/1.1. It follows no redirect.
func (tr *Traefik) Client(h2 bool) *http.Client {
	tp := &http.Transport{
		Proxy:               nil,
		DialContext:         tr.dial,
		TLSClientConfig:     &tls.Config{RootCAs: tr.Cert.Pool},
		ForceAttemptHTTP2:   h2,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	if !h2 {
		tp.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tp, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// Dial opens a TLS connection to websecure from Config.From for host
// (its SNI and the name checked), offering HTTP/1.1 alone.
func (tr *Traefik) Dial(ctx context.Context, host string) (*tls.Conn, error) {
	raw, err := tr.dial(ctx, "tcp", "")
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, &tls.Config{RootCAs: tr.Cert.Pool, ServerName: host, NextProtos: []string{"http/1.1"}})
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return c, nil
}

// dial connects to websecure whatever the address asked for: every public
// name is Traefik's here.
func (tr *Traefik) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: tr.from.AsSlice()}}
	return d.DialContext(ctx, "tcp", tr.Websecure)
}

// freeAddr is a loopback address whose port the kernel picked, closed
// again for Traefik to take.
func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:1" // Traefik's bind then fails, and the start is tried again
	}
	defer l.Close()
	return l.Addr().String()
}

// lockedBuffer keeps the first max bytes written to it.
type lockedBuffer struct {
	mu  sync.Mutex
	b   []byte
	max int
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.max - len(l.b); room > 0 {
		l.b = append(l.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}
