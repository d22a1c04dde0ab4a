package main

import (
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits of the control plane's HTTP server. Its requests are small (JSON
// bodies capped at 64 KiB, /metrics, probes), so every phase of a
// connection is bounded: a client that stalls, or keeps a connection open
// and idle, cannot hold it for long, and no more than --control-max-conns
// connections are held at once.
const (
	// defaultControlHeaderTimeout bounds the reading of a request's header.
	defaultControlHeaderTimeout = 10 * time.Second
	// defaultControlIdleTimeout closes a keep-alive connection with no
	// request for this long.
	defaultControlIdleTimeout = 60 * time.Second
	// defaultControlMaxConns is the number of control-plane connections
	// held at once; more wait in the kernel's accept backlog.
	defaultControlMaxConns = 512
	// controlReadTimeout bounds the reading of a whole request, body
	// included (a 64 KiB body needs far less).
	controlReadTimeout = 30 * time.Second
	// controlWriteTimeout bounds a request from the end of its header to
	// the end of its answer (a /metrics scrape included).
	controlWriteTimeout = 60 * time.Second
	// controlMaxHeaderBytes caps a request's header (431 beyond it).
	controlMaxHeaderBytes = 16 << 10
)

// controlServer is the control plane's http.Server with the limits above.
func controlServer(h http.Handler, f *serveFlags, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: f.controlHeaderTimeout,
		ReadTimeout:       controlReadTimeout,
		WriteTimeout:      controlWriteTimeout,
		IdleTimeout:       f.controlIdleTimeout,
		MaxHeaderBytes:    controlMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// limitListener holds at most cap(sem) accepted connections at once:
// Accept takes a slot before it accepts (so that connections beyond the
// cap wait in the kernel's accept backlog, costing this process nothing)
// and a connection gives its slot back when it is closed, once however
// often Close is called.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

// Close closes the listener and ends an Accept waiting for a slot.
func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// limitConn is a connection holding a slot of its limitListener.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite lets net/http half-close a TCP connection before it closes
// it, as it does with an unwrapped one.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
