package gateway

import (
	"fmt"
	"strings"
	"testing"
)

// TestFastHTTPLogRedacted: fasthttp logs a request it cannot parse with
// the start of its bytes, request line (and so the ticket in the URI)
// included; the gateway's logger must redact it before it is written.
func TestFastHTTPLogRedacted(t *testing.T) {
	e := newEnv(t, nil)
	url, _ := e.ticket()
	ticket := capabilityOf(url)
	// A header line without a colon: fasthttp refuses the request and
	// logs the buffer it read.
	rc := openRaw(t, e.base, fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\nthis header line has no colon", strings.TrimPrefix(url, e.base)))
	resp, _ := rc.answer("a request with a broken header")
	if resp.StatusCode != 400 {
		t.Fatalf("broken header: %d, want 400", resp.StatusCode)
	}
	line := e.logHas("component=fasthttp", "error when reading request headers")
	if !strings.Contains(line, uploadPrefix+"[redacted]") {
		t.Errorf("fasthttp's line does not show the redacted URI: %s", line)
	}
	if strings.Contains(line, ticket) {
		t.Errorf("fasthttp's line holds the ticket: %s", line)
	}
	e.assertTicket(url, false)
	// And after the shutdown, still nothing (the env's cleanup checks
	// every line again, the shutdown's too).
	e.stop()
	e.assertLogClean()
}
