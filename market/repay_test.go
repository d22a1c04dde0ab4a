package market

import (
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestLatePaymentEventsChangeNothing: an order is paid once. Another
// payment event for it (a new event id, days later: the async success
// after the completed event, a resend Stripe numbered anew) finds it paid,
// active or expired and leaves it exactly so: its paid_at and the end of
// its month stay where the first payment put them (a re-stamp would give
// the buyer a month it did not pay for), an expired order is not revived,
// the provisioner is not told again, and the listing's counts stay. Each
// event comes at a later clock than the payment, so a handler that writes
// the new time is seen (at the same instant a re-stamp changes nothing).
func TestLatePaymentEventsChangeNothing(t *testing.T) {
	m := newMarket(t)
	e := m.e
	ctx := t.Context()
	id, cs := m.order()
	if err := e.stripe.Pay(cs); err != nil {
		t.Fatal(err)
	}
	wantResult(t, e.event("evt_paid", eventCompleted, cs, e.clock.Now()), resultPaid)
	first := e.storedOrder(id)
	if first.State != imagestore.OrderPaid || !first.ExpiresAt.Equal(t0.AddDate(0, 1, 0)) {
		t.Fatalf("order after its payment: %+v", first)
	}
	late := func(evt, typ string, want imagestore.OrderState) {
		t.Helper()
		e.clock.Advance(7 * 24 * time.Hour)
		wantResult(t, e.event(evt, typ, cs, e.clock.Now()), resultAlreadyPaid)
		o := e.storedOrder(id)
		if o.State != want || !o.PaidAt.Equal(first.PaidAt) || !o.ExpiresAt.Equal(first.ExpiresAt) {
			t.Errorf("%s a week later: order %s paid %v expires %v; want %s, paid %v, expiring %v as before",
				typ, o.State, o.PaidAt, o.ExpiresAt, want, first.PaidAt, first.ExpiresAt)
		}
		if n := m.paid.Load(); n != 1 {
			t.Errorf("%s a week later: the provisioner was told %d times, want once", typ, n)
		}
		if l := e.storedListing(m.listing); want != imagestore.OrderExpired && (l.Running != 3 || l.Reserved != 0) ||
			want == imagestore.OrderExpired && l.Free() != 10 {
			t.Errorf("%s a week later: listing running %d reserved %d free %d", typ, l.Running, l.Reserved, l.Free())
		}
	}
	late("evt_async", eventAsyncSucceeded, imagestore.OrderPaid)

	// The provisioner made its machines.
	if err := e.st.MarkOrderActive(ctx, id); err != nil {
		t.Fatal(err)
	}
	late("evt_again", eventCompleted, imagestore.OrderActive)

	// Its month ended and the provisioner expired it.
	e.clock.Advance(first.ExpiresAt.Sub(e.clock.Now()))
	if err := e.st.ExpireOrder(ctx, id, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	late("evt_after_expiry", eventCompleted, imagestore.OrderExpired)
}
