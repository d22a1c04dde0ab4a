// Package fakeclock is the time a test moves by hand, given to the code
// under test as its Now: deadlines, expiries and sweeps are then reached
// at the instant the test chooses, exactly on their boundary, with no
// sleep. Safe for the code's goroutines and the test's at once.
package fakeclock

import (
	"sync"
	"time"
)

// Still stands at the time it was set to until moved.
type Still struct {
	mu sync.Mutex
	t  time.Time
}

// NewStill returns a clock standing at t.
func NewStill(t time.Time) *Still { return &Still{t: t} }

// Now is the clock's time.
func (c *Still) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t.
func (c *Still) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// Advance moves the clock on by d.
func (c *Still) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Ahead runs with the real time, ahead of it by what Advance added: for
// code that also sets deadlines on sockets from it, which must stay near
// the real time.
type Ahead struct {
	mu  sync.Mutex
	off time.Duration
}

// Now is the real time plus the advances.
func (c *Ahead) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

// Advance puts the clock d further ahead.
func (c *Ahead) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off += d
}
