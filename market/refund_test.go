package market

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/billing/stripetest"
	"github.com/vmshelf/vmshelf/imagestore"
)

// paidOrder places an order of one replica and has it paid through the
// webhook; it returns the order as stored, its PaymentIntent recorded.
func (m *marketFixture) paidOrder() imagestore.Order {
	m.e.t.Helper()
	id := m.e.placed(m.buyer, m.listing, 1).OrderID
	cs := m.e.sessionOf(id)
	if err := m.e.stripe.Pay(cs); err != nil {
		m.e.t.Fatal(err)
	}
	wantResult(m.e.t, m.e.event("evt_paid_"+id, eventCompleted, cs, m.e.clock.Now()), resultPaid)
	o := m.e.storedOrder(id)
	if o.State != imagestore.OrderPaid || !strings.HasPrefix(o.PaymentIntent, "pi_") {
		m.e.t.Fatalf("order %s, PaymentIntent %q; want paid with one", o.State, o.PaymentIntent)
	}
	return o
}

// refundedByDeadline pays an order, has its host gone, lets its deadline
// pass and runs a refund round: its refund's first attempt is made.
func (m *marketFixture) refundedByDeadline() imagestore.Order {
	m.e.t.Helper()
	o := m.paidOrder()
	if err := m.e.st.SetOrderBlocked(m.e.t.Context(), o.ID, imagestore.BlockedHostGone, m.e.clock.Now()); err != nil {
		m.e.t.Fatal(err)
	}
	m.e.clock.Advance(DefaultRefundDeadline)
	m.e.srv.refundOnce(m.e.t.Context())
	return o
}

// refundRequests is every POST /v1/refunds the fake received.
func (e *env) refundRequests() []stripetest.Request { return e.stripe.Received("/v1/refunds") }

// wantOneRefund checks that Stripe was asked to refund o for cause, in
// full, reversing the transfer and the application fee, only with o's one
// key however often it was asked, and that it made exactly one refund
// that succeeded.
func wantOneRefund(t *testing.T, e *env, o imagestore.Order, cause string, generation int) {
	t.Helper()
	key := billing.RefundKey(o.ID, cause, generation)
	var reqs []stripetest.Request
	for _, r := range e.refundRequests() {
		if r.Form.Get("metadata[order_id]") == o.ID {
			reqs = append(reqs, r)
		}
	}
	if len(reqs) == 0 {
		t.Fatal("Stripe was never asked for a refund")
	}
	for _, r := range reqs {
		want := map[string]string{"payment_intent": o.PaymentIntent, "reverse_transfer": "true",
			"refund_application_fee": "true", "metadata[order_id]": o.ID, "metadata[cause]": cause}
		for k, v := range want {
			if got := r.Form.Get(k); got != v {
				t.Errorf("refund request %s = %q, want %q", k, got, v)
			}
		}
		if len(r.Form) != len(want) {
			t.Errorf("refund request form %v, want exactly %v", r.Form, want)
		}
	}
	if last := reqs[len(reqs)-1]; last.Idempotency != key {
		t.Errorf("refund key %q, want %q", last.Idempotency, key)
	}
	var done int
	for _, rf := range e.stripe.Refunds() {
		if rf.PaymentIntent == o.PaymentIntent && rf.Status == billing.RefundSucceeded {
			done++
		}
	}
	if done != 1 {
		t.Errorf("%d refunds succeeded at Stripe for %s, want exactly 1", done, o.ID)
	}
	if got := e.storedOrder(o.ID); got.State != imagestore.OrderRefunded || got.RefundCause != cause || got.RefundedAt.IsZero() {
		t.Errorf("order %s, cause %q, refunded at %v; want refunded for %s", got.State, got.RefundCause, got.RefundedAt, cause)
	}
}

// TestPaymentForCancelledOrder: a payment that arrives for an order
// already cancelled (its reservation ended, its capacity maybe sold
// again) provisions nothing and is given back: the order goes from
// cancelled to refunded with Stripe's one refund, the listing's capacity
// stays free, the provisioner is not told. A replay, and a second event
// about the same payment, refund nothing more.
func TestPaymentForCancelledOrder(t *testing.T) {
	m := newMarket(t)
	e := m.e
	id, cs := m.order()
	if err := e.st.CancelOrder(t.Context(), id, "checkoutExpired", e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if err := e.stripe.Pay(cs); err != nil { // the buyer paid in the moment before
		t.Fatal(err)
	}
	wantResult(t, e.event("evt_1", eventCompleted, cs, e.clock.Now()), resultPaidCancelled)
	o := e.storedOrder(id)
	if !o.PaidAt.IsZero() || o.RefundFrom != imagestore.OrderCancelled || o.Reason != "checkoutExpired" {
		t.Errorf("order paid at %v, refunded from %s, reason %q; want never paid, from cancelled", o.PaidAt, o.RefundFrom, o.Reason)
	}
	wantOneRefund(t, e, o, imagestore.RefundPaidAfterCancel, 0)
	if n := m.paid.Load(); n != 0 {
		t.Errorf("the provisioner was told %d times of a cancelled order", n)
	}
	if l := e.storedListing(m.listing); l.Free() != 10 {
		t.Errorf("listing free %d, want 10: a cancelled order took capacity back", l.Free())
	}
	wantResult(t, e.event("evt_1", eventCompleted, cs, e.clock.Now()), resultDuplicate)
	wantResult(t, e.event("evt_2", eventAsyncSucceeded, cs, e.clock.Now()), resultPaidCancelled)
	if n := len(e.refundRequests()); n != 1 {
		t.Errorf("%d refund requests after a replay and a second event, want 1", n)
	}
	wantLines(t, e.scrape(),
		`vmshelf_webhook_events_total{result="paidCancelled",type="`+eventCompleted+`"} 1`,
		`vmshelf_refunds_total{cause="paidAfterCancel",outcome="started"} 1`,
		`vmshelf_refunds_total{cause="paidAfterCancel",outcome="refunded"} 1`,
		`vmshelf_orders{state="refunded"} 1`)
	if !strings.Contains(e.logs.String(), "order_id="+id) || !strings.Contains(e.logs.String(), `msg="order refunded"`) {
		t.Errorf("no log line says order %s was refunded:\n%s", id, e.logs.String())
	}
}

// TestRefundRetried: a refund Stripe does not answer is refundFailed and
// tried again after its backoff with the same key; one whose answer was
// lost (Stripe made it) is asked again with the same key and Stripe's one
// refund is recorded. Neither is tried before its time.
func TestRefundRetried(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(s *stripetest.Server)
	}{
		{"Stripe down", func(s *stripetest.Server) { s.FailRefunds(1, http.StatusServiceUnavailable) }},
		{"answer lost", func(s *stripetest.Server) { s.LoseRefunds(1, http.StatusInternalServerError) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMarket(t)
			e := m.e
			id, cs := m.order()
			if err := e.st.CancelOrder(t.Context(), id, "checkoutExpired", e.clock.Now()); err != nil {
				t.Fatal(err)
			}
			if err := e.stripe.Pay(cs); err != nil {
				t.Fatal(err)
			}
			tc.fail(e.stripe)
			wantResult(t, e.event("evt_1", eventCompleted, cs, e.clock.Now()), resultPaidCancelled)
			o := e.storedOrder(id)
			if o.State != imagestore.OrderRefundFailed || o.RefundAttempts != 1 || o.RefundError == "" {
				t.Fatalf("after a failed attempt: %s, %d attempts, error %q", o.State, o.RefundAttempts, o.RefundError)
			}
			if strings.Contains(o.RefundError, stripeKey) {
				t.Error("the refund's error carries the Stripe key")
			}
			// Not before its backoff.
			e.clock.Advance(refundBackoff(1) - time.Nanosecond)
			e.srv.refundOnce(t.Context())
			if n := len(e.refundRequests()); n != 1 {
				t.Fatalf("%d refund requests before the backoff ran out, want 1", n)
			}
			e.clock.Advance(time.Nanosecond)
			e.srv.refundOnce(t.Context())
			if n := len(e.refundRequests()); n != 2 {
				t.Errorf("%d refund requests, want 2", n)
			}
			wantOneRefund(t, e, e.storedOrder(id), imagestore.RefundPaidAfterCancel, 0)
			wantLines(t, e.scrape(), `vmshelf_refunds_total{cause="paidAfterCancel",outcome="error"} 1`,
				`vmshelf_refunds_total{cause="paidAfterCancel",outcome="refunded"} 1`)
			// Done: no further round asks again.
			e.clock.Advance(refundBackoffMax)
			e.srv.refundOnce(t.Context())
			if n := len(e.refundRequests()); n != 2 {
				t.Errorf("%d refund requests after the refund, want still 2", n)
			}
		})
	}
}

// TestRefundFailedByStripe: a refund Stripe itself fails (no money moved)
// is refundFailed, logged at Error, and the next attempt uses the next
// generation's key, since the first key would only repeat the failure.
func TestRefundFailedByStripe(t *testing.T) {
	m := newMarket(t)
	e := m.e
	id, cs := m.order()
	if err := e.st.CancelOrder(t.Context(), id, "checkoutExpired", e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if err := e.stripe.Pay(cs); err != nil {
		t.Fatal(err)
	}
	e.stripe.RefundAs(billing.RefundFailed, "insufficient_funds")
	wantResult(t, e.event("evt_1", eventCompleted, cs, e.clock.Now()), resultPaidCancelled)
	o := e.storedOrder(id)
	if o.State != imagestore.OrderRefundFailed || o.RefundGeneration != 1 || !strings.Contains(o.RefundError, "insufficient_funds") {
		t.Fatalf("after Stripe failed it: %s, generation %d, error %q", o.State, o.RefundGeneration, o.RefundError)
	}
	if !strings.Contains(e.logs.String(), "level=ERROR") {
		t.Error("no error line for a failed refund")
	}
	e.stripe.RefundAs(billing.RefundSucceeded, "")
	e.clock.Advance(refundBackoff(1))
	e.srv.refundOnce(t.Context())
	wantOneRefund(t, e, e.storedOrder(id), imagestore.RefundPaidAfterCancel, 1)
	if reqs := e.refundRequests(); len(reqs) != 2 || reqs[0].Idempotency == reqs[1].Idempotency {
		t.Errorf("refund requests %+v, want two under different keys", reqs)
	}
}

// TestRefundDeadline: a paid order is refunded only once its deadline
// after the payment has passed, and only for a cause the provisioner
// named; an active order only for a failed import of a machine that never
// ran. Exactly at the deadline, not a nanosecond before.
func TestRefundDeadline(t *testing.T) {
	const deadline = 6 * time.Hour // not the default: a test of the flag's value
	m := newMarket(t, func(c *Config) { c.RefundDeadline = deadline })
	e := m.e
	ctx := t.Context()
	blocked := m.paidOrder()
	unnamed := m.paidOrder() // the cluster does not answer: no cause
	ran := m.paidOrder()
	neverRan := m.paidOrder()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	now := e.clock.Now()
	must(e.st.SetOrderBlocked(ctx, blocked.ID, imagestore.BlockedHostGone, now))
	for _, o := range []imagestore.Order{ran, neverRan} {
		must(e.st.MarkOrderActive(ctx, o.ID))
		must(e.st.SetOrderBlocked(ctx, o.ID, imagestore.BlockedImportFailed, now))
	}
	must(e.st.SetReplicaStates(ctx, ran.ID, []imagestore.ReplicaState{{Index: 0, Name: "vm-0", State: imagestore.ReplicaRunning, ObservedAt: now}}))

	e.clock.Advance(deadline - time.Nanosecond)
	e.srv.refundOnce(ctx)
	if n := len(e.refundRequests()); n != 0 {
		t.Fatalf("%d refunds a nanosecond before the deadline, want none", n)
	}
	e.clock.Advance(time.Nanosecond)
	e.srv.refundOnce(ctx)
	wantOneRefund(t, e, e.storedOrder(blocked.ID), imagestore.RefundNotProvisioned, 0)
	if got := e.storedOrder(neverRan.ID); got.State != imagestore.OrderRefunded || got.RefundCause != imagestore.RefundImportFailed ||
		got.RefundFrom != imagestore.OrderActive {
		t.Errorf("the active order that never ran: %s, cause %q, from %s; want refunded for importFailed", got.State, got.RefundCause, got.RefundFrom)
	}
	for _, o := range []imagestore.Order{unnamed, ran} {
		if got := e.storedOrder(o.ID); got.State.Refunded() {
			t.Errorf("order %s (%s) was refunded", o.ID, got.State)
		}
	}
	if n := len(e.refundRequests()); n != 2 {
		t.Errorf("%d refund requests, want 2", n)
	}
	wantLines(t, e.scrape(), `vmshelf_refunds_total{cause="notProvisioned",outcome="started"} 1`,
		`vmshelf_refunds_total{cause="importFailed",outcome="refunded"} 1`)
}

// TestRefundsTwoServers: two control planes over one store run their
// refund rounds at once; Stripe is asked once per attempt.
func TestRefundsTwoServers(t *testing.T) {
	m := newMarket(t)
	e := m.e
	ctx := t.Context()
	var orders []imagestore.Order
	for range 3 {
		o := m.paidOrder()
		if err := e.st.SetOrderBlocked(ctx, o.ID, imagestore.BlockedImageGone, e.clock.Now()); err != nil {
			t.Fatal(err)
		}
		orders = append(orders, o)
	}
	reg := prometheus.NewRegistry()
	other, err := New(e.cfg, e.st, e.blobs, reg, reg)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(DefaultRefundDeadline)
	var wg sync.WaitGroup
	for _, s := range []*Server{e.srv, other} {
		wg.Go(func() { s.refundOnce(ctx) })
	}
	wg.Wait()
	if n := len(e.refundRequests()); n != len(orders) {
		t.Errorf("%d refund requests for %d orders, want one each", n, len(orders))
	}
	for _, o := range orders {
		wantOneRefund(t, e, e.storedOrder(o.ID), imagestore.RefundNotProvisioned, 0)
	}
}

// TestRefundWebhookEvents: Stripe's word on a refund settles it (pending,
// then succeeded or failed), charge.refunded confirms it, and a dispute
// marks the order, logs at Error and counts; each signed, replay-safe.
func TestRefundWebhookEvents(t *testing.T) {
	t.Run("pending, then succeeded", func(t *testing.T) {
		m := newMarket(t)
		e := m.e
		e.stripe.RefundAs(billing.RefundPending, "")
		o := m.refundedByDeadline()
		got := e.storedOrder(o.ID)
		if got.State != imagestore.OrderRefunding || got.RefundID == "" {
			t.Fatalf("pending refund: %s, refund %q", got.State, got.RefundID)
		}
		if err := e.stripe.SettleRefund(got.RefundID, billing.RefundSucceeded, ""); err != nil {
			t.Fatal(err)
		}
		payload, sig, err := e.stripe.RefundEvent("evt_r1", billing.EventRefundUpdated, got.RefundID, webhookSecret, e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		wantResult(t, e.postEvent(payload, sig), resultRefunded)
		wantResult(t, e.postEvent(payload, sig), resultDuplicate)
		wantOneRefund(t, e, e.storedOrder(o.ID), imagestore.RefundNotProvisioned, 0)
	})
	t.Run("failed at Stripe", func(t *testing.T) {
		m := newMarket(t)
		e := m.e
		e.stripe.RefundAs(billing.RefundPending, "")
		o := m.refundedByDeadline()
		rid := e.storedOrder(o.ID).RefundID
		if err := e.stripe.SettleRefund(rid, billing.RefundFailed, "expired_or_canceled_card"); err != nil {
			t.Fatal(err)
		}
		payload, sig, err := e.stripe.RefundEvent("evt_r2", billing.EventRefundFailed, rid, webhookSecret, e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		wantResult(t, e.postEvent(payload, sig), resultRefundFailed)
		if got := e.storedOrder(o.ID); got.State != imagestore.OrderRefundFailed || got.RefundGeneration != 1 {
			t.Errorf("after refund.failed: %s, generation %d; want refundFailed, 1", got.State, got.RefundGeneration)
		}
		// Forged and stale copies change nothing.
		if r := e.postEvent(payload, sig+"0"); r.status != http.StatusBadRequest {
			t.Errorf("forged refund.failed: %d, want 400", r.status)
		}
		old, oldSig, err := e.stripe.RefundEvent("evt_r3", billing.EventRefundFailed, rid, webhookSecret, e.clock.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if r := e.postEvent(old, oldSig); r.status != http.StatusBadRequest {
			t.Errorf("stale refund.failed: %d, want 400", r.status)
		}
		// The next generation's refund is pending when a late copy of the
		// first one's failure arrives (a new event id): it is about
		// another refund than the order's, and changes nothing.
		e.stripe.RefundAs(billing.RefundPending, "")
		e.clock.Advance(refundBackoffMax)
		e.srv.refundOnce(t.Context())
		second := e.storedOrder(o.ID)
		if second.State != imagestore.OrderRefunding || second.RefundID == rid || second.RefundGeneration != 1 {
			t.Fatalf("second generation: %s, refund %q (first %q), generation %d", second.State, second.RefundID, rid, second.RefundGeneration)
		}
		late, lateSig, err := e.stripe.RefundEvent("evt_r4", billing.EventRefundFailed, rid, webhookSecret, e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		wantResult(t, e.postEvent(late, lateSig), resultIgnored)
		if got := e.storedOrder(o.ID); got.State != imagestore.OrderRefunding || got.RefundGeneration != 1 {
			t.Errorf("after a late event about the first refund: %s, generation %d; want refunding, 1", got.State, got.RefundGeneration)
		}
		if err := e.stripe.SettleRefund(second.RefundID, billing.RefundSucceeded, ""); err != nil {
			t.Fatal(err)
		}
		done, doneSig, err := e.stripe.RefundEvent("evt_r5", billing.EventRefundUpdated, second.RefundID, webhookSecret, e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		wantResult(t, e.postEvent(done, doneSig), resultRefunded)
		wantOneRefund(t, e, e.storedOrder(o.ID), imagestore.RefundNotProvisioned, 1)
	})
	t.Run("charge refunded", func(t *testing.T) {
		m := newMarket(t)
		e := m.e
		e.stripe.LoseRefunds(1, http.StatusServiceUnavailable)
		o := m.refundedByDeadline()
		if got := e.storedOrder(o.ID); got.State != imagestore.OrderRefundFailed {
			t.Fatalf("after a lost answer: %s, want refundFailed", got.State)
		}
		// Stripe made the refund; its event says so before the retry.
		payload, sig, err := e.stripe.ChargeRefundedEvent("evt_c1", o.PaymentIntent, webhookSecret, e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		wantResult(t, e.postEvent(payload, sig), resultRefunded)
		if got := e.storedOrder(o.ID); got.State != imagestore.OrderRefunded {
			t.Errorf("after charge.refunded: %s, want refunded", got.State)
		}
	})
	t.Run("dispute", func(t *testing.T) {
		m := newMarket(t)
		e := m.e
		o := m.paidOrder()
		payload, sig, err := e.stripe.DisputeEvent("evt_d1", o.PaymentIntent, "fraudulent", webhookSecret, e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		// Forged (the signature of other bytes) and stale (signed an hour
		// ago) copies are refused before anything is read.
		if r := e.postEvent(append([]byte(" "), payload...), sig); r.status != http.StatusBadRequest {
			t.Errorf("forged dispute: %d, want 400", r.status)
		}
		old, oldSig, err := e.stripe.DisputeEvent("evt_d0", o.PaymentIntent, "fraudulent", webhookSecret, e.clock.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if r := e.postEvent(old, oldSig); r.status != http.StatusBadRequest {
			t.Errorf("stale dispute: %d, want 400", r.status)
		}
		if got := e.storedOrder(o.ID); !got.DisputedAt.IsZero() {
			t.Fatal("a forged or stale dispute marked the order")
		}
		wantResult(t, e.postEvent(payload, sig), resultDisputed)
		wantResult(t, e.postEvent(payload, sig), resultDuplicate)
		got := e.storedOrder(o.ID)
		if got.DisputedAt.IsZero() || got.DisputeID == "" || got.State != imagestore.OrderPaid {
			t.Errorf("after the dispute: %s, disputed at %v (%q); want still paid, marked", got.State, got.DisputedAt, got.DisputeID)
		}
		wantLines(t, e.scrape(), `vmshelf_disputes_total 1`,
			`vmshelf_webhook_events_total{result="disputed",type="charge.dispute.created"} 1`)
		if line := e.logLine("payment disputed", "order_id="+o.ID); !strings.Contains(line, "level=ERROR") {
			t.Errorf("no error line for the dispute:\n%s", e.logs.String())
		}
		var st statusAnswer
		decode(t, e.do(http.MethodPost, "/market/vms/status", m.buyer, nil), &st)
		for _, oi := range st.Orders {
			if oi.OrderID == o.ID && oi.DisputedAt == nil {
				t.Error("status does not show the dispute")
			}
		}
	})
}
