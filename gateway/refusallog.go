package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/logsample"
)

// DefaultRefusalLogPerSecond is how many refusal lines per reason the log
// takes per second (and at once) when Config.RefusalLogPerSecond is zero.
const DefaultRefusalLogPerSecond = 10

// suppressedEvery is how often the count of refusals not logged is.
const suppressedEvery = time.Minute

// refusalKey is the user value under which writeError leaves the error it
// answered, for the one log line per refusal written after the handler.
const refusalKey = "vmshelf.refusal"

// logRefusal writes the line for an error answer: status, reason, method,
// path (capabilities redacted) and the client address.
func (g *Gateway) logRefusal(ctx *fasthttp.RequestCtx, e *apierr.Error) {
	if !g.refusals.Allow(e.Reason, g.cfg.Now()) {
		return
	}
	level := refusalLevel(e)
	attrs := []any{"status", e.Status, "reason", e.Reason, "method", string(ctx.Method()),
		"path", logsample.Redact(string(ctx.Path())), "remote", g.clientAddr(ctx)}
	if e.Err != nil {
		// fasthttp's errors quote the request head, headers included.
		attrs = append(attrs, "err", redactHead(e.Err.Error()))
	}
	g.log.Log(context.Background(), level, "refused", attrs...)
}

// refusalLevel is WARN for an answer that is our fault (a 5xx), INFO for
// the rest: being full, restarting or left by the client is no fault of ours.
func refusalLevel(e *apierr.Error) slog.Level {
	if e.Status >= 500 && !isAny(e, answerBusy, answerShuttingDown, answerClientGone) {
		return slog.LevelWarn
	}
	return slog.LevelInfo
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
	for reason, n := range g.refusals.Take() {
		g.log.Warn("refusals suppressed", "reason", reason, "count", n, "per_second_logged", g.cfg.RefusalLogPerSecond)
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
