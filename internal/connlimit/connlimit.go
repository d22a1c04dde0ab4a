// Package connlimit caps the connections a server holds at once, and
// makes room for a new client by closing a connection with no request in
// progress. It serves net/http (Serve, Configure) and any other server
// that tells each *Conn when it is busy and when it waits again
// (Conn.Busy, Conn.Waiting: the data plane's fasthttp server does, in
// package gateway).
//
// A plain cap (a semaphore around Accept) is fair to nobody: once slow
// clients fill it, a new client waits in the kernel's backlog until the
// server's header timeout cuts the ones ahead of it, round after round;
// 2 000 clients that each send half a header delay a new one by several
// header timeouts. Here the cap is on held connections and, when it is
// full, the connection longest without a sign of life among those not in
// the middle of a request is closed for the new one, the way nginx reuses
// idle keep-alive connections when it runs out. Candidates: one that has
// sent nothing yet, one still sending its head, an idle keep-alive, and
// under net/http a handler still waiting for its request's body (a client
// sending a body at a byte a second is no better than one sending its
// head that slowly). A sign of life is the accept, bytes of a request
// arriving, the end of an answer; one younger than 20 ms protects its
// connection (see freshSign). A connection whose request a handler is
// working on, or whose answer is being written, is never closed for
// another: when every held connection is busy, the new one waits for a
// slot.
//
// Accept never gives up on a temporary error (out of descriptors, of
// buffers, a connection aborted before it was taken): it backs off, 5 ms
// doubling to 1 s, and tries again, as net/http does. fasthttp's own loop
// would end the server on the first such error.
package connlimit

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// phase is where a held connection stands, as far as eviction is
// concerned.
type phase int

const (
	// waiting: accepted with no request yet, reading a request head, or
	// idle between requests. Evictable.
	waiting phase = iota
	// reading: a handler is reading the request's body and has not begun
	// its answer. Evictable.
	reading
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
	log     *slog.Logger

	// The accept-retry log line, at most one per acceptLogEvery. Touched
	// by Accept's goroutine only.
	lastAcceptLog  time.Time
	acceptFailures int

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

// OnEvict is called (without locks held) each time a connection is closed
// to make room, e.g. to count evictions.
func OnEvict(f func()) Option { return func(l *Listener) { l.onEvict = f } }

// WithLog sets where a failing Accept is reported (rate-limited); none if
// unset.
func WithLog(log *slog.Logger) Option { return func(l *Listener) { l.log = log } }

// WithClock sets the clock that orders the candidates for eviction (tests).
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
		lc, ok := r.Context().Value(connKey{}).(*Conn)
		if !ok {
			h.ServeHTTP(w, r)
			return
		}
		// Busy (or reading) until net/http reports the connection idle
		// (or closed): the answer may still be flushing after the handler
		// returns.
		if r.Body == nil || r.Body == http.NoBody {
			lc.Busy()
			h.ServeHTTP(w, r)
			return
		}
		lc.setPhase(reading)
		r.Body = &bodyReader{ReadCloser: r.Body, c: lc}
		h.ServeHTTP(&answerWriter{ResponseWriter: w, c: lc}, r)
	})
}

// Serve configures srv (Configure) and serves on l.
func (l *Listener) Serve(srv *http.Server) error {
	l.Configure(srv)
	return srv.Serve(l)
}

type connKey struct{}

// Accept takes the next connection from the kernel and admits it: at once
// while fewer than max are held; else by closing the candidate longest
// without a sign of life (victimLocked); else, when no held connection is
// a candidate, once one is given back or becomes one (or the listener is
// closed). Accept is called from one
// goroutine, as http.Server and fasthttp.Server do.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.acceptRetrying()
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
		victim, ripe := l.victimLocked()
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
		if !l.await(ripe) {
			_ = c.Close()
			return nil, net.ErrClosed
		}
	}
}

// await waits for a held connection to be given back or to become a
// candidate (a wake), or for ripe to pass when positive; false once l is
// closed.
func (l *Listener) await(ripe time.Duration) bool {
	var later <-chan time.Time
	if ripe > 0 {
		t := time.NewTimer(ripe)
		defer t.Stop()
		later = t.C
	}
	select {
	case <-l.wake:
	case <-later:
	case <-l.done:
		return false
	}
	return true
}

// Backoff of Accept after a temporary error, as net/http's: 5 ms doubling
// to 1 s.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
	// acceptLogEvery bounds the "accept failed" lines: a process out of
	// descriptors fails an accept every second for as long as it lasts.
	acceptLogEvery = 10 * time.Second
)

// acceptRetrying is the inner listener's Accept, retried after a temporary
// error until it gives a connection, fails for good, or l is closed.
func (l *Listener) acceptRetrying() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			return c, nil
		}
		if !Temporary(err) {
			return nil, err
		}
		delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
		l.logAcceptFailure(err, delay)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return nil, net.ErrClosed
		}
	}
}

// logAcceptFailure writes one line per acceptLogEvery, saying how many
// failures it stands for.
func (l *Listener) logAcceptFailure(err error, retryIn time.Duration) {
	l.acceptFailures++
	now := l.now()
	if l.log == nil || (!l.lastAcceptLog.IsZero() && now.Sub(l.lastAcceptLog) < acceptLogEvery) {
		return
	}
	l.log.Warn("accepting a connection failed; retrying", "err", err, "retry_in", retryIn,
		"failures", l.acceptFailures, "addr", l.Addr().String())
	l.lastAcceptLog, l.acceptFailures = now, 0
}

// Temporary reports whether an Accept error passes by itself: the process
// or the system is out of descriptors or memory for now, or a client gave
// up before its connection was taken.
func Temporary(err error) bool {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS,
		syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// freshSign: a connection that showed life this recently is not closed
// for another. A request whose head has arrived is a candidate until its
// handler starts and makes it busy; after a stall of the process (an
// overloaded machine) its bytes and those of every slow body are read in
// one burst, and the request just read, as old as the rest, could be cut.
// A burst spans a few milliseconds; a flood that lively makes the new
// client wait this long, which every client waiting for a slot then pays.
const freshSign = 20 * time.Millisecond

// victimLocked is the held connection to close for a new one: of those not
// busy that the server has begun to read, the one that has gone longest
// without a sign of life (lastSign), if that is at least freshSign ago. A
// client that just connected and sent its request is thus never closed for
// a flood of slow heads or bodies: its request is the newest sign of all.
//
// A connection the server has not yet tried to read is not a candidate:
// in a burst, connections are accepted faster than their requests are
// read, and each would close the oldest of those just before it, a real
// client's among them. Accept waits for the server instead, which also
// paces a flood to the speed the server reads. nil if none qualifies;
// then ripe, when positive, is how soon the oldest fresh one will.
func (l *Listener) victimLocked() (victim *Conn, ripe time.Duration) {
	var oldest time.Time
	for c := range l.held {
		if c.phase == busy || !c.readTried.Load() {
			continue
		}
		if sign := c.lastSign(); victim == nil || sign.Before(oldest) {
			victim, oldest = c, sign
		}
	}
	if victim == nil {
		return nil, 0
	}
	if age := l.now().Sub(oldest); age < freshSign {
		return nil, freshSign - age
	}
	return victim, 0
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
		lc.Waiting()
	case http.StateHijacked:
		lc.Busy()
	}
	// StateNew: waiting since Accept. StateActive: a request's first bytes
	// arrived; it stays waiting (evictable) until its handler starts, so
	// a client that dribbles its head is no better than one that dribbles
	// a body. StateClosed: Close gives the slot back.
}

// Held returns the number of connections held now.
func (l *Listener) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

// Close closes the listener and ends an Accept waiting for a slot or
// backing off.
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
	since time.Time // when it began waiting or reading its body
	// readTried: the server has called Read on it at least once.
	readTried atomic.Bool
	// lastRead: when a Read last returned bytes (l.now, in UnixNano),
	// kept only while the connection is not busy: a busy one is never
	// ranked for eviction, and leaving busy restarts since.
	lastRead atomic.Int64
	// busyNow mirrors phase == busy for Read, which takes no lock: an
	// upload's reads skip the clock.
	busyNow atomic.Bool
}

// Read is the connection's Read. The first call makes c a candidate for
// eviction (victimLocked), so it wakes an Accept waiting for one; bytes
// read are a sign of life.
func (c *Conn) Read(p []byte) (int, error) {
	if !c.readTried.Load() {
		c.l.mu.Lock()
		c.readTried.Store(true)
		c.l.wakeLocked()
		c.l.mu.Unlock()
	}
	n, err := c.Conn.Read(p)
	if n > 0 && !c.busyNow.Load() {
		c.lastRead.Store(c.l.now().UnixNano())
	}
	return n, err
}

// lastSign is the last sign of life of c: bytes of a request (head or
// body) arriving, its accept, the end of its last answer, or the start
// of its handler's body read, whichever came last. Guarded by l.mu (since).
func (c *Conn) lastSign() time.Time {
	if r := c.lastRead.Load(); r > c.since.UnixNano() {
		return time.Unix(0, r)
	}
	return c.since
}

// Busy marks c as serving a request: it is not evicted until Waiting.
// A server calls it when a handler starts (and on a hijack).
func (c *Conn) Busy() { c.setPhase(busy) }

// Waiting marks c as waiting for its next request: evictable, oldest first,
// from now on. A server calls it once an answer is out (keep-alive idle).
func (c *Conn) Waiting() { c.setPhase(waiting) }

func (c *Conn) setPhase(p phase) {
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.phase != p && p != busy {
		c.since = l.now()
		l.wakeLocked()
	}
	c.phase = p
	c.busyNow.Store(p == busy)
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

// ReadFrom hands an answer's body to the wrapped connection's ReadFrom, so
// that a file sent on a TCP connection still goes out with sendfile(2)
// (the fetch route's zero-copy path): embedding net.Conn alone would hide
// the method and make every fetch copy through user space.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(onlyWriter{c.Conn}, r)
}

// NetConn returns the connection c wraps, for code that needs the
// *net.TCPConn underneath (a half-close), as tls.Conn's NetConn does.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// SyscallConn gives the wrapped connection's raw descriptor (a peek at
// whether the peer closed), or an error if it has none.
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.New("connlimit: the wrapped connection has no descriptor")
}

// onlyWriter hides every method but Write, so that io.Copy does not call
// ReadFrom again.
type onlyWriter struct{ io.Writer }

// bodyReader is a request body whose connection is evictable while it is
// read (each byte that arrives is a sign of life: Conn.Read); its end (or
// close) makes the connection busy, since the handler now works on the
// request.
type bodyReader struct {
	io.ReadCloser
	c *Conn
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		// EOF, a cap hit, a deadline: either way no more body is awaited.
		b.c.Busy()
	}
	return n, err
}

func (b *bodyReader) Close() error {
	b.c.Busy()
	return b.ReadCloser.Close()
}

// answerWriter makes the connection busy once the handler begins its
// answer, whether or not it read the whole body: an answer being written
// is never cut for another client.
type answerWriter struct {
	http.ResponseWriter
	c       *Conn
	started bool
}

func (w *answerWriter) begin() {
	if !w.started {
		w.started = true
		w.c.Busy()
	}
}

func (w *answerWriter) WriteHeader(code int) {
	if code >= 200 { // 1xx are interim; the body may still be awaited
		w.begin()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *answerWriter) Write(b []byte) (int, error) {
	w.begin()
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the real writer (deadlines,
// flush).
func (w *answerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
