package gateway

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
)

// preRead is what fasthttp reads of a body (at most) before any handler
// runs: the most a refusal "before the body" can have read.
const preRead = 8 << 10

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

// runCurlPut runs curl, bounded; the test must have called needTool(t,
// "curl") first.
func runCurlPut(t *testing.T, url, file string, stdin io.Reader, extra ...string) (int, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientBound)
	defer cancel()
	args := append([]string{"-sS", "--max-time", strconv.Itoa(int(clientBound / time.Second)), "-o", "-", "-w", "\n%{http_code}", "-T", file}, extra...)
	cmd := exec.CommandContext(ctx, "curl", append(args, url)...)
	cmd.Stdin = stdin
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("curl -T %s %v: %v (%s)", file, extra, err, out)
	}
	i := bytes.LastIndexByte(out, '\n')
	if i < 0 {
		t.Fatalf("curl printed no status: %q", out)
	}
	code, err := strconv.Atoi(string(out[i+1:]))
	if err != nil {
		t.Fatalf("curl status %q: %v", out[i+1:], err)
	}
	var body map[string]any
	if err := json.Unmarshal(out[:i], &body); err != nil {
		t.Fatalf("answer %d is not JSON: %q", code, out[:i])
	}
	return code, body
}

func uploadedBytes(e *env) float64 {
	return testutil.ToFloat64(e.g.metrics.bytes.WithLabelValues(dirUpload))
}

func TestUploadWithCurl(t *testing.T) {
	needQemu(t)
	needTool(t, "curl")
	img := makeImage(t, "64M")
	want := fileSHA256(t, img)
	size := int64(len(mustRead(t, img)))
	cases := []struct {
		name  string
		extra []string
		stdin bool
	}{
		{name: "expect 100-continue", extra: []string{"-H", "Expect: 100-continue"}},
		{name: "no expect", extra: []string{"-H", "Expect:"}},
		{name: "chunked", stdin: true},
	}
	e := newEnv(t, func(c *Config) { c.ImagesPerTenant = len(cases) })
	var ids []string
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url, id := e.ticket()
			before := uploadedBytes(e)
			var code int
			var body map[string]any
			if tc.stdin {
				// curl -T - sends a chunked body of unknown length.
				f, err := os.Open(img)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				code, body = curlPutStdin(t, url, f)
			} else {
				code, body = curlPut(t, url, img, tc.extra...)
			}
			checkStored(t, e, code, body, id, want, size)
			ids = append(ids, id)
			e.waitSlotFreed(dirUpload)
			// Every byte counted once.
			if got := uploadedBytes(e) - before; got != float64(size) {
				t.Errorf("upload bytes metric grew by %v, want %d", got, size)
			}
			e.assertTicket(url, true)
			e.assertNothingLeft(ids...)
		})
	}
	if got := testutil.ToFloat64(e.g.metrics.transfers.WithLabelValues(dirUpload, outcomeOK)); got != float64(len(cases)) {
		t.Errorf("ok uploads = %v, want %d", got, len(cases))
	}
	if got := testutil.ToFloat64(e.g.metrics.consumed); got != float64(len(cases)) {
		t.Errorf("tickets consumed = %v, want %d", got, len(cases))
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
	rec, err := e.st.Image(context.Background(), id)
	if err != nil {
		t.Fatalf("no image record: %v", err)
	}
	if rec.SHA256 != sha || rec.Size != size {
		t.Errorf("image record %+v, want sha %s size %d", rec, sha, size)
	}
}

// errorOf decodes the edge's error body ({"error", "reason"}).
func errorOf(t *testing.T, r io.Reader) apierr.Body {
	t.Helper()
	var b apierr.Body
	if err := json.NewDecoder(r).Decode(&b); err != nil {
		t.Fatalf("error body is not the edge's JSON: %v", err)
	}
	if b.Error == "" || b.Reason == "" {
		t.Fatalf("error body %+v lacks error or reason", b)
	}
	return b
}

// TestUploadRefusedBeforeBody: each check the upload makes before the body
// answers (1) instead of 100 Continue, (2) without Expect, after no more
// than fasthttp's pre-read of the body and without waiting for the rest,
// and (3) to curl sending the whole body. No body byte is taken, the
// ticket keeps its state or, refused for the request itself, ends with
// the refusal (release.go), and each refusal is counted exactly once.
func TestUploadRefusedBeforeBody(t *testing.T) {
	needQemu(t)
	needTool(t, "curl")
	img := makeImage(t, "64M")
	imgBytes := mustRead(t, img)
	const (
		noTicket = iota
		unused
		used
		released // each attempt with a ticket of its own, ended by the refusal
	)
	cases := []struct {
		name   string
		mod    func(*Config)
		setup  func(e *env) string // returns the upload URL
		length int64
		ticket int // the ticket's state before and after
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
			e.waitSlotFreed(dirUpload)
			return u
		}, ticket: used, status: 410, reason: "ticketUsed"},
		{name: "expired ticket", setup: func(e *env) string {
			u, _ := e.ticket()
			e.clock.Advance(time.Hour + time.Second)
			return u
		}, ticket: unused, status: 410, reason: "ticketExpired"},
		{name: "content-length over the limit", mod: func(c *Config) { c.UploadMax = 1 << 20 },
			setup: func(e *env) string { u, _ := e.ticket(); return u }, length: 2 << 20, ticket: released, status: 413, reason: "tooLarge"},
		{name: "no free space for content-length", mod: func(c *Config) { c.UploadMax = 1 << 60 },
			setup: func(e *env) string { u, _ := e.ticket(); return u }, length: 1 << 59, ticket: unused, status: 507, reason: "noSpace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.mod)
			url := tc.setup(e)
			urls := []string{url}
			// next is the URL of the next attempt: a fresh ticket when the
			// refusal ends the one it met.
			next := func() string {
				if tc.ticket == released {
					url = tc.setup(e)
					urls = append(urls, url)
				}
				return strings.TrimPrefix(url, e.base)
			}
			stored, err := e.blobs.List(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			bytesBefore := uploadedBytes(e)
			length := tc.length
			if length == 0 {
				length = int64(len(imgBytes))
			}
			path := strings.TrimPrefix(url, e.base)
			check := func(how string, status int, reason string) {
				t.Helper()
				if status != tc.status || reason != tc.reason {
					t.Errorf("%s: %d %q, want %d %s", how, status, reason, tc.status, tc.reason)
				}
			}
			reasonIn := func(b []byte) string { // "" for a body that is not the edge's JSON (a 100 Continue)
				var eb apierr.Body
				_ = json.Unmarshal(b, &eb)
				return eb.Reason
			}
			// With Expect: the answer comes instead of 100 Continue, and
			// not one body byte is sent.
			resp, b := rawRequest(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-continue", path, length), nil)
			check("with Expect", resp.StatusCode, reasonIn(b))

			// Without Expect: the client sends what fasthttp reads before
			// the handler runs, and no more; the answer must come without
			// the rest of the body.
			rc := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", next(), length))
			rc.send(imgBytes[:preRead], "the body's first 8 KiB")
			resp, b = rc.answer("a PUT without Expect that sent 8 KiB of its body")
			check("without Expect", resp.StatusCode, reasonIn(b))
			if !resp.Close {
				t.Error("a refusal with the body on the wire kept the connection open")
			}
			want := 2.0

			// Without Expect, curl sends the body; the answer is the same.
			if tc.length == 0 {
				next()
				code, body := curlPut(t, url, img, "-H", "Expect:")
				reason, _ := body["reason"].(string)
				check("curl without Expect", code, reason)
				want++
			}
			e.assertNothingLeft(stored...)
			if got := uploadedBytes(e) - bytesBefore; got != 0 {
				t.Errorf("%v body bytes taken by refused uploads, want 0", got)
			}
			switch tc.ticket {
			case unused:
				e.assertTicket(url, false)
			case used:
				e.assertTicket(url, true)
			case released:
				for _, u := range urls {
					e.assertReleased(u)
				}
			}
			// Each refusal counted once, under its reason and nowhere else.
			if got := testutil.ToFloat64(e.g.metrics.rejections.WithLabelValues(dirUpload, tc.reason)); got != want {
				t.Errorf("rejections{reason=%s} = %v, want %v", tc.reason, got, want)
			}
			if got := counterSum(t, e.reg, "vmshelf_transfer_rejections_total"); got != want {
				t.Errorf("all rejections = %v, want %v", got, want)
			}
			if got := testutil.ToFloat64(e.g.metrics.transfers.WithLabelValues(dirUpload, outcomeRejected)); got != want {
				t.Errorf("rejected uploads = %v, want %v", got, want)
			}
		})
	}
}

func TestUploadBusy(t *testing.T) {
	needQemu(t)
	needTool(t, "curl")
	img := makeImage(t, "64M")
	head := mustRead(t, img)
	e := newEnv(t, func(c *Config) { c.MaxTransfers = 1 })
	// Hold the only slot with an upload whose body stalls.
	u1, _ := e.ticket()
	holder := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", strings.TrimPrefix(u1, e.base), 1<<20))
	holder.send(head[:2*preRead], "the first 16 KiB") // more than fasthttp's pre-read: the handler runs
	waitFor(t, "the stalled upload to hold the slot", func() bool {
		return testutil.ToFloat64(e.g.metrics.inFlight.WithLabelValues(dirUpload)) == 1
	})

	u2, _ := e.ticket()
	code, body := curlPut(t, u2, img)
	if code != 503 || body["reason"] != "busy" {
		t.Fatalf("second upload: %d %v, want 503 busy", code, body)
	}
	resp, _ := rawRequest(t, e.base, "PUT "+strings.TrimPrefix(u2, e.base)+" HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: 100-continue", nil)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "5" {
		t.Errorf("with Expect: %d Retry-After %q, want 503 with Retry-After 5", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if got := testutil.ToFloat64(e.g.metrics.rejections.WithLabelValues(dirUpload, "busy")); got != 2 {
		t.Errorf("busy rejections = %v, want 2", got)
	}
	// The refused ticket was not used: it works once the slot is free.
	e.assertTicket(u2, false)
	holder.c.Close()
	e.waitSlotFreed(dirUpload)
	e.assertTicket(u1, true)
	code, body = curlPut(t, u2, img)
	if code != 201 {
		t.Fatalf("retry after busy: %d %v", code, body)
	}
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft(body["upload_id"].(string))
}

// TestUpload415FromFirstBytes: a body that does not start with a QCOW2
// header is refused from its first bytes. The client announces 64 MiB of
// junk, sends 64 KiB and waits: the 415 must come without another byte,
// and no byte counts as image. The idle timeout is far longer than the
// wait for the answer, so a server that waits for more bytes cannot
// answer in time, not even 415 at the timeout.
func TestUpload415FromFirstBytes(t *testing.T) {
	junk := bytes.Repeat([]byte("not a qcow2 image, "), 4<<10)[:64<<10]
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.IdleTimeout = 10 * waitBound })
			url, _ := e.ticket()
			path := strings.TrimPrefix(url, e.base)
			if chunked {
				rc := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked", path))
				rc.send(append(append([]byte(fmt.Sprintf("%x\r\n", len(junk))), junk...), "\r\n"...), "a 64 KiB chunk")
				checkNotQcow2(t, e, rc)
			} else {
				rc := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", path, 64<<20))
				rc.send(junk, "64 KiB of 64 MiB")
				checkNotQcow2(t, e, rc)
			}
			e.waitSlotFreed(dirUpload)
			e.assertNothingLeft()
			e.assertTicket(url, true)
		})
	}
}

func checkNotQcow2(t *testing.T, e *env, rc *rawConn) {
	t.Helper()
	resp, b := rc.answer("64 KiB of junk (no more sent)")
	if resp.StatusCode != 415 || errorOf(t, bytes.NewReader(b)).Reason != "notQcow2" {
		t.Fatalf("answer %d %s, want 415 notQcow2", resp.StatusCode, b)
	}
	// The inspector refused the first chunk whole: nothing was taken.
	if got := uploadedBytes(e); got != 0 {
		t.Errorf("upload bytes metric %v after a refusal at byte 0, want 0", got)
	}
}

func TestUploadRefusedWhileStreaming(t *testing.T) {
	needQemu(t)
	needTool(t, "curl")
	good := makeImage(t, "64M")
	goodBytes := mustRead(t, good)
	big := filepath.Join(t.TempDir(), "big.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", big, "600G")
	junk := bytes.Repeat([]byte("junk"), 3<<18)

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
				body = mustRead(t, tc.file)
			}
			req := newRequest(t, http.MethodPut, url, bytes.NewReader(body))
			if tc.chunk {
				req = newRequest(t, http.MethodPut, url, io.MultiReader(bytes.NewReader(body)))
				req.ContentLength = -1
			}
			resp, b := do(t, req)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d %s, want %d", resp.StatusCode, b, tc.status)
			}
			if eb := errorOf(t, bytes.NewReader(b)); eb.Reason != tc.reason {
				t.Errorf("reason %q, want %q", eb.Reason, tc.reason)
			}
			e.waitSlotFreed(dirUpload)
			e.assertNothingLeft()
			// A refused upload used its ticket.
			e.assertTicket(url, true)
			if code, _ := curlPut(t, url, good); code != 410 {
				t.Errorf("ticket after refusal: %d, want 410", code)
			}
			if got := testutil.ToFloat64(e.g.metrics.rejections.WithLabelValues(dirUpload, tc.reason)); got != 1 {
				t.Errorf("rejections{reason=%s} = %v, want 1", tc.reason, got)
			}
			e.logHas("msg=upload", "outcome=rejected", "reason="+tc.reason)
		})
	}
}

func TestUploadLyingContentLength(t *testing.T) {
	needQemu(t)
	body := mustRead(t, makeImage(t, "64M"))

	t.Run("shorter than declared, then the client hangs up", func(t *testing.T) {
		e := newEnv(t, nil)
		url, _ := e.ticket()
		rc := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", strings.TrimPrefix(url, e.base), len(body)+1000))
		rc.send(body, "the whole image")
		if err := rc.c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		resp, b := rc.answer("a PUT cut short")
		if resp.StatusCode != 400 || errorOf(t, bytes.NewReader(b)).Reason != "incompleteBody" {
			t.Errorf("answer %d %s, want 400 incompleteBody", resp.StatusCode, b)
		}
		e.waitSlotFreed(dirUpload)
		e.assertNothingLeft()
		e.assertTicket(url, true)
		if got := testutil.ToFloat64(e.g.metrics.transfers.WithLabelValues(dirUpload, outcomeAborted)); got != 1 {
			t.Errorf("aborted uploads = %v, want 1", got)
		}
		if got := uploadedBytes(e); got != float64(len(body)) {
			t.Errorf("upload bytes metric %v, want %d", got, len(body))
		}
	})
	t.Run("declared at the limit, more sent", func(t *testing.T) {
		// The declared length is exactly the limit, so it passes the early
		// check; the client sends the whole image behind it. A server that
		// read past the declared length would pass the limit and answer
		// 413. The image cut at that length fails the structure check:
		// 200 KiB of a fresh qemu-img image end inside its L1 table's
		// cluster, before the L2 table at 256 KiB.
		const declared = 200 << 10
		e := newEnv(t, func(c *Config) { c.UploadMax = declared })
		url, _ := e.ticket()
		path := strings.TrimPrefix(url, e.base)
		resp, b := rawRequest(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", path, declared), bytes.NewReader(body))
		if resp.StatusCode != 422 {
			t.Fatalf("status %d %s, want 422", resp.StatusCode, b)
		}
		if eb := errorOf(t, bytes.NewReader(b)); eb.Reason != "corrupt" {
			t.Errorf("reason %q, want corrupt", eb.Reason)
		}
		e.waitSlotFreed(dirUpload)
		e.assertNothingLeft()
		if got := uploadedBytes(e); got != declared {
			t.Errorf("upload bytes metric %v, want exactly the declared %d", got, declared)
		}
	})
}

func TestUploadIdle(t *testing.T) {
	needQemu(t)
	body := mustRead(t, makeImage(t, "64M"))

	t.Run("stalled client gets 408 and nothing is kept", func(t *testing.T) {
		// The test only waits for the timeout: a long one costs 2 s and
		// cannot fire early on a loaded machine.
		e := newEnv(t, func(c *Config) { c.IdleTimeout = 2 * time.Second })
		url, _ := e.ticket()
		rc := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", strings.TrimPrefix(url, e.base), len(body)))
		rc.send(body[:len(body)/2], "half the image") // then nothing more
		resp, b := rc.answer("a PUT stalled after half its body")
		if resp.StatusCode != 408 {
			t.Fatalf("status %d %s, want 408", resp.StatusCode, b)
		}
		if eb := errorOf(t, bytes.NewReader(b)); eb.Reason != "idle" {
			t.Errorf("reason %q, want idle", eb.Reason)
		}
		e.waitSlotFreed(dirUpload)
		e.assertNothingLeft()
		e.assertTicket(url, true)
		if got := testutil.ToFloat64(e.g.metrics.transfers.WithLabelValues(dirUpload, outcomeAborted)); got != 1 {
			t.Errorf("aborted uploads = %v, want 1", got)
		}
	})
	t.Run("slow but moving client is not cut off", func(t *testing.T) {
		// 40 pieces 150 ms apart: the upload takes ~6 s, three idle
		// timeouts, but never stalls for more than a thirteenth of one,
		// a margin a loaded machine keeps.
		e := newEnv(t, func(c *Config) { c.IdleTimeout = 2 * time.Second })
		url, id := e.ticket()
		rc := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", strings.TrimPrefix(url, e.base), len(body)))
		sent := make(chan error, 1)
		go func() {
			tick := time.NewTicker(150 * time.Millisecond)
			defer tick.Stop()
			piece := (len(body) + 39) / 40
			for off := 0; off < len(body); off += piece {
				<-tick.C
				if err := rc.write(body[off:min(off+piece, len(body))]); err != nil {
					sent <- fmt.Errorf("piece at %d: %w", off, err)
					return
				}
			}
			sent <- nil
		}()
		resp, b := rc.answer("a slow PUT")
		if resp.StatusCode != 201 {
			t.Fatalf("status %d %s, want 201", resp.StatusCode, b)
		}
		if err := within(t, sent, "the slow writer to finish"); err != nil {
			t.Fatal(err)
		}
		e.waitSlotFreed(dirUpload)
		e.assertNothingLeft(id)
	})
}

func TestUploadClientDisconnects(t *testing.T) {
	needQemu(t)
	needTool(t, "curl")
	good := makeImage(t, "64M")
	body := mustRead(t, good)
	e := newEnv(t, func(c *Config) { c.MaxTransfers = 1 })
	url, _ := e.ticket()
	rc := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", strings.TrimPrefix(url, e.base), len(body)))
	rc.send(body[:len(body)/2], "half the image")
	waitFor(t, "the upload to take bytes", func() bool { return uploadedBytes(e) > 0 })
	rc.c.Close()
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft()
	e.assertTicket(url, true)
	if got := testutil.ToFloat64(e.g.metrics.transfers.WithLabelValues(dirUpload, outcomeAborted)); got != 1 {
		t.Errorf("aborted uploads = %v, want 1", got)
	}
	// The freed slot takes the next upload.
	url2, id2 := e.ticket()
	if code, b := curlPut(t, url2, good); code != 201 {
		t.Fatalf("upload after a disconnect: %d %v", code, b)
	}
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft(id2)
}

func TestUploadConcurrent(t *testing.T) {
	needQemu(t)
	needTool(t, "curl")
	good := makeImage(t, "64M")
	body := mustRead(t, good)
	e := newEnv(t, func(c *Config) { c.MaxTransfers = 5; c.ImagesPerTenant = 10 })
	var conns []*rawConn
	var ids []string
	for i := 0; i < 5; i++ {
		url, id := e.ticket()
		ids = append(ids, id)
		rc := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d", strings.TrimPrefix(url, e.base), len(body)))
		rc.send(body[:len(body)/2], fmt.Sprintf("half of upload %d", i))
		conns = append(conns, rc)
	}
	waitFor(t, "five uploads in flight", func() bool {
		return testutil.ToFloat64(e.g.metrics.inFlight.WithLabelValues(dirUpload)) == 5
	})
	// All five run at once; a sixth is one too many.
	url6, _ := e.ticket()
	if code, b := curlPut(t, url6, good); code != 503 {
		t.Errorf("sixth upload: %d %v, want 503", code, b)
	}
	errs := make(chan error, len(conns))
	var wg sync.WaitGroup
	for _, rc := range conns {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- rc.write(body[len(body)/2:]) }()
	}
	for i, rc := range conns {
		if resp, b := rc.answer(fmt.Sprintf("upload %d", i)); resp.StatusCode != 201 {
			t.Errorf("upload %s: %d %s", ids[i], resp.StatusCode, b)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("sending the second halves: %v", err)
		}
	}
	for i := 0; i < 5; i++ {
		e.waitSlotFreed(dirUpload)
	}
	e.assertNothingLeft(ids...)
	if got := uploadedBytes(e); got != float64(5*len(body)) {
		t.Errorf("upload bytes metric %v, want %d", got, 5*len(body))
	}
}

// meetingStore holds every ConsumeTicket call until want of them have
// arrived, so that concurrent uploads reach the conditional consume
// together, each past every check before it.
type meetingStore struct {
	imagestore.Store
	want    int
	mu      sync.Mutex
	arrived int
	met     chan struct{}
	missed  bool // a call gave up waiting for the others
}

func (s *meetingStore) ConsumeTicket(ctx context.Context, ticket imagestore.Hash, now time.Time) (imagestore.Ticket, error) {
	s.mu.Lock()
	s.arrived++
	if s.arrived == s.want {
		close(s.met)
	}
	s.mu.Unlock()
	select {
	case <-s.met:
	case <-time.After(waitBound):
		s.mu.Lock()
		s.missed = true
		s.mu.Unlock()
	}
	return s.Store.ConsumeTicket(ctx, ticket, now)
}

// TestUploadSameTicketTwice: two PUTs on one ticket both pass admission
// and reach the store's conditional consume at once; exactly one wins.
func TestUploadSameTicketTwice(t *testing.T) {
	needQemu(t)
	body := mustRead(t, makeImage(t, "64M"))
	meet := &meetingStore{want: 2, met: make(chan struct{})}
	e := startEnv(t, t.TempDir(), filepath.Join(t.TempDir(), "vmshelf.db"), nil, func(st imagestore.Store) imagestore.Store {
		meet.Store = st
		return meet
	})
	url, id := e.ticket()
	type answer struct {
		code   int
		reason string
		err    error
	}
	answers := make(chan answer, 2)
	for i := 0; i < 2; i++ {
		go func() {
			req, err := http.NewRequest(http.MethodPut, url, bytes.NewReader(body))
			if err != nil {
				answers <- answer{err: err}
				return
			}
			resp, err := testClient.Do(req)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			var eb apierr.Body
			if resp.StatusCode != 201 {
				err = json.NewDecoder(resp.Body).Decode(&eb)
			}
			answers <- answer{code: resp.StatusCode, reason: eb.Reason, err: err}
		}()
	}
	a, b := within(t, answers, "the first PUT's answer"), within(t, answers, "the second PUT's answer")
	if a.err != nil || b.err != nil {
		t.Fatalf("PUTs: %v, %v", a.err, b.err)
	}
	meet.mu.Lock()
	arrived, missed := meet.arrived, meet.missed
	meet.mu.Unlock()
	if arrived != 2 || missed {
		t.Fatalf("%d PUTs reached ConsumeTicket together (missed %v), want 2: the race was not exercised", arrived, missed)
	}
	if a.code == 201 {
		a, b = b, a
	}
	if b.code != 201 || a.code != 410 || a.reason != "ticketUsed" {
		t.Fatalf("two PUTs on one ticket answered %d and %d %s, want 201 and 410 ticketUsed", b.code, a.code, a.reason)
	}
	for range 2 {
		e.waitSlotFreed(dirUpload)
	}
	e.assertNothingLeft(id)
	if got := testutil.ToFloat64(e.g.metrics.consumed); got != 1 {
		t.Errorf("tickets consumed = %v, want 1", got)
	}
}

func TestUploadQuotaAtCommit(t *testing.T) {
	needQemu(t)
	needTool(t, "curl")
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
	e.waitSlotFreed(dirUpload)
	e.waitSlotFreed(dirUpload)
	e.assertNothingLeft(id1)
	e.assertTicket(u2, true)
}

// unclearAddStore writes the image's record and then reports an error, as
// a PostgreSQL connection lost during COMMIT does: the store cannot say
// whether the record is there.
type unclearAddStore struct{ imagestore.Store }

func (s unclearAddStore) AddImage(ctx context.Context, img imagestore.Image, quota int) error {
	if err := s.Store.AddImage(ctx, img, quota); err != nil {
		return err
	}
	return errors.New("connection lost while committing")
}

// TestUploadUnclearRecordKeepsFile: when the store's answer to the record
// write is unclear, the committed file stays (the record may name it);
// only a refusal the store is sure of (TestUploadQuotaAtCommit) removes it.
func TestUploadUnclearRecordKeepsFile(t *testing.T) {
	needQemu(t)
	needTool(t, "curl")
	good := makeImage(t, "64M")
	e := startEnv(t, t.TempDir(), filepath.Join(t.TempDir(), "vmshelf.db"), nil, func(st imagestore.Store) imagestore.Store {
		return unclearAddStore{st}
	})
	u, id := e.ticket()
	if code, b := curlPut(t, u, good); code != 500 {
		t.Fatalf("PUT: %d %v, want 500 (the record's fate is unknown)", code, b)
	}
	e.waitSlotFreed(dirUpload)
	ctx := context.Background()
	if _, err := e.st.Image(ctx, id); err != nil {
		t.Fatalf("the record the store wrote: %v", err)
	}
	b, err := e.blobs.Open(ctx, id)
	if err != nil {
		t.Fatalf("the recorded image's file was deleted on an unclear answer: %v", err)
	}
	b.Close()
	if got, want := fileSHA256(t, filepath.Join(e.dir, id+".qcow2")), fileSHA256(t, good); got != want {
		t.Errorf("kept file's SHA-256 %s, want the upload's %s", got, want)
	}
}
