// Package headwatch judges the heads of the requests a net/http server
// reads by headerrule, from the bytes as they arrive on the connection.
// net/http hides from its handlers what the rule needs: it merges two
// Content-Length lines of one value into one, and drops the
// Content-Length of a request that also has a Transfer-Encoding (and
// reads its body as chunked). So each connection (Listen) notes the
// header names of every head read from it, in order, and the server's
// handler takes each request's verdict (Judge) before it does anything
// else.
//
// To find where one request ends and the next begins, a connection
// follows the framing as net/http does: a head, then as many body bytes
// as its one Content-Length says (none without). It stops following after
// a head it cannot frame that way (a Transfer-Encoding, a Content-Length
// that is not a number) or that is refused: the server closes such a
// connection after its answer. A request that comes all the same is
// judged unreadable.
package headwatch

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"sync"

	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/headerrule"
)

// maxPending bounds the heads a connection holds for requests net/http
// has not served yet: what it read ahead of its handlers (one 4 KiB
// buffer, a few dozen heads at most). A client that pipelines more stops
// being followed.
const maxPending = 256

// unfollowed is the answer to a request on a connection that is no longer
// followed.
var unfollowed = headerrule.AmbiguousLength.WithMsg(
	"the edge no longer follows this connection's framing after an earlier request; send the request on a new connection")

// Listen wraps ln: the heads read from its connections are watched.
func Listen(ln net.Listener) net.Listener { return listener{ln} }

type listener struct{ net.Listener }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &Conn{Conn: c}, nil
}

// Configure prepares srv, which serves a Listen listener (possibly
// wrapped), for Judge: its requests carry their connection in their
// context, a hijacked connection is no longer watched, and every request
// reaches srv's handler (net/http answers OPTIONS * itself otherwise,
// which would leave that request's verdict to the next one). It keeps the
// hooks srv already had.
func Configure(srv *http.Server) {
	prevCtx, prevState := srv.ConnContext, srv.ConnState
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if prevCtx != nil {
			ctx = prevCtx(ctx, c)
		}
		if hc := find(c); hc != nil {
			ctx = context.WithValue(ctx, connKey{}, hc)
		}
		return ctx
	}
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		if hc := find(c); hc != nil && s == http.StateHijacked {
			hc.mu.Lock()
			hc.stopped = true // what follows is another protocol's
			hc.mu.Unlock()
		}
		if prevState != nil {
			prevState(c, s)
		}
	}
	srv.DisableGeneralOptionsHandler = true
}

type connKey struct{}

// find returns the Conn that c is or wraps (through NetConn, as another
// listener's connection wrapping it offers).
func find(c net.Conn) *Conn {
	for c != nil {
		if hc, ok := c.(*Conn); ok {
			return hc
		}
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = w.NetConn()
	}
	return nil
}

// Judge returns the answer to r's head, nil when it reads one way only.
// Each request of a watched connection must be judged once, by the
// server's handler, before anything else: net/http serves a connection's
// requests one after the other, so the verdicts are taken in the order
// the heads came. A request that did not come through a watched
// connection (a test's recorder) is not judged: nil.
func Judge(r *http.Request) *apierr.Error {
	hc, ok := r.Context().Value(connKey{}).(*Conn)
	if !ok {
		return nil
	}
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if len(hc.pending) == 0 {
		return unfollowed
	}
	head := hc.pending[0]
	hc.pending = append(hc.pending[:0], hc.pending[1:]...)
	return head.Refusal(r.ProtoAtLeast(1, 1))
}

// Conn is a connection whose request heads are watched as they are read.
type Conn struct {
	net.Conn
	mu      sync.Mutex
	scan    scanner
	pending []headerrule.Head // heads read, not yet judged: oldest first
	stopped bool              // the framing is no longer followed
}

// Read is the connection's Read; the bytes read pass the scanner.
func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.watch(p[:n])
		c.mu.Unlock()
	}
	return n, err
}

// CloseWrite half-closes a TCP connection, as net/http does before it
// closes one whose client may still be sending.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// NetConn returns the connection c wraps.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// watch passes b through the scanner; each head it completes is queued
// for its request. Called with mu held.
func (c *Conn) watch(b []byte) {
	for len(b) > 0 && !c.stopped {
		var head headerrule.Head
		var done bool
		b, head, done = c.scan.feed(b)
		if !done {
			continue
		}
		c.pending = append(c.pending, head)
		length, ok := c.scan.length()
		if !ok || head.TransferEncoding() || head.Refusal(true) != nil || len(c.pending) > maxPending {
			c.stopped = true
			return
		}
		c.scan = scanner{body: length}
	}
}

// scanner reads one request at a time: its head, a byte at a time, then
// its body, skipped.
type scanner struct {
	body    uint64 // body bytes still to come before the head
	state   state
	head    headerrule.Head
	name    [nameCap]byte // the current line's name (its first nameCap bytes)
	nameLen int
	value   [valueCap]byte // the current Content-Length line's value
	valLen  int
	lengths int    // Content-Length lines
	n       uint64 // the first one's value
	badLen  bool   // a Content-Length that is not a number
}

type state uint8

const (
	requestLine state = iota // up to the request line's end
	lineStart                // a header line's first byte, or the head's end
	headEnd                  // after the CR of the empty line
	inName                   // a header name, up to its colon
	inLength                 // a Content-Length's value
	restOfLine               // the rest of a line that does not matter
)

const (
	// nameCap holds every name headerrule knows; a longer name is none.
	nameCap = 32
	// valueCap holds the longest Content-Length net/http takes (int63,
	// 19 digits) with the blanks around it.
	valueCap = 32
)

var contentLength = []byte("content-length")

// feed reads b; done reports that a head ended, rest is what follows it.
func (s *scanner) feed(b []byte) (rest []byte, head headerrule.Head, done bool) {
	if s.body > 0 {
		skip := uint64(len(b))
		if skip > s.body {
			skip = s.body
		}
		s.body -= skip
		return b[skip:], head, false
	}
	for i, c := range b {
		switch s.state {
		case requestLine, restOfLine:
			if c == '\n' {
				s.state = lineStart
			}
		case lineStart:
			switch c {
			case '\n':
				return b[i+1:], s.head, true
			case '\r':
				s.state = headEnd
			case ' ', '\t':
				s.state = restOfLine // more of the line before (obs-fold)
			default:
				s.nameLen = 0
				s.addName(c)
				s.state = inName
			}
		case headEnd:
			// net/http reads a line up to its LF and drops one CR before it.
			if c == '\n' {
				return b[i+1:], s.head, true
			}
			s.state = restOfLine
		case inName:
			switch c {
			case ':':
				s.endName()
			case '\n': // no colon: net/http refuses the head and closes
				s.state = lineStart
			default:
				s.addName(c)
			}
		case inLength:
			if c == '\n' {
				s.endLength()
				s.state = lineStart
			} else if s.valLen < valueCap {
				s.value[s.valLen] = c
				s.valLen++
			} else {
				s.badLen = true
			}
		}
	}
	return nil, head, false
}

func (s *scanner) addName(c byte) {
	if s.nameLen < nameCap {
		s.name[s.nameLen] = c
	}
	s.nameLen++
}

// endName takes the name of a line at its colon.
func (s *scanner) endName() {
	s.state = restOfLine
	if s.nameLen > nameCap {
		return
	}
	name := s.name[:s.nameLen]
	s.head.Line(name)
	if bytes.EqualFold(name, contentLength) {
		s.lengths++
		s.valLen = 0
		s.state = inLength
	}
}

// endLength takes the value of a Content-Length line as net/http reads it
// (blanks around it trimmed, decimal digits, below 2^63); the first line's
// value frames the body (a second makes the head refused).
func (s *scanner) endLength() {
	v := bytes.Trim(s.value[:s.valLen], " \t\r")
	n, ok := uint64(0), len(v) > 0
	for _, d := range v {
		if d < '0' || d > '9' || n > (1<<63-1-uint64(d-'0'))/10 {
			ok = false
			break
		}
		n = n*10 + uint64(d-'0')
	}
	if !ok {
		s.badLen = true
	} else if s.lengths == 1 {
		s.n = n
	}
}

// length is the body's length after the head: its Content-Length, or 0
// without one; false when it has no such number.
func (s *scanner) length() (uint64, bool) {
	if s.badLen {
		return 0, false
	}
	return s.n, true
}
