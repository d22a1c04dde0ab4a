package market

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"sort"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/vmshelf/vmshelf/internal/logsample"
)

// Refusals (4xx) are logged at Info, one line each, but sampled: per
// reason, a token bucket of refusalBurst lines refilled at one line per
// refusalEvery. What the bucket refuses is counted, and the counts are
// written as one "suppressed" line per reason at most every suppressedEvery
// (at the next refusal after that, and at every sweep). A flood of one
// reason thus writes at most refusalBurst lines, then 6 a minute plus one
// summary; the reasons are the server's own tokens, so there are a dozen
// buckets at most.
const (
	refusalEvery    = 10 * time.Second
	refusalBurst    = 20
	suppressedEvery = time.Minute
)

type refusalLog struct {
	log    *slog.Logger
	sample *logsample.Sampler

	mu      sync.Mutex
	flushed time.Time // the last summary
}

func newRefusalLog(log *slog.Logger) *refusalLog {
	return &refusalLog{log: log, sample: logsample.New(rate.Every(refusalEvery), refusalBurst)}
}

// allow reports whether a refusal with reason may be logged at now, and
// counts it as suppressed otherwise. It writes the summary first when one
// is due.
func (l *refusalLog) allow(ctx context.Context, reason string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.flushed.IsZero() {
		l.flushed = now
	}
	if now.Sub(l.flushed) >= suppressedEvery {
		l.flushLocked(ctx, now)
	}
	return l.sample.Allow(reason, now)
}

// flush writes one line per reason with suppressed refusals and resets
// the counts.
func (l *refusalLog) flush(ctx context.Context, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked(ctx, now)
}

func (l *refusalLog) flushLocked(ctx context.Context, now time.Time) {
	dropped := l.sample.Take()
	reasons := make([]string, 0, len(dropped))
	for r := range dropped {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		l.log.Log(ctx, slog.LevelInfo, "control refusals suppressed", "reason", r,
			"suppressed", dropped[r], "since", l.flushed.UTC().Format(time.RFC3339))
	}
	l.flushed = now
}

// logText makes client-influenced text fit for a log line: hex runs
// redacted, and cut short.
func logText(s string) string {
	s = logsample.Redact(s)
	const max = 200
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// clientAddr is the address r comes from, without the port: the peer, or
// the client a trusted proxy forwards.
func (s *Server) clientAddr(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return logText(r.RemoteAddr) // not a TCP peer (tests' fakes)
	}
	return s.cfg.TrustedProxies.Client(ap.Addr(), r.Header.Values).String()
}
