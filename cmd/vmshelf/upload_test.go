package main

// Tests of 'vmshelf upload' (the tus client) and of tus-js-client against
// the real binary: straight uploads, refusals, resumption after a cut
// connection, after the command is killed, after it gave up, and after
// serve restarts; and the README's curl sequence, run as written.

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// tcpProxy stands between the clients and serve's data plane (serve hands
// out URLs through it with --public-url). It counts the bytes clients send,
// can throttle them, cut the first connection after some bytes, and refuse
// connections.
type tcpProxy struct {
	t      *testing.T
	ln     net.Listener
	target string

	rate           atomic.Int64 // client bytes per second per connection; 0: no limit
	cutAfter       atomic.Int64 // the first connection to carry this many client bytes is cut; 0: never
	refuseAfterCut atomic.Bool  // after the cut, refuse new connections
	refuse         atomic.Bool  // close new connections at once
	cut            atomic.Bool  // the cut happened (rearmCut arms it again)
	// dropAnswerAfter: the first answer on a connection that carried this
	// many client bytes is not passed on; the connection is closed instead
	// (a lost answer). 0: never.
	dropAnswerAfter atomic.Int64
	dropped         atomic.Bool  // an answer was dropped
	up              atomic.Int64 // client bytes passed on, all connections

	mu      sync.Mutex
	closed  bool
	conns   map[net.Conn]bool
	waiters []proxyWaiter
	wg      sync.WaitGroup
	cutCh   chan struct{} // closed at the cut, after refuseAfterCut took effect
	answers []byte        // what the server sent back, all connections (the first answerCap bytes)
	events  []proxyEvent  // every chunk relayed, both ways (the first eventCap)
}

// proxyEvent is a chunk the proxy relayed: when, which way, its first bytes.
type proxyEvent struct {
	at         time.Time
	fromClient bool
	head       string
}

const eventCap = 1 << 16

// answerCap bounds the server bytes the proxy keeps (answers are small: no
// test here fetches through the proxy).
const answerCap = 1 << 20

type proxyWaiter struct {
	n  int64
	ch chan struct{}
}

func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{t: t, ln: ln, target: target, conns: map[net.Conn]bool{}, cutCh: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }
func (p *tcpProxy) base() string { return "http://" + p.addr() }

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.refuse.Load() {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *tcpProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = true
	}
	return true
}

func (p *tcpProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// serve relays one connection; when either side ends, both are closed.
func (p *tcpProxy) serve(c net.Conn) {
	defer p.wg.Done()
	s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil { // serve is down: the client sees the connection close
		c.Close()
		return
	}
	closeBoth := sync.OnceFunc(func() {
		c.Close()
		s.Close()
		p.untrack(c, s)
	})
	defer closeBoth()
	if !p.track(c, s) {
		return
	}
	var sent atomic.Int64 // client bytes on this connection
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer closeBoth()
		buf := make([]byte, 16<<10)
		for {
			m, err := s.Read(buf)
			if m > 0 {
				if da := p.dropAnswerAfter.Load(); da > 0 && sent.Load() >= da && p.dropped.CompareAndSwap(false, true) {
					return
				}
				p.answered(buf[:m])
				if _, werr := c.Write(buf[:m]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 16<<10)
	var n int64
	start := time.Now()
	for {
		chunk := buf
		if r := p.rate.Load(); r > 0 && int64(len(chunk)) > r/20 {
			chunk = buf[:max(r/20, 1)]
		}
		m, rerr := c.Read(chunk)
		if m > 0 {
			// Stamped when read, before it is relayed: stamped after, a
			// request could be recorded after the answer it caused.
			at := time.Now()
			data, cut := chunk[:m], false
			if ca := p.cutAfter.Load(); ca > 0 && n+int64(m) >= ca && p.cut.CompareAndSwap(false, true) {
				data, cut = data[:ca-n], true
			}
			if _, err := s.Write(data); err != nil {
				return
			}
			n += int64(len(data))
			sent.Store(n)
			p.passed(data, at)
			if cut {
				if p.refuseAfterCut.Load() {
					p.refuse.Store(true)
				}
				p.mu.Lock()
				close(p.cutCh)
				p.mu.Unlock()
				return
			}
			if r := p.rate.Load(); r > 0 { // throttling, not synchronisation
				if d := time.Duration(float64(n)/float64(r)*float64(time.Second)) - time.Since(start); d > 0 {
					time.Sleep(d)
				}
			}
		}
		if rerr != nil {
			return
		}
	}
}

func (p *tcpProxy) passed(data []byte, at time.Time) {
	total := p.up.Add(int64(len(data)))
	p.mu.Lock()
	defer p.mu.Unlock()
	p.record(true, data, at)
	kept := p.waiters[:0]
	for _, w := range p.waiters {
		if total >= w.n {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	p.waiters = kept
}

// answered keeps server bytes for sessionLocations.
func (p *tcpProxy) answered(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if room := answerCap - len(p.answers); room > 0 {
		p.answers = append(p.answers, b[:min(len(b), room)]...)
	}
	p.record(false, b, time.Now())
}

// record notes a relayed chunk and when it passed; p.mu is held. Events
// are kept in time order, whichever goroutine records first.
func (p *tcpProxy) record(fromClient bool, b []byte, at time.Time) {
	if len(p.events) >= eventCap {
		return
	}
	e := proxyEvent{at, fromClient, string(b[:min(len(b), 32)])}
	i := len(p.events)
	for i > 0 && p.events[i-1].at.After(at) {
		i--
	}
	p.events = slices.Insert(p.events, i, e)
}

// afterAnswer finds the first answer chunk starting with prefix and the
// first client chunk after it: when each passed the proxy.
func (p *tcpProxy) afterAnswer(prefix string) (answer, next time.Time, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, e := range p.events {
		if e.fromClient || !strings.HasPrefix(e.head, prefix) {
			continue
		}
		for _, n := range p.events[i+1:] {
			if n.fromClient {
				return e.at, n.at, true
			}
		}
		return e.at, time.Time{}, false
	}
	return time.Time{}, time.Time{}, false
}

var locationHeader = regexp.MustCompile(`(?im)^location:[ \t]*(\S+)\r?$`)

// sessionLocations is every Location header the server sent back through
// the proxy: one per upload session created (tus creation's 201).
func (p *tcpProxy) sessionLocations() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var locs []string
	for _, m := range locationHeader.FindAllSubmatch(p.answers, -1) {
		locs = append(locs, string(m[1]))
	}
	return locs
}

// cutDone is closed when the armed cut has happened.
func (p *tcpProxy) cutDone() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cutCh
}

// rearmCut lets the next connection to carry cutAfter bytes be cut too.
func (p *tcpProxy) rearmCut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.cutCh:
		p.cutCh = make(chan struct{})
	default:
	}
	p.cut.Store(false)
}

// reached is closed once clients have sent n bytes in all.
func (p *tcpProxy) reached(n int64) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := make(chan struct{})
	if p.up.Load() >= n {
		close(ch)
		return ch
	}
	p.waiters = append(p.waiters, proxyWaiter{n, ch})
	return ch
}

// waitIdle waits (bounded) until no connection is open.
func (p *tcpProxy) waitIdle() {
	p.t.Helper()
	for range 400 {
		p.mu.Lock()
		n := len(p.conns)
		p.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	p.t.Fatal("the proxy still has connections open after 10s")
}

func (p *tcpProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// needQemu is needTool for makeImageData's tools; a test calls it first,
// before it starts anything, so that a skip outside CI is never mid-test.
func needQemu(t *testing.T) {
	t.Helper()
	needTool(t, "qemu-img")
	needTool(t, "qemu-io")
}

// makeImageData writes a QCOW2 (64 MiB virtual) whose first dataMiB MiB
// hold 0xab, so that the file is a little over dataMiB MiB. The test has
// called needQemu at its start.
func makeImageData(t *testing.T, dir, name string, dataMiB int) (string, []byte) {
	t.Helper()
	for _, tool := range []string{"qemu-img", "qemu-io"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (the test should call needQemu before it starts anything)", tool, err)
		}
	}
	p := filepath.Join(dir, name)
	if r := runCmd(t, nil, "qemu-img", "create", "-f", "qcow2", p, "64M"); r.code != 0 {
		t.Fatalf("qemu-img create: %s", r.stderr)
	}
	if r := runCmd(t, nil, "qemu-io", "-f", "qcow2", "-c", "write -P 0xab 0 "+strconv.Itoa(dataMiB)+"M", p); r.code != 0 {
		t.Fatalf("qemu-io: %s%s", r.stdout, r.stderr)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, b
}

// uploadArgs is the command line of 'vmshelf upload' against s.
func (s *server) uploadArgs(file, name string, extra ...string) []string {
	args := []string{"upload", "--control", s.ctlBase, "--token-file", filepath.Join(s.dataDir, "dev-token"), "--name", name}
	return append(append(args, extra...), file)
}

// wantStored checks a successful upload: exit 0, the image JSON on stdout
// with the file's digest, listed in status, no state file left, nothing
// capability-shaped on stderr.
func (s *server) wantStored(t *testing.T, r result, file string, data []byte, name string) imageAnswer {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("upload: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	if strings.Count(r.stdout, "\n") != 1 {
		t.Errorf("stdout should be one line of JSON, got %q", r.stdout)
	}
	var img imageAnswer
	decode(t, []byte(r.stdout), &img)
	if !hex24.MatchString(img.UploadID) || img.Name != name || img.Size != int64(len(data)) ||
		img.SHA256 != sha256hex(data) || img.VirtualSize != 64<<20 {
		t.Errorf("upload printed %+v; want name %q, size %d, sha256 %s", img, name, len(data), sha256hex(data))
	}
	found := false
	for _, i := range s.status(t, s.token).Images {
		if i.UploadID == img.UploadID {
			found = i.SHA256 == sha256hex(data) && i.Name == name
		}
	}
	if !found {
		t.Errorf("status does not list image %s with the file's sha256", img.UploadID)
	}
	if _, err := os.Stat(file + ".vmshelf-upload"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the state file is still there after success (stat: %v)", err)
	}
	if anySecret.MatchString(r.stderr) {
		t.Errorf("upload's stderr shows something capability-shaped:\n%s", r.stderr)
	}
	if strings.Contains(r.stdout+r.stderr, s.token) {
		t.Errorf("upload printed the token")
	}
	return img
}

// uploadState is what the tests read of FILE.vmshelf-upload.
type uploadState struct {
	Control    string `json:"control"`
	SessionURL string `json:"session_url"`
	UploadID   string `json:"upload_id"`
}

// readState reads FILE.vmshelf-upload, checks its mode and notes the
// session capability as a secret.
func (s *server) readState(t *testing.T, file string) uploadState {
	t.Helper()
	p := file + ".vmshelf-upload"
	if m := fileMode(t, p); m != 0o600 {
		t.Errorf("%s has mode %o, want 600", p, m)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var st uploadState
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("state file %s: %v", b, err)
	}
	u, err := url.Parse(st.SessionURL)
	if err != nil {
		t.Fatalf("state file's session_url: %v", err)
	}
	id, ok := strings.CutPrefix(u.Path, "/market/vm-images/upload-sessions/")
	if !ok || !hex64.MatchString(id) || !hex24.MatchString(st.UploadID) || st.Control != s.ctlBase {
		t.Fatalf("state file holds %+v; want the control URL, a session URL and an upload id", st)
	}
	s.secret(id)
	return st
}

// head asks the data plane directly (not through a proxy) how far a
// session got: the status, and Upload-Offset when the status is 200 (a 200
// without a valid Upload-Offset fails the test; otherwise -1).
func (s *server) head(t *testing.T, sessionURL string) (int, int64) {
	t.Helper()
	u, err := url.Parse(sessionURL)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodHead, s.dataBase+u.Path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Tus-Resumable", "1.0.0")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("HEAD session: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, -1
	}
	off, err := strconv.ParseInt(resp.Header.Get("Upload-Offset"), 10, 64)
	if err != nil || off < 0 {
		t.Fatalf("HEAD session: 200 with Upload-Offset %q", resp.Header.Get("Upload-Offset"))
	}
	return resp.StatusCode, off
}

// waitSaved polls HEAD on the session (directly, 25 ms apart, at most
// 15 s) until the edge reports an offset in [lo, hi], and returns it.
func (s *server) waitSaved(t *testing.T, sessionURL string, lo, hi int64, c *child) int64 {
	t.Helper()
	code, off := 0, int64(-1)
	for range 600 {
		if code, off = s.head(t, sessionURL); code == http.StatusOK && off >= lo && off <= hi {
			return off
		}
		if c != nil {
			select {
			case <-c.exited:
				t.Fatalf("the client exited (%v) while the test waited for the edge to report an offset in [%d, %d]; stderr:\n%s", c.waitErr, lo, hi, c.stderr.String())
			default:
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("the edge did not report an offset in [%d, %d] within 15s: the last HEAD said %d, offset %d", lo, hi, code, off)
	return 0
}

// waitExit waits for a background child to exit, at most d, and returns
// its result.
func waitExit(t *testing.T, c *child, d time.Duration, what string) result {
	t.Helper()
	select {
	case <-c.exited:
	case <-time.After(d):
		t.Fatalf("%s did not finish within %v; stderr:\n%s", what, d, c.stderr.String())
	}
	code := 0
	if c.waitErr != nil {
		var ee *exec.ExitError
		if !errors.As(c.waitErr, &ee) {
			t.Fatalf("%s: %v", what, c.waitErr)
		}
		code = ee.ExitCode()
	}
	return result{c.stdout.String(), c.stderr.String(), code}
}

// ticketsIssued is vmshelf_tickets_issued_total of s; a missing series
// fails the test.
func (s *server) ticketsIssued(t *testing.T) float64 {
	t.Helper()
	v, ok := metricValue(s.scrape(t), "vmshelf_tickets_issued_total", nil)
	if !ok {
		t.Fatal("/metrics has no vmshelf_tickets_issued_total")
	}
	return v
}

// resumeMargin is what request heads, HEADs and 100-continue exchanges may
// add to the file bytes sent through the proxy.
const resumeMargin = 64 << 10

// TestE2EUploadCLI: a straight upload, with the flags from the environment.
func TestE2EUploadCLI(t *testing.T) {
	needQemu(t)
	work := t.TempDir()
	s := startServe(t, filepath.Join(work, "data"), nil)
	disk, data := makeImageData(t, work, "disk.qcow2", 4)
	start := time.Now()
	r := runCmd(t, []string{"VMSHELF_CONTROL=" + s.ctlBase, "VMSHELF_TOKEN_FILE=" + filepath.Join(s.dataDir, "dev-token")},
		binPath, "upload", "--name", "straight", "--efi", disk)
	img := s.wantStored(t, r, disk, data, "straight")
	if !img.EFI {
		t.Errorf("--efi: the image says efi=false")
	}
	if !strings.Contains(r.stderr, "100%") {
		t.Errorf("no progress line reached 100%%:\n%s", r.stderr)
	}
	t.Logf("uploaded %d bytes in %v", len(data), time.Since(start))
	if v := s.ticketsIssued(t); v != 1 {
		t.Errorf("vmshelf_tickets_issued_total = %v, want 1", v)
	}
}

// TestE2EUploadRefusals: a bad image is refused before a ticket is taken;
// bad command lines are usage errors; a verdict of the edge is exit 1.
func TestE2EUploadRefusals(t *testing.T) {
	needQemu(t)
	work := t.TempDir()
	// The edge accepts less virtual size than the local check's default.
	s := startServe(t, filepath.Join(work, "data"), []string{"--max-virtual-gib", "0.03"})
	disk, _ := makeImageData(t, work, "disk.qcow2", 1)
	tokenFile := filepath.Join(s.dataDir, "dev-token")

	junk := make([]byte, 4096)
	if _, err := rand.Read(junk); err != nil {
		t.Fatal(err)
	}
	junk[0] = 0 // never the QCOW2 magic
	junkPath := filepath.Join(work, "junk.img")
	if err := os.WriteFile(junkPath, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	r := vmshelf(t, s.uploadArgs(junkPath, "junk")...)
	if line := refusal(t, r, 1); !strings.Contains(line, "notQcow2") || !strings.Contains(line, junkPath) {
		t.Errorf("the refusal %q should name the file and the reason notQcow2", line)
	}
	if _, err := os.Stat(junkPath + ".vmshelf-upload"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused image left a state file (stat: %v)", err)
	}

	empty := filepath.Join(work, "empty-token")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		mention string
	}{
		{"no name", []string{"upload", "--control", s.ctlBase, "--token-file", tokenFile, disk}, "--name"},
		{"empty control", []string{"upload", "--control", "", "--token-file", tokenFile, "--name", "x", disk}, "--control"},
		{"no token file", []string{"upload", "--control", s.ctlBase, "--name", "x", disk}, "--token-file"},
		{"control not a URL", []string{"upload", "--control", "ftp://x", "--token-file", tokenFile, "--name", "x", disk}, "ftp://x"},
		{"missing token file", []string{"upload", "--control", s.ctlBase, "--token-file", "/nonexistent-token", "--name", "x", disk}, "/nonexistent-token"},
		{"empty token file", []string{"upload", "--control", s.ctlBase, "--token-file", empty, "--name", "x", disk}, empty},
		{"missing image", []string{"upload", "--control", s.ctlBase, "--token-file", tokenFile, "--name", "x", "/nonexistent.qcow2"}, "/nonexistent.qcow2"},
		{"two files", []string{"upload", "--control", s.ctlBase, "--token-file", tokenFile, "--name", "x", disk, disk}, "one FILE"},
		{"a token flag", []string{"upload", "--control", s.ctlBase, "--token", s.token, "--name", "x", disk}, "token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := vmshelf(t, tc.args...)
			if line := refusal(t, r, 2); !strings.Contains(line, tc.mention) {
				t.Errorf("the error %q does not mention %q", line, tc.mention)
			}
		})
	}
	mfs := s.scrape(t)
	if v, ok := metricValue(mfs, "vmshelf_tickets_issued_total", nil); !ok || v != 0 {
		t.Errorf("vmshelf_tickets_issued_total = %v (present %v) after refusals before any ticket, want 0", v, ok)
	}

	// The local check passes (512 GiB), the edge's does not (0.03 GiB):
	// its verdict ends the session and the state file goes with it.
	r = vmshelf(t, s.uploadArgs(disk, "too big for the edge")...)
	if line := refusal(t, r, 1); !strings.Contains(line, "virtualSizeTooLarge") {
		t.Errorf("the refusal %q should carry the edge's reason virtualSizeTooLarge", line)
	}
	if _, err := os.Stat(disk + ".vmshelf-upload"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the state file outlived the edge's verdict (stat: %v)", err)
	}
	// A refusal of the control plane: another tenant's token is unknown.
	bad := filepath.Join(work, "bad-token")
	if err := os.WriteFile(bad, []byte(strings.Repeat("0", 64)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = vmshelf(t, "upload", "--control", s.ctlBase, "--token-file", bad, "--name", "x", disk)
	if line := refusal(t, r, 1); !strings.Contains(line, "401") || !strings.Contains(line, bad) {
		t.Errorf("an unknown token: %q should say 401 and name the token file", line)
	}
}

// TestE2EUploadResumesAfterCut: the first data connection is cut halfway
// and the proxy refuses connections until the test has seen what the edge
// kept; the upload then resumes that session from the edge's offset
// instead of starting over: the same session and ticket, and only the rest
// of the file is sent.
func TestE2EUploadResumesAfterCut(t *testing.T) {
	needQemu(t)
	work := t.TempDir()
	data := filepath.Join(work, "data")
	p := startProxy(t, freeAddr(t))
	disk, b := makeImageData(t, work, "disk.qcow2", 8)
	size := int64(len(b))
	cutAt := size / 2 // client bytes on the cut connection, request heads included
	p.cutAfter.Store(cutAt)
	p.refuseAfterCut.Store(true)
	// serve on the address the proxy forwards to.
	s := startServeAt(t, data, p.target, freeAddr(t), []string{"--public-url", p.base()})

	start := time.Now()
	c := startChild(t, binPath, s.uploadArgs(disk, "cut")...)
	select {
	case <-p.cutDone():
	case <-c.exited:
		t.Fatalf("the upload ended (%v) before the cut; stderr:\n%s", c.waitErr, c.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the proxy did not cut the connection within 30s; stderr:\n%s", c.stderr.String())
	}
	// The state file was written before the first byte: it names the
	// session the cut connection was writing to.
	st := s.readState(t, disk)
	locs := p.sessionLocations()
	if len(locs) != 1 || locs[0] != st.SessionURL {
		t.Fatalf("before the cut the edge created %d sessions; want 1, the state file's", len(locs))
	}
	// The edge keeps every byte of the cut connection: the cut point less
	// the request heads (a few hundred bytes).
	saved := s.waitSaved(t, st.SessionURL, cutAt-resumeMargin, cutAt, c)
	before := p.up.Load()
	p.refuse.Store(false)

	r := waitExit(t, c, 60*time.Second, "the upload after the cut")
	img := s.wantStored(t, r, disk, b, "cut")
	if !strings.Contains(r.stderr, "retry 1 of 10") || !strings.Contains(r.stderr, "the edge has") {
		t.Errorf("the upload does not say it retried and resumed from the edge's offset:\n%s", r.stderr)
	}
	// The same session and ticket: no second ticket, no second session,
	// the state file's session has every byte, one image.
	if img.UploadID != st.UploadID {
		t.Errorf("stored image %s; the session before the cut was for %s: it started over", img.UploadID, st.UploadID)
	}
	if n := s.ticketsIssued(t); n != 1 {
		t.Errorf("vmshelf_tickets_issued_total = %v, want 1: a second ticket means it started over", n)
	}
	if locs := p.sessionLocations(); len(locs) != 1 {
		t.Errorf("the edge created %d upload sessions, want 1", len(locs))
	}
	if code, off := s.head(t, st.SessionURL); code != http.StatusOK || off != size {
		t.Errorf("HEAD on the session of before the cut: %d, offset %d; want 200 and all %d bytes", code, off, size)
	}
	if imgs := s.status(t, s.token).Images; len(imgs) != 1 {
		t.Errorf("status lists %d images, want 1: %+v", len(imgs), imgs)
	}
	// Bytes: before the cut exactly cutAt went through; after it, the
	// rest of the file from the saved offset (starting over would resend
	// all of it: size > size-saved+resumeMargin, as saved ≈ size/2).
	if before != cutAt {
		t.Errorf("%d bytes passed before the cut, want exactly the cut point %d", before, cutAt)
	}
	after := p.up.Load() - before
	if after < size-saved || after > size-saved+resumeMargin {
		t.Errorf("after the cut %d bytes were sent; the edge had %d of %d, so %d to %d were due: not resumed",
			after, saved, size, size-saved, size-saved+resumeMargin)
	}
	t.Logf("cut at %d, the edge kept %d of %d; %d bytes sent after the cut, %d in all, in %v",
		cutAt, saved, size, after, p.up.Load(), time.Since(start))
}

// TestE2EUploadLostLastAnswer: the answer to the last PATCH is lost; the
// edge has stored the image, HEAD says every byte is there, and the upload
// ends with the image without sending anything again.
func TestE2EUploadLostLastAnswer(t *testing.T) {
	needQemu(t)
	work := t.TempDir()
	p := startProxy(t, freeAddr(t))
	disk, b := makeImageData(t, work, "disk.qcow2", 4)
	p.dropAnswerAfter.Store(int64(len(b)))
	s := startServeAt(t, filepath.Join(work, "data"), p.target, freeAddr(t), []string{"--public-url", p.base()})

	r := vmshelf(t, s.uploadArgs(disk, "lost answer")...)
	s.wantStored(t, r, disk, b, "lost answer")
	if !p.dropped.Load() || !strings.Contains(r.stderr, "retry 1 of 10") {
		t.Errorf("the last answer was not lost (dropped %v), or the upload did not retry:\n%s", p.dropped.Load(), r.stderr)
	}
	if got := p.up.Load(); got > int64(len(b))+64<<10 {
		t.Errorf("clients sent %d bytes for a %d-byte file: something was sent twice", got, len(b))
	}
}

// TestE2EUploadBusyRetryAfter: serve with --max-transfers 1 and its slot
// held answers the upload 503 busy with Retry-After 5 (at tus creation,
// which checks for a free slot); the command
// waits that long (measured at the proxy in front of serve, from the 503
// passing to the client's next byte) and then, the slot free, finishes.
func TestE2EUploadBusyRetryAfter(t *testing.T) {
	needQemu(t)
	work := t.TempDir()
	p := startProxy(t, freeAddr(t))
	disk, b := makeImageData(t, work, "disk.qcow2", 1)
	s := startServeAt(t, filepath.Join(work, "data"), p.target, freeAddr(t), []string{"--public-url", p.base(), "--max-transfers", "1"})
	const retryAfter = 5 * time.Second // serve's busy answer

	// A PUT of the same image that stops after its first 64 KiB holds
	// the one slot.
	holder := rawUpload(t, s, s.ticket(t, "holder"), int64(len(b)))
	if _, err := holder.Write(b[:64<<10]); err != nil {
		t.Fatal(err)
	}
	inFlight := func() float64 {
		v, ok := metricValue(s.scrape(t), "vmshelf_transfers_in_flight", map[string]string{"direction": "upload"})
		if !ok {
			t.Fatal("/metrics has no vmshelf_transfers_in_flight{direction=upload}")
		}
		return v
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for range 400 {
			if cond() {
				return
			}
			time.Sleep(25 * time.Millisecond)
		}
		t.Fatalf("%s: not within 10s", what)
	}
	waitFor("the holder takes the slot", func() bool { return inFlight() == 1 })

	c := startChild(t, binPath, s.uploadArgs(disk, "busy")...)
	waitFor("a 503 answer passes the proxy", func() bool {
		select {
		case <-c.exited:
			t.Fatalf("the upload ended (%v) before it was refused busy; stderr:\n%s", c.waitErr, c.stderr.String())
		default:
		}
		answered, _, _ := p.afterAnswer("HTTP/1.1 503")
		return !answered.IsZero()
	})
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor("the holder's slot is free", func() bool { return inFlight() == 0 })

	r := waitExit(t, c, 60*time.Second, "the busy upload")
	s.wantStored(t, r, disk, b, "busy")
	answered, next, ok := p.afterAnswer("HTTP/1.1 503")
	if !ok {
		t.Fatal("no request followed the 503")
	}
	const slack = 2 * time.Second // the client binary is not built with -race
	gap := next.Sub(answered)
	if gap < retryAfter || gap > retryAfter+slack {
		t.Errorf("the retry came %v after the 503 with Retry-After %v; want %v to %v", gap, retryAfter, retryAfter, retryAfter+slack)
	}
	t.Logf("the retry came %v after the 503", gap)
	if !strings.Contains(r.stderr, "(503 busy)); retry 1 of 10 in 5s") {
		t.Errorf("stderr does not say it waits the 5 s the edge asked:\n%s", r.stderr)
	}
	mfs := s.scrape(t)
	if v, ok := metricValue(mfs, "vmshelf_transfer_rejections_total", map[string]string{"direction": "upload", "reason": "busy"}); !ok || v != 1 {
		t.Errorf("vmshelf_transfer_rejections_total{upload,busy} = %v (present %v), want 1", v, ok)
	}
	if v, ok := metricValue(mfs, "vmshelf_tickets_issued_total", nil); !ok || v != 2 {
		t.Errorf("vmshelf_tickets_issued_total = %v (present %v), want 2 (the holder's and the upload's)", v, ok)
	}
}

// TestE2EUploadResumesAfterKill: the command is killed mid-upload; run
// again, it resumes from the edge's saved offset (> 0) and sends only the
// rest.
func TestE2EUploadResumesAfterKill(t *testing.T) {
	needQemu(t)
	if r := vmshelf(t, "serve", "-h"); !strings.Contains(r.stdout, "--tus-checkpoint-mib") {
		t.Fatal("serve has no --tus-checkpoint-mib: this test needs progress made durable every MiB")
	}
	work := t.TempDir()
	data := filepath.Join(work, "data")
	p := startProxy(t, freeAddr(t))
	p.rate.Store(2 << 20)
	disk, b := makeImageData(t, work, "disk.qcow2", 12)
	size := int64(len(b))
	s := startServeAt(t, data, p.target, freeAddr(t), []string{"--public-url", p.base(), "--tus-checkpoint-mib", "1"})

	c := startChild(t, binPath, s.uploadArgs(disk, "killed")...)
	cmd, stdout, stderr, exited := c.cmd, c.stdout, c.stderr, c.exited

	statePath := disk + ".vmshelf-upload"
	for i := 0; ; i++ {
		if _, err := os.Stat(statePath); err == nil {
			break
		}
		if i == 400 {
			t.Fatalf("no state file after 10s; stderr:\n%s", stderr.String())
		}
		time.Sleep(25 * time.Millisecond)
	}
	st := s.readState(t, disk)
	for i := 0; ; i++ {
		if code, off := s.head(t, st.SessionURL); code == http.StatusOK && off > 0 {
			break
		}
		if i == 600 {
			t.Fatalf("the edge never reported an offset > 0 within 15s; stderr:\n%s", stderr.String())
		}
		time.Sleep(25 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the upload did not die within 10s of SIGKILL")
	}
	p.waitIdle()
	// The edge keeps every byte that reached it before the kill, the
	// request heads aside.
	sent := p.up.Load()
	s.waitSaved(t, st.SessionURL, sent-resumeMargin, sent, nil)
	// The killed PATCH's handler saves what it took when it notices the
	// cut, which may be after the offset above was read: the offset is
	// final only once no upload is in flight.
	poll(t, 600, 25*time.Millisecond, "the killed upload's handler to end", func() bool {
		v, ok := metricValue(s.scrape(t), "vmshelf_transfers_in_flight", map[string]string{"direction": "upload"})
		return ok && v == 0
	})
	code, saved := s.head(t, st.SessionURL)
	if code != http.StatusOK || saved < sent-resumeMargin || saved > sent {
		t.Fatalf("after the handler ended HEAD says %d, offset %d; want an offset in [%d, %d]", code, saved, sent-resumeMargin, sent)
	}
	if saved <= 0 || saved >= size {
		t.Fatalf("after the kill the edge has %d of %d; want a saved offset > 0 and short of the end", saved, size)
	}
	if strings.Contains(stdout.String()+stderr.String(), st.SessionURL) {
		t.Errorf("the command printed the session URL")
	}

	p.up.Store(0)
	p.rate.Store(0)
	start := time.Now()
	r := runWithin(t, 60*time.Second, nil, binPath, s.uploadArgs(disk, "killed")...)
	img := s.wantStored(t, r, disk, b, "killed")
	if img.UploadID != st.UploadID {
		t.Errorf("the rerun stored image %s, the state file named %s: it did not resume", img.UploadID, st.UploadID)
	}
	if !strings.Contains(r.stderr, "resuming") || !strings.Contains(r.stderr, "the edge has") {
		t.Errorf("the rerun does not say it resumed from an offset > 0:\n%s", r.stderr)
	}
	if got := p.up.Load(); got < size-saved || got > size-saved+resumeMargin {
		t.Errorf("the rerun sent %d bytes; the edge had %d of %d, so %d to %d were due", got, saved, size, size-saved, size-saved+resumeMargin)
	}
	t.Logf("resumed at %d of %d; the rerun sent %d bytes in %v", saved, size, p.up.Load(), time.Since(start))
}

// TestE2EUploadGivesUpThenResumes: with the edge unreachable after a cut,
// the command gives up (exit 3) keeping the state; a rerun with other
// flags is refused; the same command resumes. A file changed since is
// uploaded anew, and the stale session is terminated.
func TestE2EUploadGivesUpThenResumes(t *testing.T) {
	needQemu(t)
	work := t.TempDir()
	data := filepath.Join(work, "data")
	p := startProxy(t, freeAddr(t))
	disk, b := makeImageData(t, work, "disk.qcow2", 4)
	s := startServeAt(t, data, p.target, freeAddr(t), []string{"--public-url", p.base(), "--images-per-tenant", "10"})
	args := s.uploadArgs(disk, "flaky", "--retries", "1")

	p.cutAfter.Store(int64(len(b) / 2))
	p.refuseAfterCut.Store(true)
	r := vmshelf(t, args...)
	if line := refusal(t, r, 3); !strings.Contains(line, "run the same command again to resume") {
		t.Errorf("exit 3 should say how to resume, got %q", line)
	}
	st := s.readState(t, disk)
	if strings.Contains(r.stderr, st.SessionURL) || anySecret.MatchString(r.stderr) {
		t.Errorf("the command printed the session URL:\n%s", r.stderr)
	}

	r = vmshelf(t, s.uploadArgs(disk, "another name", "--retries", "1")...)
	if line := refusal(t, r, 2); !strings.Contains(line, disk+".vmshelf-upload") || !strings.Contains(line, `"flaky"`) {
		t.Errorf("a rerun with another --name: %q should name the state file and the earlier name", line)
	}

	p.refuse.Store(false)
	r = vmshelf(t, args...)
	img := s.wantStored(t, r, disk, b, "flaky")
	if img.UploadID != st.UploadID || !strings.Contains(r.stderr, "resuming") {
		t.Errorf("the rerun stored %s (state: %s), stderr:\n%s", img.UploadID, st.UploadID, r.stderr)
	}

	// Again, but the file changes before the rerun.
	p.rearmCut()
	r = vmshelf(t, args...)
	refusal(t, r, 3)
	st2 := s.readState(t, disk)
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(disk, later, later); err != nil {
		t.Fatal(err)
	}
	p.refuse.Store(false)
	r = vmshelf(t, args...)
	img2 := s.wantStored(t, r, disk, b, "flaky")
	if img2.UploadID == st2.UploadID || !strings.Contains(r.stderr, "file changed") {
		t.Errorf("a changed file should be uploaded anew: stored %s (stale session's %s), stderr:\n%s", img2.UploadID, st2.UploadID, r.stderr)
	}
	if code, _ := s.head(t, st2.SessionURL); code != http.StatusNotFound {
		t.Errorf("the stale session answers HEAD with %d, want 404 (terminated)", code)
	}

	// Again, and the session ends on the edge before the rerun: it starts
	// over with a new ticket and says so.
	p.rearmCut()
	r = vmshelf(t, args...)
	refusal(t, r, 3)
	st3 := s.readState(t, disk)
	u, err := url.Parse(st3.SessionURL)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodDelete, s.dataBase+u.Path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Tus-Resumable", "1.0.0")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE on the session: %d", resp.StatusCode)
	}
	p.refuse.Store(false)
	r = vmshelf(t, args...)
	img3 := s.wantStored(t, r, disk, b, "flaky")
	if img3.UploadID == st3.UploadID || !strings.Contains(r.stderr, "starting over with a new ticket") {
		t.Errorf("after the session ended the rerun stored %s (ended: %s), stderr:\n%s", img3.UploadID, st3.UploadID, r.stderr)
	}
}

// TestE2EUploadInterrupted: Ctrl-C (SIGINT) stops the upload with exit 3
// and keeps the state; the same command then finishes it.
func TestE2EUploadInterrupted(t *testing.T) {
	needQemu(t)
	work := t.TempDir()
	p := startProxy(t, freeAddr(t))
	p.rate.Store(2 << 20)
	disk, b := makeImageData(t, work, "disk.qcow2", 6)
	s := startServeAt(t, filepath.Join(work, "data"), p.target, freeAddr(t), []string{"--public-url", p.base()})

	c := startChild(t, binPath, s.uploadArgs(disk, "interrupted")...)
	cmd, stdout, stderr, exited := c.cmd, c.stdout, c.stderr, c.exited

	select {
	case <-p.reached(int64(len(b) / 4)):
	case <-exited:
		t.Fatalf("the upload ended (%v) before a quarter passed; stderr:\n%s", c.waitErr, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("a quarter of the bytes did not pass within 30s")
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("the upload did not stop within 10s of SIGINT; stderr:\n%s", stderr.String())
	}
	r := result{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
	if line := refusal(t, r, 3); !strings.Contains(line, "interrupted") || !strings.Contains(line, "resume") {
		t.Errorf("after SIGINT: %q; want it to say interrupted and how to resume", line)
	}
	st := s.readState(t, disk)

	p.rate.Store(0)
	r = vmshelf(t, s.uploadArgs(disk, "interrupted")...)
	if img := s.wantStored(t, r, disk, b, "interrupted"); img.UploadID != st.UploadID {
		t.Errorf("the rerun stored %s, not the interrupted upload %s", img.UploadID, st.UploadID)
	}
}

// readmeBlocks returns the sh code blocks of README's section heading.
func readmeBlocks(t *testing.T, heading string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", heading)
	}
	if i := strings.Index(sec, "\n## "); i >= 0 {
		sec = sec[:i]
	}
	var blocks []string
	for {
		_, rest, ok := strings.Cut(sec, "```sh\n")
		if !ok {
			return blocks
		}
		block, after, ok := strings.Cut(rest, "```\n")
		if !ok {
			t.Fatalf("an unterminated code block in %q", heading)
		}
		blocks = append(blocks, block)
		sec = after
	}
}

// TestE2EReadmeResumableUploads runs README's "Resumable uploads" blocks
// as written (only the addresses and the binary's path are this test's).
func TestE2EReadmeResumableUploads(t *testing.T) {
	needTool(t, "bash")
	needTool(t, "curl")
	needQemu(t)
	work := t.TempDir()
	s := startServe(t, filepath.Join(work, "vmshelf-data"), nil)
	if err := os.Mkdir(filepath.Join(work, "scratch"), 0o755); err != nil { // the walk-through's
		t.Fatal(err)
	}
	_, firstBytes := makeImageData(t, filepath.Join(work, "scratch"), "disk.qcow2", 2)
	blocks := readmeBlocks(t, "## Resumable uploads")
	if len(blocks) != 4 {
		t.Fatalf("README's resumable section has %d sh blocks, want 4 (vmshelf upload, curl, vmshelf images and rm, cancel)", len(blocks))
	}
	script := strings.Join(blocks[:3], "\n")
	for _, want := range []string{"Upload-Length: $SIZE", "head -c $HALF", "curl -sS --fail -I", "tail -c +$((OFFSET + 1))", "./bin/vmshelf upload", "./bin/vmshelf images", "./bin/vmshelf rm"} {
		if !strings.Contains(script, want) {
			t.Errorf("README's sequence lacks %q", want)
		}
	}
	script = strings.NewReplacer("127.0.0.1:8481", s.ctlAddr, "127.0.0.1:8480", s.dataAddr, "./bin/vmshelf", binPath).Replace(script)
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = work
	cmd.Env = cleanEnv("VMSHELF_CONTROL=" + s.ctlBase) // the README leaves --control to its default, make run's
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Its own process group, so that a timeout kills curl and vmshelf too;
	// and Wait does not wait for a pipe a stray grandchild keeps open.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("README's blocks failed: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		}
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the group this test started
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("bash did not exit within 10s of SIGKILL")
		}
		t.Fatalf("README's blocks did not finish within 60s; stderr:\n%s", stderr.String())
	}

	var lines []string
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	// The upload's image, the curl block's status, the images block's
	// table (a header and two rows) and rm's line.
	if len(lines) < 6 {
		t.Fatalf("README's blocks printed:\n%s", strings.Join(lines, "\n"))
	}
	var img imageAnswer
	decode(t, []byte(lines[0]), &img)
	if img.Name != "my disk" || img.SHA256 != sha256hex(firstBytes) {
		t.Errorf("vmshelf upload printed %s; want \"my disk\" with sha256 %s", lines[0], sha256hex(firstBytes))
	}
	var st statusAnswer
	if err := json.Unmarshal([]byte(lines[len(lines)-5]), &st); err != nil {
		t.Fatalf("the fifth line from the end is not the status: %q", lines[len(lines)-5])
	}
	resumed, err := os.ReadFile(filepath.Join(work, "scratch", "disk.qcow2")) // the curl part's image
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, i := range st.Images {
		names[i.Name] = i.SHA256
	}
	if names["my disk"] != sha256hex(firstBytes) || names["resumed disk"] != sha256hex(resumed) {
		t.Errorf("status lists %v; want \"my disk\" and \"resumed disk\" with their files' sha256", names)
	}
	if len(st.Images) != 2 {
		t.FailNow()
	}
	wantImageRows(t, strings.Join(lines[len(lines)-4:len(lines)-1], "\n")+"\n", st.Images)
	if want := "removed " + st.Images[0].UploadID; lines[len(lines)-1] != want {
		t.Errorf("the last line is %q, want %q (the oldest image, \"my disk\")", lines[len(lines)-1], want)
	}
	if left := s.status(t, s.token).Images; len(left) != 1 || left[0].Name != "resumed disk" {
		t.Errorf("after README's rm status lists %+v; want only \"resumed disk\"", left)
	}
	readmeCancelBlock(t, s, work, blocks[3])
}

// readmeCancelBlock runs README's cancel block: a ticket taken, listed by
// vmshelf images under UNUSED TICKET, cancelled; status lists no ticket.
func readmeCancelBlock(t *testing.T, s *server, work, block string) {
	t.Helper()
	script := strings.NewReplacer("127.0.0.1:8481", s.ctlAddr, "./bin/vmshelf", binPath).Replace(block)
	r := runWithin(t, 60*time.Second, []string{"VMSHELF_CONTROL=" + s.ctlBase}, "bash", "-euo", "pipefail", "-c", `cd "$1" && `+script, "bash", work)
	if r.code != 0 {
		t.Fatalf("README's cancel block: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "UNUSED TICKET") || !strings.Contains(r.stdout, "not now") ||
		!strings.HasSuffix(r.stdout, "done\n") || !strings.Contains(r.stdout, "cancelled ") {
		t.Errorf("README's cancel block printed:\n%s\nwant the ticket \"not now\" under UNUSED TICKET, then cancelled and done", r.stdout)
	}
	if st := s.status(t, s.token); len(st.Tickets) != 0 {
		t.Errorf("after README's cancel status lists tickets %+v", st.Tickets)
	}
}

// tusJS returns the path of the tus-js-client script; without node or the
// npm packages the test is skipped, or fails in CI.
func tusJS(t *testing.T) string {
	t.Helper()
	needTool(t, "node")
	dir, err := filepath.Abs(filepath.Join("testdata", "tusjs"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "tus-js-client", "package.json")); err != nil {
		msg := "tus-js-client is not installed (npm ci --prefix cmd/vmshelf/testdata/tusjs)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return filepath.Join(dir, "upload.mjs")
}

// TestE2ETusJSClient: the tus reference client uploads straight through,
// and across a restart of serve in the middle of its upload, resuming its
// session instead of starting over.
func TestE2ETusJSClient(t *testing.T) {
	script := tusJS(t)
	needQemu(t)

	t.Run("straight", func(t *testing.T) {
		work := t.TempDir()
		s := startServe(t, filepath.Join(work, "data"), nil)
		disk, b := makeImageData(t, work, "disk.qcow2", 2)
		tk := s.ticket(t, "tus-js")
		r := runWithin(t, 60*time.Second, nil, "node", script, tk.UploadURL, disk)
		want := "done offset=" + strconv.Itoa(len(b)) + " length=" + strconv.Itoa(len(b)) + "\n"
		if r.code != 0 || r.stdout != want {
			t.Fatalf("node upload.mjs: exit %d, stdout %q (want %q); stderr:\n%s", r.code, r.stdout, want, r.stderr)
		}
		wantImage(t, s, tk.UploadID, b)
	})

	t.Run("serve restarts mid-upload", func(t *testing.T) {
		work := t.TempDir()
		data := filepath.Join(work, "data")
		p := startProxy(t, freeAddr(t))
		p.rate.Store(2 << 20)
		disk, b := makeImageData(t, work, "disk.qcow2", 12)
		size := int64(len(b))
		serveArgs := []string{"--public-url", p.base()}
		s := startServeAt(t, data, p.target, freeAddr(t), serveArgs)
		tk := s.ticket(t, "tus-js across a restart")

		t0 := time.Now()
		c := startChild(t, "node", script, tk.UploadURL, disk)
		stdout, stderr, exited := c.stdout, c.stderr, c.exited

		select {
		case <-p.reached(size / 2):
		case <-exited:
			t.Fatalf("node ended (%v) before half the bytes passed; stderr:\n%s", c.waitErr, stderr.String())
		case <-time.After(30 * time.Second):
			t.Fatalf("half the bytes did not pass within 30s; stderr:\n%s", stderr.String())
		}
		// No connection reaches the edge again until the test has seen
		// what the first serve kept (tus-js-client retries meanwhile: up
		// to 15 s of its retryDelays).
		p.refuse.Store(true)
		began := time.Now()
		s.terminate(t)
		locs := p.sessionLocations()
		if len(locs) != 1 {
			t.Fatalf("before the restart the edge created %d upload sessions, want 1", len(locs))
		}
		loc, err := url.Parse(locs[0])
		if err != nil {
			t.Fatalf("the session's Location: %v", err)
		}
		id, ok := strings.CutPrefix(loc.Path, "/market/vm-images/upload-sessions/")
		if !ok || !hex64.MatchString(id) {
			t.Fatalf("the session's Location has path %q", loc.Path)
		}
		s.secret(id)
		s.assertNoSecrets()
		s2 := startServeAt(t, data, s.dataAddr, s.ctlAddr, serveArgs)
		s2.secret(tk.Ticket)
		s2.secret(id)
		// What the edge kept: at least a quarter (half had passed at the
		// SIGTERM), not all.
		saved := s2.waitSaved(t, locs[0], size/4, size-1, c)
		before := p.up.Load()
		p.refuse.Store(false)

		select {
		case <-exited:
			t.Logf("node done %v after SIGTERM, %v after its start", time.Since(began), time.Since(t0))
			if c.waitErr != nil {
				t.Fatalf("node upload.mjs across a restart: %v; stderr:\n%s\nserve:\n%s", c.waitErr, stderr.String(), s2.stderr)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("node did not finish within 60s after the restart; stderr:\n%s", stderr.String())
		}
		want := "done offset=" + strconv.Itoa(len(b)) + " length=" + strconv.Itoa(len(b)) + "\n"
		if stdout.String() != want {
			t.Errorf("node printed %q, want %q; stderr:\n%s", stdout.String(), want, stderr.String())
		}
		if !strings.Contains(stderr.String(), "retry") {
			t.Errorf("tus-js-client never retried, so the restart was not in the middle of its upload; stderr:\n%s", stderr.String())
		}
		// The same session: no second one created, and it has every byte;
		// one image, the ticket's.
		if locs := p.sessionLocations(); len(locs) != 1 {
			t.Errorf("the edges created %d upload sessions, want 1: tus-js-client started over", len(locs))
		}
		if code, off := s2.head(t, locs[0]); code != http.StatusOK || off != size {
			t.Errorf("HEAD on the session of before the restart: %d, offset %d; want 200 and all %d bytes", code, off, size)
		}
		imgs := s2.status(t, s2.token).Images
		if len(imgs) != 1 || imgs[0].UploadID != tk.UploadID {
			t.Errorf("status lists %+v; want one image, %s", imgs, tk.UploadID)
		}
		wantImage(t, s2, tk.UploadID, b)
		// Bytes after the restart: the rest from the saved offset (starting
		// over would resend all of it, at least size-saved+size/4).
		after := p.up.Load() - before
		if after < size-saved || after > size-saved+resumeMargin {
			t.Errorf("tus-js-client sent %d bytes after the restart; the edge had %d of %d, so %d to %d were due: not resumed",
				after, saved, size, size-saved, size-saved+resumeMargin)
		}
		t.Logf("the edge kept %d of %d; tus-js-client sent %d after the restart, %d in all; its retries:\n%s",
			saved, size, after, p.up.Load(), stderr.String())
	})
}

// wantImage checks that status lists the upload with the bytes' digest.
func wantImage(t *testing.T, s *server, uploadID string, b []byte) {
	t.Helper()
	for _, i := range s.status(t, s.token).Images {
		if i.UploadID == uploadID {
			if i.SHA256 != sha256hex(b) || i.Size != int64(len(b)) {
				t.Errorf("image %+v; want size %d, sha256 %s", i, len(b), sha256hex(b))
			}
			return
		}
	}
	t.Errorf("status does not list image %s", uploadID)
}

// child is a process a test runs in the background: its output, and a
// channel closed when it has exited (waitErr is set then). It dies with the
// test binary and is killed at cleanup.
type child struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	exited         chan struct{}
	waitErr        error
}

func startChild(t *testing.T, name string, args ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(name, args...), stdout: &syncBuffer{}, stderr: &syncBuffer{}, exited: make(chan struct{})}
	c.cmd.Env = cleanEnv()
	c.cmd.Stdout, c.cmd.Stderr = c.stdout, c.stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c.cmd.WaitDelay = 5 * time.Second // Wait returns even if a grandchild holds a pipe
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.waitErr = c.cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill() // an error: it has exited already
		select {
		case <-c.exited:
		case <-time.After(15 * time.Second):
			t.Errorf("%s did not exit within 15s of SIGKILL at cleanup", name)
		}
	})
	return c
}
