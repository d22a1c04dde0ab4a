package imagestore

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// HealthProbe answers a readiness probe for a blob store cheaply: it runs
// one Check at a time, bounded by Timeout, and keeps the verdict for TTL.
// So a flood of probes asks the store at most once per TTL, and a check
// that hangs (a stopped S3 server, a hung disk) holds no caller longer
// than its own context: the caller gets an error, the next probe waits on
// the same check instead of starting another.
type HealthProbe struct {
	Check   func(ctx context.Context) error
	Timeout time.Duration
	TTL     time.Duration

	mu      sync.Mutex
	at      time.Time // of the last verdict; zero: none yet
	err     error
	running chan struct{} // closed when the running check ends; nil: none runs
}

// Ping returns the last verdict if it is younger than TTL, or waits for a
// check (started if none runs) until ctx ends.
func (p *HealthProbe) Ping(ctx context.Context) error {
	p.mu.Lock()
	if !p.at.IsZero() && time.Since(p.at) < p.TTL {
		err := p.err
		p.mu.Unlock()
		return err
	}
	if p.running == nil {
		p.running = make(chan struct{})
		go p.run(p.running)
	}
	done := p.running
	p.mu.Unlock()
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("no answer to the health check: %w", ctx.Err())
	}
}

func (p *HealthProbe) run(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	err := p.Check(ctx)
	cancel()
	p.mu.Lock()
	p.at, p.err, p.running = time.Now(), err, nil
	p.mu.Unlock()
	close(done)
}
