package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
)

// curlPut uploads file with curl and returns the status and JSON body.
func curlPut(t *testing.T, url, file string, extra ...string) (int, map[string]any) {
	t.Helper()
	return runCurlPut(t, url, file, nil, extra...)
}

// curlPutStdin uploads what in holds with `curl -T -`: a chunked body of
// unknown length.
func curlPutStdin(t *testing.T, url string, in io.Reader) (int, map[string]any) {
	t.Helper()
	return runCurlPut(t, url, "-", in)
}

func runCurlPut(t *testing.T, url, file string, stdin io.Reader, extra ...string) (int, map[string]any) {
	t.Helper()
	needTool(t, "curl")
	args := append([]string{"-sS", "-o", "-", "-w", "\n%{http_code}", "-T", file}, extra...)
	cmd := exec.Command("curl", append(args, url)...)
	cmd.Stdin = stdin
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("curl -T %s %v: %v (%s)", file, extra, err, out)
	}
	i := bytes.LastIndexByte(out, '\n')
	code, _ := strconv.Atoi(string(out[i+1:]))
	var body map[string]any
	if err := json.Unmarshal(out[:i], &body); err != nil {
		t.Fatalf("answer %d is not JSON: %q", code, out[:i])
	}
	return code, body
}

func TestUploadWithCurl(t *testing.T) {
	img := makeImage(t, "64M")
	want := fileSHA256(t, img)
	info, _ := os.Stat(img)
	cases := []struct {
		name  string
		extra []string
		stdin bool
	}{
		{name: "expect 100-continue", extra: []string{"-H", "Expect: 100-continue"}},
		{name: "no expect", extra: []string{"-H", "Expect:"}},
		{name: "chunked", stdin: true},
	}
	e := newEnv(t, nil)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url, id := e.ticket()
			file := img
			if tc.stdin {
				// curl -T - sends a chunked body of unknown length.
				cmdFile, err := os.Open(img)
				if err != nil {
					t.Fatal(err)
				}
				defer cmdFile.Close()
				code, body := curlPutStdin(t, url, cmdFile)
				checkStored(t, e, code, body, id, want, info.Size())
				return
			}
			code, body := curlPut(t, url, file, tc.extra...)
			checkStored(t, e, code, body, id, want, info.Size())
		})
	}
}

func checkStored(t *testing.T, e *env, code int, body map[string]any, id, sha string, size int64) {
	t.Helper()
	if code != http.StatusCreated {
		t.Fatalf("status %d, body %v", code, body)
	}
	if body["upload_id"] != id || body["sha256"] != sha || body["size"] != float64(size) ||
		body["virtual_size"] != float64(64<<20) || body["name"] != "disk" || body["efi"] != false || body["created_at"] == nil {
		t.Errorf("image JSON %v, want id %s sha %s size %d", body, id, sha, size)
	}
	p := filepath.Join(e.dir, id+".qcow2")
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("image mode %v, want 0600", st.Mode().Perm())
	}
	if got := fileSHA256(t, p); got != sha {
		t.Errorf("stored file sha256 %s, want %s", got, sha)
	}
	if _, err := e.st.Image(context.Background(), id); err != nil {
		t.Errorf("no image record: %v", err)
	}
}

// errorOf decodes SPEC's error body.
func errorOf(t *testing.T, r io.Reader) apierr.Body {
	t.Helper()
	var b apierr.Body
	if err := json.NewDecoder(r).Decode(&b); err != nil {
		t.Fatalf("error body is not SPEC's JSON: %v", err)
	}
	if b.Error == "" || b.Reason == "" {
		t.Fatalf("error body %+v lacks error or reason", b)
	}
	return b
}

func TestUploadRefusedBeforeBody(t *testing.T) {
	img := makeImage(t, "64M")
	info, _ := os.Stat(img)
	cases := []struct {
		name   string
		mod    func(*Config)
		setup  func(e *env) string // returns the upload URL
		length int64
		status int
		reason string
	}{
		{name: "unknown ticket", setup: func(e *env) string { return e.base + uploadPrefix + imagestore.NewSecret() },
			status: 404, reason: "ticketUnknown"},
		{name: "malformed ticket", setup: func(e *env) string { return e.base + uploadPrefix + strings.Repeat("Z", 64) },
			status: 404, reason: "ticketUnknown"},
		{name: "used ticket", setup: func(e *env) string {
			u, _ := e.ticket()
			if code, _ := curlPut(e.t, u, img); code != 201 {
				e.t.Fatalf("first upload: %d", code)
			}
			return u
		}, status: 410, reason: "ticketUsed"},
		{name: "expired ticket", setup: func(e *env) string {
			u, _ := e.ticket()
			e.clock.advance(time.Hour + time.Second)
			return u
		}, status: 410, reason: "ticketExpired"},
		{name: "content-length over the limit", mod: func(c *Config) { c.UploadMax = 1 << 20 },
			setup: func(e *env) string { u, _ := e.ticket(); return u }, length: 2 << 20, status: 413, reason: "tooLarge"},
		{name: "no free space for content-length", mod: func(c *Config) { c.UploadMax = 1 << 60 },
			setup: func(e *env) string { u, _ := e.ticket(); return u }, length: 1 << 59, status: 507, reason: "noSpace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.mod)
			url := tc.setup(e)
			stored, _ := e.blobs.List(context.Background())
			length := tc.length
			if length == 0 {
				length = info.Size()
			}
			// With Expect: the answer comes instead of 100 Continue, and
			// not one body byte is sent.
			path := strings.TrimPrefix(url, e.base)
			resp, conn := rawRequest(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-continue", path, length), nil)
			if resp.StatusCode != tc.status {
				t.Fatalf("with Expect: status %d, want %d", resp.StatusCode, tc.status)
			}
			if b := errorOf(t, resp.Body); b.Reason != tc.reason {
				t.Errorf("with Expect: reason %q, want %q", b.Reason, tc.reason)
			}
			conn.Close()
			// Without Expect, curl sends the body; the answer is the same.
			if tc.length == 0 {
				code, body := curlPut(t, url, img, "-H", "Expect:")
				if code != tc.status || body["reason"] != tc.reason {
					t.Errorf("curl without Expect: %d %v, want %d %s", code, body, tc.status, tc.reason)
				}
			}
			e.assertNothingLeft(stored...)
			if got := testutil.ToFloat64(e.g.metrics.rejections.WithLabelValues(dirUpload, tc.reason)); got < 1 {
				t.Errorf("rejections{reason=%s} = %v", tc.reason, got)
			}
		})
	}
}

func TestUploadBusy(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxTransfers = 1 })
	img := makeImage(t, "64M")
	// Hold the only slot with an upload whose body stalls.
	u1, _ := e.ticket()
	pr, pw := io.Pipe()
	defer pw.Close()
	holder := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPut, u1, pr)
		req.ContentLength = 1 << 20
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			holder <- resp
		}
		close(holder)
	}()
	head, _ := os.ReadFile(img)
	pw.Write(head[:16384]) // fasthttp reads 8 KiB ahead before the handler runs
	waitFor(t, func() bool { return testutil.ToFloat64(e.g.metrics.inFlight.WithLabelValues(dirUpload)) == 1 })

	u2, _ := e.ticket()
	code, body := curlPut(t, u2, img)
	if code != 503 || body["reason"] != "busy" {
		t.Fatalf("second upload: %d %v, want 503 busy", code, body)
	}
	resp, _ := rawRequest(t, e.base, "PUT "+strings.TrimPrefix(u2, e.base)+" HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: 100-continue", nil)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("with Expect: %d Retry-After %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	// The refused ticket was not used: it works once the slot is free.
	pw.CloseWithError(io.ErrClosedPipe)
	e.waitSlotFreed(dirUpload)
	if code, body := curlPut(t, u2, img); code != 201 {
		t.Fatalf("retry after busy: %d %v", code, body)
	}
}

// waitFor polls a condition a bounded number of times; for states that
// have no event to wait on (a request that reached the handler).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; i < 1000; i++ {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("condition not reached within 10s")
}

func TestUploadRefusedWhileStreaming(t *testing.T) {
	good := makeImage(t, "64M")
	goodBytes, _ := os.ReadFile(good)
	big := filepath.Join(t.TempDir(), "big.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", big, "600G")
	junk := make([]byte, 3<<20)
	rand.Read(junk)

	// A header whose L1 table lies far beyond the end of the file.
	corrupt := append([]byte(nil), goodBytes...)
	binary.BigEndian.PutUint64(corrupt[40:], uint64(len(corrupt))*4096)

	cases := []struct {
		name   string
		mod    func(*Config)
		body   []byte
		file   string
		chunk  bool // send without Content-Length
		status int
		reason string
	}{
		{name: "not qcow2", body: junk, status: 415, reason: "notQcow2"},
		{name: "not qcow2 chunked", body: junk, chunk: true, status: 415, reason: "notQcow2"},
		{name: "empty body", body: []byte{}, status: 415, reason: "notQcow2"},
		{name: "virtual size too large", file: big, status: 422, reason: "virtualSizeTooLarge"},
		{name: "chunked over the limit", mod: func(c *Config) { c.UploadMax = 256 << 10 }, body: goodBytes, chunk: true, status: 413, reason: "tooLarge"},
		{name: "structure outside the file", body: corrupt, status: 422, reason: "corrupt"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.mod)
			url, _ := e.ticket()
			body := tc.body
			if tc.file != "" {
				body, _ = os.ReadFile(tc.file)
			}
			req, _ := http.NewRequest(http.MethodPut, url, bytes.NewReader(body))
			if tc.chunk {
				req, _ = http.NewRequest(http.MethodPut, url, io.MultiReader(bytes.NewReader(body)))
				req.ContentLength = -1
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if b := errorOf(t, resp.Body); b.Reason != tc.reason {
				t.Errorf("reason %q, want %q", b.Reason, tc.reason)
			}
			e.waitSlotFreed(dirUpload)
			e.assertNothingLeft()
			// A refused upload used its ticket.
			if code, _ := curlPut(t, url, good); code != 410 {
				t.Errorf("ticket after refusal: %d, want 410", code)
			}
		})
	}
}

func TestUploadLyingContentLength(t *testing.T) {
	good := makeImage(t, "64M")
	body, _ := os.ReadFile(good)

	t.Run("shorter than declared, then the client hangs up", func(t *testing.T) {
		e := newEnv(t, nil)
		url, _ := e.ticket()
		path := strings.TrimPrefix(url, e.base)
		conn := dial(t, e.base)
		fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", path, len(body)+1000)
		conn.Write(body)
		conn.(interface{ CloseWrite() error }).CloseWrite()
		e.waitSlotFreed(dirUpload)
		e.assertNothingLeft()
		if got := testutil.ToFloat64(e.g.metrics.transfers.WithLabelValues(dirUpload, outcomeAborted)); got != 1 {
			t.Errorf("aborted uploads = %v, want 1", got)
		}
	})
	t.Run("declared under the limit, more sent", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.UploadMax = int64(len(body)) - 4096 })
		url, _ := e.ticket()
		path := strings.TrimPrefix(url, e.base)
		// The declared length passes the early check; the image behind it
		// is cut at that length and fails the structure check — nothing
		// past the declared length is ever taken as image bytes.
		// 200 KiB of a fresh qemu-img image end inside its L1 table's
		// cluster, before the L2 table at 256 KiB.
		resp, _ := rawRequest(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", path, 200<<10), bytes.NewReader(body))
		if resp.StatusCode != 422 {
			t.Fatalf("status %d, want 422", resp.StatusCode)
		}
		if b := errorOf(t, resp.Body); b.Reason != "corrupt" {
			t.Errorf("reason %q, want corrupt", b.Reason)
		}
		e.waitSlotFreed(dirUpload)
		e.assertNothingLeft()
	})
}

func dial(t *testing.T, base string) netConn {
	t.Helper()
	c, err := netDial(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestUploadIdle(t *testing.T) {
	good := makeImage(t, "64M")
	body, _ := os.ReadFile(good)

	t.Run("stalled client gets 408 and nothing is kept", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
		url, _ := e.ticket()
		pr, pw := io.Pipe()
		go func() { pw.Write(body[:len(body)/2]) }() // then nothing more
		defer pw.Close()
		resp, _ := rawRequest(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", strings.TrimPrefix(url, e.base), len(body)), pr)
		if resp.StatusCode != 408 {
			t.Fatalf("status %d, want 408", resp.StatusCode)
		}
		if b := errorOf(t, resp.Body); b.Reason != "idle" {
			t.Errorf("reason %q, want idle", b.Reason)
		}
		e.waitSlotFreed(dirUpload)
		e.assertNothingLeft()
	})
	t.Run("slow but moving client is not cut off", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.IdleTimeout = 400 * time.Millisecond })
		url, id := e.ticket()
		pr, pw := io.Pipe()
		// 20 pieces 100 ms apart: the upload takes ~2 s, five idle timeouts,
		// but never stalls for one.
		go func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			piece := (len(body) + 19) / 20
			for off := 0; off < len(body); off += piece {
				<-tick.C
				if _, err := pw.Write(body[off:min(off+piece, len(body))]); err != nil {
					return
				}
			}
			pw.Close()
		}()
		resp, _ := rawRequest(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", strings.TrimPrefix(url, e.base), len(body)), pr)
		if resp.StatusCode != 201 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d %s, want 201", resp.StatusCode, b)
		}
		e.waitSlotFreed(dirUpload)
		e.assertNothingLeft(id)
	})
}

func TestUploadClientDisconnects(t *testing.T) {
	good := makeImage(t, "64M")
	body, _ := os.ReadFile(good)
	e := newEnv(t, func(c *Config) { c.MaxTransfers = 1 })
	url, _ := e.ticket()
	conn := dial(t, e.base)
	fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", strings.TrimPrefix(url, e.base), len(body))
	conn.Write(body[:len(body)/2])
	waitFor(t, func() bool { return testutil.ToFloat64(e.g.metrics.bytes.WithLabelValues(dirUpload)) > 0 })
	conn.Close()
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft()
	// The freed slot takes the next upload.
	url2, id2 := e.ticket()
	if code, b := curlPut(t, url2, good); code != 201 {
		t.Fatalf("upload after a disconnect: %d %v", code, b)
	}
	e.assertNothingLeft(id2)
}

func TestUploadConcurrent(t *testing.T) {
	good := makeImage(t, "64M")
	body, _ := os.ReadFile(good)
	e := newEnv(t, func(c *Config) { c.MaxTransfers = 5; c.ImagesPerTenant = 10 })
	type result struct {
		code int
		id   string
	}
	results := make(chan result, 5)
	var pipes []*io.PipeWriter
	var ids []string
	for i := 0; i < 5; i++ {
		url, id := e.ticket()
		ids = append(ids, id)
		pr, pw := io.Pipe()
		pipes = append(pipes, pw)
		go func() {
			req, _ := http.NewRequest(http.MethodPut, url, pr)
			req.ContentLength = int64(len(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				results <- result{code: -1, id: id}
				return
			}
			resp.Body.Close()
			results <- result{code: resp.StatusCode, id: id}
		}()
		pw.Write(body[:len(body)/2])
	}
	waitFor(t, func() bool { return testutil.ToFloat64(e.g.metrics.inFlight.WithLabelValues(dirUpload)) == 5 })
	// All five run at once; a sixth is one too many.
	url6, _ := e.ticket()
	if code, b := curlPut(t, url6, good); code != 503 {
		t.Errorf("sixth upload: %d %v, want 503", code, b)
	}
	var wg sync.WaitGroup
	for _, pw := range pipes {
		wg.Add(1)
		go func() { defer wg.Done(); pw.Write(body[len(body)/2:]); pw.Close() }()
	}
	wg.Wait()
	for i := 0; i < 5; i++ {
		if r := <-results; r.code != 201 {
			t.Errorf("upload %s: %d", r.id, r.code)
		}
	}
	for i := 0; i < 5; i++ {
		e.waitSlotFreed(dirUpload)
	}
	e.assertNothingLeft(ids...)
}

func TestUploadSameTicketTwice(t *testing.T) {
	good := makeImage(t, "64M")
	body, _ := os.ReadFile(good)
	e := newEnv(t, nil)
	url, id := e.ticket()
	codes := make(chan int, 2)
	start := make(chan struct{})
	for i := 0; i < 2; i++ {
		go func() {
			<-start
			req, _ := http.NewRequest(http.MethodPut, url, bytes.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes <- -1
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	close(start)
	a, b := <-codes, <-codes
	if min(a, b) != 201 || max(a, b) != 410 {
		t.Fatalf("two PUTs on one ticket answered %d and %d, want 201 and 410", a, b)
	}
	e.assertNothingLeft(id)
}

func TestUploadQuotaAtCommit(t *testing.T) {
	good := makeImage(t, "64M")
	e := newEnv(t, func(c *Config) { c.ImagesPerTenant = 1 })
	u1, id1 := e.ticket()
	u2, _ := e.ticket() // both tickets issued while the tenant held none
	if code, b := curlPut(t, u1, good); code != 201 {
		t.Fatalf("first: %d %v", code, b)
	}
	code, b := curlPut(t, u2, good)
	if code != 409 || b["reason"] != "imageQuota" {
		t.Fatalf("second: %d %v, want 409 imageQuota", code, b)
	}
	e.assertNothingLeft(id1)
}

// TestUploadDiskFull fills a small tmpfs while streaming: ENOSPC is 507 and
// leaves nothing behind.
func TestUploadDiskFull(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount tmpfs: %v %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs here: %v %s", err, out)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	img := filepath.Join(t.TempDir(), "full.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", img, "1G")
	qemuIO(t, img, "write -q -P 0x5a 0 16M")
	e := newEnvAt(t, dir, func(c *Config) { c.Headroom = 1 << 20 })
	url, _ := e.ticket()
	f, _ := os.Open(img)
	defer f.Close()
	code, b := curlPutStdin(t, url, f) // chunked: no length to check before
	if code != 507 || b["reason"] != "noSpace" {
		t.Fatalf("upload into a full disk: %d %v, want 507 noSpace", code, b)
	}
	e.assertNothingLeft()
}
