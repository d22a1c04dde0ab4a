package billing

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/billing/stripetest"
)

// withFake is a Stripe client of a fresh stripetest.Server that knows
// testHost, and a paid session of example() with its PaymentIntent.
func withFake(t *testing.T) (*Stripe, *stripetest.Server, Session) {
	t.Helper()
	fake := newFake(t, map[string]string{testHost: "active"})
	s, _ := clientOf(t, fake)
	ctx := context.Background()
	cs, err := s.CreateCheckout(ctx, example())
	if err != nil {
		t.Fatalf("CreateCheckout: %v", err)
	}
	if cs.PaymentIntent != "" {
		t.Errorf("an open session has a PaymentIntent %q", cs.PaymentIntent)
	}
	if err := fake.Pay(cs.ID); err != nil {
		t.Fatal(err)
	}
	paid, err := s.Session(ctx, cs.ID)
	if err != nil || !strings.HasPrefix(paid.PaymentIntent, "pi_") {
		t.Fatalf("Session of the paid session = %+v, %v; want a PaymentIntent", paid, err)
	}
	if want, _ := fake.Session(cs.ID); want.PaymentIntent != paid.PaymentIntent {
		t.Errorf("the fake's session pays with %q, Session says %q", want.PaymentIntent, paid.PaymentIntent)
	}
	return s, fake, paid
}

// The fake keeps refunds by idempotency key: a retry of one order's
// refund for one cause is one refund, whatever became of the answers.
func TestFakeRefundOncePerKey(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*stripetest.Server)
		// first is the first call's error; the retry always succeeds.
		first error
	}{
		{"both answered", func(*stripetest.Server) {}, nil},
		{"the first answer lost", func(f *stripetest.Server) { f.LoseRefunds(1, http.StatusInternalServerError) }, ErrUnavailable},
		{"Stripe down at first", func(f *stripetest.Server) { f.FailRefunds(1, http.StatusServiceUnavailable) }, ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, fake, paid := withFake(t)
			ctx := context.Background()
			r := RefundRequest{OrderID: "ord_42", Cause: "provisionfailed", PaymentIntent: paid.PaymentIntent}
			tc.setup(fake)
			first, err := s.Refund(ctx, r)
			if !errors.Is(err, tc.first) && (err != nil || tc.first != nil) {
				t.Fatalf("first Refund = %+v, %v; want %v", first, err, tc.first)
			}
			again, err := s.Refund(ctx, r)
			if err != nil {
				t.Fatalf("retried Refund: %v", err)
			}
			want := Refund{ID: again.ID, Status: RefundSucceeded, PaymentIntent: paid.PaymentIntent, OrderID: "ord_42",
				Cause: "provisionfailed", Amount: 1800}
			if again != want || (tc.first == nil && first != again) {
				t.Errorf("refunds %+v and %+v, want both %+v", first, again, want)
			}
			refunds := fake.Refunds()
			if len(refunds) != 1 {
				t.Fatalf("the fake made %d refunds, want 1: %+v", len(refunds), refunds)
			}
			posts := fake.Received("/v1/refunds")
			if len(posts) != 2 {
				t.Fatalf("the fake got %d refund requests, want 2", len(posts))
			}
			for _, p := range posts {
				if p.Idempotency != RefundKey("ord_42", "provisionfailed", 0) || p.Form.Get("reverse_transfer") != "true" ||
					p.Form.Get("refund_application_fee") != "true" || p.Form.Get("metadata[cause]") != "provisionfailed" {
					t.Errorf("refund request %+v", p)
				}
			}
		})
	}
}

// Another cause for a refunded order is a second refund Stripe refuses,
// which the caller can count as done; a PaymentIntent Stripe does not
// know is absence.
func TestFakeRefundRefusals(t *testing.T) {
	s, fake, paid := withFake(t)
	ctx := context.Background()
	if _, err := s.Refund(ctx, RefundRequest{OrderID: "ord_42", Cause: "provisionfailed", PaymentIntent: paid.PaymentIntent}); err != nil {
		t.Fatalf("Refund: %v", err)
	}
	_, err := s.Refund(ctx, RefundRequest{OrderID: "ord_42", Cause: "hostgone", PaymentIntent: paid.PaymentIntent})
	if se := checkKind(t, err, ErrRefused); !errors.Is(err, ErrAlreadyRefunded) || se.Code != "charge_already_refunded" {
		t.Errorf("second cause: %v, want ErrAlreadyRefunded", err)
	}
	_, err = s.Refund(ctx, RefundRequest{OrderID: "ord_43", Cause: "provisionfailed", PaymentIntent: "pi_stripetest_nosuch"})
	checkKind(t, err, ErrNotFound)
	if n := len(fake.Refunds()); n != 1 {
		t.Errorf("the fake made %d refunds, want 1", n)
	}
}

// A charge its buyer's bank disputes is not refunded: Stripe answers a new
// refund with charge_disputed while the dispute is open or once it is
// lost, and a retry of a refund made before the dispute with its same key
// answers that refund. A dispute won lets a refund through again.
func TestFakeRefundOfDisputedCharge(t *testing.T) {
	s, fake, paid := withFake(t)
	ctx := context.Background()
	before := RefundRequest{OrderID: "ord_42", Cause: "provisionfailed", PaymentIntent: paid.PaymentIntent}
	fake.RefundAs(RefundFailed, "expired_or_canceled_card") // no money moved: the charge is not refunded
	first, err := s.Refund(ctx, before)
	if err != nil {
		t.Fatal(err)
	}
	fake.RefundAs("", "")
	if _, _, err := fake.DisputeEvent("evt_d", paid.PaymentIntent, "fraudulent", testWebhookSecret, testNow); err != nil {
		t.Fatal(err)
	}
	if again, err := s.Refund(ctx, before); err != nil || again.ID != first.ID {
		t.Errorf("a retry under the first key = %+v, %v; want the refund made before the dispute", again, err)
	}
	wantDisputed := func(cause string) {
		t.Helper()
		_, err := s.Refund(ctx, RefundRequest{OrderID: "ord_42", Cause: cause, PaymentIntent: paid.PaymentIntent})
		se := checkKind(t, err, ErrRefused)
		if se == nil || se.Status != http.StatusBadRequest || se.Type != "invalid_request_error" || se.Code != "charge_disputed" ||
			!errors.Is(err, ErrChargeDisputed) || errors.Is(err, ErrAlreadyRefunded) {
			t.Errorf("refund of a disputed charge: %v, want 400 invalid_request_error charge_disputed", err)
		}
	}
	wantDisputed("open")
	if _, _, err := fake.DisputeClosedEvent("evt_c", paid.PaymentIntent, "lost", testWebhookSecret, testNow); err != nil {
		t.Fatal(err)
	}
	wantDisputed("lost")
	if _, _, err := fake.DisputeClosedEvent("evt_c", paid.PaymentIntent, "won", testWebhookSecret, testNow); err != nil {
		t.Fatal(err)
	}
	if rf, err := s.Refund(ctx, RefundRequest{OrderID: "ord_42", Cause: "won", PaymentIntent: paid.PaymentIntent}); err != nil || rf.ID == first.ID || rf.Status != RefundSucceeded {
		t.Errorf("refund after a dispute won = %+v, %v; want a new refund", rf, err)
	}
	if _, _, err := fake.DisputeClosedEvent("evt_x", "pi_stripetest_nosuch", "won", testWebhookSecret, testNow); err == nil {
		t.Error("a dispute of no charge was closed")
	}
	if _, _, err := fake.DisputeClosedEvent("evt_x", paid.PaymentIntent, "needs_response", testWebhookSecret, testNow); err == nil {
		t.Error("a dispute was closed with an open status")
	}
}

// A refund can come back pending and settle later, or fail; a failed one
// gives nothing back, so another cause may refund again.
func TestFakeRefundOutcomes(t *testing.T) {
	s, fake, paid := withFake(t)
	ctx := context.Background()
	secret := testWebhookSecret
	fake.RefundAs(RefundFailed, "expired_or_canceled_card")
	failed, err := s.Refund(ctx, RefundRequest{OrderID: "ord_42", Cause: "provisionfailed", PaymentIntent: paid.PaymentIntent})
	if err != nil || failed.Status != RefundFailed || failed.FailureReason != "expired_or_canceled_card" {
		t.Fatalf("Refund = %+v, %v; want failed", failed, err)
	}
	fake.RefundAs(RefundPending, "")
	pending, err := s.Refund(ctx, RefundRequest{OrderID: "ord_42", Cause: "retry", PaymentIntent: paid.PaymentIntent})
	if err != nil || pending.Status != RefundPending || pending.ID == failed.ID {
		t.Fatalf("Refund = %+v, %v; want a second refund, pending", pending, err)
	}
	if err := fake.SettleRefund(pending.ID, RefundSucceeded, ""); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		sign func() ([]byte, string, error)
		want func(*Event)
	}{
		{"refund.failed", func() ([]byte, string, error) {
			return fake.RefundEvent("evt_1", EventRefundFailed, failed.ID, secret, testNow)
		}, func(e *Event) {
			e.RefundID, e.RefundStatus, e.FailureReason, e.PaymentIntent = failed.ID, RefundFailed, "expired_or_canceled_card", paid.PaymentIntent
			e.OrderID, e.Cause = "ord_42", "provisionfailed"
		}},
		{"refund.updated", func() ([]byte, string, error) {
			return fake.RefundEvent("evt_1", EventRefundUpdated, pending.ID, secret, testNow)
		}, func(e *Event) {
			e.RefundID, e.RefundStatus, e.PaymentIntent, e.OrderID, e.Cause = pending.ID, RefundSucceeded, paid.PaymentIntent, "ord_42", "retry"
		}},
		{"charge.refunded", func() ([]byte, string, error) {
			return fake.ChargeRefundedEvent("evt_1", paid.PaymentIntent, secret, testNow)
		}, func(e *Event) { e.PaymentIntent, e.Amount, e.Refunded = paid.PaymentIntent, 1800, true }},
		{"charge.dispute.created", func() ([]byte, string, error) {
			return fake.DisputeEvent("evt_1", paid.PaymentIntent, "fraudulent", secret, testNow)
		}, func(e *Event) {
			e.DisputeID = "dp_stripetest_" + strings.TrimPrefix(paid.ID, "cs_test_")
			e.PaymentIntent, e.DisputeReason, e.Amount, e.DisputeStatus = paid.PaymentIntent, "fraudulent", 1800, "needs_response"
		}},
		{"charge.dispute.closed", func() ([]byte, string, error) {
			return fake.DisputeClosedEvent("evt_1", paid.PaymentIntent, DisputeWon, secret, testNow)
		}, func(e *Event) {
			e.DisputeID = "dp_stripetest_" + strings.TrimPrefix(paid.ID, "cs_test_")
			e.PaymentIntent, e.DisputeReason, e.Amount, e.DisputeStatus = paid.PaymentIntent, "fraudulent", 1800, DisputeWon
		}},
		{"account.updated", func() ([]byte, string, error) {
			return fake.AccountUpdatedEvent("evt_1", testHost, secret, testNow)
		}, func(e *Event) {
			e.Account, e.ChargesEnabled, e.PayoutsEnabled, e.DetailsSubmitted = testHost, true, true, true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			payload, sig, err := tc.sign()
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseEvent(payload, sig, secret, testNow)
			if err != nil {
				t.Fatalf("ParseEvent: %v", err)
			}
			want := Event{ID: "evt_1", Type: tc.name, APIVersion: got.APIVersion, Created: time.Unix(testNow.Unix(), 0)}
			tc.want(&want)
			if got != want {
				t.Errorf("event\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// An Express account is made once per tenant, and its link leads through
// the fake's onboarding page back to the return URL, after which Stripe
// (the fake) reports it enabled.
func TestFakeExpressOnboarding(t *testing.T) {
	s, fake, _ := withFake(t)
	ctx := context.Background()
	id, err := s.CreateExpressAccount(ctx, 7, tenantSince, "DE")
	if err != nil {
		t.Fatalf("CreateExpressAccount: %v", err)
	}
	again, err := s.CreateExpressAccount(ctx, 7, tenantSince, "DE")
	if err != nil || again != id {
		t.Fatalf("retried CreateExpressAccount = %q, %v; want %q", again, err, id)
	}
	if n := len(fake.Accounts()); n != 1 {
		t.Fatalf("the fake made %d accounts, want 1", n)
	}
	if state, err := s.Account(ctx, id); err != nil || state != (AccountState{ID: id}) {
		t.Fatalf("Account of a new account = %+v, %v; want nothing enabled", state, err)
	}
	if ok, err := s.TransfersActive(ctx, id); err != nil || ok {
		t.Errorf("TransfersActive of a new account = %v, %v", ok, err)
	}

	back := "http://127.0.0.1:1/host?done=1"
	link, expires, err := s.AccountLink(ctx, id, "http://127.0.0.1:1/host/refresh", back)
	if err != nil || !strings.HasPrefix(link, fake.URL+"/connect/onboard/"+id+"?") || !expires.After(time.Now()) {
		t.Fatalf("AccountLink = %q, %s, %v", link, expires, err)
	}
	// A browser: the page, then its button, which must send it back.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), `id="finish"`) || !strings.Contains(string(page), `href="http://127.0.0.1:1/host?done=1"`) {
		t.Fatalf("onboarding page %d:\n%s", resp.StatusCode, page)
	}
	resp, err = noFollow.PostForm(fake.URL+"/connect/onboard/"+id, url.Values{"return": {back}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != back {
		t.Fatalf("finishing answered %d to %q, want 303 to %q", resp.StatusCode, resp.Header.Get("Location"), back)
	}
	want := AccountState{ID: id, ChargesEnabled: true, PayoutsEnabled: true, DetailsSubmitted: true}
	if state, err := s.Account(ctx, id); err != nil || state != want {
		t.Errorf("Account after onboarding = %+v, %v; want %+v", state, err, want)
	}
	if ok, err := s.TransfersActive(ctx, id); err != nil || !ok {
		t.Errorf("TransfersActive after onboarding = %v, %v", ok, err)
	}
	if _, _, err := s.AccountLink(ctx, "acct_1Nosuch", "http://127.0.0.1:1/r", back); !errors.Is(err, ErrNotFound) {
		t.Errorf("AccountLink of an unknown account = %v, want ErrNotFound", err)
	}
}
