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
