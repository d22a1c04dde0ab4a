package gateway

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// missLimiter slows down an address that keeps presenting unknown tickets or
// tokens: only misses spend its budget, so a client with good capabilities
// is never slowed. Guessing 256-bit secrets is hopeless anyway; this keeps
// the store and the log quiet under a scan.
type missLimiter struct {
	mu      sync.Mutex
	every   rate.Limit
	burst   int
	max     int // addresses remembered; bounds memory under a spoofed scan
	clients map[string]*rate.Limiter
}

func newMissLimiter(every rate.Limit, burst, max int) *missLimiter {
	return &missLimiter{every: every, burst: burst, max: max, clients: make(map[string]*rate.Limiter)}
}

// miss records an unknown ticket or token from addr and reports whether
// addr still had a miss to spend: false means answer 429, not 404.
func (l *missLimiter) miss(addr string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.clients[addr]
	if !ok {
		if len(l.clients) >= l.max {
			l.forgetRested(now)
		}
		lim = rate.NewLimiter(l.every, l.burst)
		l.clients[addr] = lim
	}
	return lim.AllowN(now, 1)
}

// forgetRested drops addresses whose budget has refilled (they are no
// different from new ones); if none has, it starts over rather than grow.
func (l *missLimiter) forgetRested(now time.Time) {
	for addr, lim := range l.clients {
		if lim.TokensAt(now) >= float64(l.burst) {
			delete(l.clients, addr)
		}
	}
	if len(l.clients) >= l.max {
		clear(l.clients)
	}
}
