package billing

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/vmshelf/vmshelf/billing/stripetest"
)

// TestStripeMockAcceptsRequests sends every call to stripe-mock, which
// checks each request's shape against Stripe's OpenAPI (it keeps no state
// and applies no business rules; the fake Stripe tests check the values).
func TestStripeMockAcceptsRequests(t *testing.T) {
	base := stripetest.StartMock(t, stripetest.MockPath(t))
	s, err := NewStripe(StripeConfig{SecretKey: testKey, APIBase: base, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := example()
	c.ExpiresAt = time.Now().Add(31 * time.Minute)

	created, err := s.CreateCheckout(ctx, c)
	if err != nil {
		t.Fatalf("CreateCheckout: %v", err)
	}
	if created.ID == "" || created.URL == "" {
		t.Errorf("created session without id or URL: %+v", created)
	}
	if _, err := s.Session(ctx, sessionID); err != nil {
		t.Errorf("Session: %v", err)
	}
	if _, err := s.ExpireSession(ctx, sessionID); err != nil {
		t.Errorf("ExpireSession: %v", err)
	}
	if ok, err := s.TransfersActive(ctx, testHost); err != nil || !ok {
		t.Errorf("TransfersActive = %v, %v; want stripe-mock's fixture: true, nil", ok, err)
	}
	if r, err := s.Refund(ctx, exampleRefund()); err != nil || r.ID == "" {
		t.Errorf("Refund = %+v, %v", r, err)
	}
	for _, country := range []string{"DE", ""} {
		if id, err := s.CreateExpressAccount(ctx, 7, tenantSince, country); err != nil || id == "" {
			t.Errorf("CreateExpressAccount(%q) = %q, %v", country, id, err)
		}
	}
	if link, _, err := s.AccountLink(ctx, testHost, "https://edge.example/host/refresh", "https://edge.example/host"); err != nil || link == "" {
		t.Errorf("AccountLink = %q, %v", link, err)
	}
	if a, err := s.Account(ctx, testHost); err != nil || a.ID == "" {
		t.Errorf("Account = %+v, %v", a, err)
	}

	// The check is real: a form stripe-mock's spec does not allow is a 400.
	req, err := http.NewRequest("POST", base+"/v1/checkout/sessions",
		strings.NewReader("mode=payment&payment_intent_data[application_fee_amount]=half"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("stripe-mock answered %d to a malformed fee, want 400: it checks nothing", resp.StatusCode)
	}
}

// TestStripeMockDisputeObjects reads a dispute as Stripe's OpenAPI
// fixtures render it (stripe-mock's GET /v1/disputes/{id}: every field of
// the object, evidence and all) and has ParseEvent read it in a signed
// charge.dispute.created and, with the bank's decision, a
// charge.dispute.closed event. stripe-mock keeps no state and sends no
// events, so it cannot open or close a dispute or refuse a refund with
// charge_disputed; the stand-in (stripetest) plays those, and
// TestRefundAnswers checks Stripe's charge_disputed error shape.
func TestStripeMockDisputeObjects(t *testing.T) {
	base := stripetest.StartMock(t, stripetest.MockPath(t))
	req, err := http.NewRequest(http.MethodGet, base+"/v1/disputes/dp_3VmshelfDispute1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var dispute map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&dispute); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stripe-mock's dispute: %d, %v", resp.StatusCode, err)
	}
	if dispute["object"] != "dispute" || dispute["id"] != "dp_3VmshelfDispute1" {
		t.Fatalf("stripe-mock's answer is no dispute: %v", dispute)
	}
	for _, tc := range []struct {
		typ, status, pi string
	}{
		// Its fixture: an inquiry, no PaymentIntent (null).
		{EventDisputeCreated, dispute["status"].(string), ""},
		{EventDisputeCreated, "needs_response", testPI},
		{EventDisputeClosed, DisputeLost, testPI},
		{EventDisputeClosed, DisputeWon, testPI},
	} {
		obj := maps.Clone(dispute)
		obj["status"] = tc.status
		if tc.pi != "" {
			obj["payment_intent"] = tc.pi
		}
		raw, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		p := event(tc.typ, stripe.APIVersion, string(raw))
		got, err := ParseEvent([]byte(p), signed(p, testWebhookSecret, testNow), testWebhookSecret, testNow)
		if err != nil {
			t.Fatalf("%s (%s): ParseEvent of stripe-mock's dispute: %v", tc.typ, tc.status, err)
		}
		amount, _ := dispute["amount"].(float64)
		if got.Type != tc.typ || got.DisputeID != "dp_3VmshelfDispute1" || got.DisputeStatus != tc.status || got.PaymentIntent != tc.pi ||
			got.Amount != int64(amount) || got.DisputeReason != dispute["reason"] {
			t.Errorf("%s (%s): %+v", tc.typ, tc.status, got)
		}
	}
}
