package main

// Process-level tests of the data plane's strict framing through the serve
// binary: the gateway package tests the same against its in-process
// server; these prove that serve's wiring (timeouts from its flags, the
// fasthttp server it builds) keeps it.

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"path"
	"path/filepath"
	"strconv"
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

// rawClient is one connection to a plane on which a test writes requests
// by hand: repeated header lines, both framings at once, what no HTTP
// client library sends.
type rawClient struct {
	c net.Conn
	r *bufio.Reader
}

// dialRaw connects to addr; every read and write on it is bounded.
func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawClient{c: c, r: bufio.NewReader(c)}
}

// exchange writes raw and reads the answer to it (not to a HEAD).
func (rc *rawClient) exchange(t *testing.T, raw string) (*http.Response, []byte) {
	t.Helper()
	if _, err := io.WriteString(rc.c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(rc.r, nil)
	if err != nil {
		t.Fatalf("no answer to %q: %v", raw, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

// closed reports whether the server closed the connection without
// answering anything more (what was pipelined behind a refused request
// never runs); a connection it keeps open fails after its deadline.
func (rc *rawClient) closed() bool {
	_, err := http.ReadResponse(rc.r, nil)
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// refusedHead sends raw on a new connection and wants 400 with reason and
// a sentence that names what, and the connection closed after it.
func refusedHead(t *testing.T, addr, name, raw, reason, what string) {
	t.Helper()
	rc := dialRaw(t, addr)
	resp, body := rc.exchange(t, raw)
	if len(body) > 512 { // not an error's body: an image
		body = body[:512]
	}
	wantError(t, name, resp.StatusCode, body, http.StatusBadRequest, reason)
	if !strings.Contains(string(body), what) {
		t.Errorf("%s: the answer %s does not name %s", name, body, what)
	}
	if !resp.Close || !rc.closed() {
		t.Errorf("%s: the connection stays open after the refusal", name)
	}
}

// TestE2EDataOneReadingOfHeaders: a request that gives a header of one
// value twice (two Upload-Offset, two Upload-Length, two Range...), or
// frames its body both by Content-Length and by Transfer-Encoding, is
// refused 400 before its body is read, with a sentence that names the
// header, and the connection closes: no ticket is used, no session
// moves. Headers whose value is a list may be repeated (RFC 9110 5.3):
// their lines are read as one list.
func TestE2EDataOneReadingOfHeaders(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, filepath.Join(dir, "data"), nil)
	disk, data := makeImage(t, dir, "fetched.qcow2")
	img := s.upload(t, s.ticket(t, "fetched"), disk, data)
	fetchPath := strings.TrimPrefix(s.fetchURL(t, img.UploadID), s.dataBase)
	token := path.Base(fetchPath)
	tk := s.ticket(t, "never used")
	put := "PUT " + strings.TrimPrefix(tk.UploadURL, s.dataBase) + " HTTP/1.1\r\nHost: x\r\n"
	post := "POST " + strings.TrimPrefix(tk.UploadURL, s.dataBase) + " HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n"
	sess := tusCreate(t, s, s.ticket(t, "session"), len(data))
	patch := "PATCH " + strings.TrimPrefix(sess, s.dataBase) + " HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n" +
		"Content-Type: application/offset+octet-stream\r\n"
	get := "GET " + fetchPath + " HTTP/1.1\r\nHost: x\r\n"
	first := string(data[:100])
	for _, c := range []struct{ name, raw, reason, what string }{
		{"PUT with two Content-Type", put + "Content-Type: application/octet-stream\r\nContent-Type: text/plain\r\n" +
			"Content-Length: 100\r\n\r\n" + first, "repeatedHeader", "Content-Type"},
		{"PUT with Content-Length twice, the same", put + "Content-Length: 100\r\nContent-Length: 100\r\n\r\n" + first,
			"repeatedHeader", "Content-Length"},
		{"PUT with Transfer-Encoding twice", put + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n" +
			first + "\r\n0\r\n\r\n", "repeatedHeader", "Transfer-Encoding"},
		{"PUT with two Host", put + "Host: y\r\nContent-Length: 100\r\n\r\n" + first, "repeatedHeader", "Host"},
		{"PUT with Content-Length and chunked", put + "Content-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n" +
			first + "\r\n0\r\n\r\n", "ambiguousLength", "Transfer-Encoding"},
		{"PUT over HTTP/1.0 with Transfer-Encoding", strings.Replace(put, "HTTP/1.1", "HTTP/1.0", 1) +
			"Content-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n" + first, "ambiguousLength", "Transfer-Encoding"},
		{"PUT asking 100-continue with two Content-Type", put + "Content-Type: application/octet-stream\r\n" +
			"Content-Type: text/plain\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n", "repeatedHeader", "Content-Type"},
		{"POST with Upload-Length 0, then 100", post + "Upload-Length: 0\r\nUpload-Length: 100\r\n\r\n", "repeatedHeader", "Upload-Length"},
		{"POST with two Tus-Resumable", post + "Tus-Resumable: 1.0.0\r\nUpload-Length: 100\r\n\r\n", "repeatedHeader", "Tus-Resumable"},
		{"POST with two Upload-Metadata", post + "Upload-Length: 100\r\nUpload-Metadata: filename YQ==\r\n" +
			"Upload-Metadata: filename Yg==\r\n\r\n", "repeatedHeader", "Upload-Metadata"},
		{"PATCH with Upload-Offset 0, then 100", patch + "Upload-Offset: 0\r\nUpload-Offset: 100\r\nContent-Length: 100\r\n\r\n" + first,
			"repeatedHeader", "Upload-Offset"},
		{"PATCH with Content-Length and chunked", patch + "Upload-Offset: 0\r\nContent-Length: 100\r\n" +
			"Transfer-Encoding: chunked\r\n\r\n64\r\n" + first + "\r\n0\r\n\r\n", "ambiguousLength", "Transfer-Encoding"},
		{"GET with two Range", get + "Range: bytes=0-9\r\nRange: bytes=10-19\r\n\r\n", "repeatedHeader", "Range"},
		{"GET with two If-Range", get + "Range: bytes=0-9\r\nIf-Range: " + strconv.Quote(img.SHA256) +
			"\r\nIf-Range: \"other\"\r\n\r\n", "repeatedHeader", "If-Range"},
		{"GET by image id with two Authorization", "GET /market/vm-images/fetch/" + img.UploadID + " HTTP/1.1\r\nHost: x\r\n" +
			"Authorization: Bearer " + token + "\r\nAuthorization: Bearer " + strings.Repeat("0", 64) + "\r\n\r\n",
			"repeatedHeader", "Authorization"},
	} {
		refusedHead(t, s.dataAddr, c.name, c.raw, c.reason, c.what)
	}
	// Nothing moved: the session is where it was, and the ticket unused
	// (a PUT with it reaches the body check).
	if code, off := s.head(t, sess); code != http.StatusOK || off != 0 {
		t.Errorf("the session after the refused PATCHes: HEAD %d, Upload-Offset %d; want 200 at 0", code, off)
	}
	code, body := curl(t, "-X", "PUT", "--data-binary", "not a qcow2 image", tk.UploadURL)
	wantError(t, "PUT with the ticket afterwards", code, body, http.StatusUnsupportedMediaType, "notQcow2")

	// A list may come in several lines: they are one list. The second
	// If-None-Match line names the image: 304; repeated Accept, Cache-Control
	// and X-Forwarded-For are no refusal.
	rc := dialRaw(t, s.dataAddr)
	resp, body := rc.exchange(t, get+"If-None-Match: \"other\"\r\nIf-None-Match: "+strconv.Quote(img.SHA256)+"\r\n\r\n")
	if resp.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match in two lines, the second the image's: %d with %d bytes, want 304", resp.StatusCode, len(body))
	}
	resp, body = rc.exchange(t, get+"Range: bytes=0-9\r\nAccept: */*\r\nAccept: application/octet-stream\r\n"+
		"Cache-Control: no-cache\r\nCache-Control: no-transform\r\nX-Forwarded-For: 192.0.2.1\r\nX-Forwarded-For: 192.0.2.2\r\n\r\n")
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, data[:10]) {
		t.Errorf("repeated list headers: %d, %d bytes; want 206 with the first 10 bytes", resp.StatusCode, len(body))
	}
}
