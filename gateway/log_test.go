package gateway

import (
	"fmt"
	"strings"
	"testing"
	"time"
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

// TestLogRedactsHexRuns: a malformed capability (63 hex digits) in a URI
// is redacted in fasthttp's own line and in our refusal line.
func TestLogRedactsHexRuns(t *testing.T) {
	e := newEnv(t, nil)
	bad := strings.Repeat("c", 63)
	e.remember(bad + "c") // assertLogClean looks for either half of it
	rc := openRaw(t, e.base, "PUT "+uploadPrefix+bad+" HTTP/1.1\r\nHost: x\r\nno colon here")
	if resp, _ := rc.answer("a broken head with a 63-hex ticket"); resp.StatusCode != 400 {
		t.Fatalf("broken head: %d, want 400", resp.StatusCode)
	}
	line := e.logHas("component=fasthttp", "error when reading request headers")
	if strings.Contains(line, bad[:16]) || !strings.Contains(line, uploadPrefix+"[redacted]") {
		t.Errorf("fasthttp's line: %s, want the 63 hex digits redacted", line)
	}
	if resp, _ := get(t, "GET", e.base+fetchPrefix+bad); resp.StatusCode != 404 {
		t.Fatalf("malformed token: %d, want 404", resp.StatusCode)
	}
	line = e.logHas("msg=refused", "reason=tokenUnknown")
	for _, want := range []string{"status=404", "method=GET", "path=" + fetchPrefix + "[redacted]", "remote=127.0.0.1"} {
		if !strings.Contains(line, want) {
			t.Errorf("refusal line %s: no %s", line, want)
		}
	}
	if strings.Contains(line, bad[:16]) {
		t.Errorf("refusal line holds the malformed token: %s", line)
	}
}

// TestRefusalLogSampled: a flood of one refusal logs at most the bucket
// per reason, counts the rest and reports the count; another reason is
// still logged during the flood.
func TestRefusalLogSampled(t *testing.T) {
	const perSecond, flood = 5, 60
	e := newEnv(t, func(c *Config) { c.RefusalLogPerSecond = perSecond; c.MissBurst = 1000 })
	start := time.Now()
	for i := range flood {
		if resp, _ := get(t, "GET", e.base+fetchPrefix+fmt.Sprintf("not-a-token-%d", i)); resp.StatusCode != 404 {
			t.Fatalf("miss %d: %d, want 404", i, resp.StatusCode)
		}
	}
	elapsed := time.Since(start)
	if resp, _ := get(t, "POST", e.base+fetchPrefix+"x"); resp.StatusCode != 405 {
		t.Fatalf("POST to a fetch URL: %d, want 405", resp.StatusCode)
	}
	e.logHas("msg=refused", "status=405", "reason=methodNotAllowed")
	logged := strings.Count(e.log.String(), "reason=tokenUnknown")
	// The bucket holds perSecond and refills perSecond a second (the
	// gateway's clock is the real one here).
	if most := perSecond + int(elapsed.Seconds()*perSecond) + 1; logged < perSecond || logged > most {
		t.Errorf("%d refusal lines for %d refusals in %v, want %d to %d", logged, flood, elapsed, perSecond, most)
	}
	e.g.flushSuppressed()
	line := e.logHas("msg=\"refusals suppressed\"", "reason=tokenUnknown")
	if want := fmt.Sprintf("count=%d ", flood-logged); !strings.Contains(line, want) {
		t.Errorf("suppressed line %s, want %s(%d refusals, %d logged)", line, want, flood, logged)
	}
}
