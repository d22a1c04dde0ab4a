package market

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/headwatch"
)

// TestHeadJudged: served over watched connections, as serve does, the
// router refuses a head that reads two ways before any route runs: 400 in
// the JSON shape, the connection closed, no ticket issued.
func TestHeadJudged(t *testing.T) {
	e := newEnv(t)
	_, token := e.tenant("box", true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: e.srv.Handler(), ReadHeaderTimeout: clientTimeout}
	headwatch.Configure(srv)
	go func() { _ = srv.Serve(headwatch.Listen(ln)) }()
	t.Cleanup(func() { srv.Close() })

	const body = `{"name":"twice","efi":false}`
	ticket := "POST /market/vm-images/ticket HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + "\r\n" +
		"Content-Type: application/json\r\n"
	length := "Content-Length: " + strconv.Itoa(len(body)) + "\r\n"
	for _, c := range []struct{ name, raw, reason, what string }{
		{"two Authorization", ticket + "Authorization: Bearer x\r\n" + length + "\r\n" + body, "repeatedHeader", "Authorization"},
		{"Content-Length twice, the same", ticket + length + length + "\r\n" + body, "repeatedHeader", "Content-Length"},
		{"Content-Length and chunked", ticket + length + "Transfer-Encoding: chunked\r\n\r\n" +
			strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n\r\n", "ambiguousLength", "Transfer-Encoding"},
		{"two Range on an unknown path", "GET /nowhere HTTP/1.1\r\nHost: x\r\nRange: bytes=0-1\r\nRange: bytes=2-3\r\n\r\n",
			"repeatedHeader", "Range"},
	} {
		c.raw += "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" // never answered
		status, got, closed := rawExchange(t, ln.Addr().String(), c.raw)
		if status != http.StatusBadRequest || got.Reason != c.reason || !strings.Contains(got.Error, c.what) || !closed {
			t.Errorf("%s: %d %+v closed=%v, want 400 %s naming %s, and the connection closed", c.name, status, got, closed, c.reason, c.what)
		}
	}
	if tickets := e.statusTickets(token); len(tickets) != 0 {
		t.Errorf("tickets after the refusals: %v, want none", tickets)
	}
}

// rawExchange writes raw on a new connection and reads the first answer;
// closed reports that nothing else was answered before the server closed.
func rawExchange(t *testing.T, addr, raw string) (status int, got apierr.Body, closed bool) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, clientTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(clientTimeout))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("no answer to %.40q: %v", raw, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(b, &got); err != nil {
		t.Errorf("answer %d %q: not the JSON error shape", resp.StatusCode, b)
	}
	_, err = http.ReadResponse(r, nil)
	closed = errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
	return resp.StatusCode, got, closed
}
