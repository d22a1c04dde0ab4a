package main

// Process-level tests of the control plane's connection limits, the data
// dir's mode and --log-level: the real binary over loopback.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// raiseNoFile lifts this process's soft RLIMIT_NOFILE to its hard limit
// (children inherit it) and fails unless that allows need descriptors.
func raiseNoFile(t *testing.T, need uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Max < need {
		t.Fatalf("RLIMIT_NOFILE hard limit %d < %d descriptors this test needs (ulimit -Hn)", lim.Max, need)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
}

// openSockets counts the sockets process pid holds (listeners included).
func openSockets(pid int) (int, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	es, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range es {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n, nil
}

// parallel runs f(i) for i in [0, n) on workers goroutines.
func parallel(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// TestE2EControlIdleConnsClosed: 2 000 keep-alive connections, each after
// one request, are all closed by serve within --control-idle-timeout (and
// not before it is half over: they were kept alive).
func TestE2EControlIdleConnsClosed(t *testing.T) {
	const n, idle = 2000, 2 * time.Second
	raiseNoFile(t, 3*n)
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{
		"--control-idle-timeout", idle.String(), "--control-max-conns", "2100"})

	conns := make([]net.Conn, n)
	answered := make([]time.Time, n)
	errs := make([]error, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	parallel(n, 64, func(i int) {
		c, err := net.DialTimeout("tcp", s.ctlAddr, 10*time.Second)
		if err != nil {
			errs[i] = err
			return
		}
		conns[i] = c
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: vmshelf\r\n\r\n"); err != nil {
			errs[i] = err
			return
		}
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			errs[i] = err
			return
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered[i] = time.Now()
		switch {
		case err != nil:
			errs[i] = err
		case resp.StatusCode != http.StatusOK || resp.Close:
			errs[i] = fmt.Errorf("status %d, close %v: want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
		case br.Buffered() != 0:
			errs[i] = fmt.Errorf("%d bytes after the answer", br.Buffered())
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}

	// Each connection is read until serve closes it, at the latest 8 s
	// (a loaded machine's margin) after the idle timeout.
	last := answered[0]
	for _, a := range answered {
		if a.After(last) {
			last = a
		}
	}
	deadline := last.Add(idle + 8*time.Second)
	var mu sync.Mutex
	open, early := 0, 0
	var firstEarly time.Duration
	parallel(n, n, func(i int) {
		c := conns[i]
		_ = c.SetReadDeadline(deadline)
		_, err := c.Read(make([]byte, 1))
		after := time.Since(answered[i])
		mu.Lock()
		defer mu.Unlock()
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			open++
		case err == nil:
			t.Errorf("connection %d: serve sent a byte to an idle connection", i)
		case after < idle/2:
			if early == 0 {
				firstEarly = after
			}
			early++
		}
	})
	if open != 0 {
		t.Errorf("%d of %d idle keep-alive connections still open %v after the last answer (idle timeout %v)", open, n, idle+8*time.Second, idle)
	}
	if early != 0 {
		t.Errorf("%d of %d connections closed before half the idle timeout (one after %v): not kept alive", early, n, firstEarly)
	}
}

// TestE2EControlSlowClients: 2 000 clients that send half a request header
// and stall hold at most --control-max-conns connections of serve (the
// default, 512) and keep its RSS under 64 MiB, and a new client is
// answered at once with the default header timeout (10 s): at the cap the
// connection that has waited longest makes room for it, so the new client
// does not wait for the header timeout to cut the stalled ones ahead of it
// (which took ~40 s with a plain cap).
func TestE2EControlSlowClients(t *testing.T) {
	const n, maxConns, headerTimeout = 2000, 512, defaultControlHeaderTimeout
	const rssBound = 64 << 20
	raiseNoFile(t, 3*n)
	s := startServeWith(t, serveBinary(t), filepath.Join(t.TempDir(), "data"), nil, nil)
	pid := s.cmd.Process.Pid
	base, err := openSockets(pid)
	if err != nil {
		t.Fatal(err)
	}

	conns := make([]net.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	errs := make([]error, n)
	parallel(n, 64, func(i int) {
		c, err := net.DialTimeout("tcp", s.ctlAddr, 10*time.Second)
		if err != nil {
			errs[i] = err
			return
		}
		conns[i] = c
		_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, errs[i] = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: vmshelf\r\nX-Slow: stall")
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("slow client %d: %v", i, err)
		}
	}

	// Serve's sockets, sampled every 20 ms while the new client waits.
	stop, sampled := make(chan struct{}), make(chan int)
	go func() {
		most := 0
		for {
			if k, err := openSockets(pid); err == nil && k > most {
				most = k
			}
			select {
			case <-stop:
				sampled <- most
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	// The new client is behind n-maxConns stalled ones in the backlog;
	// each of those takes the place of an older one as it is accepted, so
	// the new client is reached without any header timeout running out.
	bound := headerTimeout / 2
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, Timeout: bound}
	start := time.Now()
	resp, err := client.Get(s.ctlBase + "/healthz")
	took := time.Since(start)
	close(stop)
	most := <-sampled
	if err != nil {
		t.Fatalf("GET /healthz during %d stalled clients: %v (after %v)", n, err, took)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz during %d stalled clients: %d", n, resp.StatusCode)
	}
	held := most - base
	rss := peakRSS(t, pid)
	t.Logf("new client answered after %v (bound %v); at most %d connections held; peak RSS %.1f MiB",
		took, bound, held, float64(rss)/(1<<20))
	// One more than the cap for a moment: the connection being admitted,
	// accepted before the one it replaces is closed.
	if held > maxConns+1 {
		t.Errorf("serve held %d connections at once, cap %d", held, maxConns)
	}
	ev, ok := metricValue(s.scrape(t), "vmshelf_connections_evicted_total", map[string]string{"plane": "control"})
	if !ok {
		t.Error(`no series vmshelf_connections_evicted_total{plane="control"}`)
	} else if ev < n-maxConns {
		t.Errorf(`vmshelf_connections_evicted_total{plane="control"} %v, want at least %d (every stalled client beyond the cap replaced one)`, ev, n-maxConns)
	}
	if held < maxConns/2 {
		t.Errorf("serve held at most %d connections: the %d stalled clients never filled the cap of %d (the method is blind)", held, n, maxConns)
	}
	if rss > rssBound {
		t.Errorf("serve's peak RSS %d MiB under %d stalled clients, bound %d MiB", rss>>20, n, rssBound>>20)
	}
}

// TestE2EControlHeaderTimeout: below the cap, a client that sends half a
// header and stalls is closed once --control-header-timeout has passed
// (and not long before): nothing else would end it until the 30 s read
// timeout.
func TestE2EControlHeaderTimeout(t *testing.T) {
	const timeout = 2 * time.Second
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--control-header-timeout", timeout.String()})
	c, err := net.DialTimeout("tcp", s.ctlAddr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: vmshelf\r\nX-Slow: st"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout + 10*time.Second))
	_, err = io.Copy(io.Discard, c) // until the server closes
	took := time.Since(start)
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		t.Fatalf("a stalled header was not closed within %v of the %v header timeout", took, timeout)
	}
	if took < timeout/2 {
		t.Errorf("a stalled header was closed after %v, before half the %v header timeout", took, timeout)
	}
	t.Logf("stalled header closed after %v (header timeout %v)", took, timeout)
}

// TestE2EControlHeaderTooLarge: a header over 16 KiB gets 431 and the
// connection is not kept.
func TestE2EControlHeaderTooLarge(t *testing.T) {
	s := startServe(t, filepath.Join(t.TempDir(), "data"), nil)
	c, err := net.DialTimeout("tcp", s.ctlAddr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	// 16 KiB of header fits (net/http allows 4 KiB more); 24 KiB does not.
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: vmshelf\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 24<<10))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a 24 KiB header: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("24 KiB header: %d, want 431", resp.StatusCode)
	}
	code, _ := curl(t, "-H", "X-Fits: "+strings.Repeat("a", 12<<10), s.ctlBase+"/healthz")
	if code != http.StatusOK {
		t.Errorf("12 KiB header: %d, want 200", code)
	}
}

// TestE2EDataDirTightened: an existing data dir and image directory of
// mode 0755 are 0700 once serve has started.
func TestE2EDataDirTightened(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	for _, d := range []string{data, filepath.Join(data, imagesDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	startServe(t, data, nil)
	for _, d := range []string{data, filepath.Join(data, imagesDir)} {
		if m := fileMode(t, d); m != 0o700 {
			t.Errorf("%s is %04o after serve started, want 0700", d, m)
		}
	}
}

// TestE2EDataDirNotOurs: serve as another user (nobody) on a data dir, or
// an image directory, it may write to but cannot chmod refuses to start
// with one line naming it, exit 2.
func TestE2EDataDirNotOurs(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test runs serve as user nobody: it needs root, as CI has")
		}
		t.Skip("runs serve as user nobody: needs root (run the tests as root, as CI does)")
	}
	const nobody = 65534
	// A tree nobody can reach: the binary and the data dirs.
	top, err := os.MkdirTemp("", "vmshelf-notours-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(top, "vmshelf")
	b, err := os.ReadFile(binPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}

	// The data dir is root's, writable by all: nobody may write, not chmod.
	rootsData := filepath.Join(top, "roots")
	// The data dir is nobody's, its image directory root's (writable by all).
	mixed := filepath.Join(top, "mixed")
	for _, d := range []string{rootsData, mixed, filepath.Join(mixed, imagesDir)} {
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(mixed, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ dataDir, refused string }{
		{rootsData, rootsData},
		{mixed, filepath.Join(mixed, imagesDir)},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, bin, "serve", "--data-dir", tc.dataDir,
			"--data-addr", freeAddr(t), "--control-addr", freeAddr(t))
		cmd.Env = cleanEnv()
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatalf("serve as nobody on %s did not refuse within 20s; stderr:\n%s", tc.dataDir, stderr.String())
		}
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		line := refusal(t, result{stdout.String(), stderr.String(), code}, 2)
		if !strings.Contains(line, tc.refused+" ") || !strings.Contains(line, "0777") {
			t.Errorf("refusal %q does not name %s and its mode", line, tc.refused)
		}
		if m := fileMode(t, tc.refused); m != 0o777 {
			t.Errorf("%s is %04o after the refusal, want it untouched", tc.refused, m)
		}
	}
}

// TestE2ELogLevel: --log-level (or VMSHELF_LOG_LEVEL) leaves out the lines
// below it; bad values are refused before any port is opened.
func TestE2ELogLevel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		env      []string
		wantInfo bool
	}{
		{"default", nil, nil, true},
		{"debug", []string{"--log-level", "debug"}, nil, true},
		{"warn", []string{"--log-level", "warn"}, nil, false},
		{"error from env", nil, []string{"VMSHELF_LOG_LEVEL=error"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServe(t, filepath.Join(t.TempDir(), "data"), tc.args, tc.env...)
			s.stop()
			logs := s.stderr.String()
			info := strings.Contains(logs, "level=INFO")
			if info != tc.wantInfo || tc.wantInfo && !strings.Contains(logs, `msg="vmshelf serving"`) {
				t.Errorf("INFO lines written: %v, want %v; stderr:\n%s", info, tc.wantInfo, logs)
			}
		})
	}

	needTool(t, "strace")
	for _, tc := range []struct {
		name    string
		args    []string
		env     []string
		mention string
	}{
		{"unknown level", []string{"--log-level", "verbose"}, nil, "log-level"},
		{"unknown level from env", nil, []string{"VMSHELF_LOG_LEVEL=loud"}, "log-level"},
		{"bad trusted proxy", []string{"--trusted-proxies", "10.0.0.0/33"}, nil, "trusted-proxies"},
		{"the world as a trusted proxy", []string{"--trusted-proxies", "0.0.0.0/0"}, nil, "trusted-proxies"},
		{"all of IPv6 as a trusted proxy", []string{"--trusted-proxies", "::/0"}, nil, "trusted-proxies"},
		{"negative fetch queue wait", []string{"--fetch-queue-wait", "-1s"}, nil, "fetch-queue-wait"},
		{"no control connections", []string{"--control-max-conns", "0"}, nil, "control-max-conns"},
		{"zero control idle timeout", []string{"--control-idle-timeout", "0s"}, nil, "control-idle-timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"serve", "--data-dir", filepath.Join(t.TempDir(), "data"),
				"--data-addr", freeAddr(t), "--control-addr", freeAddr(t)}, tc.args...)
			r, calls := traceSockets(t, 20*time.Second, tc.env, args...)
			if len(calls) != 0 {
				t.Errorf("bound or listened before refusing:\n%s", strings.Join(calls, "\n"))
			}
			if line := refusal(t, r, 2); !strings.Contains(line, tc.mention) {
				t.Errorf("the error %q does not mention %q", line, tc.mention)
			}
		})
	}
}

// TestE2ETrustedProxiesWired: --trusted-proxies reaches both planes. A
// refusal from behind a trusted proxy is logged (and, on the data plane,
// rate-limited) under the forwarded client; from any other peer the header
// is ignored.
func TestE2ETrustedProxiesWired(t *testing.T) {
	needTool(t, "curl")
	const client = "203.0.113.7" // a documentation address, named in a header only
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"trusted", []string{"--trusted-proxies", "127.0.0.1/32"}, "remote=" + client},
		{"untrusted", nil, "remote=127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServe(t, filepath.Join(t.TempDir(), "data"), tc.args)
			code, _ := curl(t, "-H", "X-Forwarded-For: "+client, s.dataBase+"/market/vm-images/fetch/"+strings.Repeat("ab", 32))
			if code != http.StatusNotFound {
				t.Fatalf("unknown token: %d, want 404", code)
			}
			code, _ = curl(t, "-H", "X-Forwarded-For: "+client, s.ctlBase+"/no/such/route")
			if code != http.StatusNotFound {
				t.Fatalf("control plane, unknown route: %d, want 404", code)
			}
			for _, reason := range []string{"reason=tokenUnknown", "reason=notFound"} {
				poll(t, 400, 25*time.Millisecond, "the refusal's log line "+reason, func() bool {
					return strings.Contains(s.logs(), reason)
				})
				for _, l := range strings.Split(s.logs(), "\n") {
					if strings.Contains(l, reason) && !strings.Contains(l, tc.want) {
						t.Errorf("refusal logged without %s: %s", tc.want, l)
					}
				}
			}
			if tc.name == "untrusted" && strings.Contains(s.logs(), client) {
				t.Errorf("an untrusted peer's X-Forwarded-For reached the log:\n%s", s.logs())
			}
		})
	}
}

// TestE2ETicketRateFlags: --ticket-burst and --ticket-rate reach the
// tenant's ticket bucket: with a burst of 2 and a rate far too low to
// refill within the test, the third ticket is 429 rateLimited with a
// Retry-After, and a second tenant still gets its own.
func TestE2ETicketRateFlags(t *testing.T) {
	t.Parallel()
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--ticket-burst", "2", "--ticket-rate", "0.001", "--ticket-ttl", "7m"})
	for i := range 2 {
		code, body := s.ctl(t, "/market/vm-images/ticket", s.token, `{"name":"t","efi":false}`)
		if code != http.StatusCreated {
			t.Fatalf("ticket %d within the burst: %d %s", i+1, code, body)
		}
		var tk ticketAnswer
		decode(t, body, &tk)
		s.secret(tk.Ticket)
		// --ticket-ttl 7m, not the default hour.
		if d := time.Until(tk.ExpiresAt); d < 6*time.Minute || d > 7*time.Minute+5*time.Second {
			t.Errorf("ticket %d expires %v from now; want 7 min (--ticket-ttl 7m)", i+1, d)
		}
	}
	code, body := s.ctl(t, "/market/vm-images/ticket", s.token, `{"name":"t","efi":false}`)
	if code != http.StatusTooManyRequests || !strings.Contains(string(body), `"reason":"rateLimited"`) {
		t.Fatalf("the third ticket with --ticket-burst 2: %d %s, want 429 rateLimited", code, body)
	}
	r := vmshelf(t, "tenant", "add", "box2", "--sharing", "--data-dir", s.dataDir)
	if r.code != 0 {
		t.Fatalf("tenant add: exit %d: %s", r.code, r.stderr)
	}
	other := strings.TrimSpace(r.stdout)
	s.secret(other)
	if code, body := s.ctl(t, "/market/vm-images/ticket", other, `{"name":"t","efi":false}`); code != http.StatusCreated {
		t.Fatalf("another tenant's first ticket: %d %s", code, body)
	}
}
