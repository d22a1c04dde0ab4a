package market

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmshelf/vmshelf/imagestore"
)

// scriptedPower is a cluster whose answer to each replica's power action
// the test sets; it records what it was asked.
type scriptedPower struct {
	mu      sync.Mutex
	answers map[int]error
	calls   []string
	// hold, when set, is waited on inside each call, after entered
	// is told.
	hold, entered chan struct{}
}

func (p *scriptedPower) Power(_ context.Context, o imagestore.Order, replica int, a imagestore.PowerAction) error {
	p.mu.Lock()
	p.calls = append(p.calls, fmt.Sprintf("%s %d %s", o.ID, replica, a))
	err, hold, entered := p.answers[replica], p.hold, p.entered
	p.mu.Unlock()
	if hold != nil {
		select {
		case entered <- struct{}{}:
		default: // a second call while one is held: a test's failure
		}
		// Bounded, so that a second call that should not come cannot
		// hang the test.
		select {
		case <-hold:
		case <-time.After(10 * time.Second):
		}
	}
	return err
}

func (p *scriptedPower) asked() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer func() { p.calls = nil }()
	return p.calls
}

func (p *scriptedPower) answer(replica int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answers[replica] = err
}

// powerMarket is a market with power and one active order of three
// replicas: 0 and 1 running, 2 importing its disk.
func powerMarket(t *testing.T) (*marketFixture, imagestore.Order, *scriptedPower) {
	t.Helper()
	sp := &scriptedPower{answers: map[int]error{}}
	m := newMarket(t, func(c *Config) { c.Power = sp })
	id := m.e.placed(m.buyer, m.listing, 3).OrderID
	cs := m.e.sessionOf(id)
	if err := m.e.stripe.Pay(cs); err != nil {
		t.Fatal(err)
	}
	wantResult(t, m.e.event("evt_paid_"+id, eventCompleted, cs, m.e.clock.Now()), resultPaid)
	ctx := t.Context()
	if err := m.e.st.MarkOrderActive(ctx, id); err != nil {
		t.Fatal(err)
	}
	now := m.e.clock.Now()
	if err := m.e.st.SetReplicaStates(ctx, id, []imagestore.ReplicaState{
		{Index: 0, Name: "vm-0", State: imagestore.ReplicaRunning, ObservedAt: now},
		{Index: 1, Name: "vm-1", State: imagestore.ReplicaRunning, ObservedAt: now},
		{Index: 2, Name: "vm-2", State: imagestore.ReplicaImporting, ObservedAt: now},
	}); err != nil {
		t.Fatal(err)
	}
	return m, m.e.storedOrder(id), sp
}

func (m *marketFixture) power(token, body string) response {
	m.e.t.Helper()
	return m.e.post("/market/vms/orders/power", token, body)
}

func powerBody(o imagestore.Order, replica any, action, requestID string) string {
	b, _ := json.Marshal(map[string]any{"order_id": o.ID, "replica": replica, "action": action, "request_id": requestID})
	return string(b)
}

// TestPowerActions: the buyer's action reaches the cluster for exactly
// the replica named, answered 202 with its outcome and counted; every
// other tenant hears the order is unknown; what the machine cannot take
// is 409 in words, and asks the cluster nothing where the edge knows it
// already (an import running, an order not yet made or ended).
func TestPowerActions(t *testing.T) {
	m, o, sp := powerMarket(t)
	accepted := func(action string) float64 {
		return testutil.ToFloat64(m.e.srv.metrics.powerActions.WithLabelValues(action, powerOutcomeAccepted))
	}

	r := m.power(m.buyer, powerBody(o, 1, "restart", ""))
	if r.status != http.StatusAccepted {
		t.Fatalf("restart of replica 1: %d %s", r.status, r.body)
	}
	var a powerAnswer
	decode(t, r, &a)
	if a.OrderID != o.ID || a.Action != "restart" || len(a.Replicas) != 1 || a.Replicas[0] != (powerOutcome{Replica: 1,
		Name: "vm-" + o.ID + "-1", Outcome: powerOutcomeAccepted}) {
		t.Errorf("answer %+v", a)
	}
	if got, want := sp.asked(), []string{o.ID + " 1 restart"}; !slices.Equal(got, want) {
		t.Errorf("the cluster was asked %v, want %v", got, want)
	}
	if accepted("restart") != 1 {
		t.Errorf("accepted restarts counted %v, want 1", accepted("restart"))
	}

	for _, tc := range []struct {
		name, token, body string
		status            int
		reason            string
	}{
		{"the host", m.host, powerBody(o, 0, "stop", ""), 404, "orderUnknown"},
		{"no such order", m.buyer, `{"order_id":"o0000000000000000","action":"stop"}`, 404, "orderUnknown"},
		{"no such replica", m.buyer, powerBody(o, 3, "stop", ""), 404, "replicaUnknown"},
		{"a negative replica", m.buyer, powerBody(o, -2, "stop", ""), 404, "replicaUnknown"},
		{"an unknown action", m.buyer, powerBody(o, 0, "reset", ""), 422, "badRequest"},
		{"a request id with a space", m.buyer, powerBody(o, 0, "stop", "a b"), 422, "badRequest"},
		{"a request id of 65", m.buyer, powerBody(o, 0, "stop", string(make([]byte, 65))), 422, "badRequest"},
		{"an importing replica", m.buyer, powerBody(o, 2, "stop", ""), 409, "replicaImporting"},
	} {
		r := m.power(tc.token, tc.body)
		wantError(t, r, tc.status, tc.reason)
		if got := sp.asked(); len(got) != 0 {
			t.Errorf("%s: the cluster was asked %v", tc.name, got)
		}
	}

	// The cluster's 409, in the action's words.
	for action, want := range map[string]string{"start": "alreadyRunning", "stop": "alreadyStopped", "restart": "machineStopped"} {
		sp.answer(0, fmt.Errorf("provisioner: %w: Operation cannot be fulfilled", imagestore.ErrPowerRefused))
		wantError(t, m.power(m.buyer, powerBody(o, 0, action, "")), http.StatusConflict, want)
		if n := testutil.ToFloat64(m.e.srv.metrics.powerActions.WithLabelValues(action, want)); n != 1 {
			t.Errorf("%s refused %s counted %v, want 1", action, want, n)
		}
	}
	sp.answer(0, imagestore.ErrNoMachine)
	wantError(t, m.power(m.buyer, powerBody(o, 0, "stop", "")), http.StatusConflict, "machinesNotMade")
	sp.answer(0, errors.New("the server is currently unable to handle the request"))
	wantError(t, m.power(m.buyer, powerBody(o, 0, "stop", "")), http.StatusServiceUnavailable, "clusterBusy")
	sp.asked()

	// Every replica: each outcome said; 202 when any took it.
	sp.answer(0, nil)
	sp.answer(1, imagestore.ErrPowerRefused)
	r = m.power(m.buyer, fmt.Sprintf(`{"order_id":%q,"action":"stop"}`, o.ID))
	if r.status != http.StatusAccepted {
		t.Fatalf("stop of every replica: %d %s", r.status, r.body)
	}
	decode(t, r, &a)
	var outcomes []string
	for _, x := range a.Replicas {
		outcomes = append(outcomes, fmt.Sprintf("%d %s", x.Replica, x.Outcome))
		if (x.Outcome == powerOutcomeAccepted) != (x.Error == "") {
			t.Errorf("replica %d: outcome %s with words %q", x.Replica, x.Outcome, x.Error)
		}
	}
	if want := []string{"0 accepted", "1 alreadyStopped", "2 replicaImporting"}; !slices.Equal(outcomes, want) {
		t.Errorf("outcomes %v, want %v", outcomes, want)
	}
	if got, want := sp.asked(), []string{o.ID + " 0 stop", o.ID + " 1 stop"}; !slices.Equal(got, want) {
		t.Errorf("the cluster was asked %v, want %v", got, want)
	}
	sp.answer(0, imagestore.ErrPowerRefused)
	wantError(t, m.power(m.buyer, fmt.Sprintf(`{"order_id":%q,"action":"stop"}`, o.ID)), http.StatusConflict, "alreadyStopped")
	sp.asked()

	// Past its end: nothing starts again; a stop still may.
	sp.answer(0, nil)
	m.e.clock.Set(o.ExpiresAt)
	for _, action := range []string{"start", "restart"} {
		wantError(t, m.power(m.buyer, powerBody(o, 0, action, "")), http.StatusConflict, "orderEnded")
	}
	if got := sp.asked(); len(got) != 0 {
		t.Errorf("past the order's end the cluster was asked %v", got)
	}
	if r := m.power(m.buyer, powerBody(o, 0, "stop", "")); r.status != http.StatusAccepted {
		t.Errorf("stop past the end: %d %s", r.status, r.body)
	}
}

// TestPowerOrderStates: an order not yet made, or ended, takes no action.
func TestPowerOrderStates(t *testing.T) {
	sp := &scriptedPower{answers: map[int]error{}}
	m := newMarket(t, func(c *Config) { c.Power = sp })
	unpaid := m.e.storedOrder(m.e.placed(m.buyer, m.listing, 1).OrderID)
	wantError(t, m.power(m.buyer, powerBody(unpaid, 0, "start", "")), http.StatusConflict, "machinesNotMade")
	paid := m.paidOrder()
	wantError(t, m.power(m.buyer, powerBody(paid, 0, "start", "")), http.StatusConflict, "machinesNotMade")
	if err := m.e.st.MarkOrderActive(t.Context(), paid.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.e.st.ExpireOrder(t.Context(), paid.ID, paid.ExpiresAt); err != nil {
		t.Fatal(err)
	}
	wantError(t, m.power(m.buyer, powerBody(paid, 0, "stop", "")), http.StatusConflict, "orderEnded")
	if got := sp.asked(); len(got) != 0 {
		t.Errorf("the cluster was asked %v", got)
	}

	off := newMarket(t)
	wantError(t, off.power(off.buyer, powerBody(paid, 0, "stop", "")), http.StatusServiceUnavailable, "powerUnavailable")
}

// TestPowerRequestID: a retry with the request id gets the first answer,
// byte for byte, and the cluster is asked once; while the first runs a
// retry is told so; the id used for another action is refused; a fault's
// answer is not kept, so its retry runs again.
func TestPowerRequestID(t *testing.T) {
	m, o, sp := powerMarket(t)
	first := m.power(m.buyer, powerBody(o, 0, "restart", "req-1"))
	if first.status != http.StatusAccepted {
		t.Fatalf("restart: %d %s", first.status, first.body)
	}
	again := m.power(m.buyer, powerBody(o, 0, "restart", "req-1"))
	if again.status != first.status || string(again.body) != string(first.body) {
		t.Errorf("the retry: %d %s, want the first answer %d %s", again.status, again.body, first.status, first.body)
	}
	if got := sp.asked(); len(got) != 1 {
		t.Errorf("the cluster was asked %v, want one restart", got)
	}
	wantError(t, m.power(m.buyer, powerBody(o, 1, "restart", "req-1")), http.StatusUnprocessableEntity, "badRequest")
	wantError(t, m.power(m.buyer, powerBody(o, 0, "stop", "req-1")), http.StatusUnprocessableEntity, "badRequest")
	wantError(t, m.power(m.host, powerBody(o, 0, "restart", "req-1")), http.StatusNotFound, "orderUnknown")

	sp.answer(0, errors.New("etcdserver: request timed out"))
	wantError(t, m.power(m.buyer, powerBody(o, 0, "stop", "req-2")), http.StatusServiceUnavailable, "clusterBusy")
	sp.answer(0, nil)
	if r := m.power(m.buyer, powerBody(o, 0, "stop", "req-2")); r.status != http.StatusAccepted {
		t.Errorf("the retry of a clusterBusy: %d %s, want it run again", r.status, r.body)
	}
	sp.asked()

	sp.mu.Lock()
	sp.hold, sp.entered = make(chan struct{}), make(chan struct{}, 1)
	sp.mu.Unlock()
	done := make(chan response, 1)
	go func() { done <- m.power(m.buyer, powerBody(o, 1, "stop", "req-3")) }()
	withTimeout(t, sp.entered, "the first request at the cluster")
	wantError(t, m.power(m.buyer, powerBody(o, 1, "stop", "req-3")), http.StatusConflict, "powerInProgress")
	close(sp.hold)
	if r := withTimeout(t, done, "the first request's answer"); r.status != http.StatusAccepted {
		t.Errorf("the first request: %d %s", r.status, r.body)
	}
}
