package main

// A buyer's cancel of an unpaid order through the binary: the API and
// 'vmshelf orders', against the Stripe stand-in.

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// offerFree is the free replicas of listing id among token's offers.
func offerFree(t *testing.T, s *server, token, id string) int {
	t.Helper()
	for _, o := range marketStatusOf(t, s, &answers{}, token).Offers {
		if o.ListingID == id {
			return o.Free
		}
	}
	t.Fatalf("listing %s is not among the offers", id)
	return 0
}

// TestE2EOrderCancel: an order that takes a listing's last replicas is
// cancelled by its buyer; the replicas are free at once (another order
// takes them), though the buyer had paid at Stripe a moment before: that
// payment is refunded once, and Stripe's event for it, coming after the
// cancel, refunds nothing more. Then 'vmshelf orders cancel' cancels the
// second order, whose checkout Stripe then refuses to take payment for;
// a second cancel, the host's and a malformed id are refused in words;
// 'vmshelf orders list' shows both; the metrics count both cancels.
func TestE2EOrderCancel(t *testing.T) {
	t.Parallel()
	needTool(t, "curl")
	m := startPageMarket(t)
	s := m.s
	l := m.listing(t, `{"unit_price":600,"capacity":3}`)
	first := s.ordered(t, l, "first", 3)
	if code, body := s.ctl(t, "/market/vms/orders", s.token,
		`{"listing_id":"`+l.ListingID+`","quantity":1,"image":"debian-13","name":"more"}`); code != http.StatusConflict {
		t.Fatalf("an order on the full listing: %d %s, want 409 noCapacity", code, body)
	}
	sessions := m.fake.Sessions()
	cs := sessions[len(sessions)-1].ID
	if err := m.fake.Pay(cs); err != nil { // the buyer paid; Stripe's event is on its way
		t.Fatal(err)
	}

	code, body := s.ctl(t, "/market/vms/orders/cancel", m.host, `{"order_id":"`+first.OrderID+`"}`)
	wantError(t, "the host's cancel", code, body, http.StatusNotFound, "orderUnknown")
	code, body = s.ctl(t, "/market/vms/orders/cancel", s.token, `{"order_id":"`+first.OrderID+`"}`)
	if code != http.StatusOK || !strings.Contains(string(body), `"order_id":"`+first.OrderID+`"`) {
		t.Fatalf("the buyer's cancel: %d %s", code, body)
	}
	if free := offerFree(t, s, s.token, l.ListingID); free != 3 {
		t.Errorf("after the cancel the offer has %d free, want 3 at once", free)
	}
	wantRefundedOnce(t, s, m.fake, first.OrderID)
	payload, sig, err := m.fake.Event("evt_paid_late", "checkout.session.completed", cs, m.whsec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	code, body = postWebhook(t, s, payload, sig)
	wantWebhookResult(t, "the payment's event after the cancel", code, body, "paidCancelled")
	if n := wantRefundedOnce(t, s, m.fake, first.OrderID); n != 1 {
		t.Errorf("Stripe was asked %d times to refund order %s, want once", n, first.OrderID)
	}

	second := s.ordered(t, l, "second", 3) // the freed replicas
	control := []string{"--control", s.ctlBase, "--token-file", filepath.Join(s.dataDir, "dev-token")}
	r := vmshelf(t, append([]string{"orders", "cancel", second.OrderID}, control...)...)
	if r.code != 0 || r.stdout != "cancelled "+second.OrderID+"\n" {
		t.Fatalf("orders cancel: exit %d, stdout %q; stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if free := offerFree(t, s, s.token, l.ListingID); free != 3 {
		t.Errorf("after 'orders cancel' the offer has %d free, want 3", free)
	}
	cs2 := m.fake.Sessions()[len(m.fake.Sessions())-1]
	if cs2.OrderID != second.OrderID || cs2.Status != "expired" {
		t.Errorf("the second order's checkout at Stripe: %+v; want it expired", cs2)
	}
	if err := m.fake.Pay(cs2.ID); err == nil {
		t.Error("Stripe took a payment for the checkout of a cancelled order")
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"cancelled already", []string{second.OrderID}, 1, "cancelled already"},
		{"a malformed ORDER_ID", []string{"../vmshelf.db"}, 2, "is not an ORDER_ID"},
		{"no ORDER_ID", nil, 2, "orders cancel needs the ORDER_IDs"},
	} {
		r := vmshelf(t, append(append([]string{"orders", "cancel"}, tc.args...), control...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) || r.stdout != "" {
			t.Errorf("orders cancel, %s: exit %d, stdout %q, stderr %q; want exit %d saying %q", tc.name, r.code, r.stdout, r.stderr, tc.code, tc.want)
		}
	}

	r = vmshelf(t, append([]string{"orders", "list"}, control...)...)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("orders list: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ORDER_ID") ||
		!strings.HasPrefix(lines[1], second.OrderID) || !strings.Contains(lines[1], "cancelled (buyerCancelled)") ||
		!strings.HasPrefix(lines[2], first.OrderID) || !strings.Contains(lines[2], "refunded") || !strings.Contains(lines[2], "18.00 EUR") {
		t.Errorf("orders list:\n%s\nwant the second order cancelled by its buyer, then the first refunded, 18.00 EUR", r.stdout)
	}
	metrics := rawMetrics(t, s)
	for _, want := range []string{`vmshelf_orders_cancelled_total{checkout="paid"} 1`, `vmshelf_orders_cancelled_total{checkout="expired"} 1`} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
