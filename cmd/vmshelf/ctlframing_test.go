package main

// Process-level test of the control plane's framing: a request with a
// Transfer-Encoding (alone, or with a Content-Length as a smuggler sends
// it) ends its connection, so what follows it is never run.

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestE2EControlTransferEncodingCloses: the control plane answers a
// request that came with Transfer-Encoding (with or without a
// Content-Length) with Connection: close and closes; the request
// pipelined behind it in the same write is never answered.
func TestE2EControlTransferEncodingCloses(t *testing.T) {
	s := startServe(t, filepath.Join(t.TempDir(), "data"), nil)
	const pipelined = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
	for name, framing := range map[string]string{
		"Content-Length and chunked": "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
		"chunked alone":              "Transfer-Encoding: chunked\r\n",
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
