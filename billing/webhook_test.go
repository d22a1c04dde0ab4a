package billing

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"
)

const testWebhookSecret = "whsec_VmshelfTestSigningSecret0001"

// event is a Stripe event as its API reference shows one, of type typ,
// rendered in API version version, with object as data.object.
func event(typ, version, object string) string {
	return `{
  "id": "evt_1VmshelfEvent0001",
  "object": "event",
  "api_version": "` + version + `",
  "created": 1772367000,
  "data": {"object": ` + object + `},
  "livemode": false,
  "pending_webhooks": 1,
  "request": {"id": null, "idempotency_key": null},
  "type": "` + typ + `"
}`
}

// signed signs payload as Stripe does at instant at.
func signed(payload, secret string, at time.Time) string {
	return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{
		Payload: []byte(payload), Secret: secret, Timestamp: at,
	}).Header
}

func TestParseEvent(t *testing.T) {
	completed := event("checkout.session.completed", stripe.APIVersion, sessionPaid)
	for _, tc := range []struct {
		name    string
		payload string
		header  string
		secret  string
		want    Event
		wantErr error
	}{
		{
			name:    "checkout completed",
			payload: completed,
			header:  signed(completed, testWebhookSecret, testNow),
			want: Event{ID: "evt_1VmshelfEvent0001", Type: "checkout.session.completed", APIVersion: stripe.APIVersion,
				Created: time.Unix(1772367000, 0), SessionID: sessionID, OrderID: "ord_42"},
		},
		{
			name:    "signed 4 min ago",
			payload: completed,
			header:  signed(completed, testWebhookSecret, testNow.Add(-4*time.Minute)),
			want: Event{ID: "evt_1VmshelfEvent0001", Type: "checkout.session.completed", APIVersion: stripe.APIVersion,
				Created: time.Unix(1772367000, 0), SessionID: sessionID, OrderID: "ord_42"},
		},
		{
			name:    "checkout expired",
			payload: event("checkout.session.expired", stripe.APIVersion, sessionExpired),
			header:  signed(event("checkout.session.expired", stripe.APIVersion, sessionExpired), testWebhookSecret, testNow),
			want: Event{ID: "evt_1VmshelfEvent0001", Type: "checkout.session.expired", APIVersion: stripe.APIVersion,
				Created: time.Unix(1772367000, 0), SessionID: sessionID, OrderID: "ord_42"},
		},
		{
			name:    "order from client_reference_id alone",
			payload: event("checkout.session.async_payment_succeeded", stripe.APIVersion, `{"id":"cs_test_1","object":"checkout.session","client_reference_id":"ord_7","metadata":{}}`),
			header:  signed(event("checkout.session.async_payment_succeeded", stripe.APIVersion, `{"id":"cs_test_1","object":"checkout.session","client_reference_id":"ord_7","metadata":{}}`), testWebhookSecret, testNow),
			want: Event{ID: "evt_1VmshelfEvent0001", Type: "checkout.session.async_payment_succeeded", APIVersion: stripe.APIVersion,
				Created: time.Unix(1772367000, 0), SessionID: "cs_test_1", OrderID: "ord_7"},
		},
		{
			// The market ignores it, but it is a valid event: 200, not 400.
			name:    "unknown event type",
			payload: event("customer.created", stripe.APIVersion, `{"id":"cus_1","object":"customer"}`),
			header:  signed(event("customer.created", stripe.APIVersion, `{"id":"cus_1","object":"customer"}`), testWebhookSecret, testNow),
			want: Event{ID: "evt_1VmshelfEvent0001", Type: "customer.created", APIVersion: stripe.APIVersion,
				Created: time.Unix(1772367000, 0)},
		},
		{
			// An endpoint on another version of the same or another
			// release train: accepted, the version reported.
			name:    "older API version",
			payload: event("checkout.session.completed", "2024-06-20", sessionPaid),
			header:  signed(event("checkout.session.completed", "2024-06-20", sessionPaid), testWebhookSecret, testNow),
			want: Event{ID: "evt_1VmshelfEvent0001", Type: "checkout.session.completed", APIVersion: "2024-06-20",
				Created: time.Unix(1772367000, 0), SessionID: sessionID, OrderID: "ord_42"},
		},
		{
			name:    "newer release train",
			payload: event("checkout.session.completed", "2026-08-26.dahlia", sessionPaid),
			header:  signed(event("checkout.session.completed", "2026-08-26.dahlia", sessionPaid), testWebhookSecret, testNow),
			want: Event{ID: "evt_1VmshelfEvent0001", Type: "checkout.session.completed", APIVersion: "2026-08-26.dahlia",
				Created: time.Unix(1772367000, 0), SessionID: sessionID, OrderID: "ord_42"},
		},
		{
			// Signed, so authentic; only age says replay.
			name:    "timestamp a minute ahead",
			payload: completed,
			header:  signed(completed, testWebhookSecret, testNow.Add(time.Minute)),
			want: Event{ID: "evt_1VmshelfEvent0001", Type: "checkout.session.completed", APIVersion: stripe.APIVersion,
				Created: time.Unix(1772367000, 0), SessionID: sessionID, OrderID: "ord_42"},
		},
		{name: "signed with another secret", payload: completed, header: signed(completed, "whsec_other", testNow), wantErr: ErrBadSignature},
		{name: "payload changed after signing", payload: strings.Replace(completed, `"amount_total": 1800`, `"amount_total": 18`, 1),
			header: signed(completed, testWebhookSecret, testNow), wantErr: ErrBadSignature},
		{name: "timestamp changed after signing", payload: completed,
			header: strings.Replace(signed(completed, testWebhookSecret, testNow), "t=", "t=1", 1), wantErr: ErrBadSignature},
		{name: "no header", payload: completed, header: "", wantErr: ErrBadSignature},
		{name: "garbage header", payload: completed, header: "v1", wantErr: ErrBadSignature},
		{name: "only a v0 signature", payload: completed,
			header: strings.Replace(signed(completed, testWebhookSecret, testNow), "v1=", "v0=", 1), wantErr: ErrBadSignature},
		{name: "signature without timestamp", payload: completed,
			header: strings.Split(signed(completed, testWebhookSecret, testNow), ",")[1], wantErr: ErrBadSignature},
		{
			// Exactly at the tolerance: still fresh (only older is stale).
			name:    "signed exactly 5 min ago",
			payload: completed,
			header:  signed(completed, testWebhookSecret, testNow.Add(-Tolerance)),
			want: Event{ID: "evt_1VmshelfEvent0001", Type: "checkout.session.completed", APIVersion: stripe.APIVersion,
				Created: time.Unix(1772367000, 0), SessionID: sessionID, OrderID: "ord_42"},
		},
		// A captured old event with a fresh t= put in front: stripe-go
		// checks the signature against the last t, so the age must be
		// the last t's too, or the fresh one would let the replay in.
		{name: "old event, fresh t= in front", payload: completed,
			header: fmt.Sprintf("t=%d,", testNow.Unix()) + signed(completed, testWebhookSecret, testNow.Add(-10*time.Minute)), wantErr: ErrStale},
		// The other way round the signature no longer holds: the last t
		// is not the one it was made over.
		{name: "fresh t= after the signature", payload: completed,
			header: signed(completed, testWebhookSecret, testNow.Add(-10*time.Minute)) + fmt.Sprintf(",t=%d", testNow.Unix()), wantErr: ErrBadSignature},
		{name: "signed 10 min ago", payload: completed, header: signed(completed, testWebhookSecret, testNow.Add(-10*time.Minute)), wantErr: ErrStale},
		{name: "signed 5 min and a second ago", payload: completed, header: signed(completed, testWebhookSecret, testNow.Add(-Tolerance-time.Second)), wantErr: ErrStale},
		{name: "forged and stale", payload: completed, header: signed(completed, "whsec_other", testNow.Add(-10*time.Minute)), wantErr: ErrBadSignature},
		{name: "payload not JSON", payload: "type=checkout.session.completed", header: signed("type=checkout.session.completed", testWebhookSecret, testNow), wantErr: ErrMalformedEvent},
		{name: "JSON but no event", payload: `{"hello": "world"}`, header: signed(`{"hello": "world"}`, testWebhookSecret, testNow), wantErr: ErrMalformedEvent},
		{name: "checkout event without a session",
			payload: event("checkout.session.completed", stripe.APIVersion, accountActive),
			header:  signed(event("checkout.session.completed", stripe.APIVersion, accountActive), testWebhookSecret, testNow), wantErr: ErrMalformedEvent},
		{name: "metadata and client reference disagree",
			payload: event("checkout.session.completed", stripe.APIVersion, `{"id":"cs_test_1","object":"checkout.session","client_reference_id":"ord_7","metadata":{"order_id":"ord_8"}}`),
			header:  signed(event("checkout.session.completed", stripe.APIVersion, `{"id":"cs_test_1","object":"checkout.session","client_reference_id":"ord_7","metadata":{"order_id":"ord_8"}}`), testWebhookSecret, testNow),
			wantErr: ErrMalformedEvent},
		// Without a secret anyone signs: an HMAC with an empty key.
		{name: "no secret configured", payload: completed, header: signed(completed, "", testNow), secret: "-", wantErr: ErrNoWebhookSecret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secret := testWebhookSecret
			if tc.secret == "-" {
				secret = ""
			}
			got, err := ParseEvent([]byte(tc.payload), tc.header, secret, testNow)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("ParseEvent = %+v, %v; want %v", got, err, tc.wantErr)
				}
				for _, other := range []error{ErrBadSignature, ErrStale, ErrMalformedEvent, ErrNoWebhookSecret} {
					if other != tc.wantErr && errors.Is(err, other) {
						t.Errorf("%v is also %v", err, other)
					}
				}
				if got != (Event{}) {
					t.Errorf("a refusal came with an event: %+v", got)
				}
				if strings.Contains(err.Error(), testWebhookSecret) {
					t.Errorf("the error carries the secret: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseEvent: %v", err)
			}
			if got != tc.want {
				t.Errorf("event\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// The real clock as stripe-go's tests use it: signed now, checked now.
func TestParseEventRealClock(t *testing.T) {
	p := event("checkout.session.completed", stripe.APIVersion, sessionPaid)
	now := time.Now()
	if _, err := ParseEvent([]byte(p), signed(p, testWebhookSecret, now), testWebhookSecret, now); err != nil {
		t.Fatalf("ParseEvent: %v", err)
	}
}

const (
	chargeRefunded = `{
  "id": "ch_3VmshelfPaid0001",
  "object": "charge",
  "amount": 1800,
  "amount_refunded": 1800,
  "currency": "eur",
  "metadata": {"order_id": "ord_42"},
  "paid": true,
  "payment_intent": "pi_3VmshelfPaid0001",
  "refunded": true,
  "status": "succeeded",
  "transfer_data": {"destination": "acct_1HostBox0000001"}
}`
	chargePartlyRefunded = `{"id": "ch_3VmshelfPaid0001", "object": "charge", "amount": 1800, "amount_refunded": 600,
  "payment_intent": {"id": "pi_3VmshelfPaid0001", "object": "payment_intent"}, "refunded": false}`
	disputeCreated = `{
  "id": "dp_3VmshelfDispute1",
  "object": "dispute",
  "amount": 1800,
  "charge": "ch_3VmshelfPaid0001",
  "currency": "eur",
  "is_charge_refundable": false,
  "metadata": {},
  "payment_intent": "pi_3VmshelfPaid0001",
  "reason": "fraudulent",
  "status": "needs_response"
}`
	// disputeLost is the same dispute once the bank decided it, as
	// charge.dispute.closed carries it (payment_intent expanded here).
	disputeLost = `{
  "id": "dp_3VmshelfDispute1",
  "object": "dispute",
  "amount": 1800,
  "charge": "ch_3VmshelfPaid0001",
  "currency": "eur",
  "is_charge_refundable": false,
  "metadata": {},
  "payment_intent": {"id": "pi_3VmshelfPaid0001", "object": "payment_intent"},
  "reason": "fraudulent",
  "status": "lost"
}`
	// refundByHand is a refund made in the Dashboard: no metadata of ours.
	refundByHand = `{"id": "re_3ByHand", "object": "refund", "amount": 1800, "metadata": {},
  "payment_intent": "pi_3VmshelfPaid0001", "status": "pending", "failure_reason": null}`
)

// Each event type besides checkout's: the fields of its object, and a
// refusal of an object of the wrong kind.
func TestParseEventObjects(t *testing.T) {
	base := Event{ID: "evt_1VmshelfEvent0001", APIVersion: stripe.APIVersion, Created: time.Unix(1772367000, 0)}
	with := func(typ string, edit func(*Event)) Event {
		e := base
		e.Type = typ
		edit(&e)
		return e
	}
	for _, tc := range []struct {
		name, typ, object string
		want              Event
		wantErr           error
	}{
		{"charge refunded in full", EventChargeRefunded, chargeRefunded, with(EventChargeRefunded, func(e *Event) {
			e.PaymentIntent, e.Amount, e.Refunded = testPI, 1800, true
		}), nil},
		{"charge refunded in part, payment intent expanded", EventChargeRefunded, chargePartlyRefunded, with(EventChargeRefunded, func(e *Event) {
			e.PaymentIntent, e.Amount = testPI, 600
		}), nil},
		{"refund created", EventRefundCreated, refundSucceeded, with(EventRefundCreated, func(e *Event) {
			e.RefundID, e.RefundStatus, e.PaymentIntent, e.OrderID, e.Cause = "re_3VmshelfRefund01", RefundSucceeded, testPI, "ord_42", "provisionfailed"
		}), nil},
		{"refund updated by hand", EventRefundUpdated, refundByHand, with(EventRefundUpdated, func(e *Event) {
			e.RefundID, e.RefundStatus, e.PaymentIntent = "re_3ByHand", RefundPending, testPI
		}), nil},
		{"refund failed", EventRefundFailed, refundFailed, with(EventRefundFailed, func(e *Event) {
			e.RefundID, e.RefundStatus, e.PaymentIntent, e.OrderID, e.Cause = "re_3VmshelfRefund01", RefundFailed, testPI, "ord_42", "provisionfailed"
			e.FailureReason = "expired_or_canceled_card"
		}), nil},
		{"dispute created", EventDisputeCreated, disputeCreated, with(EventDisputeCreated, func(e *Event) {
			e.DisputeID, e.PaymentIntent, e.DisputeReason, e.Amount = "dp_3VmshelfDispute1", testPI, "fraudulent", 1800
			e.DisputeStatus = "needs_response"
		}), nil},
		{"dispute closed", EventDisputeClosed, disputeLost, with(EventDisputeClosed, func(e *Event) {
			e.DisputeID, e.PaymentIntent, e.DisputeReason, e.Amount = "dp_3VmshelfDispute1", testPI, "fraudulent", 1800
			e.DisputeStatus = DisputeLost
		}), nil},
		{"dispute closed with a charge", EventDisputeClosed, chargeRefunded, Event{}, ErrMalformedEvent},
		{"account onboarded", EventAccountUpdated, accountActive, with(EventAccountUpdated, func(e *Event) {
			e.Account, e.ChargesEnabled, e.PayoutsEnabled, e.DetailsSubmitted = testHost, true, true, true
		}), nil},
		{"account still pending", EventAccountUpdated, accountPending, with(EventAccountUpdated, func(e *Event) {
			e.Account = testHost
		}), nil},
		{"refund event with an account", EventRefundUpdated, accountActive, Event{}, ErrMalformedEvent},
		{"charge event with a refund", EventChargeRefunded, refundSucceeded, Event{}, ErrMalformedEvent},
		{"dispute without an id", EventDisputeCreated, `{"object": "dispute", "reason": "fraudulent"}`, Event{}, ErrMalformedEvent},
		{"account event with a number for a flag", EventAccountUpdated, `{"id": "acct_1", "object": "account", "charges_enabled": 1}`, Event{}, ErrMalformedEvent},
		{"refund with a number for a payment intent", EventRefundCreated, `{"id": "re_1", "object": "refund", "payment_intent": 7}`, Event{}, ErrMalformedEvent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := event(tc.typ, stripe.APIVersion, tc.object)
			got, err := ParseEvent([]byte(p), signed(p, testWebhookSecret, testNow), testWebhookSecret, testNow)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || got != (Event{}) {
					t.Fatalf("ParseEvent = %+v, %v; want %v", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseEvent: %v", err)
			}
			if got != tc.want {
				t.Errorf("event\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
