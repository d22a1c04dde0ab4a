package market

import (
	"net/http"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/imagestore"
)

// cancelOrder posts token's cancel of order id.
func (e *env) cancelOrder(token, id string) response {
	e.t.Helper()
	return e.post("/market/vms/orders/cancel", token, `{"order_id":"`+id+`"}`)
}

// cancelled cancels order id as its buyer, which must succeed, and
// returns the order of the answer.
func (m *marketFixture) cancelled(id string) orderInfo {
	m.e.t.Helper()
	r := m.e.cancelOrder(m.buyer, id)
	if r.status != http.StatusOK {
		m.e.t.Fatalf("cancel of order %s: %d %s, want 200", id, r.status, r.body)
	}
	var o orderInfo
	decode(m.e.t, r, &o)
	if o.OrderID != id {
		m.e.t.Fatalf("cancel of order %s answered %s", id, r.body)
	}
	return o
}

// TestCancelOrder: the buyer cancels an order awaiting payment. The
// answer is the order, cancelled by its buyer; its replicas are free at
// once; its checkout is expired at Stripe, so the buyer can pay it no
// more; the cancel is counted and logged. A second cancel is a 409 that
// says the order is cancelled already.
func TestCancelOrder(t *testing.T) {
	m := newMarket(t)
	e := m.e
	id, cs := m.order()
	if l := e.storedListing(m.listing); l.Free() != 7 {
		t.Fatalf("listing free %d after an order of 3 of 10, want 7", l.Free())
	}
	o := m.cancelled(id)
	if o.State != imagestore.OrderCancelled || o.Reason != "buyerCancelled" || o.CheckoutURL != "" || o.Host != "host" {
		t.Errorf("the cancel answered %+v; want the order cancelled (buyerCancelled), no checkout URL, host named", o)
	}
	if l := e.storedListing(m.listing); l.Free() != 10 || l.Reserved != 0 {
		t.Errorf("after the cancel the listing has %d free, %d reserved; want 10, 0 at once", l.Free(), l.Reserved)
	}
	if sess, _ := e.stripe.Session(cs); sess.Status != billing.StatusExpired {
		t.Errorf("the checkout at Stripe is %q after the cancel, want expired", sess.Status)
	}
	if err := e.stripe.Pay(cs); err == nil {
		t.Error("the buyer could still pay the checkout of a cancelled order")
	}
	st := e.statusOf(m.buyer)
	if len(st.Orders) != 1 || st.Orders[0].State != imagestore.OrderCancelled || st.Orders[0].Reason != "buyerCancelled" {
		t.Errorf("status orders %+v; want the one order cancelled by its buyer", st.Orders)
	}
	if len(st.Offers) != 1 || st.Offers[0].Free != 10 {
		t.Errorf("status offers %+v; want the listing with all 10 free", st.Offers)
	}

	r := e.cancelOrder(m.buyer, id)
	wantError(t, r, http.StatusConflict, "orderNotAwaitingPayment")
	if !strings.Contains(string(r.body), "cancelled already") {
		t.Errorf("a second cancel answered %s; want it to say the order is cancelled already", r.body)
	}
	wantLines(t, e.scrape(),
		`vmshelf_orders_cancelled_total{checkout="expired"} 1`,
		`vmshelf_orders_cancelled_total{checkout="paid"} 0`,
		`vmshelf_orders{state="cancelled"} 1`)
	if logs := e.logs.String(); !strings.Contains(logs, `msg="order cancelled by its buyer"`) || !strings.Contains(logs, "order_id="+id) {
		t.Errorf("no log line says order %s was cancelled by its buyer:\n%s", id, logs)
	}
}

// TestCancelOrderRefused: another tenant, the host included, is told the
// order is unknown, as for an id that names nothing, and the order keeps
// its reservation and its checkout; a paid order is a 409 in words and
// stays paid, its checkout untouched.
func TestCancelOrderRefused(t *testing.T) {
	m := newMarket(t)
	e := m.e
	_, other := e.host("other", "")
	id, cs := m.order()
	for who, token := range map[string]string{"the host": m.host, "another box": other} {
		wantError(t, e.cancelOrder(token, id), http.StatusNotFound, "orderUnknown")
		if got := e.storedOrder(id); got.State != imagestore.OrderAwaitingPayment {
			t.Errorf("after a cancel by %s the order is %s, want awaitingPayment", who, got.State)
		}
	}
	for _, bad := range []string{"o0000000000000000", "not-an-order", ""} {
		wantError(t, e.cancelOrder(m.buyer, bad), http.StatusNotFound, "orderUnknown")
	}
	if sess, _ := e.stripe.Session(cs); sess.Status != "open" {
		t.Errorf("the checkout is %q after refused cancels, want open", sess.Status)
	}
	if l := e.storedListing(m.listing); l.Reserved != 3 {
		t.Errorf("the listing has %d reserved after refused cancels, want 3", l.Reserved)
	}

	paid := m.paidOrder()
	expires := len(e.stripe.Received("/v1/checkout/sessions/" + paid.CheckoutID + "/expire"))
	r := e.cancelOrder(m.buyer, paid.ID)
	wantError(t, r, http.StatusConflict, "orderNotAwaitingPayment")
	if !strings.Contains(string(r.body), "paid") {
		t.Errorf("the cancel of a paid order answered %s; want it to say the order is paid", r.body)
	}
	if got := e.storedOrder(paid.ID); got.State != imagestore.OrderPaid {
		t.Errorf("after a refused cancel the paid order is %s", got.State)
	}
	if n := len(e.stripe.Received("/v1/checkout/sessions/" + paid.CheckoutID + "/expire")); n != expires {
		t.Errorf("a refused cancel asked Stripe to expire the paid order's checkout (%d requests)", n-expires)
	}
	wantLines(t, e.scrape(), `vmshelf_orders_cancelled_total{checkout="expired"} 0`)
}

// TestCancelOrderPaidMeanwhile: the buyer paid at Stripe, and cancels
// before Stripe's event arrives. The cancel wins in the store (the order
// is cancelled, its capacity free), Stripe says the checkout is complete,
// and that payment, for a cancelled order, is refunded at once by the
// rule for payments after a cancel; the event that follows refunds
// nothing more.
func TestCancelOrderPaidMeanwhile(t *testing.T) {
	m := newMarket(t)
	e := m.e
	id, cs := m.order()
	if err := e.stripe.Pay(cs); err != nil {
		t.Fatal(err)
	}
	m.cancelled(id)
	o := e.storedOrder(id)
	if o.State != imagestore.OrderRefunded || o.RefundFrom != imagestore.OrderCancelled || !o.PaidAt.IsZero() {
		t.Errorf("order %s from %s, paid at %v; want refunded from cancelled, never paid", o.State, o.RefundFrom, o.PaidAt)
	}
	wantOneRefund(t, e, o, imagestore.RefundPaidAfterCancel, 0)
	if l := e.storedListing(m.listing); l.Free() != 10 {
		t.Errorf("listing free %d, want 10", l.Free())
	}
	wantResult(t, e.event("evt_late", eventCompleted, cs, e.clock.Now()), resultPaidCancelled)
	if n := len(e.refundRequests()); n != 1 {
		t.Errorf("%d refund requests after the late event, want 1", n)
	}
	if m.paid.Load() != 0 {
		t.Error("the provisioner was told of a cancelled order")
	}
	wantLines(t, e.scrape(), `vmshelf_orders_cancelled_total{checkout="paid"} 1`)
}

// TestCancelOrderStripeDown: Stripe does not answer the expiry. The
// order is cancelled all the same (its capacity back at once), the cancel
// counted as one Stripe did not confirm, the line logged; a payment that
// still reaches the checkout before it runs out is refunded when its
// event comes.
func TestCancelOrderStripeDown(t *testing.T) {
	m := newMarket(t)
	e := m.e
	id, cs := m.order()
	e.stripe.Down(1)
	if o := m.cancelled(id); o.State != imagestore.OrderCancelled {
		t.Errorf("the cancel answered the order %s, want cancelled", o.State)
	}
	if l := e.storedListing(m.listing); l.Free() != 10 {
		t.Errorf("listing free %d, want 10", l.Free())
	}
	wantLines(t, e.scrape(), `vmshelf_orders_cancelled_total{checkout="unconfirmed"} 1`)
	if !strings.Contains(e.logs.String(), "checkout not expired at Stripe") {
		t.Errorf("no log line says the checkout could not be expired:\n%s", e.logs.String())
	}
	if err := e.stripe.Pay(cs); err != nil {
		t.Fatal(err)
	}
	wantResult(t, e.event("evt_late", eventCompleted, cs, e.clock.Now()), resultPaidCancelled)
	wantOneRefund(t, e, e.storedOrder(id), imagestore.RefundPaidAfterCancel, 0)
}

// TestCancelOrderAvailability: the cancel is a machine action, refused
// like the others where the market is not open to the tenant; without
// Stripe keys it is refused, since nothing could stop the checkout.
func TestCancelOrderAvailability(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Payments = nil })
	_, token := e.host("box", "")
	wantError(t, e.cancelOrder(token, "o0000000000000000"), http.StatusServiceUnavailable, "paymentsUnavailable")
}
