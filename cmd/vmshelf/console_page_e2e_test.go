package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image/png"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/vmshelf/vmshelf/internal/testkit/testguest"
)

// TestPageConsole: the buyer's Machines page, in Chromium, opens a running
// machine's console. The machine is a real QEMU (testguest) behind the
// in-memory Kubernetes API's vnc and console subresources:
//   - a console refused (both of the box's consoles held) is said in words;
//   - Reconnect opens the screen, and noVNC's canvas shows the guest's
//     picture, judged by the same check as the guest's own VNC tests;
//   - full screen is entered and left;
//   - Ctrl-Alt-Del reaches the guest: its BIOS restarts it, which the test
//     sees on the serial line, where the guest says its prompt again;
//   - on the serial console (xterm.js) a typed line reaches the guest and
//     its answer is shown;
//   - a console the machine ended is said in words, and Reconnect opens a
//     working one again.
func TestPageConsole(t *testing.T) {
	t.Parallel()
	browserDir(t)
	g := testguest.Start(t, testguest.Options{Reboots: true})
	const account = "acct_e2ePageConsole"
	m := startKubeMarket(t, account)
	s := m.s
	l := s.listing(t, addHost(t, s, "host", account), `{"unit_price":600,"capacity":2}`)
	// The serial line's connections to QEMU, so that the test can end one
	// as a machine's console ends.
	var mu sync.Mutex
	var serial []net.Conn
	o, vm := m.runningOrder(t, l.ListingID, "debian-13", "qemu", "evt_page_console", map[string]dialer{
		"vnc": g.DialVNC,
		"console": func(ctx context.Context) (net.Conn, error) {
			c, err := g.DialSerial(ctx)
			if err == nil {
				mu.Lock()
				serial = append(serial, c)
				mu.Unlock()
			}
			return c, err
		},
	})

	// open is a console of the box as the page would open it.
	open := func(kind string) *websocket.Conn {
		code, a, body := consoleTicket(t, s, s.token, o.OrderID, kind)
		if code != 201 {
			t.Fatalf("%s ticket: %d %s", kind, code, body)
		}
		return dialConsole(t, a.URL)
	}
	consolesOpen := func(kind string, n int) {
		want := `vmshelf_consoles_open{kind="` + kind + `"} ` + strconv.Itoa(n)
		poll(t, 400, 25*time.Millisecond, want, func() bool { return strings.Contains(rawMetrics(t, s), want) },
			func() string { return grepLines(rawMetrics(t, s), "console") })
	}
	var held []*websocket.Conn
	var watch net.Conn
	pr := startPage(t, "console", 3*time.Minute, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token,
		"PAGE_ORDER": o.OrderID, "PAGE_REPLICA": vm,
		"PAGE_GUEST": guestColours(),
	}, map[string]action{
		// hold: both consoles the box may have open are open (their
		// bridges run: QEMU's RFB greeting came through each).
		"hold": func([]byte) any {
			for range 2 {
				c := open("vnc")
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				if _, err := testguest.Expect(ctx, websocket.NetConn(ctx, c, websocket.MessageBinary), "RFB 003.008"); err != nil {
					t.Fatalf("a held console: %v", err)
				}
				cancel()
				held = append(held, c)
			}
			return map[string]bool{"ok": true}
		},
		"release": func([]byte) any {
			for _, c := range held {
				_ = c.Close(websocket.StatusNormalClosure, "")
			}
			consolesOpen("vnc", 0)
			return map[string]bool{"ok": true}
		},
		// watch-serial listens on the guest's serial line, saying nothing.
		"watch-serial": func([]byte) any {
			ctx := context.WithoutCancel(t.Context())
			watch = websocket.NetConn(ctx, open("serial"), websocket.MessageBinary)
			consolesOpen("serial", 1)
			return map[string]bool{"ok": true}
		},
		// await-reboot: the guest said its prompt unasked, which it does
		// only when it starts.
		"await-reboot": func([]byte) any {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			got, err := testguest.Expect(ctx, watch, testguest.Prompt)
			if err != nil {
				t.Fatalf("no restart of the guest after Ctrl-Alt-Del on the page: %v (the serial line said %q)", err, got)
			}
			_ = watch.Close()
			consolesOpen("serial", 0)
			return map[string]bool{"ok": true}
		},
		// hangup ends the machine's side of the open serial console.
		"hangup": func([]byte) any {
			mu.Lock()
			defer mu.Unlock()
			_ = serial[len(serial)-1].Close()
			return map[string]bool{"ok": true}
		},
	})
	pr.extra = s.logs
	type closed struct {
		Code  string `json:"code"`
		Words string `json:"words"`
	}
	var rep struct {
		Busy       closed `json:"busy"`
		Screen     string `json:"screen"`
		FullScreen bool   `json:"fullScreen"`
		Serial     string `json:"serial"`
		Hangup     closed `json:"hangup"`
		Again      string `json:"again"`
	}
	pr.wait(&rep)

	if rep.Busy.Code != "consoleBusy" || !strings.Contains(rep.Busy.Words, "Too many consoles are open") {
		t.Errorf("with both consoles held the page said %+v, want consoleBusy in words", rep.Busy)
	}
	pngBytes, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(rep.Screen, "data:image/png;base64,"))
	if err != nil {
		t.Fatalf("the canvas's picture: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(pngBytes))
	if err != nil {
		t.Fatalf("the canvas's picture: %v", err)
	}
	if err := testguest.CheckScreen(img); err != nil {
		t.Errorf("noVNC's canvas in the page: %v", err)
	}
	if !rep.FullScreen {
		t.Error("the console did not go full screen")
	}
	if !strings.Contains(rep.Serial, testguest.EchoPrefix+"hello page") {
		t.Errorf("the page's serial console shows %q, want the guest's answer to the typed line", rep.Serial)
	}
	if rep.Hangup.Code != "1000" || !strings.Contains(rep.Hangup.Words, "console closed") {
		t.Errorf("a console the machine ended: the page said %+v, want code 1000 in words", rep.Hangup)
	}
	if !strings.Contains(rep.Again, testguest.EchoPrefix+"again") {
		t.Errorf("after Reconnect the serial console shows %q, want the guest's answer", rep.Again)
	}
	// No capability in the page's output or serve's log.
	for _, c := range []string{pr.stdout.String(), pr.stderr.String(), s.logs()} {
		if strings.Contains(c, "ticket=") {
			t.Errorf("a console URL was written out: %s", grepLines(c, "ticket="))
		}
	}
}

// guestColours are the guest's screen colours for the scenario's wait
// (testguest.CheckScreen judges the picture itself).
func guestColours() string {
	rgb := func(c interface{ RGBA() (r, g, b, a uint32) }) []uint32 {
		r, g, b, _ := c.RGBA()
		return []uint32{r >> 8, g >> 8, b >> 8}
	}
	b, _ := json.Marshal(map[string][]uint32{"background": rgb(testguest.Background), "bar": rgb(testguest.Bar), "text": rgb(testguest.Text)})
	return string(b)
}
