package market

import (
	"net/http"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestUnpaidLimitCountsOnlyUnpaid: the limit of 3 is on orders awaiting
// payment. A buyer whose earlier orders were paid (and run) orders again
// up to 3 unpaid at once, and exactly the fourth unpaid is refused; once
// one of those is paid, it may order again. The market's other test of
// the limit never paid an order, so a limit that counted every order
// holding capacity passed it, and a paying customer with three machines
// could never buy a fourth.
func TestUnpaidLimitCountsOnlyUnpaid(t *testing.T) {
	m := newMarket(t)
	e := m.e
	pay := func(id string) {
		t.Helper()
		cs := e.sessionOf(id)
		if err := e.stripe.Pay(cs); err != nil {
			t.Fatal(err)
		}
		wantResult(t, e.event("evt_"+id, eventCompleted, cs, e.clock.Now()), resultPaid)
	}
	var paid []string
	for range maxUnpaidOrders {
		id := e.placed(m.buyer, m.listing, 1).OrderID
		pay(id)
		paid = append(paid, id)
	}
	if err := e.st.MarkOrderActive(t.Context(), paid[0]); err != nil { // the provisioner made its machines
		t.Fatal(err)
	}
	var unpaid []string
	for range maxUnpaidOrders {
		unpaid = append(unpaid, e.placed(m.buyer, m.listing, 1).OrderID)
	}
	wantError(t, e.order(m.buyer, m.listing, 1, "debian-13", "web", ""), http.StatusConflict, "tooManyUnpaidOrders")
	pay(unpaid[0])
	if o := e.storedOrder(unpaid[0]); o.State != imagestore.OrderPaid {
		t.Fatalf("order %s, want paid", o.State)
	}
	e.placed(m.buyer, m.listing, 1)
}
