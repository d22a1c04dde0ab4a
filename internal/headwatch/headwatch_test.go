package headwatch

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/headerrule"
)

// serve runs an http.Server over a watched loopback listener whose
// handler judges every request first: a refusal is 400 with the reason
// and closes; otherwise it reads the body and answers 200 with the
// request's path and the body's length.
func serve(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if aerr := Judge(r); aerr != nil {
			w.Header().Set("Connection", "close")
			w.WriteHeader(aerr.Status)
			_, _ = w.Write(aerr.JSON())
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, r.URL.Path+" "+strconv.FormatInt(n, 10))
	}), ReadHeaderTimeout: 10 * time.Second}
	Configure(srv)
	go func() { _ = srv.Serve(Listen(ln)) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// exchange writes raw on a new connection, in pieces of at most piece
// bytes (0: at once), and reads answers until the server closes it.
func exchange(t *testing.T, addr, raw string, piece int) []string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		b := []byte(raw)
		for len(b) > 0 {
			n := len(b)
			if piece > 0 && n > piece {
				n = piece
			}
			if _, err := c.Write(b[:n]); err != nil {
				return
			}
			b = b[n:]
		}
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	var got []string
	r := bufio.NewReader(c)
	for {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("after %q: %v", got, err)
			}
			return got
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e apierr.Body
		if resp.StatusCode != 200 && json.Unmarshal(body, &e) == nil {
			body = []byte(e.Reason)
		}
		got = append(got, strconv.Itoa(resp.StatusCode)+" "+string(body))
	}
}

func post(path, headers, body string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: x\r\n" + headers + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

func TestJudged(t *testing.T) {
	addr := serve(t)
	const badHead = "GET /x HTTP/1.1\r\nRange: a\r\nRange: b\r\n\r\n"
	for _, c := range []struct {
		name, raw string
		want      []string
	}{
		{"one request", post("/a", "", "{}"), []string{"200 /a 2"}},
		{"Content-Length twice, the same", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\n{}",
			[]string{"400 repeatedHeader"}},
		{"Content-Length and chunked", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"2\r\n{}\r\n0\r\n\r\n" + post("/smuggled", "", ""), []string{"400 ambiguousLength"}},
		{"chunked, then Content-Length", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n" +
			"2\r\n{}\r\n0\r\n\r\n", []string{"400 ambiguousLength"}},
		{"HTTP/1.0 with Transfer-Encoding", "POST /a HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
			[]string{"400 ambiguousLength"}},
		{"two Authorization", post("/a", "Authorization: Bearer a\r\nAuthorization: Bearer b\r\n", "{}"), []string{"400 repeatedHeader"}},
		{"lists repeated", post("/a", "Accept: a/b\r\nAccept: c/d\r\nX-Forwarded-For: 192.0.2.1\r\nX-Forwarded-For: 192.0.2.2\r\n", "{}"),
			[]string{"200 /a 2"}},
		// Kept alive: each request is judged by its own head, the
		// bodies skipped, even one that looks like a bad head.
		{"pipelined", post("/a", "", "{}") + post("/b", "", badHead) +
			"GET /c HTTP/1.1\r\nHost: x\r\n\r\n" + post("/d", "Range: a\r\nRange: b\r\n", "") + post("/e", "", ""),
			[]string{"200 /a 2", "200 /b " + strconv.Itoa(len(badHead)), "200 /c 0", "400 repeatedHeader"}},
		{"folded line, LF line ends", "POST /a HTTP/1.1\nHost: x\nX-Long: a\n Range: b\nRange: c\nContent-Length: 1\n\nxGET /b HTTP/1.1\nHost: x\n\n",
			[]string{"200 /a 1", "200 /b 0"}},
		{"OPTIONS * reaches the handler", "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n" + post("/a", "Range: a\r\nRange: b\r\n", ""),
			[]string{"200 * 0", "400 repeatedHeader"}},
		// Not closed after a chunked request (the control plane closes):
		// the next request is not followed, so it is refused.
		{"after a chunked request", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n" + post("/b", "", ""),
			[]string{"200 /a 2", "400 ambiguousLength"}},
	} {
		for _, piece := range []int{0, 1, 7} {
			got := exchange(t, addr, c.raw, piece)
			if strings.Join(got, " | ") != strings.Join(c.want, " | ") {
				t.Errorf("%s (written %d bytes at a time): %q, want %q", c.name, piece, got, c.want)
			}
		}
	}
}

// A request that did not come through a watched connection is not judged.
func TestUnwatchedNotJudged(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
	r.Header["Content-Type"] = []string{"a/b", "c/d"}
	if aerr := Judge(r); aerr != nil {
		t.Errorf("%v, want nil", aerr)
	}
}

// A Content-Length net/http does not take (it answers 400 and closes)
// stops the following; the heads before it keep their verdicts.
func TestLengthsNotNumbers(t *testing.T) {
	for _, v := range []string{"", "x", "+1", "-1", "1 2", "9223372036854775808", strings.Repeat("1", 40)} {
		var c Conn
		c.watch([]byte(post("/a", "", "") + "POST /b HTTP/1.1\r\nContent-Length: " + v + "\r\n\r\n"))
		if !c.stopped || len(c.pending) != 2 {
			t.Errorf("Content-Length %q: stopped %v with %d heads, want stopped with 2", v, c.stopped, len(c.pending))
		}
	}
	var c Conn
	c.watch([]byte("POST /a HTTP/1.1\r\nContent-Length:  9223372036854775807 \r\n\r\n"))
	if c.stopped || c.scan.body != 1<<63-1 {
		t.Errorf("the largest length: stopped %v, %d body bytes to come", c.stopped, c.scan.body)
	}
}

// More heads read ahead than any server holds stops the following.
func TestPendingBounded(t *testing.T) {
	var c Conn
	c.watch([]byte(strings.Repeat("GET / HTTP/1.1\r\nHost: x\r\n\r\n", maxPending+10)))
	if !c.stopped || len(c.pending) > maxPending+1 {
		t.Errorf("stopped %v with %d heads pending, want stopped with at most %d", c.stopped, len(c.pending), maxPending+1)
	}
}

func TestRefusalsAreTheRules(t *testing.T) {
	if !errors.Is(unfollowed, headerrule.AmbiguousLength) {
		t.Error("the answer to an unfollowed connection is not an ambiguousLength")
	}
}
