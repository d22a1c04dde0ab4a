// Package pgtest starts a throw-away PostgreSQL cluster for tests: initdb
// into a temporary directory and pg_ctl start, listening on a Unix socket
// in that directory only (no TCP port, so parallel test binaries never
// collide and nothing listens beyond this machine's processes).
//
// PostgreSQL refuses to run as root, and tests here run as root in CI, so
// as root the cluster belongs to the "postgres" user that Debian's package
// creates, and the server runs as that user (runuser).
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// installHint is what a missing PostgreSQL tells the person running the
// tests.
const installHint = "apt-get install postgresql (PostgreSQL 15: initdb and pg_ctl)"

// Cluster is a running throw-away PostgreSQL server.
type Cluster struct {
	dir    string // data directory and socket directory
	bin    string // directory of initdb, pg_ctl, postgres
	owner  *user.User
	opts   string // the server's options (pg_ctl -o)
	stopMu sync.Mutex
	seq    int
}

// bindir finds PostgreSQL's programs: on PATH, or where Debian puts
// them (/usr/lib/postgresql/<major>/bin), newest major first.
func bindir() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(real), nil
		}
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "pg_ctl")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("pg_ctl not found")
}

// Start starts a cluster that the test's cleanup stops. A missing
// PostgreSQL fails under CI=true and skips loudly elsewhere.
func Start(tb testing.TB) *Cluster {
	tb.Helper()
	c, err := start()
	if err != nil {
		if errors.Is(err, errMissing) {
			if os.Getenv("CI") == "true" {
				tb.Fatalf("PostgreSQL is needed: %v; install it: %s", err, installHint)
			}
			tb.Skipf("SKIP: PostgreSQL is needed: %v; install it: %s", err, installHint)
		}
		tb.Fatalf("start PostgreSQL: %v", err)
	}
	tb.Cleanup(func() {
		if err := c.Stop(); err != nil {
			tb.Errorf("stop PostgreSQL: %v", err)
		}
	})
	return c
}

var errMissing = errors.New("PostgreSQL not installed")

// StartMain is Start for TestMain, which has no testing.TB: it returns
// nil and a message to print when PostgreSQL is missing outside CI.
func StartMain() (*Cluster, string, error) {
	c, err := start()
	if errors.Is(err, errMissing) && os.Getenv("CI") != "true" {
		return nil, fmt.Sprintf("SKIP: PostgreSQL is needed: %v; install it: %s", err, installHint), nil
	}
	return c, "", err
}

func start() (*Cluster, error) {
	bin, err := bindir()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errMissing, err)
	}
	// A short path: a Unix socket path must fit in 107 bytes, and
	// t.TempDir's are long. Not under a root-only directory either: the
	// server's user must reach it.
	dir, err := os.MkdirTemp("/tmp", "vmshelf-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		c.owner, err = user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("%w: running as root needs the postgres user: %v", errMissing, err)
		}
		uid, _ := strconv.Atoi(c.owner.Uid)
		gid, _ := strconv.Atoi(c.owner.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	data := filepath.Join(dir, "data")
	if out, err := c.run(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	// fsync off: a throw-away cluster; crash safety is PostgreSQL's and
	// not what these tests measure. max_connections: the suite runs many
	// stores at once, each with a pool.
	c.opts = fmt.Sprintf("-c listen_addresses='' -c unix_socket_directories=%s -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300", dir)
	if out, err := c.run(ctx, "pg_ctl", "-D", data, "-l", filepath.Join(dir, "log"), "-o", c.opts, "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pg_ctl start: %v: %s %s", err, out, log)
	}
	return c, nil
}

// Down stops the server but keeps the cluster, as a database that went
// away does; Up starts it again on the same socket. The stop is a clean
// one (-m fast): the cluster runs with synchronous_commit off, so an
// immediate stop could lose commits it had acknowledged, which a real
// server (synchronous_commit on) never does.
func (c *Cluster) Down(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", "fast", "-w", "stop"); err != nil {
		tb.Fatalf("pg_ctl stop: %v: %s", err, out)
	}
}

// Up starts a server Down stopped.
func (c *Cluster) Up(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-l", filepath.Join(c.dir, "log"), "-o", c.opts, "-w", "-t", "60", "start"); err != nil {
		tb.Fatalf("pg_ctl start: %v: %s", err, out)
	}
}

func (c *Cluster) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	path := filepath.Join(c.bin, prog)
	var cmd *exec.Cmd
	if c.owner != nil {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = c.dir
	return cmd.CombinedOutput()
}

// Stop stops the server and removes the cluster.
func (c *Cluster) Stop() error {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	if c.dir == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", "immediate", "-w", "stop")
	os.RemoveAll(c.dir)
	c.dir = ""
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %v: %s", err, out)
	}
	return nil
}

// URL is the connection URL of database db (no password: the cluster
// trusts its socket).
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres:///%s?host=%s&user=postgres", db, c.dir)
}

// NewDatabase creates an empty database of its own and returns its URL.
func (c *Cluster) NewDatabase(tb testing.TB) string {
	tb.Helper()
	c.stopMu.Lock()
	c.seq++
	name := fmt.Sprintf("t%d_%d", os.Getpid(), c.seq)
	c.stopMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		tb.Fatalf("connect to the cluster: %v", err)
	}
	defer conn.Close(ctx)
	// name is ours (digits and underscores), not input.
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("create database: %v", err)
	}
	return c.URL(name)
}
