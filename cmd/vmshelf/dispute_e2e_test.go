package main

import (
	"strings"
	"testing"
	"time"
)

// The disputes through the binary: a charge the buyer's bank disputes is
// never refunded by vmshelf, and the bank's decision is recorded and
// shown.

// disputeStatus is what the tests read of an order's dispute in status.
type disputeStatus struct {
	OrderID         string     `json:"order_id"`
	State           string     `json:"state"`
	DisputedAt      *time.Time `json:"disputed_at"`
	DisputeStatus   string     `json:"dispute_status"`
	DisputeClosedAt *time.Time `json:"dispute_closed_at"`
	Refund          *struct {
		Cause         string     `json:"cause"`
		Attempts      int        `json:"attempts"`
		NextAttemptAt *time.Time `json:"next_attempt_at"`
		HeldByDispute bool       `json:"held_by_dispute"`
	} `json:"refund"`
}

func disputeStatusOf(t *testing.T, s *server, orderID string) disputeStatus {
	t.Helper()
	var o disputeStatus
	statusOrder(t, s, s.token, orderID, &o)
	return o
}

// paymentIntentOf is the PaymentIntent the stand-in Stripe paid orderID's
// checkout with.
func (m *kubeMarket) paymentIntentOf(t *testing.T, orderID string) string {
	t.Helper()
	for _, cs := range m.stripe.Sessions() {
		if cs.OrderID == orderID && cs.PaymentIntent != "" {
			return cs.PaymentIntent
		}
	}
	t.Fatalf("Stripe has no payment of order %s", orderID)
	return ""
}

// postSigned posts a signed Stripe event to serve and checks its result.
func (m *kubeMarket) postSigned(t *testing.T, what string, payload []byte, sig, result string) {
	t.Helper()
	code, body := postWebhook(t, m.s, payload, sig)
	wantWebhookResult(t, what, code, body, result)
}

// TestE2EDisputedNotRefunded: three paid orders cannot run (their host
// stopped hosting) and are due for a refund once --refund-deadline has
// passed. The buyer's bank disputes the first before that, and serve
// hears of it: serve never asks Stripe to refund it. The second is
// disputed at Stripe but its event comes late: Stripe answers the
// refund with charge_disputed, and serve holds the refund instead of
// retrying it. The third, undisputed, is refunded: by then the refund
// rounds have passed all three deadlines. Then the bank decides: the first
// dispute lost, the second won; both are recorded, shown and counted, and
// neither refunds anything.
func TestE2EDisputedNotRefunded(t *testing.T) {
	const account = "acct_e2eDispute"
	m := startKubeMarket(t, account, append([]string{"--refund-deadline", "2s"}, refundArgs...)...)
	s := m.s
	l := s.listing(t, addHost(t, s, "host", account), `{"unit_price":600,"capacity":5}`)
	disputed := m.order(t, l.ListingID, "debian-13", "disputed", 1, "")
	atStripe := m.order(t, l.ListingID, "debian-13", "atstripe", 1, "")
	control := m.order(t, l.ListingID, "debian-13", "control", 1, "")
	if r := vmshelf(t, "tenant", "set", "host", "--hosts-vms=false", "--data-dir", s.dataDir); r.code != 0 {
		t.Fatalf("tenant set host --hosts-vms=false: exit %d: %s", r.code, r.stderr)
	}

	m.pay(t, disputed.OrderID, "evt_e2e_dispute_paid_1")
	piDisputed := m.paymentIntentOf(t, disputed.OrderID)
	payload, sig, err := m.stripe.DisputeEvent("evt_e2e_dispute_1", piDisputed, "product_not_received", m.whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m.postSigned(t, "the first dispute", payload, sig, "disputed")

	m.pay(t, atStripe.OrderID, "evt_e2e_dispute_paid_2")
	piAtStripe := m.paymentIntentOf(t, atStripe.OrderID)
	late, lateSig, err := m.stripe.DisputeEvent("evt_e2e_dispute_2", piAtStripe, "fraudulent", m.whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m.pay(t, control.OrderID, "evt_e2e_dispute_paid_3")
	waitRefunded(t, s, control.OrderID)

	asked := func(orderID string) int {
		n := 0
		for _, r := range m.stripe.Received("/v1/refunds") {
			if r.Form.Get("metadata[order_id]") == orderID {
				n++
			}
		}
		return n
	}
	if n := asked(disputed.OrderID); n != 0 {
		t.Errorf("Stripe was asked %d times to refund the order disputed before its deadline, want never", n)
	}
	if n := asked(atStripe.OrderID); n != 1 {
		t.Errorf("Stripe was asked %d times to refund the order disputed at Stripe, want once (answered charge_disputed)", n)
	}
	if refunds := m.stripe.Refunds(); len(refunds) != 1 || refunds[0].OrderID != control.OrderID {
		t.Errorf("Stripe's refunds %+v, want only the undisputed order %s's", refunds, control.OrderID)
	}
	if st := disputeStatusOf(t, s, disputed.OrderID); st.State != "paid" || st.DisputedAt == nil || st.DisputeStatus != "open" || st.Refund != nil {
		t.Errorf("the order disputed first: %+v; want paid, disputed (open), no refund", st)
	}
	st := disputeStatusOf(t, s, atStripe.OrderID)
	if st.State != "refunding" || st.DisputedAt == nil || st.DisputeStatus != "open" || st.Refund == nil ||
		!st.Refund.HeldByDispute || st.Refund.NextAttemptAt != nil || st.Refund.Attempts != 1 {
		t.Errorf("the order disputed at Stripe: %+v; want its refund held by the dispute after one attempt", st)
	}
	metrics := rawMetrics(t, s)
	for _, want := range []string{
		`vmshelf_refunds_total{cause="notProvisioned",outcome="disputed"} 1`,
		`vmshelf_refunds_total{cause="notProvisioned",outcome="error"} 0`,
		`vmshelf_refunds_total{cause="notProvisioned",outcome="refunded"} 1`,
		`vmshelf_disputes_total 1`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(metrics, "dispute"))
		}
	}

	// The late event of the second dispute, then the bank's decisions.
	m.postSigned(t, "the second dispute", late, lateSig, "disputed")
	payload, sig, err = m.stripe.DisputeClosedEvent("evt_e2e_dispute_lost", piDisputed, "lost", m.whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m.postSigned(t, "the first dispute lost", payload, sig, "disputeClosed")
	payload, sig, err = m.stripe.DisputeClosedEvent("evt_e2e_dispute_won", piAtStripe, "won", m.whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	m.postSigned(t, "the second dispute won", payload, sig, "disputeClosed")
	for id, want := range map[string]string{disputed.OrderID: "lost", atStripe.OrderID: "won"} {
		if st := disputeStatusOf(t, s, id); st.DisputeStatus != want || st.DisputeClosedAt == nil || st.DisputedAt == nil {
			t.Errorf("order %s after the decision: %+v; want the dispute %s, with when", id, st, want)
		}
	}
	if st := disputeStatusOf(t, s, atStripe.OrderID); st.State != "refunding" || st.Refund == nil || !st.Refund.HeldByDispute {
		t.Errorf("after the dispute was won: %+v; want the refund still held (only a person refunds it)", st)
	}
	metrics = rawMetrics(t, s)
	for _, want := range []string{
		`vmshelf_disputes_total 2`,
		`vmshelf_disputes_closed_total{outcome="lost"} 1`,
		`vmshelf_disputes_closed_total{outcome="won"} 1`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(metrics, "dispute"))
		}
	}
	if n := asked(disputed.OrderID) + asked(atStripe.OrderID); n != 1 {
		t.Errorf("Stripe was asked %d times in all to refund the disputed orders, want the one charge_disputed", n)
	}
	if len(m.stripe.Refunds()) != 1 {
		t.Errorf("Stripe made %d refunds, want only the undisputed order's", len(m.stripe.Refunds()))
	}
	// Each dispute's "stripe event" line names its order.
	logs := s.logs()
	for ev, id := range map[string]string{"evt_e2e_dispute_1": disputed.OrderID, "evt_e2e_dispute_2": atStripe.OrderID,
		"evt_e2e_dispute_lost": disputed.OrderID, "evt_e2e_dispute_won": atStripe.OrderID} {
		line := grepLines(grepLines(logs, `"stripe event"`), "event="+ev+" ")
		if !strings.Contains(line, "order_id="+id) {
			t.Errorf("the stripe event line of %s does not name order %s: %q", ev, id, line)
		}
	}
}
