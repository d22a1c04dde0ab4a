package market

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestStatusShowsOnlyOwnOrders: a tenant's status lists the orders it
// placed as a buyer and no other: not the orders other tenants placed on
// its listings (a host is not their buyer: it would be shown another
// tenant's checkout link, image and machines as its own), and nothing of
// a third tenant's. A host that also buys sees exactly its own purchase.
// The host learns what it sold only as its listings' counts.
func TestStatusShowsOnlyOwnOrders(t *testing.T) {
	m := newMarket(t)
	e := m.e
	_, other := e.host("other", "acct_1HostActive000002")
	otherListing := e.listing(other, 700, 4)

	unpaid := e.placed(m.buyer, m.listing, 2)
	paidID, cs := m.order()
	if err := e.stripe.Pay(cs); err != nil {
		t.Fatal(err)
	}
	wantResult(t, e.event("evt_1", eventCompleted, cs, e.clock.Now()), resultPaid)
	e.clock.Advance(time.Minute)
	own := e.placed(m.host, otherListing, 1) // the host buys elsewhere

	ids := func(st statusAnswer) []string {
		var s []string
		for _, o := range st.Orders {
			s = append(s, o.OrderID)
		}
		slices.Sort(s)
		return s
	}
	buyerWant := []string{unpaid.OrderID, paidID}
	slices.Sort(buyerWant)
	if got := ids(e.statusOf(m.buyer)); !slices.Equal(got, buyerWant) {
		t.Errorf("buyer's orders %v, want its two %v", got, buyerWant)
	}
	r := e.post("/market/vms/status", m.host, "")
	var host statusAnswer
	decode(t, r, &host)
	if got := ids(host); !slices.Equal(got, []string{own.OrderID}) {
		t.Errorf("host's orders %v, want only the one it placed (%s), none of its buyers'", got, own.OrderID)
	}
	for _, leak := range []string{unpaid.OrderID, paidID, unpaid.CheckoutURL} {
		if strings.Contains(string(r.body), leak) {
			t.Errorf("the host's status carries %q of its buyer's order", leak)
		}
	}
	if len(host.Listings) != 1 || host.Listings[0].Reserved != 2 || host.Listings[0].Running != 3 {
		t.Errorf("host's listings %+v, want its one listing with 2 reserved and 3 running", host.Listings)
	}
	if got := ids(e.statusOf(other)); len(got) != 0 {
		t.Errorf("the other host sees orders %v, want none (it bought nothing)", got)
	}
	if o := e.storedOrder(own.OrderID); o.HostID == m.hostT.ID || o.BuyerID != m.hostT.ID {
		t.Fatalf("fixture: the host's own order %+v is not its purchase", o)
	}
}
