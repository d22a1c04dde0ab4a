package market

import (
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestPaymentForCancelledOrder: a payment that arrives for an order
// already cancelled (its reservation ended, its capacity maybe sold
// again) provisions nothing: the order stays cancelled, the listing's
// capacity stays free, the provisioner is not told. Stripe holds the
// buyer's money for nothing, so the event is counted as paidCancelled and
// logged as an error that says to refund it; an operator finds it no
// other way. The market never had a test of this path.
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
	if o := e.storedOrder(id); o.State != imagestore.OrderCancelled || !o.PaidAt.IsZero() {
		t.Errorf("order %s paid at %v, want it cancelled and never paid", o.State, o.PaidAt)
	}
	if n := m.paid.Load(); n != 0 {
		t.Errorf("the provisioner was told %d times of a cancelled order", n)
	}
	if l := e.storedListing(m.listing); l.Free() != 10 {
		t.Errorf("listing free %d, want 10: a cancelled order took capacity back", l.Free())
	}
	wantLines(t, e.scrape(), `vmshelf_webhook_events_total{result="paidCancelled",type="`+eventCompleted+`"} 1`)
	var line string
	for l := range strings.SplitSeq(e.logs.String(), "\n") {
		if strings.Contains(l, "order_id="+id) && strings.Contains(l, "refund") {
			line = l
		}
	}
	if !strings.Contains(line, "level=ERROR") {
		t.Errorf("no error line tells the operator to refund order %s:\n%s", id, e.logs.String())
	}
}
