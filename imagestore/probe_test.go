package imagestore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestHealthProbeFlood: a flood of probes runs one check, the verdict is
// kept for the TTL, and a check that hangs holds each caller only as long
// as its own context, without another check piling up behind it.
func TestHealthProbeFlood(t *testing.T) {
	var checks atomic.Int32
	release := make(chan struct{})
	p := &HealthProbe{Timeout: time.Minute, TTL: time.Hour, Check: func(ctx context.Context) error {
		checks.Add(1)
		select {
		case <-release:
			return errors.New("the bucket is gone")
		case <-ctx.Done():
			return ctx.Err()
		}
	}}

	// While the check hangs, every caller gives up with its context.
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if err := p.Ping(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Ping while the check hangs: %v, want the caller's deadline", err)
			}
		})
	}
	wg.Wait()
	if n := checks.Load(); n != 1 {
		t.Fatalf("50 probes while a check hangs ran %d checks, want 1", n)
	}

	// Once it ends, its verdict answers every probe of the TTL.
	close(release)
	for range 50 {
		if err := p.Ping(context.Background()); err == nil || err.Error() != "the bucket is gone" {
			t.Fatalf("Ping after the check: %v, want its verdict", err)
		}
	}
	if n := checks.Load(); n != 1 {
		t.Errorf("50 probes within the TTL ran %d checks, want 1", n)
	}
}

// TestHealthProbeTTL: a verdict older than the TTL is asked again, so a
// store that answers again is ready again.
func TestHealthProbeTTL(t *testing.T) {
	var healthy atomic.Bool
	var checks atomic.Int32
	p := &HealthProbe{Timeout: time.Second, TTL: time.Nanosecond, Check: func(context.Context) error {
		checks.Add(1)
		if healthy.Load() {
			return nil
		}
		return errors.New("down")
	}}
	if err := p.Ping(context.Background()); err == nil {
		t.Fatal("Ping of a store that is down: nil")
	}
	healthy.Store(true)
	if err := p.Ping(context.Background()); err != nil {
		t.Fatalf("Ping once the store answers again: %v", err)
	}
	if n := checks.Load(); n != 2 {
		t.Errorf("%d checks, want 2", n)
	}
}
