package main

// Process-level tests of the data plane's connection cap and its accept
// retry: serve under a small descriptor limit (prlimit), flooded with
// connections that never send a byte.

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// underNoFile writes a script that runs vmshelf with RLIMIT_NOFILE n (soft
// and hard) and returns its path, for startServeWith. prlimit execs
// vmshelf, so the pid stays serve's.
func underNoFile(t *testing.T, n int) string {
	t.Helper()
	needTool(t, "prlimit")
	p := filepath.Join(t.TempDir(), "vmshelf-nofile")
	script := fmt.Sprintf("#!/bin/sh\nexec prlimit --nofile=%d:%d -- %q \"$@\"\n", n, n, binPath)
	if err := os.WriteFile(p, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// flood opens n connections to addr that send nothing, and closes them
// when the test ends (or when the returned func is called).
func flood(t *testing.T, addr string, n int) (closeAll func()) {
	t.Helper()
	conns := make([]net.Conn, n)
	errs := make([]error, n)
	parallel(n, 32, func(i int) {
		conns[i], errs[i] = net.DialTimeout("tcp", addr, 10*time.Second)
	})
	closeAll = func() {
		for i, c := range conns {
			if c != nil {
				c.Close()
				conns[i] = nil
			}
		}
	}
	t.Cleanup(closeAll)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("flood connection %d of %d: %v", i, n, err)
		}
	}
	return closeAll
}

// alive fails t if serve has exited.
func (s *server) alive(t *testing.T) {
	t.Helper()
	select {
	case <-s.done:
		t.Fatalf("serve exited (%v); stderr:\n%s", s.waitErr, s.stderr)
	default:
	}
}

// uploadAndFetch uploads a fresh image with curl (a ticket from the
// control plane) and fetches it back whole.
func (s *server) uploadAndFetch(t *testing.T, name string) {
	t.Helper()
	file, data := makeImage(t, t.TempDir(), name+".qcow2")
	img := s.upload(t, s.ticket(t, name), file, data)
	out := filepath.Join(t.TempDir(), "fetched")
	code, _ := curlTo(t, out, s.fetchURL(t, img.UploadID))
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("fetch after the flood: %d, %d bytes; want 200 and the %d bytes uploaded", code, len(got), len(data))
	}
}

// waitLog waits, bounded, until serve's output contains line.
func (s *server) waitLog(t *testing.T, line string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !strings.Contains(s.logs(), line) {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not log %q within %v; output:\n%s", line, d, s.logs())
		}
		time.Sleep(20 * time.Millisecond) // polling a log: there is no event to wait on
	}
}

// dataEvictions is vmshelf_connections_evicted_total{plane="data"}.
func (s *server) dataEvictions(t *testing.T) float64 {
	t.Helper()
	v, _ := metricValue(s.scrape(t), "vmshelf_connections_evicted_total", map[string]string{"plane": "data"})
	return v
}

// TestE2EDataFloodOutOfDescriptors: with a data-plane cap above what the
// descriptor limit allows, a flood of silent connections runs serve out of
// descriptors. The data plane backs off and keeps accepting (fasthttp
// alone stopped serving and serve exited 1), and once the flood is gone a
// valid upload and its fetch are served; serve never exits.
func TestE2EDataFloodOutOfDescriptors(t *testing.T) {
	const nofile, n = 256, 400
	raiseNoFile(t, 4*n)
	s := startServeWith(t, underNoFile(t, nofile), filepath.Join(t.TempDir(), "data"),
		[]string{"--data-max-conns", "1000"}, nil)
	s.waitLog(t, "the connection caps do not fit the descriptor limit", 5*time.Second)
	closeFlood := flood(t, s.dataAddr, n)
	s.waitLog(t, "accepting a connection failed; retrying", 20*time.Second)
	if !strings.Contains(s.logs(), "too many open files") {
		t.Errorf("the accept-retry line does not say why:\n%s", s.logs())
	}
	s.alive(t)
	closeFlood()
	s.uploadAndFetch(t, "after-flood")
	s.alive(t)
	if strings.Contains(s.logs(), "Permanent error") {
		t.Errorf("fasthttp saw an accept error:\n%s", s.logs())
	}
}

// TestE2EDataFloodDefaultCap: without --data-max-conns the cap is derived
// from the descriptor limit ((256-128)/2 = 64 here), so a flood of more
// silent connections than descriptors never runs serve out of them: each
// new connection takes the place of the one silent longest, and an upload
// and its fetch are served during the flood.
func TestE2EDataFloodDefaultCap(t *testing.T) {
	const nofile, n, cap = 256, 400, 64
	raiseNoFile(t, 4*n)
	s := startServeWith(t, underNoFile(t, nofile), filepath.Join(t.TempDir(), "data"), nil, nil)
	base, err := openSockets(s.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	flood(t, s.dataAddr, n)
	waitEvictions(t, s, n-cap)
	held, err := openSockets(s.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// One more than the cap for a moment: the connection being admitted,
	// accepted before the one it replaces is closed.
	if held-base > cap+1 {
		t.Errorf("serve holds %d more sockets after %d silent connections; the derived cap is %d", held-base, n, cap)
	}
	s.uploadAndFetch(t, "during-flood")
	s.alive(t)
	if strings.Contains(s.logs(), "accepting a connection failed") {
		t.Errorf("serve ran out of descriptors although the derived cap fits the limit:\n%s", s.logs())
	}
}

// TestE2EDataConnCap: with --data-max-conns N, N+k silent connections
// leave N held (k evicted, oldest first) and a new client is served at
// once.
func TestE2EDataConnCap(t *testing.T) {
	const capN, k = 40, 25
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--data-max-conns", fmt.Sprint(capN)})
	base, err := openSockets(s.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	flood(t, s.dataAddr, capN+k)
	waitEvictions(t, s, k)
	held, err := openSockets(s.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if held-base > capN+1 { // +1: the one being admitted (see above)
		t.Errorf("serve holds %d more sockets after %d silent connections, cap %d", held-base, capN+k, capN)
	}
	if held-base < capN-1 {
		t.Errorf("serve holds only %d of the %d silent connections: more than k=%d were closed", held-base, capN+k, k)
	}
	start := time.Now()
	code, body := curl(t, s.dataBase+"/market/vm-images/no-such-route")
	wantError(t, "a new client at the cap", code, body, http.StatusNotFound, "notFound")
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a new client at the cap was answered after %v", took)
	}
	if ev := s.dataEvictions(t); ev < k+1 {
		t.Errorf("%v data-plane evictions, want at least %d (the flood's %d and the new client's)", ev, k+1, k)
	}
}

// waitEvictions waits, bounded, until the data plane has evicted at least
// n connections.
func waitEvictions(t *testing.T, s *server, n int) {
	t.Helper()
	for range 250 {
		if s.dataEvictions(t) >= float64(n) {
			return
		}
		time.Sleep(20 * time.Millisecond) // polling a counter: there is no event to wait on
	}
	t.Fatalf("data-plane evictions %v after 5s, want at least %d", s.dataEvictions(t), n)
}

// TestE2EDataUploadNeverEvicted: with --data-max-conns 2, a running
// upload holds its connection through a flood of silent connections that
// churn through the other slot; it completes with 201.
func TestE2EDataUploadNeverEvicted(t *testing.T) {
	const capN, n = 2, 12
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--data-max-conns", fmt.Sprint(capN)})
	_, data := makeImage(t, t.TempDir(), "held.qcow2")
	conn := rawUpload(t, s, s.ticket(t, "held"), int64(len(data)))
	half := len(data) / 2
	if _, err := conn.Write(data[:half]); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ { // until the upload runs (its handler has the connection)
		if v, _ := metricValue(s.scrape(t), "vmshelf_transfers_in_flight", map[string]string{"direction": "upload"}); v == 1 {
			break
		}
		if i == 250 {
			t.Fatal("the upload did not start within 5s")
		}
		time.Sleep(20 * time.Millisecond) // polling a gauge: there is no event to wait on
	}
	flood(t, s.dataAddr, n)
	waitEvictions(t, s, n-1)
	if _, err := conn.Write(data[half:]); err != nil {
		t.Fatalf("the running upload's connection was cut by the flood: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the running upload got no answer after the flood: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("the running upload: %d, want 201", resp.StatusCode)
	}
}
