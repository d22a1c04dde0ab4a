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

// stopFlag is raised, with its cause, to stop a request's read from
// outside: by a request that takes a resumable upload over
// (errTakenOver), or by the end of the request's lease on its upload
// (errLeaseEnded). The first cause raised stays.
type stopFlag struct{ cause atomic.Pointer[error] }

// raise stops the read for cause, unless it was stopped already.
func (f *stopFlag) raise(cause error) { f.cause.CompareAndSwap(nil, &cause) }

// err is the cause the flag was raised with; nil while it is not.
func (f *stopFlag) err() error {
	if f == nil {
		return nil
	}
	if c := f.cause.Load(); c != nil {
		return *c
	}
	return nil
}

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
	// stop, if set, is raised by a takeover or the end of the lease,
	// which then also moves this connection's read deadline to now to
	// wake a blocked read.
	stop *stopFlag
}

func (ir *idleReader) Read(p []byte) (int, error) {
	if err := ir.stop.err(); err != nil {
		return 0, err
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
		if err := ir.stop.err(); err != nil {
			return 0, err
		}
	}
	return ir.r.Read(p)
}
