package market

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/vmshelf/vmshelf/internal/logsample"
)

// Refusals (4xx) are logged at Info, one line each, but sampled: per
// reason, a token bucket of refusalBurst lines refilled at one line per
// refusalEvery. What the bucket refuses is counted, and the counts are
// written as one "suppressed" line per reason at most every suppressedEvery
// (at the next refusal after that, and by RunRefusalSummary's ticker on
// every replica). A flood of one
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
// redacted, order ids excepted, and cut short.
//
// Order ids are no secret: they grant nothing (every order route needs
// the buyer's token), they name the order's machines in the cluster
// (vm-<order>-<i>) and Stripe's metadata. So the log names them in clear
// wherever it names one — under the key order_id, and inside an error's
// text, where the redaction of hex runs (the shape of tokens and tickets)
// would otherwise cut "o" + 16 hex to "o[redacted]". Only a whole word of
// exactly that form is spared: a token is 64 hex, and no part of one is
// a word of its own.
func logText(s string) string {
	s = redactSparingOrderIDs(s)
	const max = 200
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// orderIDWord is an order id as a word of its own (imagestore.NewOrderID).
var orderIDWord = regexp.MustCompile(`\bo[0-9a-f]{16}\b`)

// redactSparingOrderIDs is logsample.Redact on everything but the order
// ids in s. A word boundary stands on both sides of each id, so no hex run
// reaches across one into the text beside it.
func redactSparingOrderIDs(s string) string {
	var b strings.Builder
	last := 0
	for _, m := range orderIDWord.FindAllStringIndex(s, -1) {
		b.WriteString(logsample.Redact(s[last:m[0]]))
		b.WriteString(s[m[0]:m[1]])
		last = m[1]
	}
	b.WriteString(logsample.Redact(s[last:]))
	return b.String()
}

// orderError is an error about one order: the line that logs it names the
// order under order_id.
type orderError struct {
	orderID string
	err     error
}

func (e *orderError) Error() string { return e.err.Error() }
func (e *orderError) Unwrap() error { return e.err }

// aboutOrder marks err as about the order id.
func aboutOrder(id string, err error) error { return &orderError{orderID: id, err: err} }

// clientAddr is the address r comes from, without the port: the peer, or
// the client a trusted proxy forwards.
func (s *Server) clientAddr(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return logText(r.RemoteAddr) // not a TCP peer (tests' fakes)
	}
	return s.cfg.TrustedProxies.Client(ap.Addr(), r.Header.Values).String()
}
