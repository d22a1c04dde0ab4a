package main

// The Machines page in headless Chromium (see page_e2e_test.go for the
// harness): what the buyer pays for, why it cannot order, and the cancel
// of an unpaid order.

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestPageCancelOrder: an offer shows one replica's size (the edge's
// defaults: 1 vCPU, 2 GiB memory, 20 GiB disk) and its price per
// replica-month; the order form shows each replica's size for the image
// chosen (more memory for the LosOS disk, more disk for openSUSE) and the
// total, 2 × 6.00 = 12.00, before paying. An order awaiting payment takes
// both replicas: "Order and pay" is off and says why, beside it. The
// machine, on an edge without --vms-domain, says how it is reached. Its
// Cancel order cancels it: the edge has it cancelled by its buyer, its
// checkout expired at Stripe, and the page shows the offer's 2 replicas
// free again and the button on.
// totalWords is the order form's total of 2 replicas at 6.00, in the
// browser's way of writing euros.
var totalWords = regexp.MustCompile(`Total: 2 × \D*6\.00\D* = \D*12\.00\D* for one month`)

func TestPageCancelOrder(t *testing.T) {
	t.Parallel()
	browserDir(t)
	m := startPageMarket(t)
	s := m.s
	l := m.listing(t, `{"unit_price":600,"capacity":2}`)
	var placed orderAnswer
	var atEdge struct {
		State, Reason, Checkout string
		Free                    int
	}
	pr := startPage(t, "cancelorder", 90*time.Second, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token, "PAGE_LISTING": l.ListingID,
		"PAGE_IMAGE": "debian-13", "PAGE_BIG_MEMORY": "losos-demo", "PAGE_BIG_DISK": "opensuse-tumbleweed",
	}, map[string]action{
		"fill": func([]byte) any {
			placed = s.ordered(t, l, "unpaid", 2)
			return map[string]string{"order_id": placed.OrderID}
		},
		"cancelled": func(body []byte) any {
			var req struct {
				OrderID string `json:"order_id"`
			}
			if err := json.Unmarshal(body, &req); err != nil {
				t.Fatal(err)
			}
			var o struct {
				State  string `json:"state"`
				Reason string `json:"reason"`
			}
			statusOrder(t, s, s.token, req.OrderID, &o)
			atEdge.State, atEdge.Reason = o.State, o.Reason
			atEdge.Free = offerFree(t, s, s.token, l.ListingID)
			for _, cs := range m.fake.Sessions() {
				if cs.OrderID == req.OrderID {
					atEdge.Checkout = cs.Status
				}
			}
			return map[string]string{}
		},
	})
	pr.extra = s.logs
	type summary struct {
		Text  string `json:"text"`
		Total string `json:"total"`
	}
	var rep struct {
		commonReport
		Offer         struct{ Price, Size, Free string } `json:"offer"`
		Summaries     map[string]summary                 `json:"summaries"`
		EnabledBefore struct{ Disabled, Why bool }       `json:"enabledBefore"`
		OrderID       string                             `json:"orderID"`
		Full          struct {
			Disabled, Visible, DescribedBy bool
			Why, Text, OfferFree           string
		} `json:"full"`
		Unpaid struct{ Address, Button string } `json:"unpaid"`
		After  struct {
			State, Note, Free, Message, OfferFree string
			CancelButton, Disabled, Why           bool
		} `json:"after"`
	}
	pr.wait(&rep)

	if !strings.Contains(rep.Offer.Price, "6.00") || !strings.Contains(rep.Offer.Price, "per replica-month") ||
		!strings.Contains(rep.Offer.Size, "1 vCPU, 2.0 GiB memory, 20 GiB disk") || rep.Offer.Free != "2 of 2 replicas free" {
		t.Errorf("the offer shows %+v; want 6.00 per replica-month, 1 vCPU, 2.0 GiB memory, 20 GiB disk, 2 of 2 free", rep.Offer)
	}
	for id, want := range map[string]string{
		"debian-13":           "Each replica: 1 vCPU, 2.0 GiB memory, 20 GiB disk.",
		"losos-demo":          "Each replica: 1 vCPU, 4.0 GiB memory, 20 GiB disk.",
		"opensuse-tumbleweed": "Each replica: 1 vCPU, 2.0 GiB memory, 24 GiB disk.",
	} {
		got := rep.Summaries[id]
		if !strings.HasPrefix(got.Text, want) || !totalWords.MatchString(got.Text) || got.Total != "1200" {
			t.Errorf("with %s the order form says %q (total %q); want %q and the total 2 × 6.00 = 12.00", id, got.Text, got.Total, want)
		}
	}
	if rep.EnabledBefore.Disabled || rep.EnabledBefore.Why {
		t.Errorf("with replicas free the button is %+v; want it on, with no reason shown", rep.EnabledBefore)
	}
	if rep.OrderID != placed.OrderID {
		t.Fatalf("the page worked on order %q, the test placed %q", rep.OrderID, placed.OrderID)
	}
	if f := rep.Full; !f.Disabled || f.Why != "full" || !f.Visible || !f.DescribedBy || !strings.Contains(f.Text, "Every offer is full") ||
		f.OfferFree != "0 of 2 replicas free" {
		t.Errorf("with the offer full the button is %+v; want it off, saying why beside it (aria-describedby)", f)
	}
	if rep.Unpaid.Address != "no public address on this edge: use the console" || rep.Unpaid.Button != "Cancel order" {
		t.Errorf("the unpaid machine shows %+v; want no public address, use the console, and Cancel order", rep.Unpaid)
	}
	if a := rep.After; a.State != "cancelled" || a.CancelButton || a.Free != "2" || a.OfferFree != "2 of 2 replicas free" ||
		a.Disabled || a.Why || !strings.Contains(a.Note, "You cancelled the order") || !strings.Contains(a.Message, "free again") {
		t.Errorf("after Cancel order the page shows %+v; want the order cancelled in words, the offer's 2 replicas free, the button on", a)
	}
	if atEdge.State != "cancelled" || atEdge.Reason != "buyerCancelled" || atEdge.Free != 2 || atEdge.Checkout != "expired" {
		t.Errorf("after Cancel order the edge has %+v; want the order cancelled by its buyer, 2 free, its checkout expired", atEdge)
	}
	if code, body := s.ctl(t, "/market/vms/orders/cancel", s.token, `{"order_id":"`+placed.OrderID+`"}`); code != http.StatusConflict {
		t.Errorf("a second cancel: %d %s, want 409", code, body)
	}
}
