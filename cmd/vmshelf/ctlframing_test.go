package main

// Process-level tests of the control plane's framing: a request with a
// Transfer-Encoding ends its connection, so what follows it is never run;
// one framed two ways, or with a header of one value given twice, is
// refused before its handler runs.

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestE2EControlTransferEncodingCloses: the control plane answers a
// request that came with Transfer-Encoding with Connection: close and
// closes; the request pipelined behind it in the same write is never
// answered. (One that also has a Content-Length is refused:
// TestE2EControlOneReadingOfHeaders.)
func TestE2EControlTransferEncodingCloses(t *testing.T) {
	s := startServe(t, filepath.Join(t.TempDir(), "data"), nil)
	const pipelined = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
	for name, framing := range map[string]string{
		"chunked alone": "Transfer-Encoding: chunked\r\n",
	} {
		c, err := net.DialTimeout("tcp", s.ctlAddr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		_, err = io.WriteString(c, "POST /market/vms/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+s.token+"\r\n"+
			"Content-Type: application/json\r\n"+framing+"\r\n2\r\n{}\r\n0\r\n\r\n"+pipelined)
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("%s: no answer: %v", name, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d, want 200 (the chunked body is the request's)", name, resp.StatusCode)
		}
		if !resp.Close {
			t.Errorf("%s: the answer does not say Connection: close", name)
		}
		if r2, err := http.ReadResponse(r, nil); err == nil {
			t.Errorf("%s: the request pipelined behind it was answered: %d", name, r2.StatusCode)
		} else if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s: after the answer: %v, want the connection closed", name, err)
		}
		c.Close()
	}
}

// TestE2EControlOneReadingOfHeaders: the control plane refuses, 400 in
// its JSON shape with a sentence that names the header, a request that
// gives a header of one value twice (Authorization, Content-Type, even
// Content-Length twice with the same value, which net/http itself would
// merge), or frames its body both by Content-Length and by
// Transfer-Encoding (which net/http would read as chunked), and closes
// the connection; the request's handler never runs: no ticket is issued.
// Headers whose value is a list may be repeated.
func TestE2EControlOneReadingOfHeaders(t *testing.T) {
	s := startServe(t, filepath.Join(t.TempDir(), "data"), nil)
	ticket := "POST /market/vm-images/ticket HTTP/1.1\r\nHost: x\r\n"
	auth := "Authorization: Bearer " + s.token + "\r\n"
	json := "Content-Type: application/json\r\n"
	const body = `{"name":"twice","efi":false}`
	length := "Content-Length: " + strconv.Itoa(len(body)) + "\r\n"
	chunked := "Transfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n\r\n"
	const pipelined = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, c := range []struct{ name, raw, reason, what string }{
		{"two Authorization", ticket + auth + "Authorization: Bearer " + strings.Repeat("0", 64) + "\r\n" + json + length + "\r\n" + body,
			"repeatedHeader", "Authorization"},
		{"two Content-Type", ticket + auth + json + "Content-Type: text/plain\r\n" + length + "\r\n" + body,
			"repeatedHeader", "Content-Type"},
		{"Content-Length twice, the same", ticket + auth + json + length + length + "\r\n" + body,
			"repeatedHeader", "Content-Length"},
		{"Content-Length and chunked", ticket + auth + json + length + chunked + pipelined,
			"ambiguousLength", "Transfer-Encoding"},
		{"HTTP/1.0 with Transfer-Encoding", strings.Replace(ticket, "HTTP/1.1", "HTTP/1.0", 1) + auth + json + length +
			"Transfer-Encoding: chunked\r\n\r\n" + body, "ambiguousLength", "Transfer-Encoding"},
		{"two Stripe-Signature", "POST /market/stripe/webhook HTTP/1.1\r\nHost: x\r\nStripe-Signature: t=1,v1=aa\r\n" +
			"Stripe-Signature: t=2,v1=bb\r\n" + json + "Content-Length: 2\r\n\r\n{}", "repeatedHeader", "Stripe-Signature"},
		{"two Sec-WebSocket-Key", "GET /market/vms/console?ticket=x HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n" +
			"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" +
			"Sec-WebSocket-Key: b3RoZXIgc2FtcGxlIG5vbmNl\r\n\r\n", "repeatedHeader", "Sec-WebSocket-Key"},
	} {
		refusedHead(t, s.ctlAddr, c.name, c.raw, c.reason, c.what)
	}
	if st := s.status(t, s.token); len(st.Tickets) != 0 {
		t.Errorf("tickets after the refused requests: %+v, want none", st.Tickets)
	}

	// Lists may come in several lines; a request after them on the same
	// connection is read as usual.
	rc := dialRaw(t, s.ctlAddr)
	resp, got := rc.exchange(t, "POST /market/vms/status HTTP/1.1\r\nHost: x\r\n"+auth+"Accept: text/plain\r\n"+
		"Accept: application/json\r\nX-Forwarded-For: 192.0.2.1\r\nX-Forwarded-For: 192.0.2.2\r\nContent-Length: 0\r\n\r\n")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("status with repeated list headers: %d %s, want 200", resp.StatusCode, got)
	}
	resp, got = rc.exchange(t, ticket+auth+json+length+"\r\n"+body)
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("a ticket on the same connection afterwards: %d %s, want 201", resp.StatusCode, got)
	}
}
