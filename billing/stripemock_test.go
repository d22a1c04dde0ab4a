package billing

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

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
