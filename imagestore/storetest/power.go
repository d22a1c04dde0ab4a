package storetest

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// testPowerRequests: a power request is the buyer's; its id finds the
// first request and its answer again; one still running is taken again
// only once it is stale (strictly before the bound); of concurrent takes
// of one id exactly one runs it; the sweep removes old ones.
func testPowerRequests(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h, b := newHost(t, s, "host"), newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 5, t0)
	o := paidOrder(t, s, l, h, b, "o1", 2)
	r := imagestore.PowerRequest{TenantID: b.ID, OrderID: o.ID, RequestID: "req-1", Replica: imagestore.AllReplicas,
		Action: imagestore.PowerRestart, TakenAt: t0}
	if _, _, err := s.TakePowerRequest(ctx, imagestore.PowerRequest{TenantID: h.ID, OrderID: o.ID, RequestID: "req-h",
		Replica: 0, Action: imagestore.PowerStop, TakenAt: t0}, t0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("a power request of the order's host: %v, want ErrNotFound (only its buyer)", err)
	}
	for _, bad := range []imagestore.PowerRequest{
		{TenantID: b.ID, OrderID: o.ID, RequestID: "x", Replica: 0, Action: "reset", TakenAt: t0},
		{TenantID: b.ID, OrderID: o.ID, RequestID: "x", Replica: -2, Action: imagestore.PowerStop, TakenAt: t0},
		{TenantID: b.ID, OrderID: o.ID, RequestID: "", Replica: 0, Action: imagestore.PowerStop, TakenAt: t0},
	} {
		if _, _, err := s.TakePowerRequest(ctx, bad, t0); err == nil {
			t.Errorf("%+v was taken", bad)
		}
	}

	got, taken, err := s.TakePowerRequest(ctx, r, t0.Add(-time.Minute))
	if err != nil || !taken || got.Replica != imagestore.AllReplicas || got.Action != imagestore.PowerRestart ||
		!got.TakenAt.Equal(t0) || !got.DoneAt.IsZero() || got.TenantID != b.ID {
		t.Fatalf("first take = %+v, %v, %v", got, taken, err)
	}
	// Running, and taken exactly at the stale bound: not stale yet.
	later := r
	later.TakenAt, later.Action, later.Replica = t0.Add(time.Minute), imagestore.PowerStop, 1
	if got, taken, err := s.TakePowerRequest(ctx, later, t0); err != nil || taken || got.Action != imagestore.PowerRestart ||
		got.Replica != imagestore.AllReplicas || !got.TakenAt.Equal(t0) {
		t.Fatalf("a retry while it runs = %+v, %v, %v; want the first, not taken", got, taken, err)
	}
	// Stale: taken again, as it was first asked.
	if got, taken, err := s.TakePowerRequest(ctx, later, t0.Add(time.Nanosecond)); err != nil || !taken ||
		got.Action != imagestore.PowerRestart || !got.TakenAt.Equal(later.TakenAt) {
		t.Fatalf("a retry once stale = %+v, %v, %v; want the first request, taken at the retry", got, taken, err)
	}
	// The first taker's answer comes too late: its take is over.
	if err := s.FinishPowerRequest(ctx, o.ID, "req-1", t0, 202, []byte(`{}`), t0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("finishing a take that was taken again: %v, want ErrNotFound", err)
	}
	answer := []byte(`{"order_id":"o1","replicas":[]}`)
	must(t, "FinishPowerRequest", s.FinishPowerRequest(ctx, o.ID, "req-1", later.TakenAt, 202, answer, later.TakenAt.Add(time.Second)))
	if err := s.FinishPowerRequest(ctx, o.ID, "req-1", later.TakenAt, 409, nil, later.TakenAt); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("finishing twice: %v, want ErrNotFound", err)
	}
	// Done: every retry gets the answer, however late.
	if got, taken, err := s.TakePowerRequest(ctx, later, t0.Add(time.Hour)); err != nil || taken || got.Status != 202 ||
		!bytes.Equal(got.Answer, answer) || !got.DoneAt.Equal(later.TakenAt.Add(time.Second)) {
		t.Fatalf("a retry after the answer = %+v, %v, %v", got, taken, err)
	}
	// A fault's answer is not kept: the retry runs again.
	fault := r
	fault.RequestID = "req-3"
	if _, _, err := s.TakePowerRequest(ctx, fault, t0); err != nil {
		t.Fatal(err)
	}
	must(t, "FinishPowerRequest", s.FinishPowerRequest(ctx, o.ID, "req-3", t0, 503, []byte(`{}`), t0))
	if got, taken, err := s.TakePowerRequest(ctx, fault, t0); err != nil || !taken || got.Status != 0 {
		t.Errorf("a retry after a 503 = %+v, %v, %v; want it taken anew", got, taken, err)
	}
	if err := s.FinishPowerRequest(ctx, o.ID, "req-2", t0, 202, make([]byte, imagestore.MaxPowerAnswer+1), t0); err == nil {
		t.Error("an answer over MaxPowerAnswer was stored")
	}

	const n = 8
	start := make(chan struct{})
	wins := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			race := r
			race.RequestID = "race"
			_, taken, err := s.TakePowerRequest(ctx, race, t0.Add(-time.Hour))
			wins[i] = taken
			if err != nil {
				t.Errorf("TakePowerRequest: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	count := 0
	for _, w := range wins {
		if w {
			count++
		}
	}
	if count != 1 {
		t.Errorf("%d of %d concurrent takes of one request id ran it, want exactly 1", count, n)
	}

	// The sweep keeps a request for the retention, then removes it.
	if _, err := s.SweepTickets(ctx, t0.Add(time.Hour), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, taken, err := s.TakePowerRequest(ctx, later, t0.Add(time.Hour)); err != nil || taken || got.Status != 202 {
		t.Fatalf("after a sweep within the retention = %+v, %v, %v; want the answer kept", got, taken, err)
	}
	if _, err := s.SweepTickets(ctx, t0.Add(2*time.Hour), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, taken, err := s.TakePowerRequest(ctx, later, t0.Add(2*time.Hour)); err != nil || !taken || got.Status != 0 {
		t.Fatalf("after a sweep past the retention = %+v, %v, %v; want a new request", got, taken, err)
	}
}
