package billing

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/billing/stripetest"
)

const (
	refundsPath  = "/v1/refunds"
	accountsPath = "/v1/accounts"
	linksPath    = "/v1/account_links"
	testPI       = "pi_3VmshelfPaid0001"
	newHost      = "acct_1NewHost00000001"
)

func exampleRefund() RefundRequest {
	return RefundRequest{OrderID: "ord_42", Cause: "provisionfailed", PaymentIntent: testPI}
}

// checkWire asserts that f got exactly one request, method and path, with
// exactly the form want and the Idempotency-Key key ("" for stripe-go's
// own random one, which it puts on every POST).
func checkWire(t *testing.T, f *stripetest.Server, method, path string, want url.Values, key string) {
	t.Helper()
	reqs := f.History()
	if len(reqs) != 1 {
		t.Fatalf("Stripe got %d requests, want exactly 1", len(reqs))
	}
	r := reqs[0]
	if r.Method != method || r.Path != path {
		t.Fatalf("request %s %s, want %s %s", r.Method, r.Path, method, path)
	}
	for k, v := range want {
		if g := r.Form[k]; len(g) != 1 || g[0] != v[0] {
			t.Errorf("form %s = %q, want %q", k, g, v[0])
		}
	}
	for k, v := range r.Form {
		if _, ok := want[k]; !ok {
			t.Errorf("form has unexpected %s = %q", k, v)
		}
	}
	if g := r.Header.Get("Idempotency-Key"); key == "" && strings.HasPrefix(g, "vmshelf-") {
		t.Errorf("Idempotency-Key %q is one of vmshelf's", g)
	} else if key == "" {
		key = g
	}
	for h, v := range map[string]string{"Authorization": "Bearer " + testKey, "Idempotency-Key": key} {
		if g := r.Header.Get(h); g != v {
			t.Errorf("header %s = %q, want %q", h, g, v)
		}
	}
}

// A refund of a destination charge takes back the host's transfer and
// the platform's fee, names its order and cause, and has one key per
// order and cause.
func TestRefundSendsFullReversal(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer string
		want   Refund
	}{
		{"succeeded", refundSucceeded, Refund{ID: "re_3VmshelfRefund01", Status: RefundSucceeded, PaymentIntent: testPI,
			OrderID: "ord_42", Cause: "provisionfailed", Amount: 1800}},
		{"failed, payment intent expanded", refundFailed, Refund{ID: "re_3VmshelfRefund01", Status: RefundFailed, PaymentIntent: testPI,
			OrderID: "ord_42", Cause: "provisionfailed", FailureReason: "expired_or_canceled_card", Amount: 1800}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, nil)
			f.Answer("POST", refundsPath, http.StatusOK, tc.answer)
			s, _ := clientOf(t, f)
			got, err := s.Refund(context.Background(), exampleRefund())
			if err != nil {
				t.Fatalf("Refund: %v", err)
			}
			if got != tc.want {
				t.Errorf("refund\n got %+v\nwant %+v", got, tc.want)
			}
			checkWire(t, f, "POST", refundsPath, url.Values{
				"payment_intent":         {testPI},
				"reverse_transfer":       {"true"},
				"refund_application_fee": {"true"},
				"metadata[order_id]":     {"ord_42"},
				"metadata[cause]":        {"provisionfailed"},
			}, "vmshelf-refund-ord_42-provisionfailed")
		})
	}
}

// The key names the order and the cause: another of either is another
// refund request, the same pair the same.
func TestRefundKey(t *testing.T) {
	for _, tc := range []struct {
		orderA, causeA, orderB, causeB string
		same                           bool
	}{
		{"ord_42", "provisionfailed", "ord_42", "provisionfailed", true},
		{"ord_42", "provisionfailed", "ord_43", "provisionfailed", false},
		{"ord_42", "provisionfailed", "ord_42", "hostgone", false},
		// The split between order and cause cannot move: a cause has no "-".
		{"ord-a", "b", "ord", "ab", false},
	} {
		a, b := RefundKey(tc.orderA, tc.causeA, 0), RefundKey(tc.orderB, tc.causeB, 0)
		if (a == b) != tc.same {
			t.Errorf("RefundKey(%s, %s) = %q, RefundKey(%s, %s) = %q; same %v, want %v",
				tc.orderA, tc.causeA, a, tc.orderB, tc.causeB, b, a == b, tc.same)
		}
	}
	// After a refund Stripe failed, the next has another key, and the
	// first generation's stays what it was.
	if a, b := RefundKey("ord_42", "importFailed", 0), RefundKey("ord_42", "importFailed", 1); a == b || a != "vmshelf-refund-ord_42-importFailed" || b != a+"-1" {
		t.Errorf("generations 0 and 1: %q, %q", a, b)
	}
	longest := RefundKey(strings.Repeat("o", 200), strings.Repeat("c", MaxCauseLen), 999_999)
	if len(longest) > 255 {
		t.Errorf("the longest refund key has %d characters, Stripe takes 255", len(longest))
	}
}

// Stripe's answers to a refund, sorted; charge_already_refunded and
// charge_disputed are refusals the caller can tell from the others.
func TestRefundAnswers(t *testing.T) {
	for _, tc := range []struct {
		name        string
		answer      stripetest.Canned
		kind        error
		refunded    bool
		wantSuccess bool
	}{
		{"Stripe unavailable", stripetest.Canned{Status: 503, Body: errAPI}, ErrUnavailable, false, false},
		{"Stripe fails", stripetest.Canned{Status: 500, Body: errAPI}, ErrUnavailable, false, false},
		{"no such payment intent", stripetest.Canned{Status: 404, Body: errNoSuchPaymentIntent}, ErrNotFound, false, false},
		{"already refunded", stripetest.Canned{Status: 400, Body: errAlreadyRefunded}, ErrRefused, true, false},
		{"charge disputed", stripetest.Canned{Status: 400, Body: errChargeDisputed}, ErrRefused, false, false},
		{"another refusal", stripetest.Canned{Status: 400, Body: errNoAcct}, ErrRefused, false, false},
		// charge_already_refunded with "retry" is no answer yet.
		{"already refunded, but retry", stripetest.Canned{Status: 400, Body: errAlreadyRefunded, Header: map[string]string{"Stripe-Should-Retry": "true"}}, ErrUnavailable, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, nil)
			f.AnswerWith("POST", refundsPath, tc.answer)
			s, _ := clientOf(t, f)
			got, err := s.Refund(context.Background(), exampleRefund())
			checkKind(t, err, tc.kind)
			if errors.Is(err, ErrAlreadyRefunded) != tc.refunded {
				t.Errorf("errors.Is(%v, ErrAlreadyRefunded) = %v, want %v", err, !tc.refunded, tc.refunded)
			}
			if disputed := tc.name == "charge disputed"; errors.Is(err, ErrChargeDisputed) != disputed {
				t.Errorf("errors.Is(%v, ErrChargeDisputed) = %v, want %v", err, !disputed, disputed)
			}
			if got != (Refund{}) {
				t.Errorf("an error came with a refund: %+v", got)
			}
		})
	}
}

// Whatever is not of the shape the refund needs, Stripe never hears of.
func TestRefundBadInputNotAsked(t *testing.T) {
	f := newFake(t, nil)
	f.Answer("POST", refundsPath, http.StatusOK, refundSucceeded)
	s, _ := clientOf(t, f)
	for _, tc := range []struct {
		name string
		edit func(*RefundRequest)
	}{
		{"no order", func(r *RefundRequest) { r.OrderID = "" }},
		{"order with a slash", func(r *RefundRequest) { r.OrderID = "ord/42" }},
		{"no cause", func(r *RefundRequest) { r.Cause = "" }},
		{"cause with a dash", func(r *RefundRequest) { r.Cause = "host-gone" }},
		{"cause with a digit", func(r *RefundRequest) { r.Cause = "cause2" }},
		{"cause too long", func(r *RefundRequest) { r.Cause = strings.Repeat("c", MaxCauseLen+1) }},
		{"no payment intent", func(r *RefundRequest) { r.PaymentIntent = "" }},
		{"a charge, not a payment intent", func(r *RefundRequest) { r.PaymentIntent = "ch_3VmshelfPaid0001" }},
		{"payment intent with a path", func(r *RefundRequest) { r.PaymentIntent = "pi_1/../x" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := exampleRefund()
			tc.edit(&r)
			if _, err := s.Refund(context.Background(), r); !errors.Is(err, ErrBadID) {
				t.Errorf("Refund(%+v) = %v, want ErrBadID", r, err)
			}
		})
	}
	if n := len(f.History()); n != 0 {
		t.Errorf("Stripe got %d requests for malformed refunds", n)
	}
}

// tenantSince is the creation time of the tests' tenant 7.
var tenantSince = time.Date(2026, 11, 1, 9, 30, 0, 0, time.UTC)

func TestCreateExpressAccount(t *testing.T) {
	for _, tc := range []struct {
		name    string
		country string
		want    url.Values
	}{
		{"with a country", "DE", url.Values{
			"type":                                   {"express"},
			"country":                                {"DE"},
			"capabilities[transfers][requested]":     {"true"},
			"capabilities[card_payments][requested]": {"true"},
			"metadata[tenant_id]":                    {"7"},
		}},
		{"the host chooses the country", "", url.Values{
			"type":                                   {"express"},
			"capabilities[transfers][requested]":     {"true"},
			"capabilities[card_payments][requested]": {"true"},
			"metadata[tenant_id]":                    {"7"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, nil)
			f.Answer("POST", accountsPath, http.StatusOK, accountCreated)
			s, _ := clientOf(t, f)
			got, err := s.CreateExpressAccount(context.Background(), 7, tenantSince, tc.country)
			if err != nil || got != newHost {
				t.Fatalf("CreateExpressAccount = %q, %v; want %s", got, err, newHost)
			}
			checkWire(t, f, "POST", accountsPath, tc.want, "vmshelf-account-7-"+strconv.FormatInt(tenantSince.UnixNano(), 10))
		})
	}
}

func TestAccountLink(t *testing.T) {
	f := newFake(t, nil)
	f.Answer("POST", linksPath, http.StatusOK, accountLinkCreated)
	s, _ := clientOf(t, f)
	refresh, back := "https://edge.example/host/onboard?refresh=1", "https://edge.example/host"
	link, expires, err := s.AccountLink(context.Background(), newHost, refresh, back)
	if err != nil {
		t.Fatalf("AccountLink: %v", err)
	}
	if link != "https://connect.stripe.com/setup/e/acct_1NewHost00000001/VmshelfLink0001" || !expires.Equal(time.Unix(1772366700, 0)) {
		t.Errorf("AccountLink = %q, %s", link, expires)
	}
	// No key of vmshelf's: a link is good once, and a new one is harmless.
	checkWire(t, f, "POST", linksPath, url.Values{
		"account":     {newHost},
		"type":        {"account_onboarding"},
		"refresh_url": {refresh},
		"return_url":  {back},
	}, "")
}

func TestAccount(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       AccountState
	}{
		{"onboarded", accountActive, AccountState{ID: testHost, ChargesEnabled: true, PayoutsEnabled: true, DetailsSubmitted: true}},
		{"pending", accountPending, AccountState{ID: testHost}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, nil)
			f.Answer("GET", accountPath, http.StatusOK, tc.body)
			s, _ := clientOf(t, f)
			got, err := s.Account(context.Background(), testHost)
			if err != nil || got != tc.want {
				t.Fatalf("Account = %+v, %v; want %+v", got, err, tc.want)
			}
			if reqs := f.History(); len(reqs) != 1 || reqs[0].Method != "GET" || reqs[0].Path != accountPath {
				t.Errorf("requests %+v, want GET %s", reqs, accountPath)
			}
		})
	}
}

func TestConnectBadInputNotAsked(t *testing.T) {
	f := newFake(t, nil)
	s, _ := clientOf(t, f)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		tenant  int64
		country string
	}{
		{"no tenant", 0, "DE"},
		{"negative tenant", -1, "DE"},
		{"lower-case country", 7, "de"},
		{"three-letter country", 7, "DEU"},
	} {
		if _, err := s.CreateExpressAccount(ctx, tc.tenant, tenantSince, tc.country); !errors.Is(err, ErrBadID) {
			t.Errorf("%s: CreateExpressAccount = %v, want ErrBadID", tc.name, err)
		}
	}
	for _, acct := range []string{"", "acct_", "acct_1/../../v1/balance", "cus_1"} {
		if _, _, err := s.AccountLink(ctx, acct, "https://edge.example/r", "https://edge.example/b"); !errors.Is(err, ErrBadID) {
			t.Errorf("AccountLink(%q) = %v, want ErrBadID", acct, err)
		}
		if _, err := s.Account(ctx, acct); !errors.Is(err, ErrBadID) {
			t.Errorf("Account(%q) = %v, want ErrBadID", acct, err)
		}
	}
	for _, u := range []string{"", "/host", "javascript:alert(1)", "https://user:pw@edge.example/"} {
		if _, _, err := s.AccountLink(ctx, newHost, u, "https://edge.example/b"); !errors.Is(err, ErrBadURL) {
			t.Errorf("AccountLink refresh %q = %v, want ErrBadURL", u, err)
		}
		if _, _, err := s.AccountLink(ctx, newHost, "https://edge.example/r", u); !errors.Is(err, ErrBadURL) {
			t.Errorf("AccountLink return %q = %v, want ErrBadURL", u, err)
		}
	}
	if n := len(f.History()); n != 0 {
		t.Errorf("Stripe got %d requests for malformed arguments", n)
	}
}

// TestAccountKeyPerTenant: a tenant's account key is its own for its
// whole life, and another tenant that gets the same id (SQLite may reuse
// a removed tenant's) gets another key, never the removed one's account.
func TestAccountKeyPerTenant(t *testing.T) {
	later := tenantSince.Add(time.Hour)
	if accountKey(7, tenantSince) != accountKey(7, tenantSince) {
		t.Error("one tenant's account key changes")
	}
	if accountKey(7, tenantSince) == accountKey(7, later) {
		t.Error("a later tenant with a reused id gets the removed one's account key")
	}
	if accountKey(7, tenantSince) == accountKey(8, tenantSince) {
		t.Error("two tenants share an account key")
	}
}
