package market

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestOrderIDsLoggedInClear: order ids are no secret (they grant
// nothing: every order route needs the buyer's token; they name the
// machines in the cluster), so the log names them in clear wherever it
// names one, and a line about one order carries it as order_id. The
// whole flow of orders is scanned: placed, paid by the webhook, a
// checkout Stripe did not open, a total the payment gate refused, an
// expired checkout, and one the sweeper settles.
func TestOrderIDsLoggedInClear(t *testing.T) {
	m := newMarket(t)
	e := m.e
	var ids []string

	// Paid.
	a, cs := m.order()
	ids = append(ids, a)
	if err := e.stripe.Pay(cs); err != nil {
		t.Fatal(err)
	}
	wantResult(t, e.event("evt_paid", eventCompleted, cs, e.clock.Now()), resultPaid)

	// Stripe did not answer the checkout: cancelled, 503.
	e.stripe.Down(1)
	r := e.order(m.buyer, m.listing, 1, "debian-13", "down", "")
	wantError(t, r, http.StatusServiceUnavailable, "paymentsUnavailable")

	// The gate refuses a total below the minimum: cancelled, 422.
	low, err := e.st.CreateListing(t.Context(), imagestore.Listing{ID: imagestore.NewListingID(), HostID: m.hostT.ID,
		UnitPrice: 10, Currency: "eur", Capacity: 5, CreatedAt: e.clock.Now()})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, e.order(m.buyer, low.ID, 1, "debian-13", "low", ""), http.StatusUnprocessableEntity, "belowMinimumCharge")

	// Expired at Stripe: cancelled by the event.
	d, csD := m.order()
	ids = append(ids, d)
	if err := e.stripe.Expire(csD); err != nil {
		t.Fatal(err)
	}
	wantResult(t, e.event("evt_expired", eventExpired, csD, e.clock.Now()), resultCancelled)

	// Never reported on: the sweeper expires and settles it.
	s, _ := m.order()
	ids = append(ids, s)
	e.clock.Advance(DefaultCheckoutTTL + DefaultCheckoutGrace + time.Minute)
	e.srv.sweepCheckouts(t.Context())
	if o := e.storedOrder(s); o.State != imagestore.OrderCancelled {
		t.Fatalf("the swept order is %s, want cancelled", o.State)
	}

	orders, err := e.st.Orders(t.Context(), m.buyerT.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(orders) != 5 {
		t.Fatalf("the buyer has %d orders, want 5", len(orders))
	}
	ids = ids[:0]
	for _, o := range orders {
		ids = append(ids, o.ID)
	}
	logs := e.logs.String()
	for _, v := range orderLogViolations(logs, ids) {
		t.Error(v)
	}
	// The refusals of orders that were created (and cancelled at once)
	// are lines about that order too.
	about := 0
	for line := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(line, "route=/market/vms/orders") && (strings.Contains(line, "status=503") || strings.Contains(line, "status=422")) {
			about++
			if m := orderIDAttr.FindStringSubmatch(line); m == nil || !strings.Contains(strings.Join(ids, " "), m[1]) {
				t.Errorf("the answer to a created order does not name it as order_id: %s", line)
			}
		}
	}
	if about != 2 {
		t.Errorf("%d lines of the two refused orders, want 2", about)
	}
	if t.Failed() {
		t.Logf("the log:\n%s", logs)
	}
}

// orderIDShape is an order id with its hex redacted, or whole.
var (
	redactedOrderID = regexp.MustCompile(`\bo\[redacted\]`)
	orderIDAttr     = regexp.MustCompile(`\border_id=(\S+)`)
)

// orderLogViolations checks log lines (slog text) against the rule on
// order ids: never redacted, always under the key order_id (never
// "order"), and every line that names one of ids carries it as order_id.
func orderLogViolations(logs string, ids []string) []string {
	var out []string
	for line := range strings.SplitSeq(strings.TrimSpace(logs), "\n") {
		if redactedOrderID.MatchString(line) {
			out = append(out, "an order id is redacted: "+line)
		}
		if strings.Contains(line, " order=") {
			out = append(out, "an order id is logged under the key order, not order_id: "+line)
		}
		attr := ""
		if m := orderIDAttr.FindStringSubmatch(line); m != nil {
			attr = m[1]
		}
		for _, id := range ids {
			if strings.Contains(line, id) && attr != id {
				out = append(out, fmt.Sprintf("the line names order %s but its order_id is %q: %s", id, attr, line))
			}
		}
	}
	return out
}

// TestLogTextSparesOnlyOrderIDs: the exception to the redaction of hex
// runs is exactly an order id as a word of its own; a token (64 hex), a
// token behind an "o", a 17-hex word and an id glued to other letters are
// still redacted.
func TestLogTextSparesOnlyOrderIDs(t *testing.T) {
	token := strings.Repeat("0123456789abcdef", 4)
	for _, tc := range []struct{ in, want string }{
		{`order "o0123456789abcdef": bad`, `order "o0123456789abcdef": bad`},
		{"order o0123456789abcdef, token " + token, "order o0123456789abcdef, token [redacted]"},
		{"o" + token, "o[redacted]"},
		{"o0123456789abcdef0", "o[redacted]"},
		{"xo0123456789abcdef", "xo[redacted]"},
		{"o0123456789ABCDEF", "o[redacted]"},
		{"/fetch/" + token + "/o0123456789abcdef", "/fetch/[redacted]/o0123456789abcdef"},
	} {
		if got := logText(tc.in); got != tc.want {
			t.Errorf("logText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
