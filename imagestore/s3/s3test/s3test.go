// Package s3test runs a real S3 server for tests: versitygw with its posix
// backend on a temporary directory, on a loopback port, over plain http
// or over https with a certificate made for the test.
package s3test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/vmshelf/vmshelf/imagestore/s3"
	"github.com/vmshelf/vmshelf/internal/testkit/gobin"
	"github.com/vmshelf/vmshelf/internal/testkit/selfsigned"
)

// Install is how a developer gets versitygw (.ci/deps says the same).
const Install = "go install github.com/versity/versitygw/cmd/versitygw@v1.8.0"

// Bucket is the bucket Start creates.
const Bucket = "vmshelf-test"

// startWithin bounds the wait for the server to answer.
const startWithin = 30 * time.Second

// Path finds versitygw on PATH or where go install puts it. Missing, it
// fails the test under CI=true and skips it loudly elsewhere.
func Path(t testing.TB) string {
	t.Helper()
	return gobin.Need(t, "versitygw", "the S3 server of the S3 blob tests", Install)
}

// Server is one running versitygw.
type Server struct {
	// Config reaches the server's bucket Bucket under the prefix
	// "vmshelf" with fresh random credentials; the sizes are the
	// caller's to set.
	Config s3.Config
	// Dir is the posix backend's root: Dir/<bucket>/<key>.
	Dir string
	// Cert is the server's self-signed certificate (StartServerTLS); its
	// Pool is Config.RootCAs, and its CertFile can be SSL_CERT_FILE.
	Cert selfsigned.Cert

	bin, root, access, secret, addr string

	mu      sync.Mutex // over cmd, done and stopped, which Restart replaces
	cmd     *exec.Cmd
	done    chan struct{}
	stopped bool
	out     *limitedBuffer
}

// Start runs a server for the test and returns its Config; it is stopped
// at the test's end.
func Start(t testing.TB) s3.Config { return StartServer(t).Config }

// StartServer is Start, with the server to stop early (a test of a server
// that went away).
func StartServer(t testing.TB) *Server {
	t.Helper()
	return startServer(t, false)
}

// StartTLS is Start over https: the Config's endpoint is https:// and
// its RootCAs trust the server's certificate, and only it.
func StartTLS(t testing.TB) s3.Config { return StartServerTLS(t).Config }

// StartServerTLS is StartServer over https (see StartTLS).
func StartServerTLS(t testing.TB) *Server {
	t.Helper()
	return startServer(t, true)
}

func startServer(t testing.TB, tls bool) *Server {
	t.Helper()
	bin := Path(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	var cert selfsigned.Cert
	if tls {
		var err error
		if cert, err = selfsigned.Write(dir); err != nil {
			t.Fatal(err)
		}
	}
	access, secret := "AK"+random(9), random(20)
	var srv *Server
	var err error
	// The port is the kernel's pick, closed and handed over: another
	// process may take it in between, so a failed bind is tried again.
	for range 3 {
		if srv, err = start(bin, root, access, secret, freeAddr(), cert, nil); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("starting versitygw: %v", err)
	}
	srv.Dir, srv.Cert = root, cert
	t.Cleanup(srv.Stop)
	if err := makeBucket(srv.Config); err != nil {
		t.Fatalf("creating bucket %s on versitygw: %v\n%s", Bucket, err, srv.out.String())
	}
	return srv
}

// freeAddr is a loopback address whose port the kernel picked, closed
// again for versitygw to take.
func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:0" // versitygw's bind then fails, and the start is retried
	}
	defer l.Close()
	return l.Addr().String()
}

// start runs versitygw on addr, over https if cert is set, with extra
// arguments before its backend.
func start(bin, root, access, secret, addr string, cert selfsigned.Cert, extra []string) (*Server, error) {
	out := &limitedBuffer{max: 64 << 10}
	// The credentials go in the environment, not on the command line
	// (which every user of the host can read).
	args := []string{"--port", addr, "--quiet"}
	scheme := "http://"
	if cert.CertFile != "" {
		args = append(args, "--cert", cert.CertFile, "--key", cert.KeyFile)
		scheme = "https://"
	}
	args = append(args, extra...)
	cmd := exec.Command(bin, append(args, "posix", root)...)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+access, "ROOT_SECRET_ACCESS_KEY="+secret)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{cmd: cmd, done: make(chan struct{}), out: out,
		bin: bin, root: root, access: access, secret: secret, addr: addr}
	go func() { _ = cmd.Wait(); close(s.done) }()
	s.Config = s3.Config{
		Endpoint:        scheme + addr,
		Region:          "us-east-1",
		AccessKeyID:     s3.Secret(access),
		SecretAccessKey: s3.Secret(secret),
		Bucket:          Bucket,
		Prefix:          "vmshelf",
		RootCAs:         cert.Pool,
	}
	deadline := time.NewTimer(startWithin)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return s, nil
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("versitygw ended before it listened on %s:\n%s", addr, out.String())
		case <-deadline.C:
			s.Stop()
			return nil, fmt.Errorf("versitygw did not listen on %s within %v:\n%s", addr, startWithin, out.String())
		case <-tick.C:
		}
	}
}

// Stop ends the server (and waits for it); safe to call twice. From then
// on its port is closed: connections to it are refused.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.stopped = true
}

// Restart runs the server again (stopping it first if it runs) on the
// same address, with the same root and credentials, so that every client
// of it finds it back: an S3 server that was down and returns. extra
// goes before the backend (versitygw's "--readonly": a server that
// answers reads and refuses every write). The port was closed meanwhile:
// should another process hold it, the start is tried again until
// startWithin.
func (s *Server) Restart(t testing.TB, extra ...string) {
	t.Helper()
	s.Stop()
	deadline := time.Now().Add(startWithin)
	for {
		n, err := start(s.bin, s.root, s.access, s.secret, s.addr, s.Cert, extra)
		if err == nil {
			s.mu.Lock()
			s.cmd, s.done, s.out, s.stopped = n.cmd, n.done, n.out, false
			s.mu.Unlock()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarting versitygw on %s: %v", s.addr, err)
		}
	}
}

// Pause stops the server with SIGSTOP: it keeps its port, the kernel
// still accepts connections for it, and nothing answers, as a hung S3
// does. The test's cleanup continues it (SIGCONT) so that nothing is left
// stopped, whatever fails in between.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	t.Cleanup(s.Continue)
	proc, _ := s.process()
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP versitygw: %v", err)
	}
	// kill(2) returns before every thread has stopped: a thread busy on
	// the other core could still answer a request sent at once. Wait until
	// the kernel reports each thread stopped.
	deadline := time.Now().Add(10 * time.Second)
	for !allStopped(proc.Pid) {
		if time.Now().After(deadline) {
			t.Fatalf("versitygw's threads did not all stop within 10 s of SIGSTOP")
		}
		time.Sleep(time.Millisecond) // polling the kernel's view; bounded above
	}
}

// allStopped reports whether every thread of pid is stopped ('T' or 't'
// in /proc/PID/task/TID/stat).
func allStopped(pid int) bool {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return false
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
			return false
		}
	}
	return true
}

// Continue undoes Pause (SIGCONT); a server that ended is left alone.
func (s *Server) Continue() {
	proc, done := s.process()
	select {
	case <-done:
	default:
		_ = proc.Signal(syscall.SIGCONT)
	}
}

// process is the running versitygw and the channel closed when it ends.
func (s *Server) process() (*os.Process, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd.Process, s.done
}

func makeBucket(cfg s3.Config) error {
	c, err := Client(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startWithin)
	defer cancel()
	return c.MakeBucket(ctx, cfg.Bucket, minio.MakeBucketOptions{Region: cfg.Region})
}

// Client is a plain minio-go client of cfg's server (over https, trusting
// cfg.RootCAs), for a test that looks at the bucket behind the store.
func Client(cfg s3.Config) (*minio.Client, error) {
	host, secure := strings.CutPrefix(cfg.Endpoint, "https://")
	host = strings.TrimPrefix(host, "http://")
	tr, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, err
	}
	if secure {
		tr.TLSClientConfig.RootCAs = cfg.RootCAs
	}
	return minio.New(host, &minio.Options{
		Creds:        credentials.NewStaticV4(string(cfg.AccessKeyID), string(cfg.SecretAccessKey), ""),
		Region:       cfg.Region,
		BucketLookup: minio.BucketLookupPath,
		Secure:       secure,
		Transport:    tr,
	})
}

func random(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return strings.ToUpper(hex.EncodeToString(b))[:n*2]
}

// limitedBuffer keeps the first max bytes of the server's output, for a
// failure message; it is written from the process's copier goroutine.
type limitedBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
