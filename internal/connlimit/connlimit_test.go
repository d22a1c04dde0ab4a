package connlimit

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// server serves h on a Listener of cap max over loopback and returns the
// listener and its address; the server stops when the test ends.
func server(t *testing.T, max int, h http.HandlerFunc, opts ...Option) (*Listener, string) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, max, opts...)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
	done := make(chan error, 1)
	go func() { done <- l.Serve(srv) }()
	t.Cleanup(func() {
		_ = srv.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("server did not stop within 10s")
		}
	})
	return l, inner.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func send(t *testing.T, c net.Conn, s string) {
	t.Helper()
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
}

// waitHeld waits, bounded, until l holds n connections.
func waitHeld(t *testing.T, l *Listener, n int) {
	t.Helper()
	for range 500 {
		if l.Held() == n {
			return
		}
		time.Sleep(10 * time.Millisecond) // polling a count: there is no event to wait on
	}
	t.Fatalf("listener holds %d connections, want %d (waited 5s)", l.Held(), n)
}

// status reads one answer from c, bounded by d, and returns its status
// code (0 and the error if none arrived).
func status(c net.Conn, r *bufio.Reader, d time.Duration) (int, error) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// closedByPeer reports whether the server closed c within d.
func closedByPeer(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

const get = "GET / HTTP/1.1\r\nHost: t\r\n\r\n"

// TestEvictsLongestWaiting: at the cap, a new client is served at once;
// the connection that has waited longest (here: half a header sent) is
// closed for it, the younger one is kept.
func TestEvictsLongestWaiting(t *testing.T) {
	var evicted atomic.Int64
	l, addr := server(t, 2, func(w http.ResponseWriter, r *http.Request) {}, OnEvict(func() { evicted.Add(1) }))
	older := dial(t, addr)
	send(t, older, "GET / HTTP/1.1\r\nHost: t\r\nX-Slow: st")
	waitBytesRead(t, l, 1)
	younger := dial(t, addr)
	// The younger sends nothing at all: its accept is its last sign of
	// life, after the older's half header.
	waitReadTried(t, l, 2)

	fresh := dial(t, addr)
	send(t, fresh, get)
	if code, err := status(fresh, bufio.NewReader(fresh), 5*time.Second); code != http.StatusOK {
		t.Fatalf("new client at the cap: %d, %v; want 200 at once", code, err)
	}
	if !closedByPeer(older, 5*time.Second) {
		t.Error("the longest-waiting connection was not closed for the new client")
	}
	if closedByPeer(younger, 200*time.Millisecond) {
		t.Error("the younger waiting connection was closed too")
	}
	if n := evicted.Load(); n != 1 {
		t.Errorf("OnEvict called %d times, want 1", n)
	}
	if n := l.Held(); n > 2 {
		t.Errorf("%d connections held, cap 2", n)
	}
}

// TestBusyNeverEvicted: a connection whose request a handler is serving
// is never closed for a new client, which waits for a slot instead; once
// the answer is out the connection is an idle keep-alive, and that is
// closed for the waiting client.
func TestBusyNeverEvicted(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	first := true
	l, addr := server(t, 1, func(w http.ResponseWriter, r *http.Request) {
		if first {
			first = false // one handler at a time: the cap is 1
			entered <- struct{}{}
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	})
	a := dial(t, addr)
	ar := bufio.NewReader(a)
	send(t, a, get)
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the first request never reached its handler")
	}

	b := dial(t, addr)
	br := bufio.NewReader(b)
	send(t, b, get)
	if code, err := status(b, br, 300*time.Millisecond); err == nil {
		t.Fatalf("second client answered %d while the only slot's request is being served", code)
	}
	close(release)
	if code, err := status(a, ar, 5*time.Second); code != http.StatusOK {
		t.Fatalf("the busy connection's answer: %d, %v; want 200 (it must not be closed)", code, err)
	}
	// a is now an idle keep-alive: it makes room for b.
	if code, err := status(b, br, 5*time.Second); code != http.StatusOK {
		t.Fatalf("second client after the first answer: %d, %v; want 200", code, err)
	}
	if !closedByPeer(a, 5*time.Second) {
		t.Error("the idle keep-alive was not closed for the waiting client")
	}
	if n := l.Held(); n != 1 {
		t.Errorf("%d connections held, want 1", n)
	}
}

// TestCloseGivesSlotBack: a closed connection frees its slot, once however
// often it is closed; closing the listener ends an Accept waiting for one.
func TestCloseGivesSlotBack(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, 1)
	defer l.Close()
	accept := func() chan net.Conn {
		ch := make(chan net.Conn, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				close(ch)
				return
			}
			ch <- c
		}()
		return ch
	}
	got := func(ch chan net.Conn, what string) *Conn {
		select {
		case c, ok := <-ch:
			if !ok {
				t.Fatalf("%s: Accept failed", what)
			}
			return c.(*Conn)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: Accept did not return within 5s", what)
		}
		return nil
	}
	for range 3 {
		dial(t, inner.Addr().String())
	}
	a := got(accept(), "first")
	a.Busy() // as if its handler ran: not evictable
	second := accept()
	select {
	case <-second:
		t.Fatal("Accept returned with the only slot busy")
	case <-time.After(200 * time.Millisecond):
	}
	_ = a.Close()
	_ = a.Close()
	b := got(second, "second after a close")
	b.Busy()
	if n := l.Held(); n != 1 {
		t.Fatalf("after a double close and a new accept %d held, want 1", n)
	}
	third := accept()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-third:
		if ok {
			t.Error("Accept waiting for a slot returned a connection after Close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept waiting for a slot did not return within 5s of Close")
	}
	// CloseWrite reaches the TCP connection (net/http's graceful close).
	if err := b.CloseWrite(); err != nil {
		t.Errorf("CloseWrite: %v", err)
	}
	if !strings.Contains(b.LocalAddr().String(), "127.0.0.1") {
		t.Errorf("unexpected local address %s", b.LocalAddr())
	}
}

// TestReadFromReachesTheConn: a Conn passes ReadFrom on to the connection
// it wraps (a *net.TCPConn sends a file with sendfile(2) there); without
// it the method is hidden and every fetch copies through user space.
func TestReadFromReachesTheConn(t *testing.T) {
	inner := &readFromConn{}
	l := New(nil, 1)
	c := &Conn{Conn: inner, l: l}
	n, err := c.ReadFrom(strings.NewReader("four"))
	if err != nil || n != 4 {
		t.Fatalf("ReadFrom: %d, %v", n, err)
	}
	if inner.calls != 1 || inner.got != "four" {
		t.Fatalf("the wrapped connection's ReadFrom got %d calls with %q, want 1 with %q", inner.calls, inner.got, "four")
	}
}

type readFromConn struct {
	net.Conn
	calls int
	got   string
}

func (c *readFromConn) ReadFrom(r io.Reader) (int64, error) {
	c.calls++
	b, err := io.ReadAll(r)
	c.got += string(b)
	return int64(len(b)), err
}

// TestFreshSignNotCut: a connection whose bytes arrived less than
// freshSign ago is never closed for another, even when it is the oldest
// candidate (every other one showed life at the same moment, as a burst
// of bytes is read after a stall, while a request just read waits for its
// handler). The new client waits until the oldest is no longer fresh.
func TestFreshSignNotCut(t *testing.T) {
	l, addr := server(t, 2, func(w http.ResponseWriter, r *http.Request) {})
	a, b := dial(t, addr), dial(t, addr)
	waitReadTried(t, l, 2)
	sent := time.Now() // the server reads them later: their signs are no earlier
	send(t, a, "GET / HTTP/1.1\r\nHost: t\r\nX-Slow: a")
	send(t, b, "GET / HTTP/1.1\r\nHost: t\r\nX-Slow: b")
	waitBytesRead(t, l, 2)

	// Which of the two the server read first (the older) is its choice:
	// one of them is closed, no sooner than freshSign after its bytes.
	closed := make(chan time.Time, 2)
	for _, c := range []net.Conn{a, b} {
		go func() {
			if closedByPeer(c, 10*time.Second) {
				closed <- time.Now()
			}
		}()
	}
	fresh := dial(t, addr)
	send(t, fresh, get)
	if code, err := status(fresh, bufio.NewReader(fresh), 5*time.Second); code != http.StatusOK {
		t.Fatalf("new client at the cap: %d, %v; want 200 once the oldest is no longer fresh", code, err)
	}
	select {
	case at := <-closed:
		if d := at.Sub(sent); d < freshSign {
			t.Errorf("a connection was closed %v after its last bytes were sent; want no sooner than %v", d, freshSign)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("neither held connection was closed for the new client")
	}
	select {
	case <-closed:
		t.Error("both held connections were closed for one new client")
	case <-time.After(200 * time.Millisecond):
	}
}
