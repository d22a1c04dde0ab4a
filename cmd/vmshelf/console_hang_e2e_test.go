package main

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// A cluster that hangs a console, through the binary: the in-memory
// Kubernetes API takes the console's request and never answers the
// upgrade, or answers it and then neither reads nor writes. A console
// holds one of a box's few slots from the moment it is let in; whatever
// the cluster does, the slot comes back at once when the browser leaves,
// and within --console-timeout when nobody does.

// consoleSessionEnds counts serve's "console session" lines by their end.
func consoleSessionEnds(logs string) map[string]int {
	ends := map[string]int{}
	for _, m := range regexp.MustCompile(`msg="console session".* end=(\S+)`).FindAllStringSubmatch(logs, -1) {
		ends[m[1]]++
	}
	return ends
}

// consolesOpen is serve's vmshelf_consoles_open of kind, as its line reads.
func consolesOpen(t *testing.T, s *server, kind string, n int) func() bool {
	return func() bool {
		return strings.Contains(rawMetrics(t, s), `vmshelf_consoles_open{kind="`+kind+`"} `+strconv.Itoa(n)+"\n")
	}
}

// hungConsoleMarket is a market whose one running order's replica has a
// serial console that hangs before the upgrade and a VNC console that
// hangs after it; serve runs with the given --console-timeout.
func hungConsoleMarket(t *testing.T, timeout string) (*kubeMarket, orderAnswer) {
	t.Helper()
	const account = "acct_e2eConsoleHung"
	m := startKubeMarket(t, account, "--console-timeout", timeout)
	host := addHost(t, m.s, "host", account)
	l := m.s.listing(t, host, `{"unit_price":600,"capacity":5}`)
	o, vm := m.runningOrder(t, l.ListingID, "debian-13", "hung", "evt_e2e_console_hung", nil)
	m.kube.setConsoleHang(vm, "console", hangBeforeUpgrade)
	m.kube.setConsoleHang(vm, "vnc", hangAfterUpgrade)
	return m, o
}

// TestE2EConsoleHungClusterBrowserLeaves: consoles whose cluster hangs
// hold their slots (counted as open, the box's third refused) until their
// browsers leave, and then not a moment longer: the slots come back well
// within --console-timeout (60s here), the cluster's requests are let go,
// and each session logs its line.
func TestE2EConsoleHungClusterBrowserLeaves(t *testing.T) {
	m, o := hungConsoleMarket(t, "60s")
	s, kube := m.s, m.kube

	// Two serial consoles whose upgrade the cluster never answers.
	var browsers []*websocket.Conn
	for range 2 {
		code, a, body := consoleTicket(t, s, s.token, o.OrderID, "serial")
		if code != http.StatusCreated {
			t.Fatalf("a console ticket: %d %s", code, body)
		}
		browsers = append(browsers, dialConsole(t, a.URL))
	}
	poll(t, 400, 25*time.Millisecond, "both consoles' requests at the cluster", func() bool { return kube.consolesHanging() == 2 })
	poll(t, 400, 25*time.Millisecond, "two serial consoles counted open while the cluster opens them", consolesOpen(t, s, "serial", 2),
		func() string { return grepLines(rawMetrics(t, s), "console") })
	if code, _, body := consoleTicket(t, s, s.token, o.OrderID, "serial"); code != http.StatusTooManyRequests || !strings.Contains(string(body), "consoleBusy") {
		t.Fatalf("a third console while two hang: %d %s, want 429 consoleBusy", code, body)
	}

	// The browsers leave: one closes as a page does, one just drops.
	left := time.Now()
	go func() { _ = browsers[0].Close(websocket.StatusGoingAway, "") }()
	_ = browsers[1].CloseNow()
	// At once means well before the 60 s the cluster is given.
	poll(t, 400, 25*time.Millisecond, "the slots back after the browsers left", consolesOpen(t, s, "serial", 0),
		func() string { return grepLines(rawMetrics(t, s), "console") })
	poll(t, 400, 25*time.Millisecond, "the cluster's hung requests let go", func() bool { return kube.consolesHanging() == 0 })
	if d := time.Since(left); d > 10*time.Second {
		t.Errorf("the slots came back %v after the browsers left", d)
	}
	poll(t, 400, 25*time.Millisecond, "two session lines", func() bool { return consoleSessionEnds(s.logs())["browser_left"] == 2 },
		func() string { return grepLines(s.logs(), "console") })

	// A console whose cluster took the upgrade and then went silent: the
	// browser types, gets nothing, leaves; its slot comes back at once.
	code, a, body := consoleTicket(t, s, s.token, o.OrderID, "vnc")
	if code != http.StatusCreated {
		t.Fatalf("a console ticket after the browsers left: %d %s", code, body)
	}
	vnc := dialConsole(t, a.URL)
	poll(t, 400, 25*time.Millisecond, "the VNC console upgraded at the cluster", func() bool { return kube.consolesHanging() == 1 })
	if err := vnc.Write(t.Context(), websocket.MessageBinary, []byte("RFB 003.008\n")); err != nil {
		t.Fatal(err)
	}
	poll(t, 400, 25*time.Millisecond, "one VNC console open", consolesOpen(t, s, "vnc", 1))
	_ = vnc.CloseNow()
	poll(t, 400, 25*time.Millisecond, "the VNC slot back after the browser left", consolesOpen(t, s, "vnc", 0))
	poll(t, 400, 25*time.Millisecond, "its session line", func() bool { return consoleSessionEnds(s.logs())["browser_closed"] == 1 },
		func() string { return grepLines(s.logs(), "console") })
	for _, l := range strings.Split(s.logs(), "\n") {
		if strings.Contains(l, `msg="console session"`) && !strings.Contains(l, "order_id="+o.OrderID) {
			t.Errorf("a console session line without its order: %q", l)
		}
	}
}

// TestE2EConsoleHungClusterTimeout: with nobody leaving, a console the
// cluster never opens closes 4502 with its words within --console-timeout
// (2s here), and one whose cluster stopped taking bytes closes 4504 when
// a write stalls that long; both give their slots back and log their
// lines.
func TestE2EConsoleHungClusterTimeout(t *testing.T) {
	m, o := hungConsoleMarket(t, "2s")
	s, kube := m.s, m.kube

	code, a, body := consoleTicket(t, s, s.token, o.OrderID, "serial")
	if code != http.StatusCreated {
		t.Fatalf("a console ticket: %d %s", code, body)
	}
	start := time.Now()
	if code, reason := closeOf(t, dialConsole(t, a.URL)); code != 4502 || !strings.Contains(reason, "did not open") {
		t.Errorf("a console the cluster never opens: close %d %q, want 4502 with its words", code, reason)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("the console closed after %v; --console-timeout is 2s", d)
	}
	poll(t, 400, 25*time.Millisecond, "the cluster's hung request let go", func() bool { return kube.consolesHanging() == 0 })
	poll(t, 400, 25*time.Millisecond, "the serial slot back", consolesOpen(t, s, "serial", 0))

	// The cluster took the upgrade and reads nothing: the browser's bytes
	// fill every buffer on the way, a write to the machine's side waits
	// for the timeout, and the console closes as stalled.
	code, a, body = consoleTicket(t, s, s.token, o.OrderID, "vnc")
	if code != http.StatusCreated {
		t.Fatalf("a console ticket: %d %s", code, body)
	}
	vnc := dialConsole(t, a.URL)
	flood, stopFlood := context.WithCancel(t.Context())
	defer stopFlood()
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		chunk := make([]byte, 64<<10)
		for i := 0; i < 1024 && flood.Err() == nil; i++ { // at most 64 MiB
			if vnc.Write(flood, websocket.MessageBinary, chunk) != nil {
				return
			}
		}
	}()
	if code, reason := closeOf(t, vnc); code != 4504 || !strings.Contains(reason, "stopped taking bytes") {
		t.Errorf("a console whose machine side takes nothing: close %d %q, want 4504 with its words", code, reason)
	}
	stopFlood()
	<-flooded
	poll(t, 400, 25*time.Millisecond, "the VNC slot back", consolesOpen(t, s, "vnc", 0))
	poll(t, 400, 25*time.Millisecond, "both session lines", func() bool {
		ends := consoleSessionEnds(s.logs())
		return ends["cluster"] == 1 && ends["stalled"] == 1
	}, func() string { return grepLines(s.logs(), "console") })
}
