package market

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/billing/stripetest"
	"github.com/vmshelf/vmshelf/imagestore"
)

// disputeShown is what status shows of an order's dispute and refund, as
// a client reads it.
type disputeShown struct {
	State           string     `json:"state"`
	DisputedAt      *time.Time `json:"disputed_at"`
	DisputeStatus   string     `json:"dispute_status"`
	DisputeClosedAt *time.Time `json:"dispute_closed_at"`
	Refund          *struct {
		Attempts      int        `json:"attempts"`
		NextAttemptAt *time.Time `json:"next_attempt_at"`
		Error         string     `json:"error"`
		HeldByDispute bool       `json:"held_by_dispute"`
	} `json:"refund"`
}

// shownOrder is order id as its buyer's status shows it.
func (m *marketFixture) shownOrder(id string) disputeShown {
	m.e.t.Helper()
	var st struct {
		Orders []struct {
			OrderID string `json:"order_id"`
			disputeShown
		} `json:"orders"`
	}
	decode(m.e.t, m.e.do(http.MethodPost, "/market/vms/status", m.buyer, nil), &st)
	for _, o := range st.Orders {
		if o.OrderID == id {
			return o.disputeShown
		}
	}
	m.e.t.Fatalf("status does not list order %s", id)
	return disputeShown{}
}

// dispute has the buyer's bank dispute o's charge at the fake Stripe and,
// if post, posts the charge.dispute.created event, which must answer
// result.
func (m *marketFixture) dispute(o imagestore.Order, eventID string, post bool, result string) {
	m.e.t.Helper()
	payload, sig, err := m.e.stripe.DisputeEvent(eventID, o.PaymentIntent, "product_not_received", webhookSecret, m.e.clock.Now())
	if err != nil {
		m.e.t.Fatal(err)
	}
	if post {
		wantResult(m.e.t, m.e.postEvent(payload, sig), result)
	}
}

// closeDispute posts charge.dispute.closed of o's dispute with status,
// which must answer result.
func (m *marketFixture) closeDispute(o imagestore.Order, eventID, status, result string) {
	m.e.t.Helper()
	payload, sig, err := m.e.stripe.DisputeClosedEvent(eventID, o.PaymentIntent, status, webhookSecret, m.e.clock.Now())
	if err != nil {
		m.e.t.Fatal(err)
	}
	wantResult(m.e.t, m.e.postEvent(payload, sig), result)
}

// refundRequestsOf counts the refund requests Stripe received for order id.
func (e *env) refundRequestsOf(id string) int {
	n := 0
	for _, r := range e.refundRequests() {
		if r.Form.Get("metadata[order_id]") == id {
			n++
		}
	}
	return n
}

// logLine is the last log line that contains every one of parts, "" if
// none does.
func (e *env) logLine(parts ...string) string {
	line := ""
	for l := range strings.SplitSeq(e.logs.String(), "\n") {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(l, p) }) {
			line = l
		}
	}
	return line
}

// stripeEventLine is the "stripe event" log line of event id.
func (e *env) stripeEventLine(id string) string {
	return e.logLine(`msg="stripe event"`, "event="+id+" ")
}

// TestRefundCause: a disputed order is never refunded automatically,
// whatever keeps it from running; the same order undisputed is.
func TestRefundCause(t *testing.T) {
	paid := t0
	due := paid.Add(DefaultRefundDeadline)
	for _, tc := range []struct {
		name string
		o    imagestore.Order
		want string
	}{
		{"paid, blocked", imagestore.Order{State: imagestore.OrderPaid, PaidAt: paid, BlockedCause: imagestore.BlockedHostGone},
			imagestore.RefundNotProvisioned},
		{"paid, blocked, disputed", imagestore.Order{State: imagestore.OrderPaid, PaidAt: paid, BlockedCause: imagestore.BlockedHostGone,
			DisputedAt: paid.Add(time.Minute)}, ""},
		{"paid, import failed, disputed", imagestore.Order{State: imagestore.OrderPaid, PaidAt: paid, BlockedCause: imagestore.BlockedImportFailed,
			DisputedAt: paid.Add(time.Minute)}, ""},
		{"active, import failed", imagestore.Order{State: imagestore.OrderActive, PaidAt: paid, BlockedCause: imagestore.BlockedImportFailed},
			imagestore.RefundImportFailed},
		{"active, import failed, disputed", imagestore.Order{State: imagestore.OrderActive, PaidAt: paid,
			BlockedCause: imagestore.BlockedImportFailed, DisputedAt: paid, DisputeID: "dp_1"}, ""},
	} {
		if got := refundCause(tc.o, due, DefaultRefundDeadline); got != tc.want {
			t.Errorf("%s: refundCause = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestDisputedOrderNotRefunded: a paid order that cannot run, disputed by
// the buyer's bank before its refund deadline, is never refunded by
// vmshelf: Stripe is not even asked. It stays paid, shown disputed, and
// the webhook's "stripe event" line names the order.
func TestDisputedOrderNotRefunded(t *testing.T) {
	m := newMarket(t)
	e := m.e
	o := m.paidOrder()
	if err := e.st.SetOrderBlocked(t.Context(), o.ID, imagestore.BlockedHostGone, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	m.dispute(o, "evt_d1", true, resultDisputed)
	if line := e.stripeEventLine("evt_d1"); !strings.Contains(line, "order_id="+o.ID) {
		t.Errorf("the stripe event line of the dispute does not name order %s: %q", o.ID, line)
	}
	e.clock.Advance(DefaultRefundDeadline)
	e.srv.refundOnce(t.Context())
	e.clock.Advance(refundBackoffMax)
	e.srv.refundOnce(t.Context())
	if n := e.refundRequestsOf(o.ID); n != 0 {
		t.Errorf("Stripe was asked %d times to refund a disputed order, want never", n)
	}
	got := m.shownOrder(o.ID)
	if got.State != string(imagestore.OrderPaid) || got.DisputedAt == nil || got.Refund != nil || got.DisputeStatus != "open" {
		t.Errorf("status of the disputed order: %+v; want paid, disputed (open), no refund", got)
	}
	wantLines(t, e.scrape(), `vmshelf_refunds_total{cause="notProvisioned",outcome="started"} 0`, `vmshelf_disputes_total 1`)
}

// TestDisputeStopsDecidedRefund: the refund was decided, and its first
// attempt failed (Stripe down); the dispute comes before the next one. No
// attempt is sent after it, not even by a round that listed the order
// before the dispute; the order shows its refund held by the dispute and
// leaves refundFailed, so the failing-refund alert does not fire for it.
func TestDisputeStopsDecidedRefund(t *testing.T) {
	m := newMarket(t)
	e := m.e
	e.stripe.FailRefunds(1, http.StatusServiceUnavailable)
	o := m.refundedByDeadline()
	if got := e.storedOrder(o.ID); got.State != imagestore.OrderRefundFailed {
		t.Fatalf("after Stripe was down: %s, want refundFailed", got.State)
	}
	m.dispute(o, "evt_d1", true, resultDisputed)
	e.clock.Advance(refundBackoffMax)
	// A round that read the due refunds before the dispute goes on to
	// claim and send this one.
	e.srv.attemptRefund(t.Context(), o.ID)
	e.srv.refundOnce(t.Context())
	if n := e.refundRequestsOf(o.ID); n != 1 {
		t.Errorf("Stripe was asked %d times, want once: nothing after the dispute", n)
	}
	got := m.shownOrder(o.ID)
	if got.State != string(imagestore.OrderRefunding) || got.DisputedAt == nil || got.Refund == nil ||
		!got.Refund.HeldByDispute || got.Refund.NextAttemptAt != nil {
		t.Errorf("status: %+v; want refunding, held by the dispute, no next attempt", got)
	}
	wantLines(t, e.scrape(), `vmshelf_orders{state="refundFailed"} 0`, `vmshelf_disputes_total 1`)
}

// TestRefundChargeDisputed: Stripe knows of the dispute before the
// webhook does and answers the refund with charge_disputed. That is no
// failure to retry: the refund is held (refunding, the order marked
// disputed), counted as disputed, and never asked again; the dispute
// event that follows records the dispute and counts it.
func TestRefundChargeDisputed(t *testing.T) {
	m := newMarket(t)
	e := m.e
	o := m.paidOrder()
	m.dispute(o, "evt_d1", false, "")
	if err := e.st.SetOrderBlocked(t.Context(), o.ID, imagestore.BlockedHostGone, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(DefaultRefundDeadline)
	e.srv.refundOnce(t.Context())
	got := e.storedOrder(o.ID)
	if got.State != imagestore.OrderRefunding || got.DisputedAt.IsZero() || !strings.Contains(got.RefundError, "disputed") {
		t.Errorf("after charge_disputed: %s, disputed at %v, error %q; want refunding, held, marked disputed", got.State, got.DisputedAt, got.RefundError)
	}
	for range 3 {
		e.clock.Advance(refundBackoffMax)
		e.srv.refundOnce(t.Context())
	}
	if n := e.refundRequestsOf(o.ID); n != 1 {
		t.Errorf("Stripe was asked %d times, want once: charge_disputed is not retried", n)
	}
	if len(e.stripe.Refunds()) != 0 {
		t.Errorf("Stripe refunded a disputed charge: %+v", e.stripe.Refunds())
	}
	wantLines(t, e.scrape(), `vmshelf_refunds_total{cause="notProvisioned",outcome="disputed"} 1`,
		`vmshelf_refunds_total{cause="notProvisioned",outcome="error"} 0`, `vmshelf_disputes_total 0`)
	if !strings.Contains(e.logs.String(), "charge_disputed") {
		t.Errorf("no log line says Stripe answered charge_disputed:\n%s", e.logs.String())
	}
	m.dispute(o, "evt_d1", true, resultDisputed)
	if got := e.storedOrder(o.ID); got.DisputeID == "" || got.State != imagestore.OrderRefunding {
		t.Errorf("after the dispute event: %s, dispute %q; want the dispute recorded, the refund still held", got.State, got.DisputeID)
	}
	wantLines(t, e.scrape(), `vmshelf_disputes_total 1`)
	if sh := m.shownOrder(o.ID); sh.Refund == nil || !sh.Refund.HeldByDispute || sh.Refund.NextAttemptAt != nil {
		t.Errorf("status: %+v; want the refund held by the dispute", sh)
	}
}

// TestDisputeWhileRefundSent: the dispute lands while the refund's request
// is on its way. If Stripe sees the dispute first it refuses the refund
// (charge_disputed) and the refund is held; if it made the refund first,
// the order is refunded and the dispute only marked. Either way the money
// moves at most once, and no later round asks again.
func TestDisputeWhileRefundSent(t *testing.T) {
	for _, tc := range []struct {
		name      string
		hold      func(*marketFixture) func()
		wantState imagestore.OrderState
		refunds   int
	}{
		{"before Stripe decides", func(m *marketFixture) func() { return m.e.stripe.HoldRefundRequests() }, imagestore.OrderRefunding, 0},
		{"after Stripe refunded", func(m *marketFixture) func() { return m.e.stripe.HoldRefunds() }, imagestore.OrderRefunded, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMarket(t)
			e := m.e
			o := m.paidOrder()
			if err := e.st.SetOrderBlocked(t.Context(), o.ID, imagestore.BlockedHostGone, e.clock.Now()); err != nil {
				t.Fatal(err)
			}
			e.clock.Advance(DefaultRefundDeadline)
			release := tc.hold(m)
			defer release()
			var wg sync.WaitGroup
			wg.Go(func() { e.srv.refundOnce(t.Context()) })
			// Bounded: the round's request reaches the fake at once.
			for i := 0; e.refundRequestsOf(o.ID) == 0; i++ {
				if i == 1000 {
					t.Fatal("the refund request never reached Stripe")
				}
				time.Sleep(5 * time.Millisecond)
			}
			m.dispute(o, "evt_d1", true, resultDisputed)
			release()
			wg.Wait()
			got := e.storedOrder(o.ID)
			if got.State != tc.wantState || got.DisputedAt.IsZero() || got.DisputeID == "" {
				t.Errorf("order %s, disputed at %v (%q); want %s, the dispute recorded", got.State, got.DisputedAt, got.DisputeID, tc.wantState)
			}
			for range 3 {
				e.clock.Advance(refundBackoffMax)
				e.srv.refundOnce(t.Context())
			}
			if n := e.refundRequestsOf(o.ID); n != 1 {
				t.Errorf("Stripe was asked %d times, want once", n)
			}
			if n := len(e.stripe.Refunds()); n != tc.refunds {
				t.Errorf("Stripe made %d refunds, want %d", n, tc.refunds)
			}
		})
	}
}

// TestDisputeClosed: charge.dispute.closed records the bank's decision
// (won, lost, warning_closed, prevented) and when; status shows it, it is
// counted by outcome and logged, and the first decision is kept. A closed
// event that comes before its created one records the dispute too, and
// counts it once. Neither outcome refunds anything.
func TestDisputeClosed(t *testing.T) {
	m := newMarket(t)
	e := m.e
	lost := m.paidOrder()
	m.dispute(lost, "evt_d1", true, resultDisputed)
	e.clock.Advance(time.Hour)
	closedAt := e.clock.Now()
	m.closeDispute(lost, "evt_c1", "lost", "disputeClosed")
	if line := e.stripeEventLine("evt_c1"); !strings.Contains(line, "order_id="+lost.ID) {
		t.Errorf("the stripe event line of the closed dispute does not name order %s: %q", lost.ID, line)
	}
	got := m.shownOrder(lost.ID)
	if got.DisputeStatus != "lost" || got.DisputeClosedAt == nil || !got.DisputeClosedAt.Equal(closedAt) || got.State != string(imagestore.OrderPaid) {
		t.Errorf("status after the dispute was lost: %+v; want lost at %v, still paid", got, closedAt)
	}
	// A late copy of another decision changes nothing.
	m.closeDispute(lost, "evt_c2", "won", resultIgnored)
	if got := m.shownOrder(lost.ID); got.DisputeStatus != "lost" {
		t.Errorf("a second decision replaced the first: %q", got.DisputeStatus)
	}

	// Out of order: closed (won) before created.
	won := m.paidOrder()
	if _, _, err := e.stripe.DisputeEvent("evt_d2", won.PaymentIntent, "fraudulent", webhookSecret, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	m.closeDispute(won, "evt_c3", "won", "disputeClosed")
	m.dispute(won, "evt_d2", true, resultDisputed)
	if got := m.shownOrder(won.ID); got.DisputeStatus != "won" || got.DisputedAt == nil {
		t.Errorf("status of the dispute won: %+v", got)
	}
	// A closed event whose status is no decision records nothing.
	payload, sig, err := e.stripe.DisputeClosedEvent("evt_c4", won.PaymentIntent, "warning_closed", webhookSecret, e.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	payload = []byte(strings.Replace(string(payload), `"status":"warning_closed"`, `"status":"under_review"`, 1))
	payload, sig = stripetest.Signed(payload, webhookSecret, e.clock.Now())
	wantResult(t, e.postEvent(payload, sig), resultIgnored)
	if got := m.shownOrder(won.ID); got.DisputeStatus != "won" {
		t.Errorf("a closed event without a decision changed the outcome to %q", got.DisputeStatus)
	}

	if n := len(e.refundRequests()); n != 0 {
		t.Errorf("Stripe was asked for %d refunds of disputed orders", n)
	}
	wantLines(t, e.scrape(), `vmshelf_disputes_total 2`,
		`vmshelf_disputes_closed_total{outcome="lost"} 1`, `vmshelf_disputes_closed_total{outcome="won"} 1`,
		`vmshelf_disputes_closed_total{outcome="warning_closed"} 0`,
		`vmshelf_webhook_events_total{result="disputeClosed",type="charge.dispute.closed"} 2`)
	if line := e.logLine("dispute closed", "order_id="+lost.ID); !strings.Contains(line, "outcome=lost") {
		t.Errorf("no log line says the dispute of %s was lost:\n%s", lost.ID, e.logs.String())
	}
}
