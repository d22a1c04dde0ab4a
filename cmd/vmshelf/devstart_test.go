package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2EDevPrintsNextStep: serve --dev (make run) prints on stdout, once
// both planes listen, where the dev token is and the next step, the
// Machines page's address to paste it into: exactly the lines README.md
// shows on its first screen, on this serve's own data dir and control
// plane; never the token (the server's cleanup checks its output).
func TestE2EDevPrintsNextStep(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```text\ndev tenant token in ")
	block, _, closed := strings.Cut(block, "```\n")
	if !ok || !closed {
		t.Fatal("README.md shows no ```text block of what make run prints (starting \"dev tenant token in\")")
	}
	data := filepath.Join(t.TempDir(), "vmshelf-data")
	s := startServe(t, data, nil)
	s.stop()
	want := strings.NewReplacer("vmshelf-data/", data+"/", "127.0.0.1:8481", s.ctlAddr).Replace("dev tenant token in " + block)
	if got := s.stdout.String(); got != want {
		t.Errorf("serve --dev printed on stdout:\n%s\nwant what README.md shows:\n%s", got, want)
	}
}

// TestBrowserPageURL: the next step names a page a browser here can open:
// --checkout-return-url, else the control plane's address, a wildcard one
// as loopback of its family.
func TestBrowserPageURL(t *testing.T) {
	for _, tc := range []struct {
		checkout, listen, want string
	}{
		{"", "127.0.0.1:8481", "http://127.0.0.1:8481/machines"},
		{"", "0.0.0.0:8481", "http://127.0.0.1:8481/machines"},
		{"", "[::]:8481", "http://[::1]:8481/machines"},
		{"", "[fd00::7]:9000", "http://[fd00::7]:9000/machines"},
		{"https://edge.example/machines", "0.0.0.0:8481", "https://edge.example/machines"},
	} {
		addr, err := net.ResolveTCPAddr("tcp", tc.listen)
		if err != nil {
			t.Fatal(err)
		}
		f := &serveFlags{checkoutReturnURL: tc.checkout, controlAddr: tc.listen}
		if got := f.browserPageURL(addr); got != tc.want {
			t.Errorf("--checkout-return-url %q, listening on %s: %q, want %q", tc.checkout, tc.listen, got, tc.want)
		}
	}
}
