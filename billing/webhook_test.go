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
