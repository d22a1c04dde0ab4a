// Package lazyctx gives a context with a deadline whose timer is started
// only if somebody waits on it.
//
// Why: the data plane bounds every store call of a request with a
// deadline, but most of those calls are answered from memory (a fetch
// token's cached grant, an image file already open) and never wait. A
// context.WithTimeout starts a runtime timer and allocates a goroutine-safe
// cancel context for each of them, which a profile of 4 KiB range reads
// showed as 3–4 % of the server's CPU per request. A call that does wait
// (a query, a select on Done) asks for Done, and gets the same deadline a
// WithTimeout would have given.
package lazyctx

import (
	"context"
	"sync"
	"time"
)

// Ctx is a context.Context whose deadline is fixed at creation and whose
// timer starts at the first call of Done. Its parent is always
// context.Background: it carries no values.
type Ctx struct {
	deadline time.Time
	now      func() time.Time

	mu       sync.Mutex
	inner    context.Context // nil until Done is first called
	cancel   context.CancelFunc
	canceled bool
}

// WithTimeout returns a context that ends at now()+d, or when cancel is
// called, like context.WithTimeout(context.Background(), d). now is the
// clock Err reads before a timer exists; time.Now if nil.
func WithTimeout(d time.Duration, now func() time.Time) (*Ctx, context.CancelFunc) {
	if now == nil {
		now = time.Now
	}
	c := &Ctx{deadline: now().Add(d), now: now}
	return c, c.stop
}

// Deadline is fixed at creation.
func (c *Ctx) Deadline() (time.Time, bool) { return c.deadline, true }

// Done starts the timer on first use: from then on the context is a real
// context.WithDeadline (already canceled if cancel came first).
func (c *Ctx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		c.inner, c.cancel = context.WithDeadline(context.Background(), c.deadline)
		if c.canceled {
			c.cancel()
		}
	}
	return c.inner.Done()
}

// Err is what context.WithDeadline's Err would say: Canceled after
// cancel, DeadlineExceeded once the deadline passed, else nil.
func (c *Ctx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.inner != nil:
		return c.inner.Err()
	case c.canceled:
		return context.Canceled
	case !c.now().Before(c.deadline):
		return context.DeadlineExceeded
	}
	return nil
}

// Value: a Ctx carries no values.
func (c *Ctx) Value(any) any { return nil }

func (c *Ctx) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.canceled = true
	if c.cancel != nil {
		c.cancel()
	}
}
