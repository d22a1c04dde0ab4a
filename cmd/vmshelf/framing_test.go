package main

// Process-level tests of the data plane's strict framing through the serve
// binary: the gateway package tests the same against its in-process
// server; these prove that serve's wiring (timeouts from its flags, the
// fasthttp server it builds) keeps it.

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestE2EDataTransferEncodingNotChunked: a Transfer-Encoding other than
// chunked gets 400 badRequest and the connection closes, so the bytes
// after the head are never run as a second request; the ticket stays
// unused.
func TestE2EDataTransferEncodingNotChunked(t *testing.T) {
	s := startServe(t, filepath.Join(t.TempDir(), "data"), nil)
	tk := s.ticket(t, "smuggle")
	path := strings.TrimPrefix(tk.UploadURL, s.dataBase)
	for _, te := range []string{"identity", "gzip, chunked", "IDENTITY"} {
		c, err := net.DialTimeout("tcp", s.dataAddr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		smuggled := "GET /no-such-route HTTP/1.1\r\nHost: x\r\n\r\n"
		_, err = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\nUpload-Length: 100\r\n"+
			"Transfer-Encoding: "+te+"\r\n\r\n"+smuggled)
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("Transfer-Encoding: %s: no answer: %v", te, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantError(t, "Transfer-Encoding: "+te, resp.StatusCode, body, http.StatusBadRequest, "badRequest")
		if !resp.Close {
			t.Errorf("Transfer-Encoding: %s: the 400 does not close the connection", te)
		}
		if r2, err := http.ReadResponse(r, nil); err == nil {
			t.Errorf("Transfer-Encoding: %s: the smuggled request was answered: %d", te, r2.StatusCode)
		} else if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("Transfer-Encoding: %s: after the 400: %v, want the connection closed", te, err)
		}
		c.Close()
	}
	// The ticket was not used: a PUT with it reaches the body check
	// (415 for bytes that are no QCOW2), not 410 ticketUsed.
	code, body := curl(t, "-X", "PUT", "--data-binary", "not a qcow2 image", tk.UploadURL)
	wantError(t, "PUT with the ticket afterwards", code, body, http.StatusUnsupportedMediaType, "notQcow2")
}

// TestE2EDataHeaderTimeout408: a client that sends half a head and waits
// gets 408 requestTimeout in JSON after serve's --idle-timeout, not 400
// or a silent close.
func TestE2EDataHeaderTimeout408(t *testing.T) {
	s := startServe(t, filepath.Join(t.TempDir(), "data"), []string{"--idle-timeout", "1s"})
	c, err := net.DialTimeout("tcp", s.dataAddr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	start := time.Now()
	if _, err := io.WriteString(c, "GET /market/vm-images/fetch/x HTTP/1.1\r\nHost: x\r\nX-Half: "); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("half a head: %v after %v, want a 408 answer", err, time.Since(start))
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantError(t, "half a head", resp.StatusCode, body, http.StatusRequestTimeout, "requestTimeout")
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("408 Content-Type %q, want JSON", ct)
	}
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("408 after %v, before half the 1s idle timeout", took)
	}
}
