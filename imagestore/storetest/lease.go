package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// leaseTTL is the suite's lease time: its steps are offsets from t0 in
// whole seconds, so that a boundary (at, just before ExpiresAt) shows.
const leaseTTL = 10 * time.Second

// leaseStep is one call of a lease sequence and what it must answer.
type leaseStep struct {
	op     string        // acquire, renew, release, check
	holder string        // acquire, renew, release
	token  int64         // renew, release, check
	at     time.Duration // now = t0 + at
	ttl    time.Duration // acquire, renew; leaseTTL if zero
	// want is the Lease acquire or renew returns (with ErrLeaseHeld too:
	// the holder's); its Name is the case's.
	want imagestore.Lease
	err  error
}

func leaseAt(holder string, token int64, until time.Duration) imagestore.Lease {
	return imagestore.Lease{Holder: holder, Token: token, ExpiresAt: t0.Add(until)}
}

// testLeaseRules runs each rule of imagestore.Leases as a sequence of
// calls on a name of its own.
func testLeaseRules(t *testing.T, s imagestore.Store) {
	const ns = time.Nanosecond
	sec := time.Second
	tests := []struct {
		name  string
		steps []leaseStep
	}{
		{"acquire free", []leaseStep{
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
		}},
		{"acquire own lease renews it, same token", []leaseStep{
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
			{op: "acquire", holder: "a", at: 5 * sec, want: leaseAt("a", 1, 15*sec)},
			{op: "acquire", holder: "a", at: 15*sec - ns, ttl: sec, want: leaseAt("a", 1, 16*sec-ns)},
		}},
		{"held by another", []leaseStep{
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
			{op: "acquire", holder: "b", at: 5 * sec, want: leaseAt("a", 1, 10*sec), err: imagestore.ErrLeaseHeld},
			{op: "acquire", holder: "b", at: 10*sec - ns, want: leaseAt("a", 1, 10*sec), err: imagestore.ErrLeaseHeld},
		}},
		{"expired is taken with the next token", []leaseStep{
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
			{op: "acquire", holder: "b", at: 10 * sec, want: leaseAt("b", 2, 20*sec)},
			{op: "acquire", holder: "a", at: 15 * sec, want: leaseAt("b", 2, 20*sec), err: imagestore.ErrLeaseHeld},
			{op: "acquire", holder: "a", at: 25 * sec, want: leaseAt("a", 3, 35*sec)},
		}},
		{"own expired lease is a new term", []leaseStep{
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
			{op: "acquire", holder: "a", at: 10 * sec, want: leaseAt("a", 2, 20*sec)},
			{op: "check", token: 1, at: 11 * sec, err: imagestore.ErrLeaseLost},
		}},
		{"renew by holder", []leaseStep{
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
			{op: "renew", holder: "a", token: 1, at: 4 * sec, want: leaseAt("a", 1, 14*sec)},
			{op: "renew", holder: "a", token: 1, at: 14*sec - ns, want: leaseAt("a", 1, 24*sec-ns)},
			{op: "acquire", holder: "b", at: 20 * sec, want: leaseAt("a", 1, 24*sec-ns), err: imagestore.ErrLeaseHeld},
		}},
		{"renew after takeover is lost", []leaseStep{
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
			{op: "acquire", holder: "b", at: 10 * sec, want: leaseAt("b", 2, 20*sec)},
			{op: "renew", holder: "a", token: 1, at: 11 * sec, err: imagestore.ErrLeaseLost},
			{op: "check", token: 2, at: 11 * sec},
		}},
		{"renew of an expired lease is lost", []leaseStep{
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
			{op: "renew", holder: "a", token: 1, at: 10 * sec, err: imagestore.ErrLeaseLost},
			{op: "acquire", holder: "a", at: 10 * sec, want: leaseAt("a", 2, 20*sec)},
		}},
		{"renew never held is lost", []leaseStep{
			{op: "renew", holder: "a", token: 1, err: imagestore.ErrLeaseLost},
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
			{op: "renew", holder: "b", token: 1, at: sec, err: imagestore.ErrLeaseLost},
			{op: "renew", holder: "a", token: 2, at: sec, err: imagestore.ErrLeaseLost},
			{op: "check", token: 1, at: 9 * sec},
		}},
		{"release then acquire by another", []leaseStep{
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
			{op: "release", holder: "a", token: 1},
			{op: "check", token: 1, at: sec, err: imagestore.ErrLeaseLost},
			{op: "renew", holder: "a", token: 1, at: sec, err: imagestore.ErrLeaseLost},
			{op: "acquire", holder: "b", at: sec, want: leaseAt("b", 2, 11*sec)},
		}},
		{"release then acquire by the same holder", []leaseStep{
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
			{op: "release", holder: "a", token: 1},
			{op: "acquire", holder: "a", at: sec, want: leaseAt("a", 2, 11*sec)},
			{op: "check", token: 1, at: 2 * sec, err: imagestore.ErrLeaseLost},
		}},
		{"release with an old token changes nothing", []leaseStep{
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
			{op: "acquire", holder: "b", at: 10 * sec, want: leaseAt("b", 2, 20*sec)},
			{op: "release", holder: "a", token: 1},
			{op: "release", holder: "a", token: 2},
			{op: "release", holder: "b", token: 1},
			{op: "acquire", holder: "c", at: 11 * sec, want: leaseAt("b", 2, 20*sec), err: imagestore.ErrLeaseHeld},
			{op: "check", token: 2, at: 11 * sec},
		}},
		{"release never held is no error", []leaseStep{
			{op: "release", holder: "a", token: 1},
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
		}},
		{"check fences old and expired tokens", []leaseStep{
			{op: "check", token: 1, err: imagestore.ErrLeaseLost},
			{op: "acquire", holder: "a", want: leaseAt("a", 1, 10*sec)},
			{op: "check", token: 1},
			{op: "check", token: 1, at: 10*sec - ns},
			{op: "check", token: 1, at: 10 * sec, err: imagestore.ErrLeaseLost},
			{op: "check", token: 0, at: sec, err: imagestore.ErrLeaseLost},
			{op: "check", token: 2, at: sec, err: imagestore.ErrLeaseLost},
			{op: "acquire", holder: "b", at: 12 * sec, want: leaseAt("b", 2, 22*sec)},
			{op: "check", token: 1, at: 12 * sec, err: imagestore.ErrLeaseLost},
			{op: "check", token: 2, at: 12 * sec},
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("lease-%d", i)
			for j, st := range tc.steps {
				runLeaseStep(t, s, name, j, st)
			}
		})
	}
}

func runLeaseStep(t *testing.T, s imagestore.Store, name string, j int, st leaseStep) {
	t.Helper()
	ctx := t.Context()
	now := t0.Add(st.at)
	ttl := st.ttl
	if ttl == 0 {
		ttl = leaseTTL
	}
	op := fmt.Sprintf("step %d: %s %q token %d at t0+%v", j, st.op, st.holder, st.token, st.at)
	var (
		got imagestore.Lease
		err error
	)
	switch st.op {
	case "acquire":
		got, err = s.AcquireLease(ctx, name, st.holder, ttl, now)
	case "renew":
		got, err = s.RenewLease(ctx, name, st.holder, st.token, ttl, now)
	case "release":
		err = s.ReleaseLease(ctx, name, st.holder, st.token)
	case "check":
		err = s.CheckLease(ctx, name, st.token, now)
	default:
		t.Fatalf("%s: unknown op", op)
	}
	if st.err == nil && err != nil || st.err != nil && !errors.Is(err, st.err) {
		t.Fatalf("%s: err = %v, want %v", op, err, st.err)
	}
	if st.op != "acquire" && st.op != "renew" || st.err == imagestore.ErrLeaseLost {
		return
	}
	want := st.want
	want.Name = name
	if got.Name != want.Name || got.Holder != want.Holder || got.Token != want.Token || !got.ExpiresAt.Equal(want.ExpiresAt) {
		t.Fatalf("%s: lease = %+v, want %+v", op, got, want)
	}
}

// testLeaseRefused: what does not describe a lease is refused, as an
// error of its own, neither held nor lost, and takes nothing.
func testLeaseRefused(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	tests := []struct {
		name, lease, holder string
		ttl                 time.Duration
	}{
		{"empty name", "", "a", leaseTTL},
		{"empty holder", "l", "", leaseTTL},
		{"zero ttl", "l", "a", 0},
		{"negative ttl", "l", "a", -time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for op, call := range map[string]func() error{
				"acquire": func() error { _, err := s.AcquireLease(ctx, tc.lease, tc.holder, tc.ttl, t0); return err },
				"renew":   func() error { _, err := s.RenewLease(ctx, tc.lease, tc.holder, 1, tc.ttl, t0); return err },
			} {
				err := call()
				if err == nil || errors.Is(err, imagestore.ErrLeaseHeld) || errors.Is(err, imagestore.ErrLeaseLost) {
					t.Errorf("%s: err = %v, want a refusal of the arguments", op, err)
				}
			}
		})
	}
	l, err := s.AcquireLease(ctx, "l", "b", leaseTTL, t0)
	if err != nil || l.Token != 1 {
		t.Errorf("AcquireLease after the refusals = %+v, %v; want token 1: a refusal took nothing", l, err)
	}
}

// testLeaseNames: leases of different names are independent, each with
// tokens of its own.
func testLeaseNames(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	for _, name := range []string{"provisioner", "sweeper", "upload-0123"} {
		l, err := s.AcquireLease(ctx, name, "a", leaseTTL, t0)
		if err != nil || l.Token != 1 || l.Holder != "a" {
			t.Errorf("AcquireLease(%s) = %+v, %v; want a's, token 1", name, l, err)
		}
	}
	l, err := s.AcquireLease(ctx, "sweeper-2", "b", leaseTTL, t0)
	if err != nil || l.Token != 1 || l.Holder != "b" {
		t.Errorf("AcquireLease(sweeper-2) = %+v, %v; want b's, token 1", l, err)
	}
	must(t, "CheckLease", s.CheckLease(ctx, "sweeper-2", 1, t0))
}

// testLeaseConcurrent: of many holders acquiring one name at the same now,
// exactly one wins each round and the others hear ErrLeaseHeld naming
// it; each round (a ttl later, all expired) has the next token.
func testLeaseConcurrent(t *testing.T, s imagestore.Store) {
	const (
		holders = 12
		rounds  = 4
	)
	for r := range rounds {
		now := t0.Add(time.Duration(r) * leaseTTL)
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			won  []imagestore.Lease
			held []imagestore.Lease
		)
		for h := range holders {
			wg.Go(func() {
				l, err := s.AcquireLease(t.Context(), "leader", fmt.Sprintf("replica-%d", h), leaseTTL, now)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					won = append(won, l)
				case errors.Is(err, imagestore.ErrLeaseHeld):
					held = append(held, l)
				default:
					t.Errorf("round %d: AcquireLease: %v", r, err)
				}
			})
		}
		wg.Wait()
		if len(won) != 1 || len(held) != holders-1 {
			t.Fatalf("round %d: %d won, %d held: want 1 and %d", r, len(won), len(held), holders-1)
		}
		w := won[0]
		if w.Token != int64(r+1) || !w.ExpiresAt.Equal(now.Add(leaseTTL)) {
			t.Errorf("round %d: winner %+v, want token %d until %v", r, w, r+1, now.Add(leaseTTL))
		}
		for _, h := range held {
			if h != w {
				t.Errorf("round %d: refused with %+v, want the winner %+v", r, h, w)
			}
		}
		must(t, "CheckLease", s.CheckLease(t.Context(), "leader", w.Token, now))
	}
}

// testForgetLeases: ended leases under the prefix go, held ones and
// others' stay; an empty prefix is refused.
func testForgetLeases(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	acquire := func(name string) imagestore.Lease {
		t.Helper()
		l, err := s.AcquireLease(ctx, name, "r1", leaseTTL, t0)
		must(t, "AcquireLease "+name, err)
		return l
	}
	acquire("upload/expired")
	released := acquire("upload/released")
	must(t, "ReleaseLease", s.ReleaseLease(ctx, released.Name, "r1", released.Token))
	acquire("leader")
	// Held until t0+2*TTL: taken later.
	if _, err := s.AcquireLease(ctx, "upload/held", "r1", leaseTTL, t0.Add(leaseTTL)); err != nil {
		t.Fatal(err)
	}
	_, err := s.ForgetLeases(ctx, "", t0.Add(time.Hour))
	if err == nil {
		t.Error("ForgetLeases with an empty prefix succeeded")
	}
	n, err := s.ForgetLeases(ctx, "upload/", t0.Add(leaseTTL+time.Second))
	must(t, "ForgetLeases", err)
	if n != 2 {
		t.Errorf("ForgetLeases = %d, want 2 (the expired and the released upload leases)", n)
	}
	// A forgotten name starts over; the others are as they were.
	if l := acquire("upload/expired"); l.Token != 1 {
		t.Errorf("a forgotten lease comes back with token %d, want 1", l.Token)
	}
	if _, err := s.AcquireLease(ctx, "upload/held", "r2", leaseTTL, t0.Add(leaseTTL+time.Second)); !errors.Is(err, imagestore.ErrLeaseHeld) {
		t.Errorf("the held upload lease after ForgetLeases: %v, want ErrLeaseHeld", err)
	}
	if _, err := s.AcquireLease(ctx, "leader", "r2", leaseTTL, t0.Add(leaseTTL+time.Second)); err != nil {
		t.Errorf("leader lease (expired, another prefix) kept: %v", err)
	} else if l, _ := s.AcquireLease(ctx, "leader", "r2", leaseTTL, t0.Add(leaseTTL+2*time.Second)); l.Token != 2 {
		t.Errorf("leader lease token %d after ForgetLeases of upload/, want 2 (not forgotten)", l.Token)
	}
}

// testEndUnleasedUploads: of the plain uploads marked running, only those
// started before the bound whose lease nobody holds are ended.
func testEndUnleasedUploads(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	a := newTenant(t, s, "alpha")
	const prefix = "upload/"
	start := func(i int, at time.Time) string {
		t.Helper()
		secret := fmt.Sprintf("put-%d", i)
		id := uploadID(i)
		newTicket(t, s, a.ID, secret, id, t0.Add(time.Hour))
		_, err := s.ConsumeTicket(ctx, hash(secret), at)
		must(t, "ConsumeTicket "+secret, err)
		return id
	}
	dead := start(1, t0)                      // its replica died: lease expired
	alive := start(2, t0)                     // lease held
	young := start(3, t0.Add(50*time.Second)) // too young to judge, no lease yet
	neverLeased := start(4, t0)               // no lease row at all
	now := t0.Add(time.Minute)
	// On the boundaries: started exactly at the bound (not before it, so
	// still too young), and a lease that ends exactly now (dead at its
	// ExpiresAt, like every lease).
	atBound := start(5, now.Add(-30*time.Second))
	lapsing := start(6, t0)
	for _, id := range []string{dead, alive} {
		if _, err := s.AcquireLease(ctx, prefix+id, "r1", leaseTTL, t0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AcquireLease(ctx, prefix+lapsing, "r1", leaseTTL, now.Add(-leaseTTL)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RenewLease(ctx, prefix+alive, "r1", 1, leaseTTL, t0.Add(leaseTTL-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcquireLease(ctx, prefix+alive, "r1", 2*time.Minute, t0.Add(leaseTTL-time.Second)); err != nil {
		t.Fatal(err)
	}
	n, err := s.EndUnleasedUploads(ctx, prefix, now, now.Add(-30*time.Second))
	must(t, "EndUnleasedUploads", err)
	if n != 3 {
		t.Errorf("EndUnleasedUploads = %d, want 3 (the dead one, the never leased one and the one whose lease ends now)", n)
	}
	_, _, _, _ = neverLeased, young, atBound, lapsing // judged through the quota below
	// alive, young and atBound still hold their places: a quota of 3 is
	// full, and was not overfull.
	err = s.CreateTicket(ctx, imagestore.Ticket{UploadID: uploadID(9), TenantID: a.ID, Name: "more",
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, hash("more"), 3)
	wantErr(t, "ticket beside the three still running at quota 3", err, imagestore.ErrQuota)
	err = s.CreateTicket(ctx, imagestore.Ticket{UploadID: uploadID(10), TenantID: a.ID, Name: "one more",
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, hash("one more"), 4)
	must(t, "ticket beside the three still running at quota 4", err)
	if n, err := s.EndUnleasedUploads(ctx, prefix, now, now.Add(-30*time.Second)); err != nil || n != 0 {
		t.Errorf("second EndUnleasedUploads = %d, %v; want 0", n, err)
	}
}
