package market

import (
	"context"
	"log/slog"
	"net"
	"regexp"
	"sort"
	"sync"
	"time"

	"golang.org/x/time/rate"
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
	log *slog.Logger

	mu      sync.Mutex
	reasons map[string]*reasonLog
	flushed time.Time // the last summary
}

type reasonLog struct {
	lim        *rate.Limiter
	suppressed int64
}

func newRefusalLog(log *slog.Logger) *refusalLog {
	return &refusalLog{log: log, reasons: map[string]*reasonLog{}}
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
	rl := l.reasons[reason]
	if rl == nil {
		rl = &reasonLog{lim: rate.NewLimiter(rate.Every(refusalEvery), refusalBurst)}
		l.reasons[reason] = rl
	}
	if rl.lim.AllowN(now, 1) {
		return true
	}
	rl.suppressed++
	return false
}

// flush writes one line per reason with suppressed refusals and resets
// the counts.
func (l *refusalLog) flush(ctx context.Context, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked(ctx, now)
}

func (l *refusalLog) flushLocked(ctx context.Context, now time.Time) {
	reasons := make([]string, 0, len(l.reasons))
	for r, rl := range l.reasons {
		if rl.suppressed > 0 {
			reasons = append(reasons, r)
		}
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		l.log.Log(ctx, slog.LevelInfo, "control refusals suppressed", "reason", r,
			"suppressed", l.reasons[r].suppressed, "since", l.flushed.UTC().Format(time.RFC3339))
		l.reasons[r].suppressed = 0
	}
	l.flushed = now
}

// hexRun is a run of 16 or more hex digits: the shape of tokens, tickets,
// upload ids and their fragments. No log line of a refusal carries one.
var hexRun = regexp.MustCompile(`[0-9a-fA-F]{16,}`)

// logText makes client-influenced text fit for a log line: hex runs
// redacted, and cut short.
func logText(s string) string {
	s = hexRun.ReplaceAllString(s, "[redacted]")
	const max = 200
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// clientAddr is the address the request came from, without the port.
func clientAddr(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return logText(remote)
}
