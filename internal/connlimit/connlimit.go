// Package connlimit caps the connections an http.Server holds at once, and
// makes room for a new client by closing the connection that has waited
// longest without a request in progress.
//
// A plain cap (a semaphore around Accept) is fair to nobody: once slow
// clients fill it, a new client waits in the kernel's backlog until the
// server's header timeout cuts the ones ahead of it, round after round;
// 2 000 clients that each send half a header delay a new one by several
// header timeouts. Here the cap is on held connections and, when it is
// full, the oldest connection that is not in the middle of a request (one
// that has sent nothing yet, is still sending its header, or is an idle
// keep-alive) is closed for the new one, the way nginx reuses idle
// keep-alive connections when it runs out. A connection whose request a
// handler is serving, or whose answer is being written, is never closed
// for another: when every held connection is busy, the new one waits for
// a slot.
package connlimit

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// phase is where a held connection stands, as far as eviction is
// concerned.
type phase int

const (
	// waiting: accepted with no request yet, reading a request header, or
	// idle between requests. The connection may be evicted.
	waiting phase = iota
	// busy: a handler is serving its request, or its answer is being
	// finished, or it was hijacked. Never evicted.
	busy
)

// Listener holds at most max accepted connections. Wire it into the
// http.Server with Serve (or Configure), which it needs to tell waiting
// connections from busy ones.
type Listener struct {
	net.Listener
	max     int
	onEvict func()
	now     func() time.Time

	mu   sync.Mutex
	held map[*Conn]struct{}
	// wake tells a waiting Accept that a slot was given back or a
	// connection became evictable (buffered 1: a wake-up, not a count).
	wake chan struct{}

	done      chan struct{}
	closeOnce sync.Once
}

// Option configures a Listener.
type Option func(*Listener)

// OnEvict is called (without locks held) each time a waiting connection is
// closed to make room, e.g. to count evictions.
func OnEvict(f func()) Option { return func(l *Listener) { l.onEvict = f } }

// WithClock sets the clock that orders waiting connections (tests).
func WithClock(now func() time.Time) Option { return func(l *Listener) { l.now = now } }

// New wraps l so that at most max connections (max ≥ 1) are held at once.
func New(l net.Listener, max int, opts ...Option) *Listener {
	ll := &Listener{Listener: l, max: max, now: time.Now, held: map[*Conn]struct{}{},
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	for _, o := range opts {
		o(ll)
	}
	return ll
}

// Configure sets srv's ConnState and ConnContext hooks and wraps its
// Handler, so that the listener sees which connections are busy. It keeps
// hooks srv already had.
func (l *Listener) Configure(srv *http.Server) {
	prevState, prevCtx, h := srv.ConnState, srv.ConnContext, srv.Handler
	if h == nil {
		h = http.DefaultServeMux
	}
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		l.connState(c, s)
		if prevState != nil {
			prevState(c, s)
		}
	}
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if prevCtx != nil {
			ctx = prevCtx(ctx, c)
		}
		if lc, ok := c.(*Conn); ok {
			ctx = context.WithValue(ctx, connKey{}, lc)
		}
		return ctx
	}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if lc, ok := r.Context().Value(connKey{}).(*Conn); ok {
			l.setPhase(lc, busy)
		}
		// Busy until net/http reports the connection idle (or closed):
		// the answer may still be flushing after the handler returns.
		h.ServeHTTP(w, r)
	})
}

// Serve configures srv (Configure) and serves on l.
func (l *Listener) Serve(srv *http.Server) error {
	l.Configure(srv)
	return srv.Serve(l)
}

type connKey struct{}

// Accept takes the next connection from the kernel and admits it: at once
// while fewer than max are held; else by closing the longest-waiting held
// connection; else, when every held connection is busy, once one is given
// back or becomes evictable (or the listener is closed). Accept is called
// from one goroutine, as http.Server does.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	lc := &Conn{Conn: c, l: l}
	for {
		l.mu.Lock()
		if len(l.held) < l.max {
			lc.since = l.now()
			l.held[lc] = struct{}{}
			l.mu.Unlock()
			return lc, nil
		}
		victim := l.oldestWaitingLocked()
		if victim != nil {
			l.releaseLocked(victim)
		}
		l.mu.Unlock()
		if victim != nil {
			_ = victim.Conn.Close() // its server goroutine sees the close and ends
			if l.onEvict != nil {
				l.onEvict()
			}
			continue
		}
		select {
		case <-l.wake:
		case <-l.done:
			_ = c.Close()
			return nil, net.ErrClosed
		}
	}
}

// oldestWaitingLocked is the held connection that has been waiting the
// longest, or nil if all are busy.
func (l *Listener) oldestWaitingLocked() *Conn {
	var oldest *Conn
	for c := range l.held {
		if c.phase == waiting && (oldest == nil || c.since.Before(oldest.since)) {
			oldest = c
		}
	}
	return oldest
}

// releaseLocked gives c's slot back, once.
func (l *Listener) releaseLocked(c *Conn) {
	if _, ok := l.held[c]; !ok {
		return
	}
	delete(l.held, c)
	l.wakeLocked()
}

func (l *Listener) wakeLocked() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *Listener) connState(c net.Conn, s http.ConnState) {
	lc, ok := c.(*Conn)
	if !ok {
		return
	}
	switch s {
	case http.StateIdle:
		// The answer is out; waiting for the next request from now on.
		l.setPhase(lc, waiting)
	case http.StateHijacked:
		l.setPhase(lc, busy)
	}
	// StateNew: waiting since Accept. StateActive: a request's first bytes
	// arrived; it stays waiting (evictable) until its handler starts, so
	// a client that dribbles its header is no better than one that sends
	// nothing. StateClosed: Close gives the slot back.
}

func (l *Listener) setPhase(c *Conn, p phase) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.phase != p && p == waiting {
		c.since = l.now()
		l.wakeLocked()
	}
	c.phase = p
}

// Held returns the number of connections held now.
func (l *Listener) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

// Close closes the listener and ends an Accept waiting for a slot.
func (l *Listener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// Conn is a connection holding a slot of its Listener.
type Conn struct {
	net.Conn
	l *Listener
	// Guarded by l.mu.
	phase phase
	since time.Time // when it began waiting
}

// Close closes the connection and gives its slot back, once however often
// it is called.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	return err
}

// CloseWrite lets net/http half-close a TCP connection before it closes
// it, as it does with an unwrapped one.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
