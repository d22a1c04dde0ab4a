package market

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// Defaults of Config.TicketRate and Config.TicketBurst: a tenant may take
// 10 tickets at once and then one a second, far above what a person or a
// script uploading a few images needs, and far below the thousands a
// second one tenant could otherwise write into the store.
const (
	DefaultTicketRate  = rate.Limit(1)
	DefaultTicketBurst = 10
)

// tenantLimiter is one token bucket per tenant. Tenants are known (the
// key is an authenticated tenant id), so the map is bounded by the number
// of tenants; still, a bucket idle long enough to be full again is the
// same as a new one, so such buckets are dropped on the way.
type tenantLimiter struct {
	limit rate.Limit
	burst int

	mu      sync.Mutex
	buckets map[int64]*bucket
	swept   time.Time // the last time idle buckets were dropped
}

type bucket struct {
	lim  *rate.Limiter
	last time.Time // the last request
}

func newTenantLimiter(limit rate.Limit, burst int) *tenantLimiter {
	return &tenantLimiter{limit: limit, burst: burst, buckets: map[int64]*bucket{}}
}

// refill is how long a bucket takes to fill up from empty: after that
// much idleness it holds nothing a new bucket would not.
func (l *tenantLimiter) refill() time.Duration {
	if l.limit == rate.Inf || l.limit <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(float64(l.burst) / float64(l.limit) * float64(time.Second)))
}

// take spends one token of tenant's bucket at now. When the bucket is
// empty it spends nothing and returns how long until a token is there.
func (l *tenantLimiter) take(tenant int64, now time.Time) (wait time.Duration, ok bool) {
	if l.limit == rate.Inf {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	full := l.refill()
	if now.Sub(l.swept) >= full {
		for id, b := range l.buckets {
			if now.Sub(b.last) >= full {
				delete(l.buckets, id)
			}
		}
		l.swept = now
	}
	b := l.buckets[tenant]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(l.limit, l.burst)}
		l.buckets[tenant] = b
	}
	if now.After(b.last) {
		b.last = now
	}
	r := b.lim.ReserveN(now, 1)
	if !r.OK() { // a burst of 0: never
		return time.Hour, false
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d, false
	}
	return 0, true
}

// size is the number of buckets held (tests).
func (l *tenantLimiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// errRateLimited is the 429 of a tenant over its ticket rate, with
// Retry-After: wait in whole seconds, rounded up.
func errRateLimited(wait time.Duration) error {
	secs := int(math.Ceil(wait.Seconds()))
	return apierr.New(reason.RateLimited).
		WithMsg("this box asked for tickets faster than the edge allows; wait Retry-After seconds and retry").WithRetryAfter(max(secs, 1))
}
