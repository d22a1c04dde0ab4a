package connlimit

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeListener answers Accept from a script of errors, then with one end
// of a pipe; after the script it blocks until closed.
type fakeListener struct {
	mu     sync.Mutex
	errs   []error
	calls  []time.Time
	conn   net.Conn
	closed chan struct{}
}

func (f *fakeListener) Accept() (net.Conn, error) {
	f.mu.Lock()
	f.calls = append(f.calls, time.Now())
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		f.mu.Unlock()
		return nil, err
	}
	c := f.conn
	f.conn = nil
	f.mu.Unlock()
	if c != nil {
		return c, nil
	}
	<-f.closed
	return nil, net.ErrClosed
}

func (f *fakeListener) Close() error {
	select {
	case <-f.closed:
	default:
		close(f.closed)
	}
	return nil
}

func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

// acceptErr is an Accept error as the net package returns it.
func acceptErr(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
}

// TestAcceptRetriesTemporary: out of descriptors (and the other temporary
// errors) Accept backs off and tries again, 5 ms doubling, instead of
// handing the error to the server (fasthttp stops serving on it); the
// failures are logged on one line, not one each.
func TestAcceptRetriesTemporary(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	errs := []error{acceptErr(syscall.EMFILE), acceptErr(syscall.ENFILE), acceptErr(syscall.ENOBUFS),
		acceptErr(syscall.ENOMEM), acceptErr(syscall.ECONNABORTED), acceptErr(syscall.EMFILE)}
	f := &fakeListener{errs: errs, conn: server, closed: make(chan struct{})}
	var logged bytes.Buffer
	l := New(f, 1, WithLog(slog.New(slog.NewTextHandler(&logged, nil))))
	defer l.Close()

	got := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil && c.(*Conn).Conn != server {
			err = errors.New("not the listener's connection")
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Accept after %d temporary errors: %v; want the connection", len(errs), err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return within 5s")
	}
	f.mu.Lock()
	calls := f.calls
	f.mu.Unlock()
	if len(calls) != len(errs)+1 {
		t.Fatalf("inner Accept called %d times, want %d", len(calls), len(errs)+1)
	}
	// 5+10+20+40+80+160 ms of back-off in all: at least most of it.
	if took := calls[len(calls)-1].Sub(calls[0]); took < 250*time.Millisecond {
		t.Errorf("%d retries took %v: no back-off (want 5 ms doubling, about 315 ms)", len(errs), took)
	}
	if n := strings.Count(logged.String(), "accepting a connection failed"); n != 1 {
		t.Errorf("%d log lines for %d failures within 10s, want 1:\n%s", n, len(errs), logged.String())
	}
	if !strings.Contains(logged.String(), "too many open files") {
		t.Errorf("the log line does not say why: %s", logged.String())
	}
}

// TestAcceptPermanentError: any other error ends Accept at once, and Close
// ends a back-off.
func TestAcceptPermanentError(t *testing.T) {
	perm := errors.New("listener broken")
	f := &fakeListener{errs: []error{perm}, closed: make(chan struct{})}
	l := New(f, 1)
	if _, err := l.Accept(); !errors.Is(err, perm) {
		t.Fatalf("Accept: %v, want %v", err, perm)
	}

	f = &fakeListener{errs: []error{acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE),
		acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE),
		acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE)}, closed: make(chan struct{})}
	l = New(f, 1)
	got := make(chan error, 1)
	go func() { _, err := l.Accept(); got <- err }()
	for range 500 { // until it is backing off
		f.mu.Lock()
		n := len(f.calls)
		f.mu.Unlock()
		if n >= 3 {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling a count: there is no event to wait on
	}
	_ = l.Close()
	select {
	case err := <-got:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close during a back-off: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end Accept's back-off within 5s")
	}
}

func TestTemporary(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{acceptErr(syscall.EMFILE), true},
		{acceptErr(syscall.ENFILE), true},
		{acceptErr(syscall.ENOBUFS), true},
		{acceptErr(syscall.ENOMEM), true},
		{acceptErr(syscall.ECONNABORTED), true},
		{acceptErr(syscall.EINVAL), false},
		{net.ErrClosed, false},
		{errors.New("other"), false},
	} {
		if got := Temporary(c.err); got != c.want {
			t.Errorf("Temporary(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
