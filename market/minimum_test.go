package market

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/imagestore"
)

// TestListingBelowMinimumCharge: a listing whose unit price is below
// Stripe's minimum charge in the edge's currency could never be paid for
// one machine, so it is refused with its own reason and the minimum in
// words; exactly the minimum is listed and one machine of it can be
// ordered. NOK and EUR have different minimums (3.00 and 0.50), so a
// check against one fixed number fails one of them.
func TestListingBelowMinimumCharge(t *testing.T) {
	for _, c := range []struct {
		currency string
		minimum  int64
		words    string // the refusal of minimum-1
	}{
		{"nok", 300, "the smallest charge Stripe accepts in NOK is 3.00 NOK; a unit price of 2.99 NOK cannot be paid for one machine"},
		{"eur", 50, "the smallest charge Stripe accepts in EUR is 0.50 EUR; a unit price of 0.49 EUR cannot be paid for one machine"},
	} {
		t.Run(c.currency, func(t *testing.T) {
			if m, ok := billing.MinimumAmount(c.currency); !ok || m != c.minimum {
				t.Fatalf("the gate's minimum of %s is %d, %v; the test expects %d", c.currency, m, ok, c.minimum)
			}
			e := newEnv(t, func(cfg *Config) { cfg.Currency = c.currency })
			hostT, host := e.host("host", "acct_1HostActive000001")
			_, buyer := e.host("buyer", "acct_1HostActive000002")
			r := e.post("/market/vms/listings", host, fmt.Sprintf(`{"unit_price":%d,"capacity":1}`, c.minimum-1))
			wantError(t, r, http.StatusUnprocessableEntity, "belowMinimumCharge")
			var b struct{ Error string }
			_ = json.Unmarshal(r.body, &b)
			if b.Error != c.words {
				t.Errorf("refusal says %q, want %q", b.Error, c.words)
			}
			if ls, _ := e.st.Listings(t.Context(), hostT.ID); len(ls) != 0 {
				t.Errorf("a refused listing was stored: %+v", ls)
			}
			id := e.listing(host, c.minimum, 1)
			a := e.placed(buyer, id, 1)
			if a.Total != c.minimum || a.Currency != c.currency {
				t.Errorf("order of one at the minimum: %+v, want a total of %d %s", a, c.minimum, c.currency)
			}
		})
	}
}

// TestOrderBelowMinimumCharge: a listing below the minimum that is in the
// store already (listed before the check existed) cannot be paid for one
// machine. The payment gate's refusal is the buyer's 422 in words, never
// a 500; the order is cancelled at once, its capacity back; an order of
// enough machines to reach the minimum goes through.
func TestOrderBelowMinimumCharge(t *testing.T) {
	e := newEnv(t, func(cfg *Config) { cfg.Currency = "nok" })
	hostT, _ := e.host("host", "acct_1HostActive000001")
	_, buyer := e.host("buyer", "acct_1HostActive000002")
	l, err := e.st.CreateListing(t.Context(), imagestore.Listing{ID: imagestore.NewListingID(), HostID: hostT.ID,
		UnitPrice: 50, Currency: "nok", Capacity: 10, CreatedAt: e.clock.Now()})
	if err != nil {
		t.Fatal(err)
	}
	r := e.order(buyer, l.ID, 1, "debian-13", "web", "")
	wantError(t, r, http.StatusUnprocessableEntity, "belowMinimumCharge")
	want := "the smallest charge Stripe accepts in NOK is 3.00 NOK; this order's total of 0.50 NOK cannot be paid; the order is cancelled"
	if !strings.Contains(string(r.body), want) {
		t.Errorf("refusal %s, want it to say %q", r.body, want)
	}
	if l := e.storedListing(l.ID); l.Reserved != 0 {
		t.Errorf("the refused order still holds %d replicas", l.Reserved)
	}
	if strings.Contains(e.logs.String(), "level=ERROR") {
		t.Errorf("the gate's refusal was logged as a server fault:\n%s", e.logs.String())
	}
	if a := e.placed(buyer, l.ID, 6); a.Total != 300 {
		t.Errorf("order of 6 at 0.50 NOK: total %d, want 300", a.Total)
	}
}

// TestOrderHostAccountMalformed: a host whose Stripe account was changed
// to something that is no account id after it listed fails the payment
// gate's destination check: that is the listing's host no longer able to
// take payouts (409 notHosting), not a server fault; the order is
// cancelled and Stripe never asked to open a checkout.
func TestOrderHostAccountMalformed(t *testing.T) {
	e := newEnv(t)
	hostT, host := e.host("host", "acct_1HostActive000001")
	_, buyer := e.host("buyer", "acct_1HostActive000002")
	id := e.listing(host, 600, 2)
	hostT.StripeAccount = "paypal:me"
	if err := e.st.UpdateTenant(t.Context(), hostT); err != nil {
		t.Fatal(err)
	}
	wantError(t, e.order(buyer, id, 1, "debian-13", "web", ""), http.StatusConflict, "notHosting")
	if l := e.storedListing(id); l.Reserved != 0 {
		t.Errorf("the refused order still holds %d replicas", l.Reserved)
	}
	if len(e.stripe.Sessions()) != 0 {
		t.Errorf("Stripe opened %d checkouts for a malformed destination", len(e.stripe.Sessions()))
	}
}
