package market

import (
	"context"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/clientaddr"
)

// logLines returns the log lines with msg.
func (e *env) logLines(msg string) []string {
	var out []string
	for l := range strings.Lines(e.logs.String()) {
		if strings.Contains(l, `msg="`+msg+`"`) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

// Every refusal writes one Info line with route, status, reason and the
// client's address.
func TestRefusalLogged(t *testing.T) {
	big := `{"name":"` + strings.Repeat("a", 70<<10) + `"}`
	cases := []struct {
		name          string
		method, path  string
		auth          bool
		ct, body      string
		status        int
		reason, route string
		setup         func(e *env, token string)
	}{
		{"401", "POST", "/market/vm-images/ticket", false, "application/json", `{"name":"disk"}`, 401, "unauthorized", "/market/vm-images/ticket", nil},
		{"404", "GET", "/no/such/route", false, "", "", 404, "notFound", "other", nil},
		{"405", "DELETE", "/market/vm-images/ticket", true, "", "", 405, "methodNotAllowed", "/market/vm-images/ticket", nil},
		{"409", "POST", "/market/vm-images/ticket", true, "application/json", `{"name":"disk"}`, 409, "imageQuota", "/market/vm-images/ticket",
			func(e *env, token string) {
				for range 3 {
					e.post("/market/vm-images/ticket", token, `{"name":"disk"}`)
				}
			}},
		{"413", "POST", "/market/vm-images/ticket", true, "application/json", big, 413, "tooLarge", "/market/vm-images/ticket", nil},
		{"415", "POST", "/market/vm-images/remove", true, "text/plain", `{}`, 415, "unsupportedMediaType", "/market/vm-images/remove", nil},
		{"429", "POST", "/market/vm-images/ticket", true, "application/json", `{"name":"disk"}`, 429, "rateLimited", "/market/vm-images/ticket",
			func(e *env, token string) {
				for range DefaultTicketBurst {
					e.post("/market/vm-images/ticket", token, `{"name":"disk"}`)
				}
			}},
		{"400", "POST", "/market/vm-images/ticket", true, "application/json", `{"name":"disk","name":"x"}`, 400, "badRequest", "/market/vm-images/ticket", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) {
				if c.reason == "rateLimited" {
					cfg.ImagesPerTenant = 100
				}
			})
			_, token := e.tenant("alice", true)
			if c.setup != nil {
				c.setup(e, token)
			}
			before := len(e.logLines("control request refused"))
			req, err := http.NewRequestWithContext(t.Context(), c.method, e.ts.URL+c.path, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if c.auth {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			if c.ct != "" {
				req.Header.Set("Content-Type", c.ct)
			}
			// A refusal that comes before the body closes the connection
			// without reading it; a client that sent the body at once may
			// then see its own write fail instead of the answer (loaded
			// machine, big body). A careful client asks first, as curl does.
			var res response
			if c.body != "" {
				res = e.sendExpecting(req)
			} else {
				res = e.send(req)
			}
			wantError(t, res, c.status, c.reason)
			lines := e.logLines("control request refused")[before:]
			if len(lines) != 1 {
				t.Fatalf("%d refusal lines, want 1:\n%s", len(lines), e.logs.String())
			}
			for _, want := range []string{"level=INFO", "method=" + c.method, "route=" + c.route,
				"status=" + strconv.Itoa(c.status), "reason=" + c.reason, "remote=127.0.0.1"} {
				if !strings.Contains(lines[0], want+" ") && !strings.HasSuffix(lines[0], want) {
					t.Errorf("refusal line lacks %q: %s", want, lines[0])
				}
			}
		})
	}
}

// A flood writes the burst of lines, then counts; the count is written as
// one "suppressed" line per reason at the summary's next tick, or at the
// next refusal once a minute has passed.
func TestRefusalLogSampled(t *testing.T) {
	e := newEnv(t)
	for range refusalBurst + 80 {
		wantError(t, e.post("/market/vm-images/ticket", "", `{}`), 401, "unauthorized")
	}
	for range refusalBurst + 10 {
		wantError(t, e.do(http.MethodGet, "/nothing", "", nil), 404, "notFound")
	}
	if n := len(e.logLines("control request refused")); n != 2*refusalBurst {
		t.Errorf("%d refusal lines in the flood, want %d (the burst of each reason)", n, 2*refusalBurst)
	}
	if n := len(e.logLines("control refusals suppressed")); n != 0 {
		t.Errorf("%d summaries before a minute passed, want 0", n)
	}

	// The summary's tick writes it, one line per reason.
	e.clock.Advance(suppressedEvery)
	e.srv.flushRefusals(t.Context())
	sum := e.logLines("control refusals suppressed")
	if len(sum) != 2 || !strings.Contains(sum[0], "reason=notFound suppressed=10 ") ||
		!strings.Contains(sum[1], "reason=unauthorized suppressed=80 ") {
		t.Fatalf("summaries %q, want notFound 10 and unauthorized 80", sum)
	}
	// In the minute since, 6 tokens came back: 6 lines, then counting again.
	for range 10 {
		e.post("/market/vm-images/ticket", "", `{}`)
	}
	if n := len(e.logLines("control request refused")); n != 2*refusalBurst+6 {
		t.Errorf("%d refusal lines, want %d", n, 2*refusalBurst+6)
	}
	// Without a tick, the next refusal a minute later writes the summary.
	e.clock.Advance(suppressedEvery)
	e.post("/market/vm-images/ticket", "", `{}`)
	sum = e.logLines("control refusals suppressed")
	if len(sum) != 3 || !strings.Contains(sum[2], "reason=unauthorized suppressed=4 ") {
		t.Errorf("summaries %q, want a third for unauthorized 4", sum)
	}
	// Nothing suppressed since: the tick writes nothing.
	e.clock.Advance(suppressedEvery)
	e.srv.flushRefusals(t.Context())
	if n := len(e.logLines("control refusals suppressed")); n != 3 {
		t.Errorf("%d summaries after a quiet minute, want still 3", n)
	}
}

// TestRefusalSummaryWithoutSweeper: a replica that runs no sweeper (over a
// shared store, one that does not lead) still writes the summary of its
// suppressed refusals, on its own ticker, and once more when it stops.
func TestRefusalSummaryWithoutSweeper(t *testing.T) {
	e := newEnv(t)
	flood := func(n int) {
		for range n {
			wantError(t, e.post("/market/vm-images/ticket", "", `{}`), 401, "unauthorized")
		}
	}
	flood(refusalBurst + 7)
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); e.srv.runRefusalSummary(ctx, 10*time.Millisecond) }()
	summaries := func() []string { return e.logLines("control refusals suppressed") }
	for i := 0; len(summaries()) == 0; i++ {
		if i == 500 {
			t.Fatal("no summary of the suppressed refusals within 5 s of ticks")
		}
		time.Sleep(10 * time.Millisecond) // polling the log, bounded
	}
	if sum := summaries(); len(sum) != 1 || !strings.Contains(sum[0], "reason=unauthorized suppressed=7 ") {
		t.Fatalf("summaries %q, want one for unauthorized 7", sum)
	}
	flood(3) // the bucket is still empty: all three are counted
	stop()
	withTimeout(t, done, "the summary's loop to end")
	// Ticks may have come between the three: the summaries since count
	// them all, the last written as the loop ended.
	counted := 0
	for _, l := range summaries()[1:] {
		m := regexp.MustCompile(`suppressed=(\d+) `).FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("summary without a count: %s", l)
		}
		n, _ := strconv.Atoi(m[1])
		counted += n
	}
	if counted != 3 {
		t.Errorf("summaries %q count %d refusals after the first, want 3", summaries(), counted)
	}
}

// No refusal line carries a token, a ticket or any hex run of 16 or more
// characters, whatever the client put in the method, path or headers.
func TestRefusalLogRedacted(t *testing.T) {
	e := newEnv(t)
	_, token := e.tenant("alice", true)
	hex := strings.Repeat("0123456789abcdef", 4)
	e.remember(hex)
	req, err := http.NewRequestWithContext(t.Context(), "X"+hex, e.ts.URL+"/market/vm-images/ticket", nil)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, e.send(req), 405, "methodNotAllowed")
	wantError(t, e.do(http.MethodGet, "/market/vm-images/upload/"+hex, "", nil), 404, "notFound")
	wantError(t, e.post("/market/vm-images/ticket", hex, `{"name":"disk"}`), 401, "unauthorized")
	wantError(t, e.post("/market/vm-images/remove", token, `{"upload_id":"`+hex[:24]+`"}`), 404, "imageUnknown")
	wantError(t, e.post("/market/vm-images/ticket", token, `{"name":"`+hex+`","`+hex+`":1}`), 400, "badRequest")
	if n := len(e.logLines("control request refused")); n != 5 {
		t.Errorf("%d refusal lines, want 5:\n%s", n, e.logs.String())
	}
	if m := regexp.MustCompile(`[0-9a-fA-F]{16,}`).FindString(e.logs.String()); m != "" {
		t.Errorf("log carries the hex run %q:\n%s", m, e.logs.String())
	}
}

// sendExpecting sends req with "Expect: 100-continue" through a client
// that waits for the server's go-ahead before the body, as curl does for
// larger bodies: a refusal then arrives instead of the go-ahead.
func (e *env) sendExpecting(req *http.Request) response {
	e.t.Helper()
	req.Header.Set("Expect", "100-continue")
	tr := &http.Transport{Proxy: nil, ExpectContinueTimeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	return e.sendWith(&http.Client{Transport: tr, Timeout: 30 * time.Second}, req)
}

// TestRefusalLogForwardedClient: behind a trusted proxy the refusal line
// names the client the proxy forwards in the header it writes; the other
// header, and both from an untrusted peer, are ignored (anyone can write
// them).
func TestRefusalLogForwardedClient(t *testing.T) {
	// Documentation addresses, named in headers only: the proxy's hop and
	// the client's own entry before it in each.
	const xffClient, fwdClient = "203.0.113.7", "203.0.113.8"
	trusted := clientaddr.Proxies{netip.MustParsePrefix("127.0.0.0/8")}
	for _, tc := range []struct {
		name  string
		trust clientaddr.Trust
		want  string
	}{
		{"trusted, X-Forwarded-For", clientaddr.Trust{Proxies: trusted}, xffClient},
		{"trusted, Forwarded", clientaddr.Trust{Proxies: trusted, Header: clientaddr.Forwarded}, fwdClient},
		{"untrusted", clientaddr.Trust{}, "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(cfg *Config) { cfg.TrustedProxies = tc.trust })
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, e.ts.URL+"/no/such/route", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Forwarded-For", "198.51.100.1, "+xffClient)
			req.Header.Set("Forwarded", "for=198.51.100.2, for="+fwdClient)
			wantError(t, e.send(req), 404, "notFound")
			lines := e.logLines("control request refused")
			want := "remote=" + tc.want
			if len(lines) != 1 || !strings.Contains(lines[0], want+" ") && !strings.HasSuffix(lines[0], want) {
				t.Fatalf("refusal lines %q, want one with %s", lines, want)
			}
			for _, a := range []string{"198.51.100.1", "198.51.100.2", xffClient, fwdClient} {
				if a != tc.want && strings.Contains(e.logs.String(), a) {
					t.Errorf("%s, from a header not believed, reached the log:\n%s", a, e.logs.String())
				}
			}
		})
	}
}
