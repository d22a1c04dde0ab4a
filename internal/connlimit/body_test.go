package connlimit

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// bodyServer serves, on a Listener of cap max: POST reads its body a read
// at a time, telling progress the X-Name of each read that got bytes, and
// then answers (or, with X-Hold, waits for hold before answering); GET
// /busy holds until hold is closed; any other GET answers at once.
func bodyServer(t *testing.T, max int) (l *Listener, addr string, progress chan string, hold chan struct{}) {
	progress, hold = make(chan string, 64), make(chan struct{})
	l, addr = server(t, max, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost:
			buf := make([]byte, 512)
			for {
				n, err := r.Body.Read(buf)
				if n > 0 {
					progress <- r.Header.Get("X-Name")
				}
				if err != nil {
					break
				}
			}
			if r.Header.Get("X-Hold") != "" {
				<-hold
			}
		case r.URL.Path == "/busy":
			<-hold
		}
		_, _ = io.WriteString(w, "ok")
	})
	t.Cleanup(func() {
		select {
		case <-hold:
		default:
			close(hold)
		}
	})
	return l, addr, progress, hold
}

// slowPost starts a POST of a 100-byte body on a new connection and sends
// its first byte; it returns once the handler has read that byte.
func slowPost(t *testing.T, addr, name string, progress chan string, extra string) net.Conn {
	t.Helper()
	c := dial(t, addr)
	send(t, c, "POST /up HTTP/1.1\r\nHost: t\r\nX-Name: "+name+"\r\n"+extra+"Content-Length: 100\r\n\r\nx")
	waitProgress(t, progress, name)
	return c
}

func waitProgress(t *testing.T, progress chan string, name string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case got := <-progress:
			if got == name {
				return
			}
		case <-deadline:
			t.Fatalf("the handler of %s read no byte within 5s", name)
		}
	}
}

// TestSlowBodyEvicted: at the cap a new client takes the place of the
// body reader that has gone longest without a byte; a connection whose
// handler is serving it (busy) is kept, and so is a reader that sent a
// byte since.
func TestSlowBodyEvicted(t *testing.T) {
	l, addr, progress, _ := bodyServer(t, 3)
	busy := dial(t, addr)
	send(t, busy, "GET /busy HTTP/1.1\r\nHost: t\r\n\r\n")
	older := slowPost(t, addr, "older", progress, "")
	younger := slowPost(t, addr, "younger", progress, "")
	waitHeld(t, l, 3)
	// older's last byte is now the most recent: younger has gone longest
	// without one.
	send(t, older, "y")
	waitProgress(t, progress, "older")

	fresh := dial(t, addr)
	send(t, fresh, get)
	if code, err := status(fresh, bufio.NewReader(fresh), 5*time.Second); code != http.StatusOK {
		t.Fatalf("new client with the cap full of a busy request and two slow bodies: %d, %v; want 200 at once", code, err)
	}
	if !closedByPeer(younger, 5*time.Second) {
		t.Error("the body reader longest without a byte was not closed for the new client")
	}
	if closedByPeer(older, 200*time.Millisecond) {
		t.Error("the body reader that sent a byte more recently was closed")
	}
	if closedByPeer(busy, 200*time.Millisecond) {
		t.Error("the busy connection was closed")
	}
}

// TestEvictionRanksWaitingAndReading: waiting connections and body readers
// are ranked together by the time without a sign of life: a connection
// silent since before a reader's last byte goes first, and a reader whose
// last byte is older than a just-accepted connection goes before it (a
// client sending its request is not cut for a flood of slow bodies).
func TestEvictionRanksWaitingAndReading(t *testing.T) {
	l, addr, progress, _ := bodyServer(t, 2)
	silent := dial(t, addr)
	waitReadTried(t, l, 1)
	reader := slowPost(t, addr, "reader", progress, "")
	waitHeld(t, l, 2)
	fresh := dial(t, addr)
	send(t, fresh, get)
	if code, err := status(fresh, bufio.NewReader(fresh), 5*time.Second); code != http.StatusOK {
		t.Fatalf("new client: %d, %v; want 200", code, err)
	}
	if !closedByPeer(silent, 5*time.Second) {
		t.Error("the connection silent since before the reader's last byte was not closed for the new client")
	}
	if closedByPeer(reader, 200*time.Millisecond) {
		t.Error("the body reader was closed while a connection silent for longer was held")
	}

	// Now fresh is an idle keep-alive newer than reader's last byte, and
	// a client that connects is newer still.
	waitHeld(t, l, 2)
	late := dial(t, addr)
	send(t, late, get)
	if code, err := status(late, bufio.NewReader(late), 5*time.Second); code != http.StatusOK {
		t.Fatalf("second new client: %d, %v; want 200", code, err)
	}
	if !closedByPeer(reader, 5*time.Second) {
		t.Error("the body reader longest without a byte was not closed for the new client")
	}
}

// TestBodyReadIsBusy: once a handler has read its whole body (and works
// on it), or has begun its answer, its connection is never evicted: a new
// client waits for a slot.
func TestBodyReadIsBusy(t *testing.T) {
	for _, c := range []struct {
		name, req string
	}{
		{"whole body read", "POST /up HTTP/1.1\r\nHost: t\r\nX-Name: a\r\nX-Hold: 1\r\nContent-Length: 1\r\n\r\nx"},
		{"chunked body read", "POST /up HTTP/1.1\r\nHost: t\r\nX-Name: a\r\nX-Hold: 1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, addr, progress, hold := bodyServer(t, 1)
			a := dial(t, addr)
			send(t, a, c.req)
			waitProgress(t, progress, "a")
			waitHeld(t, l, 1)
			fresh := dial(t, addr)
			br := bufio.NewReader(fresh)
			send(t, fresh, get)
			if code, err := status(fresh, br, 300*time.Millisecond); err == nil {
				t.Fatalf("new client answered %d while the only slot's handler works on its read body", code)
			}
			close(hold)
			if code, err := status(a, bufio.NewReader(a), 5*time.Second); code != http.StatusOK {
				t.Fatalf("the busy connection's answer: %d, %v; want 200 (it must not be closed)", code, err)
			}
			if code, err := status(fresh, br, 5*time.Second); code != http.StatusOK {
				t.Fatalf("new client after the answer: %d, %v", code, err)
			}
		})
	}
}

// TestAnsweringIsBusy: a handler that answers without reading the body
// (a refusal) is busy from its first write on.
func TestAnsweringIsBusy(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	started := make(chan struct{}, 1)
	l, addr := server(t, 1, func(w http.ResponseWriter, r *http.Request) {
		// As the market does for a refusal: without it net/http would
		// drain the body before the header leaves.
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusUnauthorized)
		_ = http.NewResponseController(w).Flush()
		started <- struct{}{}
		<-hold
	})
	a := dial(t, addr)
	send(t, a, "POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nx")
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("handler did not start")
	}
	waitHeld(t, l, 1)
	fresh := dial(t, addr)
	send(t, fresh, get)
	if code, err := status(fresh, bufio.NewReader(fresh), 300*time.Millisecond); err == nil {
		t.Fatalf("new client answered %d: the connection being answered was evicted", code)
	}
	if closedByPeer(a, 100*time.Millisecond) {
		t.Error("the connection being answered was closed")
	}
}

// TestUnreadNotEvicted: a connection the server has not yet tried to read
// is not closed for another, however long it has been held: the new one
// waits until the server reads the first (which then has nothing to say,
// and goes for the new one).
func TestUnreadNotEvicted(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, 1)
	defer l.Close()
	dial(t, inner.Addr().String())
	first, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	dial(t, inner.Addr().String())
	second := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(second)
			return
		}
		second <- c
	}()
	select {
	case <-second:
		t.Fatal("a connection the server never read was closed for a new one")
	case <-time.After(300 * time.Millisecond):
	}
	go func() { _, _ = first.Read(make([]byte, 1)) }() // blocks: the client says nothing
	select {
	case c, ok := <-second:
		if !ok {
			t.Fatal("Accept failed")
		}
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the new connection was not admitted within 5s of the server reading the first")
	}
	if l.Held() != 0 {
		// second closed above; first was evicted for it.
		t.Errorf("%d held after the eviction and a close, want 0", l.Held())
	}
}

// waitReadTried waits, bounded, until the server has begun to read n of
// the connections l holds (only those are candidates for eviction).
func waitReadTried(t *testing.T, l *Listener, n int) {
	t.Helper()
	for range 500 {
		l.mu.Lock()
		k := 0
		for c := range l.held {
			if c.readTried.Load() {
				k++
			}
		}
		l.mu.Unlock()
		if k >= n {
			return
		}
		time.Sleep(10 * time.Millisecond) // polling a count: there is no event to wait on
	}
	t.Fatalf("the server has not begun to read %d connections after 5s", n)
}

// waitBytesRead waits, bounded, until n of the connections l holds have
// had bytes read.
func waitBytesRead(t *testing.T, l *Listener, n int) {
	t.Helper()
	for range 500 {
		l.mu.Lock()
		k := 0
		for c := range l.held {
			if c.lastRead.Load() != 0 {
				k++
			}
		}
		l.mu.Unlock()
		if k >= n {
			return
		}
		time.Sleep(10 * time.Millisecond) // polling a count: there is no event to wait on
	}
	t.Fatalf("no bytes read from %d connections after 5s", n)
}
