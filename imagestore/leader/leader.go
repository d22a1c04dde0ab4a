// Package leader runs a job on exactly one of the replicas that share a
// store: the provisioner and the sweepers act on every order, so two
// replicas running them at once would act twice. The replicas compete for
// one lease (imagestore.Leases); its holder runs the job, the others ask
// again every TTL/3 and take over once the lease is released or expired.
//
// Bounds, with the TTL of Config (DefaultTTL 15 s):
//   - a leader renews every TTL/3, so two failed renewals in a row still
//     leave it leading; it stops at its lease's ExpiresAt at the latest,
//     which is the first instant another replica can take the lease;
//   - a leader that dies (or loses the store) is replaced within
//     TTL + TTL/3 (20 s by default): its lease expires at most TTL after
//     its last renewal, and every other replica asks every TTL/3;
//   - a leader that shuts down (Run's ctx ends) releases its lease, and
//     is replaced at the others' next attempt, within TTL/3.
//
// Those bounds hold in the replicas' own clocks, which must agree within a
// skew small against the TTL (NTP keeps them within milliseconds): a skew
// s lets an old and a new leader overlap by up to s. The job therefore
// stays safe to run twice for a moment, as the provisioner's are (its
// cluster writes are idempotent); a writer that must never overlap checks
// the lease's token with imagestore.Leases.CheckLease before it commits.
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// DefaultTTL is the lease time when Config.TTL is zero: long against the
// replicas' clock skew and a store's hiccup (two renewals may fail), short
// enough that a dead leader's work pauses for 20 s at most.
const DefaultTTL = 15 * time.Second

// Config is what a Leader needs.
type Config struct {
	// Leases is the store the replicas share.
	Leases imagestore.Leases
	// Name is the lease the replicas compete for (serve's is "leader").
	Name string
	// Holder names this replica, distinct among the replicas (serve's is
	// the host name and 8 random hex digits, new at every start); it
	// appears in the others' logs.
	Holder string
	// TTL is the lease time; DefaultTTL if zero. The leader renews every
	// TTL/3.
	TTL time.Duration
	// Lead is the job: called once per term in a goroutine of its own, with
	// a context cancelled the moment the term ends (lease lost, expired
	// unrenewed, or Run's ctx done). It must return soon after: the next
	// term does not start, and Run does not return, before it has. A Lead
	// that returns by itself gives up its term (the lease is released); the
	// replicas compete again at the next attempt.
	Lead func(ctx context.Context)
	// Now is the clock; time.Now if nil.
	Now func() time.Time
	// After waits as time.After does (its default); tests pass a fake
	// clock's.
	After func(d time.Duration) <-chan time.Time
	// Log hears the changes of leadership and the store's errors; nothing
	// if nil.
	Log *slog.Logger
}

// Leader competes for one lease and runs Config.Lead while it holds it.
type Leader struct {
	cfg      Config
	interval time.Duration

	mu      sync.Mutex
	leading bool
	expires time.Time // the running term's ExpiresAt

	// parked, if set (tests), hears each time Run waits, with the instant
	// it waits for: the next attempt, or the lease's expiry if sooner.
	parked func(wake time.Time)
}

// New checks cfg and returns its Leader; Run starts it.
func New(cfg Config) (*Leader, error) {
	switch {
	case cfg.Leases == nil:
		return nil, errors.New("leader: no lease store")
	case cfg.Name == "" || cfg.Holder == "":
		return nil, fmt.Errorf("leader: lease name %q and holder %q must not be empty", cfg.Name, cfg.Holder)
	case cfg.Lead == nil:
		return nil, errors.New("leader: no Lead")
	case cfg.TTL < 0 || cfg.TTL > 0 && cfg.TTL < 3*time.Millisecond:
		return nil, fmt.Errorf("leader: TTL %v: want 0 (default %v) or at least 3ms", cfg.TTL, DefaultTTL)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cfg.Log = cfg.Log.With("lease", cfg.Name, "holder", cfg.Holder)
	return &Leader{cfg: cfg, interval: cfg.TTL / 3}, nil
}

// Leading reports whether this replica leads now: Lead runs, and the
// lease is unexpired by the clock. For /readyz and the metrics.
func (l *Leader) Leading() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading && l.cfg.Now().Before(l.expires)
}

func (l *Leader) setLeading(leading bool, expires time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leading, l.expires = leading, expires
}

// Run competes for the lease until ctx ends, leading whenever it holds
// it; then it ends the term, waits for Lead to return and releases the
// lease, so that another replica takes over at once. Call it once.
func (l *Leader) Run(ctx context.Context) {
	r := &run{l: l, ctx: ctx}
	for ctx.Err() == nil {
		start := l.cfg.Now()
		r.attempt(start)
		if ctx.Err() != nil || !r.park(start.Add(l.interval)) {
			break
		}
	}
	r.stop()
}

// run is the state of one Run.
type run struct {
	l   *Leader
	ctx context.Context
	// lease is the last lease obtained, held is whether it may still be
	// this replica's (not known lost, not released).
	lease imagestore.Lease
	held  bool
	// term is the running term's Lead, nil while following; prev the last
	// term, whose Lead may still be returning.
	term, prev *term
}

type term struct {
	cancel context.CancelFunc
	done   chan struct{}
}

type answer struct {
	lease imagestore.Lease
	err   error
}

// attempt renews the lease while leading and acquires it otherwise, asking
// at now. While the store answers the term ends at ExpiresAt regardless:
// a store that hangs must not keep a leader leading past it.
func (r *run) attempt(now time.Time) {
	cfg := r.l.cfg
	leading, token := r.term != nil, r.lease.Token
	// A hung store is given up after a TTL (real time: the store's
	// driver knows no other).
	actx, cancel := context.WithTimeout(r.ctx, cfg.TTL)
	defer cancel()
	res := make(chan answer, 1)
	go func() {
		var a answer
		if leading {
			a.lease, a.err = cfg.Leases.RenewLease(actx, cfg.Name, cfg.Holder, token, cfg.TTL, now)
		} else {
			a.lease, a.err = cfg.Leases.AcquireLease(actx, cfg.Name, cfg.Holder, cfg.TTL, now)
		}
		res <- a
	}()
	for {
		var expiry <-chan time.Time
		if r.term != nil {
			expiry = cfg.After(r.lease.ExpiresAt.Sub(cfg.Now()))
		}
		select {
		case a := <-res:
			r.answered(a)
			return
		case <-expiry:
			r.expire()
		}
	}
}

// answered acts on the store's answer to an attempt.
func (r *run) answered(a answer) {
	switch {
	case a.err == nil:
		r.lease, r.held = a.lease, true
		if !r.l.cfg.Now().Before(a.lease.ExpiresAt) {
			// Answered too late to lead on.
			r.stepDown("the lease expired while the store answered")
			return
		}
		if r.term == nil {
			r.startTerm()
			return
		}
		r.l.setLeading(true, a.lease.ExpiresAt)
	case errors.Is(a.err, imagestore.ErrLeaseHeld), errors.Is(a.err, imagestore.ErrLeaseLost):
		r.held = false
		if r.term != nil {
			r.stepDown("the lease was lost")
		}
	default:
		// Could not ask is not lost: a leader leads on until its
		// lease's own expiry, and asks again at the next attempt.
		if r.ctx.Err() == nil {
			r.l.cfg.Log.Warn("leader: could not ask the store for the lease", "leading", r.term != nil, "err", a.err)
		}
	}
}

// expire ends the term if its lease has expired by the clock.
func (r *run) expire() {
	if r.term != nil && !r.l.cfg.Now().Before(r.lease.ExpiresAt) {
		r.stepDown("the lease expired unrenewed")
	}
}

// startTerm starts Lead for the lease just obtained, once the last term's
// Lead has returned (two of this replica's never overlap).
func (r *run) startTerm() {
	if r.prev != nil {
		select {
		case <-r.prev.done:
		case <-r.ctx.Done():
		}
	}
	if r.ctx.Err() != nil || !r.l.cfg.Now().Before(r.lease.ExpiresAt) {
		return
	}
	ctx, cancel := context.WithCancel(r.ctx)
	t := &term{cancel: cancel, done: make(chan struct{})}
	r.term = t
	r.l.setLeading(true, r.lease.ExpiresAt)
	r.l.cfg.Log.Info("leader: leading", "token", r.lease.Token, "until", r.lease.ExpiresAt)
	go func() {
		defer close(t.done)
		r.l.cfg.Lead(ctx)
	}()
}

// stepDown ends the running term: Lead's context is cancelled at once.
func (r *run) stepDown(why string) {
	if r.term == nil {
		return
	}
	r.l.setLeading(false, time.Time{})
	r.term.cancel()
	r.prev, r.term = r.term, nil
	r.l.cfg.Log.Info("leader: stepped down", "token", r.lease.Token, "why", why)
}

// park waits for next, the instant of the next attempt, ending the term
// at its lease's expiry if that comes first, or when Lead returns by
// itself. It reports false if ctx ended.
func (r *run) park(next time.Time) bool {
	cfg := r.l.cfg
	for {
		now := cfg.Now()
		r.expire()
		if !now.Before(next) {
			return true
		}
		wake := next
		var leadDone <-chan struct{}
		if r.term != nil {
			if r.lease.ExpiresAt.Before(wake) {
				wake = r.lease.ExpiresAt
			}
			leadDone = r.term.done
		}
		timer := cfg.After(wake.Sub(now))
		if r.l.parked != nil {
			r.l.parked(wake) // after After, so that a test's clock moves only then
		}
		select {
		case <-r.ctx.Done():
			return false
		case <-timer:
		case <-leadDone:
			r.stepDown("Lead returned")
			r.release()
		}
	}
}

// stop ends the term of a Run whose ctx ended and hands the lease on.
func (r *run) stop() {
	r.stepDown("shutting down")
	if r.prev != nil {
		<-r.prev.done
	}
	r.release()
}

// release gives the lease up if it may still be held, bounded by a TTL
// even though Run's ctx has ended: without it the others wait for the
// expiry.
func (r *run) release() {
	if !r.held {
		return
	}
	r.held = false
	cfg := r.l.cfg
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), cfg.TTL)
	defer cancel()
	if err := cfg.Leases.ReleaseLease(ctx, cfg.Name, cfg.Holder, r.lease.Token); err != nil {
		cfg.Log.Warn("leader: could not release the lease; it ends at its expiry", "token", r.lease.Token, "until", r.lease.ExpiresAt, "err", err)
	}
}
