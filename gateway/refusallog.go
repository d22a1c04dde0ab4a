package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"github.com/vmshelf/vmshelf/internal/apierr"
)

// DefaultRefusalLogPerSecond is how many refusal lines per reason the log
// takes per second (and at once) when Config.RefusalLogPerSecond is zero.
const DefaultRefusalLogPerSecond = 10

// suppressedEvery is how often the count of refusals not logged is.
const suppressedEvery = time.Minute

// refusalKey is the user value under which writeError leaves the error it
// answered, for the one log line per refusal written after the handler.
const refusalKey = "vmshelf.refusal"

// refusalLog writes one line per refusal, sampled per reason with a token
// bucket so that a flood of one kind (a scan: 404 tokenUnknown, 429) cannot
// fill the disk nor hide the other kinds; what it drops it counts, and
// reportSuppressed writes the counts.
type refusalLog struct {
	mu         sync.Mutex
	perSecond  int
	reasons    map[string]*rate.Limiter
	suppressed map[string]int64
}

func newRefusalLog(perSecond int) *refusalLog {
	return &refusalLog{perSecond: perSecond, reasons: map[string]*rate.Limiter{}, suppressed: map[string]int64{}}
}

// allow reports whether a refusal for reason is logged at now, and counts
// it as suppressed when not.
func (l *refusalLog) allow(reason string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.reasons[reason]
	if !ok {
		lim = rate.NewLimiter(rate.Limit(l.perSecond), l.perSecond)
		l.reasons[reason] = lim
	}
	if lim.AllowN(now, 1) {
		return true
	}
	l.suppressed[reason]++
	return false
}

// take returns and resets the suppressed counts.
func (l *refusalLog) take() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.suppressed
	l.suppressed = map[string]int64{}
	return s
}

// logRefusal writes the line for an error answer: status, reason, method,
// path (capabilities redacted) and the client address.
func (g *Gateway) logRefusal(ctx *fasthttp.RequestCtx, e *apierr.Error) {
	if !g.refusals.allow(e.Reason, g.cfg.Now()) {
		return
	}
	level := slog.LevelInfo
	if e.Status >= 500 && e.Reason != "busy" && e.Reason != "shuttingDown" && e.Reason != "clientGone" {
		level = slog.LevelWarn
	}
	attrs := []any{"status", e.Status, "reason", e.Reason, "method", string(ctx.Method()),
		"path", redact(string(ctx.Path())), "remote", g.clientAddr(ctx)}
	if e.Err != nil {
		attrs = append(attrs, "err", redact(e.Err.Error()))
	}
	g.log.Log(context.Background(), level, "refused", attrs...)
}

// logAnswer is called after a handler: it logs the refusal writeError
// left, if any.
func (g *Gateway) logAnswer(ctx *fasthttp.RequestCtx) {
	if e, ok := ctx.UserValue(refusalKey).(*apierr.Error); ok {
		g.logRefusal(ctx, e)
	}
}

// flushSuppressed writes one line per reason whose refusals were dropped
// since the last call.
func (g *Gateway) flushSuppressed() {
	for reason, n := range g.refusals.take() {
		if n > 0 {
			g.log.Warn("refusals suppressed", "reason", reason, "count", n, "per_second_logged", g.refusals.perSecond)
		}
	}
}

// reportSuppressed writes the suppressed counts every suppressedEvery
// until Shutdown, and once more then.
func (g *Gateway) reportSuppressed() {
	t := time.NewTicker(suppressedEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			g.flushSuppressed()
		case <-g.stopping:
			g.flushSuppressed()
			return
		}
	}
}
