package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"image"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/vmshelf/vmshelf/internal/testkit/testguest"
)

// The console through the binary: the buyer's ticket, the WebSocket the
// page opens with it, serve's bridge to KubeVirt's subresource (the
// in-memory Kubernetes API), and a machine behind it.

// consoleTicketAnswer is POST /market/vms/console/ticket's 201.
type consoleTicketAnswer struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// consoleTicket asks serve for a console of replica 0 of orderID as
// token; it returns the status and the answer.
func consoleTicket(t *testing.T, s *server, token, orderID, kind string) (int, consoleTicketAnswer, []byte) {
	t.Helper()
	code, body := s.ctl(t, "/market/vms/console/ticket", token, `{"order_id":"`+orderID+`","replica":0,"kind":"`+kind+`"}`)
	var a consoleTicketAnswer
	if code == http.StatusCreated {
		decode(t, body, &a)
		if u, err := url.Parse(a.URL); err == nil {
			s.secret(u.Query().Get("ticket"))
		}
	}
	return code, a, body
}

// dialer is how the in-memory Kubernetes API reaches a replica's console
// (kubeFake.setConsole).
type dialer = func(ctx context.Context) (net.Conn, error)

// runningOrder orders one replica of image from listingID as the dev box,
// lets the cluster run it with consoles (subresource → dialer), pays it
// (Stripe event eventID) and waits until status shows it active and
// running. It answers the order and its replica's VM name.
func (m *kubeMarket) runningOrder(t *testing.T, listingID, image, name, eventID string, consoles map[string]dialer) (orderAnswer, string) {
	t.Helper()
	o := m.order(t, listingID, image, name, 1, "")
	vm := "vm-" + o.OrderID + "-0"
	m.kube.setVMStatus("", vm, "Running")
	for sub, dial := range consoles {
		m.kube.setConsole("", vm, sub, dial)
	}
	m.pay(t, o.OrderID, eventID)
	m.waitMachine(t, m.s.token, o.OrderID, "active", []replicaStatus{{Name: vm, State: "running", Detail: "Running"}})
	return o, vm
}

// dialConsole opens the WebSocket of a console URL as a client that is
// no browser would (with no Origin).
func dialConsole(t *testing.T, u string) *websocket.Conn {
	t.Helper()
	return openConsoleFrom(t, u, "")
}

// openConsoleFrom opens the WebSocket of a console URL as a page of
// origin would ("" sends none).
func openConsoleFrom(t *testing.T, u, origin string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var opts websocket.DialOptions
	if origin != "" {
		opts.HTTPHeader = http.Header{"Origin": {origin}}
	}
	c, _, err := websocket.Dial(ctx, u, &opts)
	if err != nil {
		t.Fatalf("dialing the console: %v", err)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

// refusedConsoleFrom tries the WebSocket of a console URL as a page of
// origin would, expecting a refusal: the status and body of the answer.
func refusedConsoleFrom(t *testing.T, u, origin string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {origin}}})
	if err == nil {
		_ = c.CloseNow()
		t.Fatalf("a console from Origin %s was let in", origin)
	}
	if resp == nil {
		t.Fatalf("a console from Origin %s: %v", origin, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// closeOf reads from c until it closes and returns the close status and
// reason (bounded by 10 s).
func closeOf(t *testing.T, c *websocket.Conn) (websocket.StatusCode, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		_, _, err := c.Read(ctx)
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		if errors.As(err, &ce) {
			return ce.Code, ce.Reason
		}
		t.Fatalf("the console did not close with a status: %v", err)
	}
}

// echoSerial is a serial line that says "guest ready" and answers every
// line with "echo: <line>", as the test guest does.
func echoSerial(_ context.Context) (net.Conn, error) {
	a, b := net.Pipe()
	go func() {
		defer b.Close()
		if _, err := b.Write([]byte("guest ready\r\n")); err != nil {
			return
		}
		r := bufio.NewReader(b)
		for {
			line, err := r.ReadString('\r')
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(b, "echo: %s\r\n", strings.TrimSuffix(line, "\r")); err != nil {
				return
			}
		}
	}()
	return a, nil
}

// readUntil reads the console's bytes until they contain want (bounded).
func readUntil(t *testing.T, c net.Conn, want string) string {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(15 * time.Second)); err != nil {
		t.Fatal(err)
	}
	var got []byte
	buf := make([]byte, 4096)
	for !strings.Contains(string(got), want) {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("reading the console for %q: %v; got %q", want, err, got)
		}
	}
	return string(got)
}

// TestE2EConsoleSerial: the buyer's serial console of a running replica
// passes bytes both ways; its ticket is single use; the host and other
// tenants get no ticket; a replica not running gets none; the per-box cap
// holds; one log line per session carries no ticket.
func TestE2EConsoleSerial(t *testing.T) {
	const account = "acct_e2eConsole"
	m := startKubeMarket(t, account)
	s, kube := m.s, m.kube
	host := addHost(t, s, "host", account)
	l := s.listing(t, host, `{"unit_price":600,"capacity":5}`)
	o, _ := m.runningOrder(t, l.ListingID, "debian-13", "web", "evt_e2e_console_a", map[string]dialer{"console": echoSerial})

	// Not running: a second order whose VM has not started.
	stopped := m.order(t, l.ListingID, "debian-13", "stopped", 1, "")
	m.pay(t, stopped.OrderID, "evt_e2e_console_b")
	m.waitMachine(t, s.token, stopped.OrderID, "active", []replicaStatus{{Name: "vm-" + stopped.OrderID + "-0", State: "starting"}})
	if code, _, body := consoleTicket(t, s, s.token, stopped.OrderID, "serial"); code != http.StatusConflict || !strings.Contains(string(body), "replicaNotRunning") {
		t.Errorf("a console of a replica not running: %d %s, want 409 replicaNotRunning", code, body)
	}
	// A running replica whose console the cluster does not give (the API
	// server answers 404): closed 4502 with its reason, nothing passes.
	dark, _ := m.runningOrder(t, l.ListingID, "debian-13", "dark", "evt_e2e_console_dark", nil)
	if code, a, body := consoleTicket(t, s, s.token, dark.OrderID, "serial"); code != http.StatusCreated {
		t.Errorf("a ticket for a running replica: %d %s", code, body)
	} else if code, reason := closeOf(t, dialConsole(t, a.URL)); code != 4502 || !strings.Contains(reason, "did not open") {
		t.Errorf("a console the cluster does not give: close %d %q, want 4502 with the reason", code, reason)
	}

	// The host of the order, and a stranger, learn nothing.
	stranger := addHost(t, s, "stranger", "acct_e2eStranger")
	for who, token := range map[string]string{"host": host, "stranger": stranger} {
		if code, _, body := consoleTicket(t, s, token, o.OrderID, "serial"); code != http.StatusNotFound || !strings.Contains(string(body), "orderUnknown") {
			t.Errorf("the %s's console ticket: %d %s, want 404 orderUnknown", who, code, body)
		}
	}

	code, a, body := consoleTicket(t, s, s.token, o.OrderID, "serial")
	if code != http.StatusCreated || !strings.HasPrefix(a.URL, "ws://"+s.ctlAddr+"/market/vms/console?ticket=") ||
		a.ExpiresAt.Sub(time.Now()) > time.Minute+5*time.Second {
		t.Fatalf("console ticket: %d %s; want 201, a ws:// URL of the control plane, valid a minute", code, body)
	}
	// A page of another origin is refused before the ticket is used:
	// scheme, host and port must all be the page's own.
	for _, origin := range []string{"https://" + s.ctlAddr, "http://evil.example", "http://" + s.ctlAddr + "0", "null"} {
		if code, body := refusedConsoleFrom(t, a.URL, origin); code != http.StatusForbidden || !strings.Contains(body, `"badOrigin"`) {
			t.Errorf("a console from Origin %s: %d %s, want 403 badOrigin", origin, code, body)
		}
	}
	c := openConsoleFrom(t, a.URL, "http://"+s.ctlAddr)
	conn := websocket.NetConn(t.Context(), c, websocket.MessageBinary)
	readUntil(t, conn, "guest ready")
	if _, err := conn.Write([]byte("hello vmshelf\r")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, conn, "echo: hello vmshelf")

	// The same ticket again: closed at once with its reason, no byte.
	again := dialConsole(t, a.URL)
	if code, reason := closeOf(t, again); code != 4404 || !strings.Contains(reason, "used or expired") {
		t.Errorf("a used ticket: close %d %q, want 4404 with the reason", code, reason)
	}
	if n := kube.consolesOpened(); n != 1 {
		t.Errorf("the cluster was asked for %d consoles, want 1: a used ticket passes nothing", n)
	}

	// The cap: two open per box (one is), so one more, then 429.
	_, b, _ := consoleTicket(t, s, s.token, o.OrderID, "serial")
	second := websocket.NetConn(t.Context(), dialConsole(t, b.URL), websocket.MessageBinary)
	readUntil(t, second, "guest ready")
	if code, _, body := consoleTicket(t, s, s.token, o.OrderID, "serial"); code != http.StatusTooManyRequests || !strings.Contains(string(body), "consoleBusy") {
		t.Errorf("a third console of one box: %d %s, want 429 consoleBusy", code, body)
	}
	_ = c.Close(websocket.StatusNormalClosure, "")
	_ = second.Close()
	// Every session that held a slot logs its line: the two that passed
	// bytes, and the one the cluster gave no console.
	poll(t, 400, 25*time.Millisecond, "every console session logged", func() bool {
		ends := consoleSessionEnds(s.logs())
		return ends["browser_closed"] == 2 && ends["cluster"] == 1
	}, func() string { return grepLines(s.logs(), "console") })
	for _, l := range strings.Split(s.logs(), "\n") {
		order := o.OrderID
		if strings.Contains(l, "end=cluster") {
			order = dark.OrderID
		}
		if strings.Contains(l, `msg="console session"`) && (!strings.Contains(l, "order_id="+order) || !strings.Contains(l, "kind=serial") ||
			!strings.Contains(l, "bytes_in=")) {
			t.Errorf("console log line %q lacks the order, kind or bytes", l)
		}
	}
	metrics := rawMetrics(t, s)
	for _, want := range []string{`vmshelf_console_refusals_total{kind="unknown",reason="ticket"} 1`, `vmshelf_consoles_open{kind="serial"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(metrics, "console"))
		}
	}
}

// TestE2EConsoleQEMU: through the binary to a real QEMU (the package
// testguest's guest, software emulation): the VNC console shows the
// guest's screen (RFB over serve's WebSocket, read by a VNC client), and on
// the serial console a typed line reaches the guest and its answer comes
// back.
func TestE2EConsoleQEMU(t *testing.T) {
	skipShort(t, "it boots a QEMU guest")
	g := testguest.Start(t, testguest.Options{})
	const account = "acct_e2eConsoleQemu"
	m := startKubeMarket(t, account)
	s := m.s
	l := s.listing(t, addHost(t, s, "host", account), `{"unit_price":600,"capacity":5}`)
	o, _ := m.runningOrder(t, l.ListingID, "debian-13", "qemu", "evt_e2e_console_qemu",
		map[string]dialer{"vnc": g.DialVNC, "console": g.DialSerial})

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	code, a, body := consoleTicket(t, s, s.token, o.OrderID, "vnc")
	if code != http.StatusCreated {
		t.Fatalf("vnc ticket: %d %s", code, body)
	}
	screen := websocket.NetConn(ctx, dialConsole(t, a.URL), websocket.MessageBinary)
	img, err := testguest.ReadScreen(ctx, screen, func(img *image.RGBA) bool { return testguest.CheckScreen(img) == nil })
	if err != nil {
		t.Fatalf("the guest's screen through serve: %v", err)
	}
	if err := testguest.CheckScreen(img); err != nil {
		t.Errorf("the screen through serve is not the guest's: %v", err)
	}
	_ = screen.Close()

	code, a, body = consoleTicket(t, s, s.token, o.OrderID, "serial")
	if code != http.StatusCreated {
		t.Fatalf("serial ticket: %d %s", code, body)
	}
	line := websocket.NetConn(ctx, dialConsole(t, a.URL), websocket.MessageBinary)
	// An empty line makes the guest say its prompt again (what it said
	// before anybody listened is gone).
	if _, err := line.Write([]byte("\r")); err != nil {
		t.Fatal(err)
	}
	if _, err := testguest.Expect(ctx, line, testguest.Prompt); err != nil {
		t.Fatalf("the guest's prompt through serve: %v", err)
	}
	if _, err := line.Write([]byte("hello vmshelf\r")); err != nil {
		t.Fatal(err)
	}
	if got, err := testguest.Expect(ctx, line, testguest.EchoPrefix+"hello vmshelf"); err != nil {
		t.Fatalf("the guest's answer through serve: %v (got %q)", err, got)
	}
}
