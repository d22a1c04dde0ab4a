package market

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/vmshelf/vmshelf/imagestore"
)

// pipeConsoles is a cluster whose consoles are in-memory pipes the test
// holds the other end of.
type pipeConsoles struct{ machines chan net.Conn }

func (p pipeConsoles) OpenConsole(context.Context, imagestore.Order, int, imagestore.ConsoleKind) (net.Conn, error) {
	a, b := net.Pipe()
	p.machines <- b
	return a, nil
}

// consoleMarket is a market with consoles and one active order of the
// buyer whose replica 0 runs.
func consoleMarket(t *testing.T, mod func(*Config)) (*marketFixture, imagestore.Order, pipeConsoles) {
	t.Helper()
	pc := pipeConsoles{machines: make(chan net.Conn, 4)}
	m := newMarket(t, func(c *Config) {
		c.Consoles, c.ConsoleBase = pc, "ws://edge.example"
		if mod != nil {
			mod(c)
		}
	})
	o := m.paidOrder()
	ctx := t.Context()
	if err := m.e.st.MarkOrderActive(ctx, o.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.e.st.SetReplicaStates(ctx, o.ID, []imagestore.ReplicaState{{Index: 0, Name: "vm-0", State: imagestore.ReplicaRunning,
		ObservedAt: m.e.clock.Now()}}); err != nil {
		t.Fatal(err)
	}
	return m, o, pc
}

// openConsole takes a ticket and dials its WebSocket on the test server.
func (m *marketFixture) openConsole(t *testing.T, orderID string) *websocket.Conn {
	t.Helper()
	r := m.e.do(http.MethodPost, "/market/vms/console/ticket", m.buyer,
		strings.NewReader(`{"order_id":"`+orderID+`","replica":0,"kind":"serial"}`))
	if r.status != http.StatusCreated {
		t.Fatalf("ticket: %d %s", r.status, r.body)
	}
	var a consoleAnswer
	decode(t, r, &a)
	return m.dialTicket(t, a.URL)
}

func (m *marketFixture) dialTicket(t *testing.T, u string) *websocket.Conn {
	t.Helper()
	u = strings.Replace(u, "ws://edge.example", "ws"+strings.TrimPrefix(m.e.ts.URL, "http"), 1)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

// closedWith reads c until it closes and returns its status and reason.
func closedWith(t *testing.T, c *websocket.Conn) (websocket.StatusCode, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for {
		if _, _, err := c.Read(ctx); err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return ce.Code, ce.Reason
			}
			t.Fatalf("no close status: %v", err)
		}
	}
}

// TestConsoleTicketExpiry: a console ticket opens its WebSocket until its
// minute is over, not at it.
func TestConsoleTicketExpiry(t *testing.T) {
	m, o, _ := consoleMarket(t, nil)
	r := m.e.do(http.MethodPost, "/market/vms/console/ticket", m.buyer,
		strings.NewReader(`{"order_id":"`+o.ID+`","replica":0,"kind":"vnc"}`))
	var a consoleAnswer
	decode(t, r, &a)
	if !a.ExpiresAt.Equal(m.e.clock.Now().Add(consoleTicketTTL)) {
		t.Errorf("expires at %v, want a minute from now", a.ExpiresAt)
	}
	m.e.clock.Advance(consoleTicketTTL)
	if code, reason := closedWith(t, m.dialTicket(t, a.URL)); code != closeTicket || !strings.Contains(reason, "expired") {
		t.Errorf("a ticket at its expiry: %d %q, want %d", code, reason, closeTicket)
	}
}

// TestConsoleEnds: a console closes after its idle time without a byte,
// and when its replica stops running; each with its code and reason.
func TestConsoleEnds(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		m, o, pc := consoleMarket(t, func(c *Config) { c.ConsoleIdle = 400 * time.Millisecond })
		c := m.openConsole(t, o.ID)
		machine := <-pc.machines
		defer machine.Close()
		if code, reason := closedWith(t, c); code != closeIdle || !strings.Contains(reason, "nothing passed") {
			t.Errorf("idle console: %d %q, want %d", code, reason, closeIdle)
		}
	})
	t.Run("order ended", func(t *testing.T) {
		m, o, pc := consoleMarket(t, func(c *Config) { c.ConsoleIdle = 2 * time.Second })
		c := m.openConsole(t, o.ID)
		machine := <-pc.machines
		defer machine.Close()
		// The replica stops (the month is over, or the machine halted).
		if err := m.e.st.SetReplicaStates(t.Context(), o.ID, []imagestore.ReplicaState{{Index: 0, Name: "vm-0",
			State: imagestore.ReplicaStopped, ObservedAt: m.e.clock.Now()}}); err != nil {
			t.Fatal(err)
		}
		// Bytes keep passing, so only the order's end closes it.
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					_ = machine.SetWriteDeadline(time.Now().Add(time.Second))
					_, _ = machine.Write([]byte("."))
				}
			}
		}()
		if code, reason := closedWith(t, c); code != closeEnded || !strings.Contains(reason, "stopped running") {
			t.Errorf("console of a stopped replica: %d %q, want %d", code, reason, closeEnded)
		}
	})
}

// TestConsoleEdgeCap: the edge's cap counts every box's consoles.
func TestConsoleEdgeCap(t *testing.T) {
	m, o, pc := consoleMarket(t, func(c *Config) { c.ConsolesPerTenant, c.ConsolesPerEdge = 5, 1 })
	m.openConsole(t, o.ID)
	machine := <-pc.machines
	defer machine.Close()
	r := m.e.do(http.MethodPost, "/market/vms/console/ticket", m.buyer,
		strings.NewReader(`{"order_id":"`+o.ID+`","replica":0,"kind":"serial"}`))
	if r.status != http.StatusTooManyRequests || !strings.Contains(string(r.body), "on this edge") {
		t.Errorf("a console beyond the edge's cap: %d %s, want 429 consoleBusy on this edge", r.status, r.body)
	}
}

// TestConsoleOriginExact: a console's WebSocket is let in from the page's
// own origin, scheme, host and port alike, or with no Origin; any other
// is 403 badOrigin, and the ticket stays usable.
func TestConsoleOriginExact(t *testing.T) {
	m, o, pc := consoleMarket(t, nil)
	r := m.e.do(http.MethodPost, "/market/vms/console/ticket", m.buyer,
		strings.NewReader(`{"order_id":"`+o.ID+`","replica":0,"kind":"serial"}`))
	var a consoleAnswer
	decode(t, r, &a)
	u := strings.Replace(a.URL, "ws://edge.example", "ws"+strings.TrimPrefix(m.e.ts.URL, "http"), 1)
	for _, origin := range []string{"https://edge.example", "http://edge.example:8481", "http://evil.example", "http://edge.example.evil", "null"} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {origin}}})
		cancel()
		if err == nil {
			_ = c.CloseNow()
			t.Errorf("a console from Origin %s was let in", origin)
			continue
		}
		if resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("a console from Origin %s: %v, want 403", origin, err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"http://edge.example"}}})
	if err != nil {
		t.Fatalf("the page's own origin, after the refusals: %v", err)
	}
	defer c.CloseNow()
	machine := <-pc.machines
	_ = machine.Close()
}
