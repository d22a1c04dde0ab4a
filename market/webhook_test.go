package market

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/billing/stripetest"
	"github.com/vmshelf/vmshelf/imagestore"
)

// postEvent posts a payload with a signature header to the webhook.
func (e *env) postEvent(payload []byte, signature string) response {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.t.Context(), http.MethodPost, e.ts.URL+"/market/stripe/webhook", bytes.NewReader(payload))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8") // as Stripe sends it
	if signature != "" {
		req.Header.Set("Stripe-Signature", signature)
	}
	return e.send(req)
}

// event posts a Stripe event of typ about session, signed at signedAt
// with the webhook's secret.
func (e *env) event(id, typ, session string, signedAt time.Time) response {
	e.t.Helper()
	payload, sig, err := e.stripe.Event(id, typ, session, webhookSecret, signedAt)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.postEvent(payload, sig)
}

// wantResult checks a webhook answer: 200 and what it did.
func wantResult(t *testing.T, r response, result string) {
	t.Helper()
	var a webhookAnswer
	if r.status != http.StatusOK {
		t.Fatalf("webhook: %d %s, want 200 %s", r.status, r.body, result)
	}
	decode(t, r, &a)
	if !a.Received || a.Result != result {
		t.Errorf("webhook answered %s, want result %q", r.body, result)
	}
}

// marketFixture is a host with a listing of 10 at 6.00 EUR and a buyer.
type marketFixture struct {
	e             *env
	host, buyer   string // tokens
	listing       string
	paid          atomic.Int64 // OnPaid calls
	lastPaid      atomic.Value
	hostT, buyerT imagestore.Tenant
	hostAcct      string
}

func newMarket(t *testing.T, mod ...func(*Config)) *marketFixture {
	m := &marketFixture{hostAcct: "acct_1HostActive000001"}
	mod = append(mod, func(c *Config) {
		c.OnPaid = func(id string) { m.paid.Add(1); m.lastPaid.Store(id) }
	})
	m.e = newEnv(t, mod...)
	m.hostT, m.host = m.e.host("host", m.hostAcct)
	m.buyerT, m.buyer = m.e.host("buyer", "")
	m.listing = m.e.listing(m.host, 600, 10)
	return m
}

// order places an order of 3 and returns its id and Stripe session.
func (m *marketFixture) order() (string, string) {
	a := m.e.placed(m.buyer, m.listing, 3)
	return a.OrderID, m.e.sessionOf(a.OrderID)
}

// TestWebhookPaid: a completed, paid session marks its order paid for a
// month from now, moves its capacity from reserved to running, tells the
// provisioner, and shows replicas starting; a replay of the event is 200
// and changes nothing, and so is a second event about the same payment.
func TestWebhookPaid(t *testing.T) {
	for _, typ := range []string{eventCompleted, eventAsyncSucceeded} {
		t.Run(typ, func(t *testing.T) {
			m := newMarket(t)
			e := m.e
			id, cs := m.order()
			if err := e.stripe.Pay(cs); err != nil {
				t.Fatal(err)
			}
			e.clock.Advance(time.Minute)
			paidAt := e.clock.Now()
			wantResult(t, e.event("evt_1", typ, cs, paidAt), resultPaid)
			o := e.storedOrder(id)
			if o.State != imagestore.OrderPaid || !o.PaidAt.Equal(paidAt) || !o.ExpiresAt.Equal(paidAt.AddDate(0, 1, 0)) {
				t.Errorf("order after payment: %s paid %v expires %v; want paid now, expiring a month later", o.State, o.PaidAt, o.ExpiresAt)
			}
			if l := e.storedListing(m.listing); l.Reserved != 0 || l.Running != 3 || l.Free() != 7 {
				t.Errorf("listing after payment: reserved %d running %d free %d; want 0 3 7", l.Reserved, l.Running, l.Free())
			}
			if m.paid.Load() != 1 || m.lastPaid.Load() != id {
				t.Errorf("OnPaid called %d times (last %v), want once with %s", m.paid.Load(), m.lastPaid.Load(), id)
			}
			st := e.statusOf(m.buyer)
			if len(st.Orders) != 1 || st.Orders[0].State != imagestore.OrderPaid || len(st.Orders[0].Replicas) != 3 ||
				st.Orders[0].Replicas[2].Name != "vm-"+id+"-2" || st.Orders[0].Replicas[0].State != "starting" ||
				st.Orders[0].CheckoutURL != "" || st.Orders[0].ExpiresAt == nil {
				t.Errorf("buyer's order after payment: %+v", st.Orders)
			}

			wantResult(t, e.event("evt_1", typ, cs, paidAt), resultDuplicate) // Stripe resends
			wantResult(t, e.event("evt_2", eventCompleted, cs, e.clock.Now()), resultAlreadyPaid)
			if o2 := e.storedOrder(id); o2 != o {
				t.Errorf("a replay changed the order:\n%+v\n%+v", o, o2)
			}
			if m.paid.Load() != 1 {
				t.Errorf("OnPaid called %d times after replays, want 1", m.paid.Load())
			}
		})
	}
}

// TestWebhookRefusals: events that do not verify are 400 and change
// nothing; a webhook without a secret is 503.
func TestWebhookRefusals(t *testing.T) {
	m := newMarket(t)
	e := m.e
	id, cs := m.order()
	if err := e.stripe.Pay(cs); err != nil {
		t.Fatal(err)
	}
	payload, sig, err := e.stripe.Event("evt_x", eventCompleted, cs, webhookSecret, e.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, otherSig, _ := e.stripe.Event("evt_x", eventCompleted, cs, "whsec_someoneelse0000000000", e.clock.Now())
	stalePayload, staleSig, _ := e.stripe.Event("evt_x", eventCompleted, cs, webhookSecret, e.clock.Now().Add(-10*time.Minute))
	tampered := bytes.Replace(payload, []byte(`"evt_x"`), []byte(`"evt_y"`), 1)
	for _, c := range []struct {
		name      string
		payload   []byte
		signature string
		status    int
		reason    string
	}{
		{"no signature", payload, "", 400, "badSignature"},
		{"another secret", payload, otherSig, 400, "badSignature"},
		{"tampered payload", tampered, sig, 400, "badSignature"},
		{"stale timestamp", stalePayload, staleSig, 400, "badSignature"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantError(t, e.postEvent(c.payload, c.signature), c.status, c.reason)
		})
	}
	t.Run("signed, but not an event", func(t *testing.T) {
		p, s, _ := stripetestSigned([]byte(`[1,2,3]`), e.clock.Now())
		wantError(t, e.postEvent(p, s), 400, "badRequest")
	})
	t.Run("over 1 MiB", func(t *testing.T) {
		wantError(t, e.postEvent(bytes.Repeat([]byte(" "), maxWebhookBody+1), sig), 413, "tooLarge")
	})
	if o := e.storedOrder(id); o.State != imagestore.OrderAwaitingPayment {
		t.Errorf("refused events changed the order to %s", o.State)
	}
	// The real event still works afterwards.
	wantResult(t, e.postEvent(payload, sig), resultPaid)

	t.Run("no secret", func(t *testing.T) {
		e2 := newEnv(t, func(c *Config) { c.WebhookSecret = "" })
		wantError(t, e2.postEvent(payload, sig), http.StatusServiceUnavailable, "webhookNotConfigured")
	})
}

// stripetestSigned signs any payload with the webhook secret.
func stripetestSigned(payload []byte, at time.Time) ([]byte, string, error) {
	body, header := stripetest.Signed(payload, webhookSecret, at)
	return body, header, nil
}

// TestWebhookNotProvisioned: a session that is not paid yet, or whose
// payment is not exactly the order's destination charge, never marks the
// order paid; it is counted and logged.
func TestWebhookNotProvisioned(t *testing.T) {
	for _, c := range []struct {
		name   string
		edit   func(*stripetest.Session)
		result string
	}{
		{"still unpaid (async)", func(s *stripetest.Session) { s.PaymentStatus = "unpaid" }, resultUnpaid},
		{"amount differs", func(s *stripetest.Session) { s.PaidAmount = 1200 }, resultInconsistent},
		{"fee differs", func(s *stripetest.Session) { s.PaidFee = 1800 }, resultInconsistent},
		{"no fee", func(s *stripetest.Session) { s.PaidFee = 0 }, resultInconsistent},
		{"destination differs", func(s *stripetest.Session) { s.PaidDestination = "acct_1Somebodyelse00001" }, resultInconsistent},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMarket(t)
			e := m.e
			id, cs := m.order()
			if err := e.stripe.PayWith(cs, c.edit); err != nil {
				t.Fatal(err)
			}
			wantResult(t, e.event("evt_1", eventCompleted, cs, e.clock.Now()), c.result)
			if o := e.storedOrder(id); o.State != imagestore.OrderAwaitingPayment || m.paid.Load() != 0 {
				t.Errorf("order %s (OnPaid %d) after an event that must not pay it", o.State, m.paid.Load())
			}
			wantLines(t, e.scrape(), `vmshelf_webhook_events_total{result="`+c.result+`",type="`+eventCompleted+`"} 1`)
			if c.result == resultInconsistent && !strings.Contains(e.logs.String(), "does not match its order") {
				t.Errorf("the mismatch is not logged:\n%s", e.logs.String())
			}
		})
	}
	t.Run("unknown order", func(t *testing.T) {
		m := newMarket(t)
		wantResult(t, m.e.event("evt_1", eventCompleted, "cs_test_notours", m.e.clock.Now()), resultUnknownOrder)
	})
	t.Run("unknown type", func(t *testing.T) {
		m := newMarket(t)
		_, cs := m.order()
		wantResult(t, m.e.event("evt_1", "payment_intent.created", cs, m.e.clock.Now()), resultIgnored)
		wantLines(t, m.e.scrape(), `vmshelf_webhook_events_total{result="ignored",type="other"} 1`)
	})
}

// TestWebhookEndsUnpaid: an expired checkout and a failed async payment
// cancel the order and give its capacity back.
func TestWebhookEndsUnpaid(t *testing.T) {
	for _, c := range []struct{ typ, reason string }{
		{eventExpired, "checkoutExpired"},
		{eventAsyncFailed, "paymentFailed"},
	} {
		t.Run(c.typ, func(t *testing.T) {
			m := newMarket(t)
			e := m.e
			id, cs := m.order()
			if c.typ == eventExpired {
				if err := e.stripe.Expire(cs); err != nil {
					t.Fatal(err)
				}
			}
			wantResult(t, e.event("evt_1", c.typ, cs, e.clock.Now()), resultCancelled)
			o := e.storedOrder(id)
			if o.State != imagestore.OrderCancelled || o.Reason != c.reason {
				t.Errorf("order %s (%s), want cancelled (%s)", o.State, o.Reason, c.reason)
			}
			if l := e.storedListing(m.listing); l.Free() != 10 {
				t.Errorf("free %d after the cancel, want 10", l.Free())
			}
			wantResult(t, e.event("evt_2", c.typ, cs, e.clock.Now()), resultIgnored)
		})
	}
	t.Run("expiry event for a paid order", func(t *testing.T) {
		m := newMarket(t)
		e := m.e
		id, cs := m.order()
		if err := e.stripe.Pay(cs); err != nil {
			t.Fatal(err)
		}
		wantResult(t, e.event("evt_1", eventCompleted, cs, e.clock.Now()), resultPaid)
		wantResult(t, e.event("evt_2", eventExpired, cs, e.clock.Now()), resultIgnored)
		if o := e.storedOrder(id); o.State != imagestore.OrderPaid {
			t.Errorf("a paid order became %s", o.State)
		}
	})
}

// TestWebhookStripeDown: when the session cannot be re-read, the webhook
// answers 503 and does not record the event, so Stripe's retry pays the
// order once Stripe answers again.
func TestWebhookStripeDown(t *testing.T) {
	m := newMarket(t)
	e := m.e
	id, cs := m.order()
	if err := e.stripe.Pay(cs); err != nil {
		t.Fatal(err)
	}
	e.stripe.Down(1)
	r := e.event("evt_1", eventCompleted, cs, e.clock.Now())
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("webhook with Stripe down: %d %s, want 503", r.status, r.body)
	}
	if o := e.storedOrder(id); o.State != imagestore.OrderAwaitingPayment {
		t.Errorf("order %s while Stripe could not be asked", o.State)
	}
	wantResult(t, e.event("evt_1", eventCompleted, cs, e.clock.Now()), resultPaid)
}

// TestCheckoutSweeper: an unpaid order past its reservation is settled by
// asking Stripe: expired at Stripe and cancelled when nobody paid, paid
// when the buyer paid and the event was lost, left alone while Stripe
// does not answer ("could not ask" is never "not paid"), and cancelled at
// once when its checkout never opened.
func TestCheckoutSweeper(t *testing.T) {
	overdue := DefaultCheckoutTTL + DefaultCheckoutGrace
	t.Run("nobody paid, no event came", func(t *testing.T) {
		m := newMarket(t)
		e := m.e
		id, cs := m.order()
		e.clock.Advance(overdue - time.Second)
		e.srv.sweepOnce(t.Context())
		if o := e.storedOrder(id); o.State != imagestore.OrderAwaitingPayment {
			t.Fatalf("swept before its reservation ended: %s", o.State)
		}
		e.clock.Advance(time.Second)
		e.srv.sweepOnce(t.Context())
		if o := e.storedOrder(id); o.State != imagestore.OrderCancelled || o.Reason != "checkoutExpired" {
			t.Errorf("order %s (%s), want cancelled (checkoutExpired)", o.State, o.Reason)
		}
		if s, _ := e.stripe.Session(cs); s.Status != "expired" {
			t.Errorf("the session is %s at Stripe, want expired (so nobody pays it later)", s.Status)
		}
		if l := e.storedListing(m.listing); l.Free() != 10 {
			t.Errorf("free %d, want 10", l.Free())
		}
	})
	t.Run("paid, event lost", func(t *testing.T) {
		m := newMarket(t)
		e := m.e
		id, cs := m.order()
		if err := e.stripe.Pay(cs); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(overdue)
		e.srv.sweepOnce(t.Context())
		if o := e.storedOrder(id); o.State != imagestore.OrderPaid || m.paid.Load() != 1 {
			t.Errorf("order %s (OnPaid %d), want paid", o.State, m.paid.Load())
		}
	})
	t.Run("Stripe down", func(t *testing.T) {
		m := newMarket(t)
		e := m.e
		id, _ := m.order()
		e.clock.Advance(overdue)
		e.stripe.Down(1)
		e.srv.sweepOnce(t.Context())
		if o := e.storedOrder(id); o.State != imagestore.OrderAwaitingPayment {
			t.Fatalf("order %s while Stripe could not be asked, want it kept", o.State)
		}
		e.srv.sweepOnce(t.Context())
		if o := e.storedOrder(id); o.State != imagestore.OrderCancelled {
			t.Errorf("order %s once Stripe answered, want cancelled", o.State)
		}
	})
	t.Run("checkout never opened", func(t *testing.T) {
		m := newMarket(t)
		e := m.e
		o := imagestore.Order{ID: imagestore.NewOrderID(), ListingID: m.listing, BuyerID: m.buyerT.ID, HostID: m.hostT.ID,
			Quantity: 1, ImageKind: imagestore.ImageCatalogue, Image: "debian-13", Name: "web", UnitPrice: 600, Total: 600,
			Fee: 300, Currency: "eur", Destination: m.hostAcct, State: imagestore.OrderAwaitingPayment,
			ReserveUntil: e.clock.Now().Add(overdue), CreatedAt: e.clock.Now()}
		if err := e.st.CreateOrder(t.Context(), o, "", 0); err != nil { // as if serve died before Stripe answered
			t.Fatal(err)
		}
		e.clock.Advance(overdue)
		before := e.stripe.Requests()
		e.srv.sweepOnce(t.Context())
		if got := e.storedOrder(o.ID); got.State != imagestore.OrderCancelled || got.Reason != "checkoutFailed" {
			t.Errorf("order %s (%s), want cancelled (checkoutFailed)", got.State, got.Reason)
		}
		if e.stripe.Requests() != before {
			t.Error("Stripe was asked about an order without a checkout")
		}
	})
}

// TestMarketMetrics: orders by state, webhook events by type and result,
// Stripe call latency.
func TestMarketMetrics(t *testing.T) {
	m := newMarket(t)
	e := m.e
	_, cs := m.order()
	if err := e.stripe.Pay(cs); err != nil {
		t.Fatal(err)
	}
	wantResult(t, e.event("evt_1", eventCompleted, cs, e.clock.Now()), resultPaid)
	_, cs2 := m.order()
	if err := e.stripe.Expire(cs2); err != nil {
		t.Fatal(err)
	}
	wantResult(t, e.event("evt_2", eventExpired, cs2, e.clock.Now()), resultCancelled)
	m.order()
	text := e.scrape()
	wantLines(t, text,
		`vmshelf_orders{state="awaitingPayment"} 1`,
		`vmshelf_orders{state="paid"} 1`,
		`vmshelf_orders{state="cancelled"} 1`,
		`vmshelf_orders{state="active"} 0`,
		`vmshelf_orders{state="expired"} 0`,
		`vmshelf_orders_placed_total 3`,
		`vmshelf_webhook_events_total{result="paid",type="checkout.session.completed"} 1`,
		`vmshelf_webhook_events_total{result="cancelled",type="checkout.session.expired"} 1`,
	)
	if !strings.Contains(text, `vmshelf_stripe_request_duration_seconds_count{call="create_checkout",outcome="ok"} 3`) {
		t.Errorf("no Stripe latency of the 3 checkouts:\n%s", text)
	}
}

// deadlines records the deadline of every Stripe call it passes on.
type deadlines struct {
	billing.Payments
	mu   sync.Mutex
	seen map[string][]time.Time // by call; the zero time for none
}

func (d *deadlines) note(ctx context.Context, call string) {
	at, _ := ctx.Deadline()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen == nil {
		d.seen = map[string][]time.Time{}
	}
	d.seen[call] = append(d.seen[call], at)
}

func (d *deadlines) of(call string) []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.seen[call])
}

func (d *deadlines) CreateCheckout(ctx context.Context, c billing.Checkout) (billing.Session, error) {
	d.note(ctx, "CreateCheckout")
	return d.Payments.CreateCheckout(ctx, c)
}

func (d *deadlines) Session(ctx context.Context, id string) (billing.Session, error) {
	d.note(ctx, "Session")
	return d.Payments.Session(ctx, id)
}

// TestDetachedWorkHasDeadlines: the work an order and a webhook finish
// whatever the client does (they are detached from the request) still
// runs under a deadline, the one its constant names: a wedged Stripe or
// store cannot hold it for ever.
func TestDetachedWorkHasDeadlines(t *testing.T) {
	d := &deadlines{}
	m := newMarket(t, func(c *Config) { d.Payments = c.Payments; c.Payments = d })
	e := m.e
	within := func(call string, bound time.Duration, before, after time.Time) {
		t.Helper()
		got := d.of(call)
		if len(got) != 1 {
			t.Fatalf("%s called %d times, want once", call, len(got))
		}
		if got[0].IsZero() {
			t.Fatalf("%s ran without a deadline, want one %v after the request", call, bound)
		}
		if got[0].Before(before.Add(bound)) || got[0].After(after.Add(bound)) {
			t.Errorf("%s's deadline %v is not %v after the request (%v to %v)", call, got[0], bound, before, after)
		}
	}
	before := time.Now()
	id, cs := m.order()
	within("CreateCheckout", checkoutBound, before, time.Now())

	if err := e.stripe.Pay(cs); err != nil {
		t.Fatal(err)
	}
	before = time.Now()
	wantResult(t, e.event("evt_1", eventCompleted, cs, e.clock.Now()), resultPaid)
	within("Session", webhookBound, before, time.Now())
	if o := e.storedOrder(id); o.State != imagestore.OrderPaid {
		t.Errorf("order %s, want paid", o.State)
	}
}
