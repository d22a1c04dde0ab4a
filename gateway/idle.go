package gateway

import (
	"io"
	"time"

	"github.com/valyala/fasthttp"
)

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
}

func (ir *idleReader) Read(p []byte) (int, error) {
	// Moving a deadline costs a timer reset; doing it at most every
	// idle/16 keeps the effective timeout within 94..100% of IdleTimeout.
	if now := ir.now(); now.Sub(ir.movedAt) >= ir.idle/16 {
		if err := ir.ctx.SetReadDeadline(now.Add(ir.idle)); err != nil {
			return 0, err
		}
		ir.movedAt = now
	}
	return ir.r.Read(p)
}
