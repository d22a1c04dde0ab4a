package leader

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
)

// The tests drive time with a fake clock and never sleep: a replica
// reports each time its Run parks (with the instant it waits for), and a
// step sets the clock, fires the timers due, and waits (bounded) until
// every replica has parked again waiting for a later instant.

const (
	ttl      = 12 * time.Second // not DefaultTTL: a Leader that ignored its TTL would pass
	interval = ttl / 3
	lease    = "provisioner"
)

// t0 is the tests' start, far from the real clock.
var t0 = time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)

// waitLimit bounds every wait for a replica (real time): far more than
// any step takes, so only a wedged Run reaches it.
const waitLimit = 20 * time.Second

// maxParks bounds the parks of one step: a step takes one or two, and a
// Run that parks more is spinning.
const maxParks = 100

type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.timers = append(c.timers, fakeTimer{at: c.now.Add(d), ch: ch})
	return ch
}

// set moves the clock to now and fires the timers due by then.
func (c *fakeClock) set(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
	c.timers = slices.DeleteFunc(c.timers, func(ft fakeTimer) bool {
		if ft.at.After(now) {
			return false
		}
		ft.ch <- now
		return true
	})
}

// faultyLeases passes calls to the store unless told to fail them.
type faultyLeases struct {
	imagestore.Leases
	mu         sync.Mutex
	renewErr   error
	acquireErr error
	hang       chan struct{} // if set, the next RenewLease waits for it
}

func (f *faultyLeases) fail(renew, acquire error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.renewErr, f.acquireErr = renew, acquire
}

func (f *faultyLeases) RenewLease(ctx context.Context, name, holder string, token int64, ttl time.Duration, now time.Time) (imagestore.Lease, error) {
	f.mu.Lock()
	err, hang := f.renewErr, f.hang
	f.hang = nil
	f.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
			return imagestore.Lease{}, errors.New("store: connection reset")
		case <-ctx.Done():
			return imagestore.Lease{}, ctx.Err()
		}
	}
	if err != nil {
		return imagestore.Lease{}, err
	}
	return f.Leases.RenewLease(ctx, name, holder, token, ttl, now)
}

func (f *faultyLeases) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (imagestore.Lease, error) {
	f.mu.Lock()
	err := f.acquireErr
	f.mu.Unlock()
	if err != nil {
		return imagestore.Lease{}, err
	}
	return f.Leases.AcquireLease(ctx, name, holder, ttl, now)
}

// replica is one Leader under test and what it reported.
type replica struct {
	name   string
	l      *Leader
	leases *faultyLeases
	parks  chan time.Time
	wake   time.Time // the instant of its last park
	cancel context.CancelFunc
	done   chan struct{} // Run returned

	// started hears each Lead's context as Lead begins; terms are those
	// the test has taken from it, in order.
	started chan context.Context
	terms   []context.Context
	calls   atomic.Int32
	// leadReturns, if set, makes the first Lead return at once.
	leadReturns bool
}

func (r *replica) lead(ctx context.Context) {
	r.started <- ctx
	if r.leadReturns && r.calls.Add(1) == 1 {
		return
	}
	<-ctx.Done()
}

// term returns the context of the replica's n-th Lead (from 1), waiting
// (bounded) for Lead to have begun: it runs in a goroutine.
func (r *replica) term(t *testing.T, n int) context.Context {
	t.Helper()
	for len(r.terms) < n {
		select {
		case ctx := <-r.started:
			r.terms = append(r.terms, ctx)
		case <-time.After(waitLimit):
			t.Fatalf("%s: Lead did not begin a %d. time", r.name, n)
		}
	}
	return r.terms[n-1]
}

// termCount is how many times Lead began; only once Run has returned is
// it final.
func (r *replica) termCount() int {
	for {
		select {
		case ctx := <-r.started:
			r.terms = append(r.terms, ctx)
		default:
			return len(r.terms)
		}
	}
}

type world struct {
	clock *fakeClock
	store *sqlite.Store
	reps  []*replica
}

func newWorld(t *testing.T) *world {
	t.Helper()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	w := &world{clock: &fakeClock{now: t0}, store: s}
	t.Cleanup(func() {
		for _, r := range w.reps {
			r.cancel()
			<-r.done
		}
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return w
}

// start runs a Leader for holder name and waits until it has parked.
func (w *world) start(t *testing.T, name string, opts ...func(*replica)) *replica {
	t.Helper()
	r := &replica{name: name, leases: &faultyLeases{Leases: w.store}, parks: make(chan time.Time, 1000), done: make(chan struct{}), started: make(chan context.Context, 100)}
	for _, o := range opts {
		o(r)
	}
	l, err := New(Config{Leases: r.leases, Name: lease, Holder: name, TTL: ttl, Lead: r.lead, Now: w.clock.Now, After: w.clock.After})
	if err != nil {
		t.Fatal(err)
	}
	l.parked = func(wake time.Time) {
		select {
		case r.parks <- wake:
		default: // a Run that spins; settle fails it
		}
	}
	r.l = l
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		l.Run(ctx)
	}()
	w.reps = append(w.reps, r)
	w.settle(t)
	return r
}

// step sets the clock to now and waits until every running replica has
// parked waiting for a later instant.
func (w *world) step(t *testing.T, now time.Time) {
	t.Helper()
	w.clock.set(now)
	w.settle(t)
}

func (w *world) settle(t *testing.T) {
	t.Helper()
	now := w.clock.Now()
	for _, r := range w.reps {
	wait:
		for n := 0; r.wake.Compare(now) <= 0; n++ {
			if n == maxParks {
				t.Fatalf("%s parked %d times at %v without waiting for a later instant", r.name, n, now)
			}
			select {
			case r.wake = <-r.parks:
			case <-r.done:
				break wait // a stopped replica parks no more
			case <-time.After(waitLimit):
				t.Fatalf("%s did not park after %v", r.name, now)
			}
		}
	}
	w.oneAtMost(t)
}

// oneAtMost: never two leaders at once.
func (w *world) oneAtMost(t *testing.T) {
	t.Helper()
	var leading []string
	for _, r := range w.reps {
		if r.l.Leading() {
			leading = append(leading, r.name)
		}
	}
	if len(leading) > 1 {
		t.Fatalf("at %v, %v lead at once", w.clock.Now(), leading)
	}
}

// leader returns the replica that leads, failing if none does.
func (w *world) leader(t *testing.T) *replica {
	t.Helper()
	for _, r := range w.reps {
		if r.l.Leading() {
			return r
		}
	}
	t.Fatalf("at %v nobody leads", w.clock.Now())
	return nil
}

// stored is the lease as the store has it, asked by a third holder.
func (w *world) stored(t *testing.T) imagestore.Lease {
	t.Helper()
	l, err := w.store.AcquireLease(t.Context(), lease, "probe", time.Nanosecond, w.clock.Now())
	if !errors.Is(err, imagestore.ErrLeaseHeld) {
		t.Fatalf("probe AcquireLease = %+v, %v; want the lease held", l, err)
	}
	return l
}

func (w *world) stop(t *testing.T, r *replica) {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(waitLimit):
		t.Fatalf("%s: Run did not return", r.name)
	}
}

func TestNew(t *testing.T) {
	lead := func(context.Context) {}
	var s imagestore.Leases = &faultyLeases{}
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"complete", Config{Leases: s, Name: "p", Holder: "a", Lead: lead}, true},
		{"own TTL", Config{Leases: s, Name: "p", Holder: "a", Lead: lead, TTL: time.Second}, true},
		{"no store", Config{Name: "p", Holder: "a", Lead: lead}, false},
		{"no name", Config{Leases: s, Holder: "a", Lead: lead}, false},
		{"no holder", Config{Leases: s, Name: "p", Lead: lead}, false},
		{"no Lead", Config{Leases: s, Name: "p", Holder: "a"}, false},
		{"negative TTL", Config{Leases: s, Name: "p", Holder: "a", Lead: lead, TTL: -time.Second}, false},
		{"TTL without a renewal interval", Config{Leases: s, Name: "p", Holder: "a", Lead: lead, TTL: time.Nanosecond}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := New(tc.cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("New: %v, want ok %v", err, tc.ok)
			}
			if tc.ok && tc.cfg.TTL == 0 && l.cfg.TTL != DefaultTTL {
				t.Errorf("TTL = %v, want DefaultTTL", l.cfg.TTL)
			}
		})
	}
}

// TestOneLeads: of replicas on one store exactly one leads, renews its
// lease term after term and runs Lead once; the others never do.
func TestOneLeads(t *testing.T) {
	w := newWorld(t)
	for _, n := range []string{"a", "b", "c"} {
		w.start(t, n)
	}
	first := w.leader(t)
	first.term(t, 1)
	for i := 1; i <= 9; i++ {
		w.step(t, t0.Add(time.Duration(i)*interval))
		if r := w.leader(t); r != first {
			t.Fatalf("at step %d %s leads, want %s still", i, r.name, first.name)
		}
		if got := w.stored(t); got.Holder != first.name || got.Token != 1 || !got.ExpiresAt.Equal(w.clock.Now().Add(ttl)) {
			t.Fatalf("at step %d the stored lease is %+v, want %s's, token 1, renewed until %v", i, got, first.name, w.clock.Now().Add(ttl))
		}
	}
	for _, r := range w.reps {
		w.stop(t, r)
	}
	for _, r := range w.reps {
		want := 0
		if r == first {
			want = 1
		}
		if got := r.termCount(); got != want {
			t.Errorf("%s ran Lead %d times, want %d", r.name, got, want)
		}
	}
	if err := first.term(t, 1).Err(); err == nil {
		t.Error("the leader's Lead context is not cancelled after Run returned")
	}
}

// TestHandover: a leader whose Run ends cancels Lead and releases the
// lease; another replica leads at its next attempt, with the next token.
func TestHandover(t *testing.T) {
	w := newWorld(t)
	a := w.start(t, "a")
	b := w.start(t, "b")
	if w.leader(t) != a {
		t.Fatal("a, started first, does not lead")
	}
	w.step(t, t0.Add(interval))
	w.stop(t, a)
	if err := a.term(t, 1).Err(); err == nil {
		t.Error("a's Lead context is not cancelled after its Run returned")
	}
	if err := w.store.CheckLease(t.Context(), lease, 1, w.clock.Now()); !errors.Is(err, imagestore.ErrLeaseLost) {
		t.Errorf("CheckLease of a's token after its Run: %v, want ErrLeaseLost (released)", err)
	}
	if b.l.Leading() {
		t.Fatal("b leads before its next attempt")
	}
	// b's next attempt is an interval after its last, well before a's
	// lease would have expired.
	w.step(t, t0.Add(2*interval))
	if w.leader(t) != b {
		t.Fatal("b does not lead after a released the lease")
	}
	if got := w.stored(t); got.Holder != "b" || got.Token != 2 {
		t.Errorf("stored lease %+v, want b's with token 2", got)
	}
	b.term(t, 1)
}

// TestStoreTrouble: a leader that cannot renew leads on until its lease's
// ExpiresAt ("could not ask" is not "lost") and stops exactly then, the
// first instant another replica may take the lease; a leader told the
// lease is lost stops at once. Either way Lead's context is cancelled and
// the other replica leads from the expiry on.
func TestStoreTrouble(t *testing.T) {
	unreachable := errors.New("dial tcp 127.0.0.1:5432: connection refused")
	tests := []struct {
		name             string
		renew, acquire   error
		leadsUntilExpiry bool
	}{
		{"store unreachable", unreachable, unreachable, true},
		{"lease lost", imagestore.ErrLeaseLost, imagestore.ErrLeaseHeld, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			a := w.start(t, "a")
			b := w.start(t, "b")
			if w.leader(t) != a {
				t.Fatal("a, started first, does not lead")
			}
			w.step(t, t0.Add(interval)) // renewed until t0+interval+ttl
			expires := t0.Add(interval + ttl)
			a.leases.fail(tc.renew, tc.acquire)
			lead := a.term(t, 1)

			w.step(t, t0.Add(2*interval)) // the first failed renewal
			if tc.leadsUntilExpiry != a.l.Leading() || tc.leadsUntilExpiry != (lead.Err() == nil) {
				t.Fatalf("after one failed renewal: a leads %v, its Lead context %v; want leading %v", a.l.Leading(), lead.Err(), tc.leadsUntilExpiry)
			}
			w.step(t, t0.Add(3*interval))
			w.step(t, expires.Add(-time.Nanosecond))
			if tc.leadsUntilExpiry != a.l.Leading() || tc.leadsUntilExpiry != (lead.Err() == nil) {
				t.Fatalf("just before the expiry: a leads %v, its Lead context %v; want leading %v", a.l.Leading(), lead.Err(), tc.leadsUntilExpiry)
			}
			if b.l.Leading() {
				t.Fatal("b leads before a's lease expired")
			}
			w.step(t, expires)
			if a.l.Leading() || lead.Err() == nil {
				t.Fatalf("at the expiry: a leads %v, its Lead context %v; want stepped down", a.l.Leading(), lead.Err())
			}
			if w.leader(t) != b {
				t.Fatal("b does not lead once a's lease expired")
			}
			if got := w.stored(t); got.Holder != "b" || got.Token != 2 {
				t.Errorf("stored lease %+v, want b's with token 2", got)
			}
		})
	}
}

// TestStoreHangs: a renewal that hangs does not keep the leader leading
// past its lease's expiry: Lead's context is cancelled at ExpiresAt while
// the store still has not answered.
func TestStoreHangs(t *testing.T) {
	w := newWorld(t)
	a := w.start(t, "a")
	lead := a.term(t, 1)
	hang := make(chan struct{})
	a.leases.mu.Lock()
	a.leases.hang = hang
	a.leases.mu.Unlock()
	// The renewal at t0+interval hangs; the lease (from t0) expires at t0+ttl.
	w.clock.set(t0.Add(interval))
	w.clock.set(t0.Add(ttl - time.Nanosecond))
	if !a.l.Leading() || lead.Err() != nil {
		t.Fatalf("before the expiry: leading %v, Lead context %v; want leading", a.l.Leading(), lead.Err())
	}
	w.clock.set(t0.Add(ttl))
	select {
	case <-lead.Done():
	case <-time.After(waitLimit):
		t.Fatal("Lead's context is not cancelled at the expiry while the renewal hangs")
	}
	if a.l.Leading() {
		t.Error("a leads past its expiry")
	}
	close(hang)
	w.settle(t)
	w.step(t, t0.Add(ttl+interval))
	if w.leader(t) != a {
		t.Fatal("a does not lead again once the store answers")
	}
	if a.term(t, 2).Err() != nil {
		t.Error("the new term's Lead context is cancelled")
	}
}

// TestLeadReturns: a Lead that returns by itself gives its term up: the
// lease is released, and the next attempt starts a new term.
func TestLeadReturns(t *testing.T) {
	w := newWorld(t)
	a := w.start(t, "a", func(r *replica) { r.leadReturns = true })
	a.term(t, 1)
	// start saw Run park leading; Lead's return wakes it, and it parks
	// again once it has stepped down and released the lease.
	select {
	case a.wake = <-a.parks:
	case <-time.After(waitLimit):
		t.Fatal("a did not park again after Lead returned")
	}
	if a.l.Leading() {
		t.Error("a leads on after Lead returned")
	}
	if err := w.store.CheckLease(t.Context(), lease, 1, w.clock.Now()); !errors.Is(err, imagestore.ErrLeaseLost) {
		t.Errorf("CheckLease after Lead returned: %v, want ErrLeaseLost (released)", err)
	}
	w.step(t, t0.Add(interval))
	if w.leader(t) != a {
		t.Fatal("a does not lead again at its next attempt")
	}
	if got := w.stored(t); got.Token != 2 {
		t.Errorf("stored lease %+v, want token 2", got)
	}
	a.term(t, 2)
}
