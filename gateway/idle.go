package gateway

import (
	"errors"
	"io"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// errTakenOver ends the read of a PATCH whose upload a newer request took.
var errTakenOver = errors.New("upload taken over by a newer request")

// errShuttingDown is the cause logged for a PATCH that Shutdown stopped:
// Shutdown stops reads through the same flag as a takeover, but its log
// line must say what happened, not that a newer request took over.
var errShuttingDown = errors.New("the data plane is shutting down")

// stopFlag is raised by a request that takes a resumable upload over.
type stopFlag = atomic.Bool

// idleReader moves the connection's read deadline on as bytes arrive, so a
// transfer ends only after IdleTimeout without a byte, however long it runs.
// fasthttp's ReadTimeout is a whole-request deadline and would kill a slow
// upload that is still moving.
type idleReader struct {
	ctx     *fasthttp.RequestCtx
	r       io.Reader
	idle    time.Duration
	now     func() time.Time
	movedAt time.Time
	// stop, if set, is raised by a takeover, which then also moves this
	// connection's read deadline to now to wake a blocked read.
	stop *stopFlag
}

func (ir *idleReader) Read(p []byte) (int, error) {
	if ir.stop != nil && ir.stop.Load() {
		return 0, errTakenOver
	}
	// Moving a deadline costs a timer reset; doing it at most every
	// idle/16 keeps the effective timeout within 94..100% of IdleTimeout.
	if now := ir.now(); now.Sub(ir.movedAt) >= ir.idle/16 {
		if err := ir.ctx.SetReadDeadline(now.Add(ir.idle)); err != nil {
			return 0, err
		}
		ir.movedAt = now
		// A takeover that set its deadline before ours must still win:
		// it raised the flag first, so look again.
		if ir.stop != nil && ir.stop.Load() {
			return 0, errTakenOver
		}
	}
	return ir.r.Read(p)
}
