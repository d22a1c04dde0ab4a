// Package logsample keeps the logs of refusals bounded and free of
// capabilities, for both planes: a token bucket per key (a refusal
// reason), counts of what the buckets dropped, and redaction of every run
// of hex digits long enough to be a token, a ticket or a piece of one.
package logsample

import (
	"regexp"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Sampler lets limit lines per second per key through, burst at once, and
// counts the rest. The keys are a server's own reason codes, so the map
// stays as small as that set.
type Sampler struct {
	limit rate.Limit
	burst int

	mu   sync.Mutex
	keys map[string]*bucket
}

type bucket struct {
	lim     *rate.Limiter
	dropped int64
}

// New returns a Sampler of limit lines per second, burst at once, per key.
func New(limit rate.Limit, burst int) *Sampler {
	return &Sampler{limit: limit, burst: burst, keys: map[string]*bucket{}}
}

// Allow reports whether a line for key may be written at now; when not,
// it counts the line as dropped.
func (s *Sampler) Allow(key string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.keys[key]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(s.limit, s.burst)}
		s.keys[key] = b
	}
	if b.lim.AllowN(now, 1) {
		return true
	}
	b.dropped++
	return false
}

// Take returns the lines dropped per key since the last Take (keys with
// none left out) and starts the counts again.
func (s *Sampler) Take() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int64{}
	for k, b := range s.keys {
		if b.dropped > 0 {
			out[k] = b.dropped
			b.dropped = 0
		}
	}
	return out
}

// hexRun is a run of 16 or more hex digits: the shape of tokens, tickets,
// session ids, upload ids and their fragments (a malformed 63-character
// ticket included).
var hexRun = regexp.MustCompile(`[0-9a-fA-F]{16,}`)

// Redact replaces every hexRun in s with "[redacted]".
func Redact(s string) string { return hexRun.ReplaceAllString(s, "[redacted]") }
