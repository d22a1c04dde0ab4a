package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestE2EAPITour sends the binary one request of each operation (and
// answer) of docs/openapi.yaml that the other end-to-end tests make only
// through processes of their own (curl in README blocks, vmshelf upload,
// the browser): tus creation with and without bytes, PATCH with its
// refusals, DELETE, OPTIONS, a CORS preflight, the page's files, HEAD on
// the control plane, 404/405 on both planes, fetch HEAD, 304 and 416. Each
// answer is asserted here and validated against the document by
// httpClient (apivalidator_test.go).
func TestE2EAPITour(t *testing.T) {
	dir := t.TempDir()
	s := startServe(t, filepath.Join(dir, "data"), nil)
	disk, data := makeImage(t, dir, "tour.qcow2")

	call := func(method, url string, body []byte, header ...string) (*http.Response, []byte) {
		t.Helper()
		var r io.Reader
		if body != nil {
			r = bytes.NewReader(body)
		}
		req, err := http.NewRequest(method, url, r)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		return resp, b
	}
	want := func(what string, resp *http.Response, body []byte, status int, reason string) {
		t.Helper()
		if reason != "" {
			wantError(t, what, resp.StatusCode, body, status, reason)
		} else if resp.StatusCode != status {
			t.Errorf("%s: %d %s, want %d", what, resp.StatusCode, body, status)
		}
	}
	tus := []string{"Tus-Resumable", "1.0.0"}
	octets := "application/offset+octet-stream"

	// tus: discovery, creation with the first bytes, resumption.
	tk := s.ticket(t, "tour")
	resp, body := call(http.MethodOptions, tk.UploadURL, nil)
	want("OPTIONS upload", resp, body, http.StatusNoContent, "")
	if resp.Header.Get("Tus-Extension") == "" {
		t.Errorf("OPTIONS upload: no Tus-Extension")
	}
	half := len(data) / 2
	resp, body = call(http.MethodPost, tk.UploadURL, data[:half], append(tus,
		"Upload-Length", strconv.Itoa(len(data)), "Content-Type", octets)...)
	want("POST with bytes", resp, body, http.StatusCreated, "")
	session := resp.Header.Get("Location")
	s.secret(session[strings.LastIndex(session, "/")+1:])
	if resp.Header.Get("Upload-Offset") != strconv.Itoa(half) {
		t.Errorf("POST with bytes: Upload-Offset %q, want %d", resp.Header.Get("Upload-Offset"), half)
	}
	resp, body = call(http.MethodOptions, session, nil)
	want("OPTIONS session", resp, body, http.StatusNoContent, "")
	resp, body = call(http.MethodHead, session, nil, tus...)
	want("HEAD session", resp, body, http.StatusOK, "")
	resp, body = call(http.MethodPatch, session, data[half:], "Content-Type", octets, "Upload-Offset", strconv.Itoa(half))
	want("PATCH without Tus-Resumable", resp, body, http.StatusPreconditionFailed, "tusVersion")
	resp, body = call(http.MethodPatch, session, data[half:], append(tus, "Content-Type", "application/octet-stream", "Upload-Offset", strconv.Itoa(half))...)
	want("PATCH with another type", resp, body, http.StatusUnsupportedMediaType, "badContentType")
	resp, body = call(http.MethodPatch, session, data[half:], append(tus, "Content-Type", octets, "Upload-Offset", "0")...)
	want("PATCH at the wrong offset", resp, body, http.StatusConflict, "offsetMismatch")
	resp, body = call(http.MethodPatch, session, data[half:], append(tus, "Content-Type", octets, "Upload-Offset", strconv.Itoa(half))...)
	want("PATCH the rest", resp, body, http.StatusNoContent, "")
	resp, body = call(http.MethodPost, session, nil, tus...)
	want("POST on a session", resp, body, http.StatusMethodNotAllowed, "methodNotAllowed")

	// A second session, created empty and terminated.
	tk2 := s.ticket(t, "tour 2")
	resp, body = call(http.MethodPost, tk2.UploadURL, nil, append(tus, "Upload-Length", strconv.Itoa(len(data)))...)
	want("POST without bytes", resp, body, http.StatusCreated, "")
	session2 := resp.Header.Get("Location")
	s.secret(session2[strings.LastIndex(session2, "/")+1:])
	resp, body = call(http.MethodDelete, session2, nil, tus...)
	want("DELETE session", resp, body, http.StatusNoContent, "")
	resp, body = call(http.MethodDelete, session2, nil, tus...)
	want("DELETE it again", resp, body, http.StatusNotFound, "sessionUnknown")
	resp, body = call(http.MethodPost, tk2.UploadURL, nil, append(tus, "Upload-Length", strconv.Itoa(len(data)))...)
	want("POST with a used ticket", resp, body, http.StatusGone, "ticketUsed")

	// The data plane's other answers.
	resp, body = call(http.MethodGet, tk.UploadURL, nil)
	want("GET on an upload URL", resp, body, http.StatusMethodNotAllowed, "methodNotAllowed")
	resp, body = call(http.MethodGet, s.dataBase+"/market/vm-images/nothing", nil)
	want("GET an unknown data path", resp, body, http.StatusNotFound, "notFound")
	resp, body = call(http.MethodOptions, s.dataBase+"/market/vm-images/upload/x", nil,
		"Origin", "http://"+s.ctlAddr, "Access-Control-Request-Method", http.MethodPatch)
	want("CORS preflight", resp, body, http.StatusNoContent, "")

	// Fetch: HEAD, a range past the end, not modified.
	fetch := s.fetchURL(t, tk.UploadID)
	resp, body = call(http.MethodHead, fetch, nil)
	want("HEAD fetch", resp, body, http.StatusOK, "")
	etag := resp.Header.Get("ETag")
	resp, body = call(http.MethodGet, fetch, nil, "Range", "bytes="+strconv.Itoa(len(data))+"-")
	want("GET a range past the end", resp, body, http.StatusRequestedRangeNotSatisfiable, "rangeNotSatisfiable")
	resp, body = call(http.MethodGet, fetch, nil, "If-None-Match", etag)
	want("GET with its ETag", resp, body, http.StatusNotModified, "")
	resp, body = call(http.MethodGet, fetch, nil, "Range", "bytes=0-0")
	want("GET one byte", resp, body, http.StatusPartialContent, "")

	// The control plane: HEAD of a GET route, the page, 405.
	resp, body = call(http.MethodHead, s.ctlBase+"/market/vm-images", nil)
	want("HEAD catalogue", resp, body, http.StatusOK, "")
	resp, body = call(http.MethodGet, s.ctlBase+"/machines", nil)
	want("GET the page", resp, body, http.StatusOK, "")
	resp, body = call(http.MethodGet, s.ctlBase+"/machines", nil, "If-None-Match", resp.Header.Get("ETag"))
	want("GET the page again", resp, body, http.StatusNotModified, "")
	resp, body = call(http.MethodHead, s.ctlBase+"/machines/app.js", nil)
	want("HEAD the page's script", resp, body, http.StatusOK, "")
	resp, body = call(http.MethodGet, s.ctlBase+"/market/vm-images/ticket", nil)
	want("GET the ticket route", resp, body, http.StatusMethodNotAllowed, "methodNotAllowed")
	resp, body = call(http.MethodGet, s.ctlBase+"/market/vm-images/", nil)
	want("GET an unknown control path", resp, body, http.StatusNotFound, "notFound")
	if !bytes.Contains(body, []byte("docs/api.md")) {
		t.Errorf("the control plane's 404 %s does not name docs/api.md, where the routes are", body)
	}
	if _, err := os.Stat(filepath.Join("..", "..", "docs", "api.md")); err != nil {
		t.Errorf("the 404 names docs/api.md: %v", err)
	}

	// The image the tour uploaded is the file.
	back := filepath.Join(dir, "back.qcow2")
	if code, _ := curlTo(t, back, fetch); code != http.StatusOK {
		t.Fatalf("fetch: %d", code)
	}
	if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the image fetched back differs from %s (%v)", disk, err)
	}
}
