package gateway

import (
	"bytes"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/clientaddr"
)

// miss presents an unknown fetch token with the given headers and returns
// the status and reason.
func (e *env) miss(hdr ...string) (int, string) {
	e.t.Helper()
	resp, b := get(e.t, "GET", e.base+fetchPrefix+imagestore.NewSecret(), hdr...)
	reason := errorOf(e.t, bytes.NewReader(b)).Reason
	if resp.StatusCode == 429 && resp.Header.Get("Retry-After") == "" {
		e.t.Errorf("429 without Retry-After")
	}
	return resp.StatusCode, reason
}

// TestMissLimiterServesValidCapabilities: after 25 unknown tokens from one
// address (20 is the budget), its valid fetch token, upload ticket and
// session are still served; only its unknown ones get 429.
func TestMissLimiterServesValidCapabilities(t *testing.T) {
	needQemu(t)
	img := makeImage(t, "64M")
	e := newEnv(t, func(c *Config) { c.MissEvery = time.Hour })
	id, data := e.stored(img)
	fetch := e.fetchURL(id, time.Hour)
	sess, _ := e.create(len(data))
	up, _ := e.ticket()
	for i := range 25 {
		code, reason := e.miss()
		want, wantReason := 404, "tokenUnknown"
		if i >= 20 {
			want, wantReason = 429, "rateLimited"
		}
		if code != want || reason != wantReason {
			t.Fatalf("miss %d: %d %s, want %d %s", i+1, code, reason, want, wantReason)
		}
	}
	if resp, b := get(t, "GET", fetch); resp.StatusCode != 200 || !bytes.Equal(b, data) {
		t.Fatalf("valid fetch token after 25 misses: %d, %d bytes, want 200 and the image", resp.StatusCode, len(b))
	}
	e.waitSlotFreed(dirFetch)
	if resp, _ := get(t, "HEAD", fetch); resp.StatusCode != 200 {
		t.Fatalf("HEAD of a valid fetch token after 25 misses: %d, want 200", resp.StatusCode)
	}
	if resp, b := tusReq(t, "HEAD", sess, nil); resp.StatusCode != 200 {
		t.Fatalf("HEAD of a valid session after 25 misses: %d %s, want 200", resp.StatusCode, b)
	}
	resp, b := do(t, newRequest(t, http.MethodPut, up, bytes.NewReader(data)))
	if resp.StatusCode != 201 {
		t.Fatalf("valid ticket after 25 misses: %d %s, want 201", resp.StatusCode, b)
	}
	// Unknown capabilities of every kind still get 429 from it.
	for _, u := range []string{
		e.base + uploadPrefix + strings.Repeat("a", 64),
		e.base + sessionPrefix + strings.Repeat("b", 64),
		e.base + fetchPrefix + "nothex",
	} {
		method := "PUT"
		if strings.Contains(u, sessionPrefix) {
			method = "HEAD"
		} else if strings.Contains(u, fetchPrefix) {
			method = "GET"
		}
		if resp, _ := tusReq(t, method, u, nil); resp.StatusCode != 429 {
			t.Errorf("%s unknown %s after 25 misses: %d, want 429", method, u[len(e.base):][:30], resp.StatusCode)
		}
	}
}

// forwardedMiss is a miss sent with headers (pairs of name and value) and
// the answer it must get.
type forwardedMiss struct {
	hdr  []string
	want int
}

// TestForwardedOnlyFromTrustedProxy: behind a trusted proxy (loopback
// here) each forwarded client has its own budget, named by the one header
// the proxy writes; the other header, and both from anyone else, are
// ignored.
func TestForwardedOnlyFromTrustedProxy(t *testing.T) {
	loopback := clientaddr.Proxies{netip.MustParsePrefix("127.0.0.1/32")}
	burst := func(c *Config) { c.MissBurst = 2; c.MissEvery = time.Hour }
	for _, tc := range []struct {
		header        clientaddr.Header
		first, second string // the client 192.0.2.1, then another, in the proxy's header
		cases         []forwardedMiss
	}{
		{clientaddr.XForwardedFor, "192.0.2.1", "192.0.2.2", []forwardedMiss{
			{[]string{"X-Forwarded-For", "192.0.2.1"}, 429},
			{[]string{"X-Forwarded-For", "192.0.2.2, 192.0.2.1"}, 429}, // right-most is the one the proxy saw
			{[]string{"X-Forwarded-For", "192.0.2.1, 127.0.0.1"}, 429}, // a trusted hop is skipped
			{[]string{"X-Forwarded-For", "192.0.2.1, 192.0.2.3"}, 404}, // 192.0.2.3 is not a proxy we trust
			// The client's own Forwarded, which such a proxy passes on
			// untouched, names no one.
			{[]string{"Forwarded", "for=192.0.2.4", "X-Forwarded-For", "192.0.2.1"}, 429},
		}},
		{clientaddr.Forwarded, "for=192.0.2.1", "for=192.0.2.2", []forwardedMiss{
			{[]string{"Forwarded", `for="192.0.2.1:4711";proto=http`}, 429}, // RFC 7239, with port
			{[]string{"Forwarded", "for=192.0.2.4, for=192.0.2.1"}, 429},
			{[]string{"Forwarded", "for=192.0.2.1, for=192.0.2.5"}, 404},
			{[]string{"X-Forwarded-For", "192.0.2.6", "Forwarded", "for=192.0.2.1"}, 429},
		}},
	} {
		t.Run(tc.header.String(), func(t *testing.T) {
			e := newEnv(t, func(c *Config) {
				burst(c)
				c.TrustedProxies = clientaddr.Trust{Proxies: loopback, Header: tc.header}
			})
			name := tc.header.String()
			for i := range 2 {
				if code, _ := e.miss(name, tc.first); code != 404 {
					t.Fatalf("miss %d of 192.0.2.1: %d, want 404", i+1, code)
				}
			}
			if code, _ := e.miss(name, tc.second); code != 404 {
				t.Errorf("another client's first miss: %d, want 404", code)
			}
			for _, c := range tc.cases {
				if code, _ := e.miss(c.hdr...); code != c.want {
					t.Errorf("%q: %d, want %d", c.hdr, code, c.want)
				}
			}
		})
	}
	t.Run("the proxy itself", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { burst(c); c.TrustedProxies = clientaddr.Trust{Proxies: loopback} })
		e.miss("X-Forwarded-For", "192.0.2.1")
		e.miss("X-Forwarded-For", "192.0.2.1")
		// The loopback peer itself spent nothing: its own misses are 404.
		if code, _ := e.miss(); code != 404 {
			t.Errorf("the proxy's own miss: %d, want 404", code)
		}
	})
	t.Run("untrusted", func(t *testing.T) {
		e := newEnv(t, func(c *Config) {
			burst(c)
			c.TrustedProxies = clientaddr.Trust{Proxies: clientaddr.Proxies{netip.MustParsePrefix("10.0.0.0/8")}}
		})
		e.miss("X-Forwarded-For", "192.0.2.1")
		e.miss("Forwarded", "for=192.0.2.2")
		// Both misses were the peer's: a third client named in a header
		// is refused with it.
		if code, _ := e.miss("X-Forwarded-For", "192.0.2.3"); code != 429 {
			t.Errorf("forged X-Forwarded-For from an untrusted peer: %d, want 429", code)
		}
	})
}

// TestMissLimiterMemoryBound: the addresses remembered are bounded; at the
// bound the rested ones (budget full again, no different from a new
// address) make room, and an address that spent its budget keeps it spent:
// a guesser is not handed a fresh budget because others came and went.
// Only when none has rested does the limiter start over.
func TestMissLimiterMemoryBound(t *testing.T) {
	l := newMissLimiter(rate.Every(time.Hour), 1, 3)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	step := func(addr string, at time.Time, want bool) {
		t.Helper()
		if got := l.miss(addr, at); got != want {
			t.Fatalf("miss of %s at %v: %v, want %v", addr, at.Sub(t0), got, want)
		}
		if len(l.clients) > 3 {
			t.Fatalf("%d addresses remembered, want at most 3", len(l.clients))
		}
	}
	step("b", t0, true)
	step("c", t0, true)
	step("a", t0.Add(90*time.Minute), true)
	step("a", t0.Add(90*time.Minute), false) // a's budget is spent
	// Two hours on, b and c have exactly their budget back (rested), a
	// half of it: the new address d takes their room, a is kept.
	now := t0.Add(2 * time.Hour)
	step("d", now, true)
	if _, kept := l.clients["a"]; len(l.clients) != 2 || !kept {
		t.Fatalf("after d: %d addresses (a kept: %v), want a and d", len(l.clients), kept)
	}
	step("a", now, false)
	// Nobody rested: the next new address starts the limiter over rather
	// than grow it.
	step("e", now, true)
	step("f", now, true)
	if len(l.clients) != 1 {
		t.Fatalf("%d addresses after a full limiter with none rested, want 1 (started over)", len(l.clients))
	}
}
