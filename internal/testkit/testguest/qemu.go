package testguest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/testkit/syncbuf"
)

// QEMU is the emulator Start runs, and Package the Debian package that
// installs it (.ci/deps installs the same).
const (
	QEMU    = "qemu-system-x86_64"
	Package = "qemu-system-x86"
)

// Options tune Start. The zero value is what the console tests need.
type Options struct {
	// StartTimeout bounds the wait for QEMU's two sockets; 0 is 30s, room
	// for a loaded CI machine (a boot sector takes well under a second).
	StartTimeout time.Duration
	// Reboots: a reset of the guest (Ctrl-Alt-Del, which its BIOS turns
	// into one) starts it again, as a real machine would. Without it QEMU
	// ends at a reset, so that a guest that crashes does not loop.
	Reboots bool
}

// Guest is a running QEMU with the test guest: its screen on VNCSocket,
// its COM1 on SerialSocket (both Unix sockets, QEMU listening).
type Guest struct {
	// VNCSocket is QEMU's VNC server: RFB 3.8, no password, any number of
	// (shared) viewers.
	VNCSocket string
	// SerialSocket is the guest's COM1. QEMU serves one connection at a
	// time: a second one waits, connected but silent, until the first
	// closes; what the guest writes while nobody is connected is lost
	// (send an empty line to get the Prompt again).
	SerialSocket string

	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan struct{} // closed when QEMU has exited; err then set
	err    error
}

// Start boots the test guest in QEMU (TCG, no accelerator needed) and
// returns once both of its sockets accept; QEMU is killed when the test
// ends, and its stderr is logged if the test failed. Without QEMU the test
// fails under CI=true and skips elsewhere, naming the package to install;
// under -short it skips, as it runs a virtual machine.
func Start(t testing.TB, opts Options) *Guest {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short (make test-quick): testguest.Start runs a QEMU virtual machine; make test runs it")
	}
	bin, err := exec.LookPath(QEMU)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is required in CI: apt-get install %s (%v)", QEMU, Package, err)
		}
		t.Skipf("%s missing: apt-get install %s (%v)", QEMU, Package, err)
	}
	// A short directory of its own, not t.TempDir(): a Unix socket's path
	// must fit in 108 bytes, and a long test name would not.
	dir, err := os.MkdirTemp("", "testguest")
	if err != nil {
		t.Fatalf("testguest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	img, err := Image(dir)
	if err != nil {
		t.Fatal(err)
	}
	g := &Guest{
		VNCSocket:    filepath.Join(dir, "vnc.sock"),
		SerialSocket: filepath.Join(dir, "serial.sock"),
		stderr:       &syncBuffer{},
		exited:       make(chan struct{}),
	}
	args := []string{
		"-no-user-config", "-nodefaults",
		"-machine", "pc", "-accel", "tcg", "-m", "32",
		"-vga", "std", "-display", "none",
		"-drive", "file=" + img + ",format=raw,if=ide",
		"-vnc", "unix:" + g.VNCSocket,
		"-serial", "unix:" + g.SerialSocket + ",server=on,wait=off",
	}
	if !opts.Reboots {
		args = append(args, "-no-reboot") // a guest that crashes ends QEMU rather than looping
	}
	g.cmd = exec.Command(bin, args...)
	g.cmd.Dir = dir
	g.cmd.Stdout = g.stderr
	g.cmd.Stderr = g.stderr
	// QEMU dies with the test process, however that ends.
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := g.cmd.Start(); err != nil {
		t.Fatalf("testguest: start %s: %v", QEMU, err)
	}
	go func() {
		g.err = g.cmd.Wait()
		close(g.exited)
	}()
	t.Cleanup(func() {
		_ = g.cmd.Process.Kill()
		<-g.exited
		if t.Failed() {
			t.Logf("testguest: %s said: %s", QEMU, g.stderr.String())
		}
	})

	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	if err := g.waitSockets(timeout); err != nil {
		t.Fatalf("testguest: %v; %s said: %s", err, QEMU, g.stderr.String())
	}
	return g
}

// waitSockets polls until both sockets accept a connection, QEMU exits, or
// the timeout passes. QEMU creates them while it starts, so there is no
// event to wait on but the sockets themselves.
func (g *Guest) waitSockets(timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	pending := []string{g.VNCSocket, g.SerialSocket}
	var last error
	for {
		for len(pending) > 0 {
			c, err := net.DialTimeout("unix", pending[0], time.Second)
			if err != nil {
				last = err
				break
			}
			c.Close()
			pending = pending[1:]
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-g.exited:
			return fmt.Errorf("%s exited before its sockets accepted: %v", QEMU, g.err)
		case <-deadline.C:
			return fmt.Errorf("%s's sockets did not accept within %v: %w", QEMU, timeout, last)
		case <-tick.C:
		}
	}
}

// DialVNC connects to the guest's screen (QEMU's VNC server).
func (g *Guest) DialVNC(ctx context.Context) (net.Conn, error) {
	return g.dial(ctx, g.VNCSocket, "VNC")
}

// DialSerial connects to the guest's COM1.
func (g *Guest) DialSerial(ctx context.Context) (net.Conn, error) {
	return g.dial(ctx, g.SerialSocket, "serial")
}

func (g *Guest) dial(ctx context.Context, path, what string) (net.Conn, error) {
	select {
	case <-g.exited:
		return nil, fmt.Errorf("testguest: dial %s: %s has exited: %v; it said: %s", what, QEMU, g.err, g.stderr.String())
	default:
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("testguest: dial %s: %w", what, err)
	}
	return c, nil
}

// Expect reads from c until what it read contains want, and returns all it
// read. Its reads are bounded by ctx (c's deadline follows it); on failure
// the error quotes what came instead.
func Expect(ctx context.Context, c net.Conn, want string) (string, error) {
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	if d, ok := ctx.Deadline(); ok {
		if err := c.SetReadDeadline(d); err != nil {
			return "", fmt.Errorf("testguest: set deadline: %w", err)
		}
	}
	var got []byte
	buf := make([]byte, 512)
	for !bytes.Contains(got, []byte(want)) {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil && !bytes.Contains(got, []byte(want)) {
			if ctx.Err() != nil {
				err = errors.Join(err, context.Cause(ctx))
			}
			return string(got), fmt.Errorf("testguest: waiting for %q, got %q: %w", want, got, err)
		}
	}
	return string(got), nil
}

// syncBuffer is QEMU's output: written by exec's copying goroutine, read
// by the test.
type syncBuffer = syncbuf.Buffer
