package market

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Bodies must be declared JSON (415 otherwise), and be JSON that
// encoding/json alone would misread: duplicate keys (it keeps the last),
// keys in another case (it matches case-insensitively) and invalid UTF-8
// (it substitutes U+FFFD) are 400 badRequest.
func TestStrictBody(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ImagesPerTenant = 100 })
	_, token := e.tenant("alice", true)
	const json = "application/json"
	cases := []struct {
		name   string
		path   string
		ct     string // "" sends none
		body   string
		status int
		reason string
	}{
		{"no content type", "/market/vm-images/ticket", "", `{"name":"disk"}`, 415, "unsupportedMediaType"},
		{"text/plain", "/market/vm-images/ticket", "text/plain", `{"name":"disk"}`, 415, "unsupportedMediaType"},
		{"form", "/market/vm-images/ticket", "application/x-www-form-urlencoded", `{"name":"disk"}`, 415, "unsupportedMediaType"},
		{"json with another charset", "/market/vm-images/ticket", "application/json; charset=latin1", `{"name":"disk"}`, 415, "unsupportedMediaType"},
		{"json suffix type", "/market/vm-images/ticket", "application/problem+json", `{"name":"disk"}`, 415, "unsupportedMediaType"},
		{"malformed content type", "/market/vm-images/ticket", "application/json; charset", `{"name":"disk"}`, 415, "unsupportedMediaType"},
		{"status without content type", "/market/vms/status", "", `{}`, 415, "unsupportedMediaType"},
		{"remove without content type", "/market/vm-images/remove", "", `{"upload_id":"000000000000000000000000"}`, 415, "unsupportedMediaType"},
		{"duplicate key", "/market/vm-images/ticket", json, `{"name":"disk","name":"other"}`, 400, "badRequest"},
		{"duplicate key escaped", "/market/vm-images/ticket", json, `{"name":"disk","na\u006de":"other"}`, 400, "badRequest"},
		{"duplicate bool", "/market/vm-images/ticket", json, `{"name":"disk","efi":true,"efi":false}`, 400, "badRequest"},
		{"upper-case key", "/market/vm-images/ticket", json, `{"NAME":"disk"}`, 400, "badRequest"},
		{"mixed-case key", "/market/vm-images/ticket", json, `{"name":"disk","Efi":true}`, 400, "badRequest"},
		{"case-mismatched remove", "/market/vm-images/remove", json, `{"Upload_ID":"000000000000000000000000"}`, 400, "badRequest"},
		{"invalid UTF-8 in value", "/market/vm-images/ticket", json, "{\"name\":\"disk\xff\"}", 400, "badRequest"},
		{"invalid UTF-8 in key", "/market/vm-images/ticket", json, "{\"name\xc3\":\"disk\"}", 400, "badRequest"},
		{"overlong UTF-8", "/market/vm-images/ticket", json, "{\"name\":\"\xc0\xafdisk\"}", 400, "badRequest"},
		{"UTF-8 surrogate", "/market/vm-images/ticket", json, "{\"name\":\"\xed\xa0\x80\"}", 400, "badRequest"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.ts.URL+c.path, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+token)
			if c.ct != "" {
				req.Header.Set("Content-Type", c.ct)
			}
			wantError(t, e.send(req), c.status, c.reason)
		})
	}

	// The other side: JSON in any case of the media type, with UTF-8
	// declared or not; an empty status body needs no type.
	for _, ct := range []string{"application/json", "Application/JSON", "application/json; charset=utf-8", "application/json;charset=UTF-8"} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.ts.URL+"/market/vm-images/ticket",
			strings.NewReader(`{"name":"disk é","efi":true}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", ct)
		if r := e.send(req); r.status != http.StatusCreated {
			t.Errorf("Content-Type %q: status %d: %s", ct, r.status, r.body)
		} else {
			var got struct{ Ticket string }
			decode(t, r, &got)
			e.remember(got.Ticket)
		}
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.ts.URL+"/market/vms/status", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if r := e.send(req); r.status != http.StatusOK {
		t.Errorf("empty status body without Content-Type: %d %s", r.status, r.body)
	}
}

// rawTimeout bounds each raw connection of a test: the answers it waits
// for come after at most a 300 ms body timeout, or at once.
const rawTimeout = 10 * time.Second

// rawConn is a bare TCP client for what net/http's client will not do:
// send headers and then dribble, or withhold, the body.
type rawConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, e *env) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", e.ts.Listener.Addr().String(), rawTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Every read and write of the test is bounded by this.
	if err := c.SetDeadline(time.Now().Add(rawTimeout)); err != nil {
		t.Fatal(err)
	}
	return &rawConn{t: t, c: c, r: bufio.NewReader(c)}
}

func (rc *rawConn) write(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
}

// dribble writes one byte of body every interval until the connection
// fails or done closes; it returns when it stops.
func (rc *rawConn) dribble(interval time.Duration, done <-chan struct{}) <-chan struct{} {
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if _, err := rc.c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	return stopped
}

// answer reads one response and checks it is the edge's error with
// Connection: close, followed by the end of the connection.
func (rc *rawConn) answer(status int, reason string) {
	rc.t.Helper()
	res, err := http.ReadResponse(rc.r, nil)
	if err != nil {
		rc.t.Fatalf("no answer within %v: %v", rawTimeout, err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		rc.t.Fatalf("reading the answer: %v", err)
	}
	wantError(rc.t, response{status: res.StatusCode, header: res.Header, body: body}, status, reason)
	if !res.Close {
		rc.t.Errorf("answer without Connection: close (header %v)", res.Header)
	}
	// A close with the client's bytes still unread in the server's
	// buffer is a reset rather than an orderly EOF; both are the end.
	if n, err := rc.r.Read(make([]byte, 1)); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		rc.t.Errorf("after the answer: read %d bytes, err %v; want the server to close (EOF or reset)", n, err)
	}
}

// A body that does not arrive in time is 408 requestTimeout and the
// connection is closed, also when the client keeps it trickling.
func TestBodyTimeout(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.BodyTimeout = 300 * time.Millisecond })
	_, token := e.tenant("alice", true)
	for _, route := range []string{"/market/vm-images/ticket", "/market/vms/status", "/market/vm-images/remove"} {
		for _, how := range []string{"withheld", "dribbled", "chunked"} {
			ok := t.Run(route+"/"+how, func(t *testing.T) {
				rc := dialRaw(t, e)
				hdr := "POST " + route + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token +
					"\r\nContent-Type: application/json\r\n"
				if how == "chunked" {
					rc.write(hdr + "Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n")
				} else {
					rc.write(hdr + "Content-Length: 4000\r\n\r\n{")
				}
				if how != "withheld" {
					done := make(chan struct{})
					stopped := rc.dribble(50*time.Millisecond, done)
					defer func() { close(done); <-stopped }()
				}
				rc.answer(http.StatusRequestTimeout, "requestTimeout")
			})
			if !ok {
				return // the others would wait as long for the same reason
			}
		}
	}
	// A body that arrives in time on the same kind of connection is
	// served, and the connection stays open for the next request.
	rc := dialRaw(t, e)
	body := `{"name":"disk"}`
	rc.write("POST /market/vm-images/ticket HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token +
		"\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n" + body)
	res, err := http.ReadResponse(rc.r, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Ticket string }
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	e.remember(got.Ticket)
	if res.StatusCode != http.StatusCreated || res.Close {
		t.Errorf("in time: status %d, close %v; want 201 on a kept connection", res.StatusCode, res.Close)
	}
}

// A request refused before its body is read (no token, no route, wrong
// method) is answered at once, with Connection: close, however slowly its
// body comes: net/http would otherwise drain the body first.
func TestRefusalDoesNotWaitForBody(t *testing.T) {
	// A body timeout far beyond the client's bound: only an answer that
	// does not wait for the body passes.
	e := newEnv(t, func(c *Config) { c.BodyTimeout = time.Hour })
	_, token := e.tenant("alice", true)
	cases := []struct {
		name, request string
		status        int
		reason        string
	}{
		{"no token", "POST /market/vm-images/ticket HTTP/1.1\r\n", 401, "unauthorized"},
		{"unknown token", "POST /market/vms/status HTTP/1.1\r\nAuthorization: Bearer " + strings.Repeat("0", 64) + "\r\n", 401, "unauthorized"},
		{"no route", "POST /market/nothing HTTP/1.1\r\n", 404, "notFound"},
		{"wrong method", "PUT /market/vm-images/ticket HTTP/1.1\r\nAuthorization: Bearer " + token + "\r\n", 405, "methodNotAllowed"},
		{"not JSON", "POST /market/vm-images/ticket HTTP/1.1\r\nAuthorization: Bearer " + token + "\r\nContent-Type: text/plain\r\n", 415, "unsupportedMediaType"},
	}
	for _, c := range cases {
		for _, how := range []string{"withheld", "dribbled"} {
			ok := t.Run(c.name+"/"+how, func(t *testing.T) {
				rc := dialRaw(t, e)
				hdr := c.request
				if !strings.Contains(hdr, "Content-Type") {
					hdr += "Content-Type: application/json\r\n"
				}
				rc.write(hdr + "Host: x\r\nContent-Length: 4000\r\n\r\n{")
				if how == "dribbled" {
					done := make(chan struct{})
					stopped := rc.dribble(50*time.Millisecond, done)
					defer func() { close(done); <-stopped }()
				}
				rc.answer(c.status, c.reason)
			})
			if !ok {
				return // the others would wait as long for the same reason
			}
		}
	}
}
