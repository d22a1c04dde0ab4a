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
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	return startWith(tb, false)
}

// StartDurable is Start for a cluster that loses no commit it
// acknowledged when its processes are killed (Kill): synchronous_commit
// on, as a real server runs. fsync stays off, since the kernel keeps what
// a killed process wrote.
func StartDurable(tb testing.TB) *Cluster {
	tb.Helper()
	return startWith(tb, true)
}

func startWith(tb testing.TB, durable bool) *Cluster {
	tb.Helper()
	c, err := start(durable)
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
	c, err := start(false)
	if errors.Is(err, errMissing) && os.Getenv("CI") != "true" {
		return nil, fmt.Sprintf("SKIP: PostgreSQL is needed: %v; install it: %s", err, installHint), nil
	}
	return c, "", err
}

func start(durable bool) (*Cluster, error) {
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
	commit := "off"
	if durable {
		commit = "on"
	}
	c.opts = fmt.Sprintf("-c listen_addresses='' -c unix_socket_directories=%s -c fsync=off -c synchronous_commit=%s -c full_page_writes=off -c max_connections=300", dir, commit)
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
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		tb.Fatalf("pg_ctl start: %v: %s\nserver log:\n%s", err, out, log)
	}
}

// Stall stops every process of the server (SIGSTOP), as a server that
// hangs does: connections stay open and nothing answers. Resume lets them
// go on. The cleanup resumes a server left stalled, so that it can stop.
func (c *Cluster) Stall(tb testing.TB) {
	tb.Helper()
	pids := c.processes(tb)
	c.signal(tb, pids, syscall.SIGSTOP)
	tb.Cleanup(func() { _ = c.signalAll(pids, syscall.SIGCONT) })
}

// Resume continues the processes Stall stopped: the children first, so
// that the postmaster finds them running. Like Up (pg_ctl start -w), it
// returns once the server answers a new connection: a postmaster that
// was stopped while clients kept dialling has a backlog to work through
// first, and a test that measures how soon its clients see the server
// back must not count that backlog as theirs. It returns how long the
// server took to answer after the signal.
func (c *Cluster) Resume(tb testing.TB) time.Duration {
	tb.Helper()
	pids := c.processes(tb)
	slices.Reverse(pids)
	c.signal(tb, pids, syscall.SIGCONT)
	resumed := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		if err := c.answers(ctx); err == nil {
			return time.Since(resumed)
		} else if ctx.Err() != nil {
			tb.Fatalf("PostgreSQL does not answer a minute after it was resumed: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // polling the server's return, bounded by ctx
	}
}

// answers connects anew and runs one query.
func (c *Cluster) answers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SELECT 1")
	return err
}

// Kill sends SIGKILL to the postmaster, as a crash or an OOM kill does,
// and waits (bounded) until its children have noticed and exited, so
// that Up can start the server again on the same socket.
func (c *Cluster) Kill(tb testing.TB) {
	tb.Helper()
	pids := c.processes(tb)
	c.signal(tb, pids[:1], syscall.SIGKILL)
	deadline := time.Now().Add(time.Minute)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				tb.Fatalf("PostgreSQL's process %d still runs a minute after its postmaster was killed", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The dead postmaster may stay a zombie where nothing reaps orphans
	// (a container's init), and its lock files, which name its pid, would
	// make the next start take it for a running server. Its children are
	// gone, so nothing uses its shared memory or its socket: they can go.
	for _, f := range []string{filepath.Join("data", "postmaster.pid"), ".s.PGSQL.5432.lock", ".s.PGSQL.5432"} {
		if err := os.Remove(filepath.Join(c.dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			tb.Fatalf("remove the killed server's %s: %v", f, err)
		}
	}
}

// processes are the server's: the postmaster (first), from its pid file,
// and its children, from /proc.
func (c *Cluster) processes(tb testing.TB) []int {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(c.dir, "data", "postmaster.pid"))
	if err != nil {
		tb.Fatalf("PostgreSQL's pid file: %v", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		tb.Fatalf("PostgreSQL's pid file starts with %q", first)
	}
	pids := []int{postmaster}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatalf("list processes: %v", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after
		// its closing parenthesis.
		_, rest, ok := strings.Cut(string(stat), ") ")
		fields := strings.Fields(rest)
		if ok && len(fields) > 1 && fields[1] == strconv.Itoa(postmaster) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func (c *Cluster) signal(tb testing.TB, pids []int, sig syscall.Signal) {
	tb.Helper()
	if err := c.signalAll(pids, sig); err != nil {
		tb.Fatalf("signal PostgreSQL (%v): %v", sig, err)
	}
}

func (c *Cluster) signalAll(pids []int, sig syscall.Signal) error {
	var errs []error
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("process %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z")
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
