package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTransferEncodingNotChunked: a Transfer-Encoding other than chunked is
// 400 and the connection closes, so bytes after the head never run as a
// second request.
func TestTransferEncodingNotChunked(t *testing.T) {
	e := newEnv(t, nil)
	up, _ := e.ticket()
	for _, te := range []string{"identity", "gzip, chunked", "IDENTITY"} {
		smuggled := "GET /no-such-route HTTP/1.1\r\nHost: x\r\n\r\n"
		rc := openRaw(t, e.base, "POST "+strings.TrimPrefix(up, e.base)+" HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n"+
			"Upload-Length: 100\r\nTransfer-Encoding: "+te)
		rc.send([]byte(smuggled), "the smuggled request")
		resp, body := rc.answer("Transfer-Encoding: " + te)
		if resp.StatusCode != 400 || errorOf(t, bytes.NewReader(body)).Reason != "badRequest" || !resp.Close {
			t.Errorf("Transfer-Encoding: %s: %d %s close=%v, want 400 badRequest and close", te, resp.StatusCode, body, resp.Close)
		}
		if r2, b2, err := rc.readAnswer(); err == nil {
			t.Errorf("Transfer-Encoding: %s: the smuggled request was answered: %d %s", te, r2.StatusCode, b2)
		} else if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
			// (A close with the smuggled bytes unread may be a reset.)
			t.Errorf("Transfer-Encoding: %s: after the 400: %v, want the connection closed", te, err)
		}
	}
	// The ticket was not used by any of it.
	e.assertTicket(up, false)
}

// TestHeaderTimeout408: a client that sends half a head and waits gets 408
// requestTimeout in our JSON after the read timeout, not 400.
func TestHeaderTimeout408(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.IdleTimeout = 500 * time.Millisecond })
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(e.base, "http://"), waitBound)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(waitBound)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET /market/vm-images/fetch/x HTTP/1.1\r\nHost: x\r\nX-Half: "); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("half a head: %v, want a 408 answer", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 408 || errorOf(t, bytes.NewReader(body)).Reason != "requestTimeout" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("half a head: %d %s %q, want 408 requestTimeout in JSON", resp.StatusCode, body, resp.Header.Get("Content-Type"))
	}
}

func TestParseRange(t *testing.T) {
	const size = 1000
	for _, c := range []struct {
		h              string
		off, n         int64
		ok, satisfying bool
	}{
		{"bytes=0-1", 0, 2, true, true},
		{"Bytes=0-1", 0, 2, true, true},
		{"BYTES=10-", 10, 990, true, true},
		{"bytes=0-99999999999999999999", 0, size, true, true},
		{"bytes=5-99999999999999999999999999999", 5, size - 5, true, true},
		{"bytes=-99999999999999999999", 0, size, true, true},
		{"bytes=-10", 990, 10, true, true},
		// One byte: N-N is that byte alone, at the first, a middle and
		// the last position; -1 is the last byte.
		{"bytes=0-0", 0, 1, true, true},
		{"bytes=5-5", 5, 1, true, true},
		{"bytes=999-999", 999, 1, true, true},
		{"bytes=999-", 999, 1, true, true},
		{"bytes=-1", 999, 1, true, true},
		{"bytes=-1000", 0, size, true, true},
		{"bytes=-0", 0, 0, true, false},
		{"bytes=6-5", 0, 0, false, false},
		{"bytes=99999999999999999999-", 0, 0, true, false},
		{"bytes=1000-1001", 0, 0, true, false},
		{"bytes=+1-2", 0, 0, false, false},
		{"bytes=2-1", 0, 0, false, false},
		{"bytes=0-1,3-4", 0, 0, false, false},
		{"items=0-1", 0, 0, false, false},
		{"bytes", 0, 0, false, false},
	} {
		off, n, ok, sat := parseRange(c.h, size)
		if off != c.off || n != c.n || ok != c.ok || sat != c.satisfying {
			t.Errorf("%q: %d %d %v %v, want %d %d %v %v", c.h, off, n, ok, sat, c.off, c.n, c.ok, c.satisfying)
		}
	}
}

// TestRangeFormsServed: the same forms through the server give 206.
func TestRangeFormsServed(t *testing.T) {
	needQemu(t)
	e := newEnv(t, nil)
	id, data := e.stored(makeImage(t, "64M"))
	url := e.fetchURL(id, time.Hour)
	size := strconv.Itoa(len(data))
	for _, c := range []struct{ rng, contentRange string }{
		{"Bytes=0-1", "bytes 0-1/" + size},
		{"bytes=0-99999999999999999999", "bytes 0-" + strconv.Itoa(len(data)-1) + "/" + size},
	} {
		resp, body := get(t, "GET", url, "Range", c.rng)
		if resp.StatusCode != 206 || resp.Header.Get("Content-Range") != c.contentRange {
			t.Errorf("Range: %s: %d %q, want 206 %q", c.rng, resp.StatusCode, resp.Header.Get("Content-Range"), c.contentRange)
		}
		if want := data[:len(body)]; !bytes.Equal(body, want) || (resp.StatusCode == 206 && resp.ContentLength != int64(len(body))) {
			t.Errorf("Range: %s: wrong bytes", c.rng)
		}
		e.waitSlotFreed(dirFetch)
	}
}

// TestTusRefusedCreationNoLocation: a creation-with-upload refused for its
// body names no session.
func TestTusRefusedCreationNoLocation(t *testing.T) {
	e := newEnv(t, nil)
	junk := bytes.Repeat([]byte("not a qcow2 image "), 8)
	for _, length := range []int{0, len(junk)} {
		up, _ := e.ticket()
		resp, b := tusReq(t, "POST", up, bytes.NewReader(junk), "Upload-Length", strconv.Itoa(length),
			"Content-Type", "application/offset+octet-stream")
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Errorf("Upload-Length %d, junk body: %d %s, want a refusal", length, resp.StatusCode, b)
		}
		if loc := resp.Header.Get("Location"); loc != "" {
			t.Errorf("Upload-Length %d, refused %d %s: Location %q, want none", length, resp.StatusCode, b, loc)
		}
	}
}

// headRefused sends head (and body, if any) on a fresh connection and
// wants 400 with reason, a sentence naming what, and the connection
// closed with nothing else answered.
func headRefused(t *testing.T, base, name, head, body, reason, what string) {
	t.Helper()
	rc := openRaw(t, base, head)
	if body != "" {
		rc.send([]byte(body), name+": the body")
	}
	resp, got := rc.answer(name)
	if resp.StatusCode != 400 || errorOf(t, bytes.NewReader(got)).Reason != reason || !strings.Contains(string(got), what) || !resp.Close {
		t.Errorf("%s: %d %.200s close=%v, want 400 %s naming %s, and close", name, resp.StatusCode, got, resp.Close, reason, what)
	}
	if r2, b2, err := rc.readAnswer(); err == nil {
		t.Errorf("%s: a second answer after the refusal: %d %.200s", name, r2.StatusCode, b2)
	}
}

// TestRepeatedHeaderRefused: a header of one value in two lines is 400
// repeatedHeader before the body is read, on every route: the ticket
// stays unused and the session where it was. fasthttp alone would read
// the first Upload-Offset (or Range) and the last Content-Type.
func TestRepeatedHeaderRefused(t *testing.T) {
	e := newEnv(t, nil)
	up, _ := e.ticket()
	sess, _ := e.create(1 << 20)
	put := "PUT " + strings.TrimPrefix(up, e.base) + " HTTP/1.1\r\nHost: x\r\n"
	post := "POST " + strings.TrimPrefix(up, e.base) + " HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n"
	patch := "PATCH " + strings.TrimPrefix(sess, e.base) + " HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n" +
		"Content-Type: application/offset+octet-stream\r\n"
	junk := strings.Repeat("x", 100)
	for _, c := range []struct{ name, head, body, what string }{
		{"PUT, two Content-Type", put + "Content-Type: application/octet-stream\r\nContent-Type: text/plain\r\nContent-Length: 100", junk, "Content-Type"},
		{"PUT, 100-continue, two Content-Type", put + "Content-Type: a/b\r\nContent-Type: c/d\r\nContent-Length: 100\r\nExpect: 100-continue", "", "Content-Type"},
		{"POST, Upload-Length 0 then 100", post + "Upload-Length: 0\r\nUpload-Length: 100", "", "Upload-Length"},
		{"POST, two Tus-Resumable", post + "Tus-Resumable: 1.0.0\r\nUpload-Length: 100", "", "Tus-Resumable"},
		{"PATCH, Upload-Offset 0 then 100", patch + "Upload-Offset: 0\r\nupload-offset: 100\r\nContent-Length: 100", junk, "Upload-Offset"},
		{"fetch, two Range", "GET /market/vm-images/fetch/" + strings.Repeat("a", 64) + " HTTP/1.1\r\nHost: x\r\nRange: bytes=0-1\r\nRange: bytes=2-3", "", "Range"},
		{"preflight, two Origin", "OPTIONS " + strings.TrimPrefix(up, e.base) + " HTTP/1.1\r\nHost: x\r\nOrigin: http://a\r\nOrigin: http://b\r\n" +
			"Access-Control-Request-Method: PUT", "", "Origin"},
	} {
		headRefused(t, e.base, c.name, c.head, c.body, "repeatedHeader", c.what)
	}
	// fasthttp's own refusals of a repeat get the same answer.
	for h, lines := range map[string]string{
		"Content-Length":    "Content-Length: 100\r\nContent-Length: 100",
		"Host":              "Host: y",
		"Transfer-Encoding": "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
	} {
		headRefused(t, e.base, "PUT, two "+h, put+lines, "", "repeatedHeader", h)
	}
	e.assertTicket(up, false)
	wantOffset(t, sess, 0, "after the refused PATCH")
	// Lists may repeat: not refused.
	resp, b := rawRequest(t, e.base, put+"Accept: */*\r\nAccept: text/plain\r\nX-Forwarded-For: 192.0.2.1\r\nX-Forwarded-For: 192.0.2.2\r\n"+
		"Content-Length: 100", strings.NewReader(junk))
	if resp.StatusCode != 415 {
		t.Errorf("PUT with repeated lists: %d %s, want 415 notQcow2 (read as usual)", resp.StatusCode, b)
	}
}

// TestBothLengthsRefused: a body framed both by Content-Length and by
// Transfer-Encoding (and a Transfer-Encoding on HTTP/1.0) is 400
// ambiguousLength and the connection closes; fasthttp alone would read
// it as chunked, the way a proxy that took the length does not.
func TestBothLengthsRefused(t *testing.T) {
	e := newEnv(t, nil)
	up, _ := e.ticket()
	sess, _ := e.create(1 << 20)
	chunks := "64\r\n" + strings.Repeat("x", 100) + "\r\n0\r\n\r\n"
	for _, c := range []struct{ name, head string }{
		{"PUT", "PUT " + strings.TrimPrefix(up, e.base) + " HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nTransfer-Encoding: chunked"},
		{"PUT, length after coding", "PUT " + strings.TrimPrefix(up, e.base) + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 100"},
		{"PATCH", "PATCH " + strings.TrimPrefix(sess, e.base) + " HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\nUpload-Offset: 0\r\n" +
			"Content-Type: application/offset+octet-stream\r\nContent-Length: 100\r\nTransfer-Encoding: chunked"},
		{"PUT over HTTP/1.0", "PUT " + strings.TrimPrefix(up, e.base) + " HTTP/1.0\r\nHost: x\r\nContent-Length: 100\r\nTransfer-Encoding: chunked"},
	} {
		headRefused(t, e.base, c.name, c.head, chunks, "ambiguousLength", "Transfer-Encoding")
	}
	e.assertTicket(up, false)
	wantOffset(t, sess, 0, "after the refused PATCH")
}

// TestIfNoneMatchLines: If-None-Match is a list; in two lines it is one
// list, and the image named by the second line is not sent again.
func TestIfNoneMatchLines(t *testing.T) {
	needQemu(t)
	e := newEnv(t, nil)
	id, data := e.stored(makeImage(t, "64M"))
	url := e.fetchURL(id, time.Hour)
	resp, b := rawRequest(t, e.base, "GET "+strings.TrimPrefix(url, e.base)+" HTTP/1.1\r\nHost: x\r\n"+
		"If-None-Match: \"other\"\r\nIf-None-Match: W/\"other\", \""+sha(data)+"\"", nil)
	if resp.StatusCode != 304 {
		t.Errorf("If-None-Match naming the image in its second line: %d with %d bytes, want 304", resp.StatusCode, len(b))
	}
}
