package gateway

import (
	"net"
	"testing"

	"github.com/vmshelf/vmshelf/internal/connlimit"
)

// TestWrappedConnSeenThrough: serve hands the gateway connections wrapped
// by the connection cap (connlimit.Conn). What the gateway does with the
// socket underneath must still work through that wrapper: the peek that
// tells a queued fetch its client went away (peerClosed), and the
// half-close before a refused request's connection is drained
// (underlyingTCP). Without them a browser's reload met a lingering
// refused connection, and a gone fetch client held its place in the queue.
func TestWrappedConnSeenThrough(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := connlimit.New(inner, 4)
	defer ln.Close()
	client, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*connlimit.Conn); !ok {
		t.Fatalf("accepted %T, want *connlimit.Conn", c)
	}
	if _, ok := underlyingTCP(c); !ok {
		t.Error("underlyingTCP does not find the *net.TCPConn under a connlimit.Conn")
	}
	if peerClosed(c) {
		t.Fatal("peerClosed before the client closed")
	}
	client.Close()
	waitFor(t, "peerClosed to see the client's close through the wrapper", func() bool { return peerClosed(c) })
}
