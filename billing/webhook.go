package billing

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82/webhook"
)

// Tolerance is how old a webhook's signed timestamp may be; older ones are
// refused as replays (Stripe's own default).
const Tolerance = webhook.DefaultTolerance

// ParseEvent's refusals. Each means: answer 400 and do nothing; Stripe
// retries a real event.
var (
	ErrBadSignature   = errors.New("the webhook's Stripe-Signature does not verify")
	ErrStale          = errors.New("the webhook's signed timestamp is older than the tolerance")
	ErrMalformedEvent = errors.New("the webhook's payload is not a Stripe event")
	// ErrNoWebhookSecret is a configuration error (answer 500): without a
	// secret anyone could sign.
	ErrNoWebhookSecret = errors.New("no webhook signing secret (STRIPE_WEBHOOK_SECRET)")
)

// Event is a verified Stripe event. The market acts on the
// checkout.session.* types (completed, async_payment_succeeded,
// async_payment_failed, expired) and ignores the others; it re-reads the
// session with Payments.Session before it believes anything, so an event
// only says which session to look at.
type Event struct {
	ID   string // evt_…; the market handles each id once
	Type string
	// APIVersion is the version the endpoint renders events in. It may
	// differ from stripe-go's: the fields read here are the same in every
	// version, and the session is re-read with the library's own.
	APIVersion string
	Created    time.Time
	// SessionID and OrderID are set for checkout.session.* events:
	// data.object.id and metadata[order_id] (or client_reference_id).
	SessionID string
	OrderID   string
}

// ParseEvent verifies payload against its Stripe-Signature header with
// secret (stripe-go's webhook package) and decodes it. now is the clock the
// signed timestamp is measured against (the market's clock, so that tests
// control it): older than Tolerance is ErrStale, checked after the
// signature, so a forgery is always ErrBadSignature. A timestamp ahead of
// now passes, as in Stripe's libraries: it is signed, and only age says
// replay. An event rendered in another API version than stripe-go's is
// accepted (see Event.APIVersion): refusing it would make Stripe retry a
// paid order's event until it gives up.
func ParseEvent(payload []byte, signatureHeader, secret string, now time.Time) (Event, error) {
	if secret == "" {
		return Event{}, fmt.Errorf("billing: webhook: %w", ErrNoWebhookSecret)
	}
	ev, err := webhook.ConstructEventWithOptions(payload, signatureHeader, secret, webhook.ConstructEventOptions{
		IgnoreTolerance:          true, // measured against now below
		IgnoreAPIVersionMismatch: true,
	})
	switch {
	case errors.Is(err, webhook.ErrNotSigned), errors.Is(err, webhook.ErrInvalidHeader), errors.Is(err, webhook.ErrNoValidSignature):
		return Event{}, fmt.Errorf("billing: webhook: %w", ErrBadSignature)
	case err != nil:
		// The signature held; only the JSON did not.
		return Event{}, fmt.Errorf("billing: webhook: %w: %v", ErrMalformedEvent, err)
	}
	signed, ok := signedAt(signatureHeader)
	if !ok {
		return Event{}, fmt.Errorf("billing: webhook: %w", ErrBadSignature)
	}
	if age := now.Sub(signed); age > Tolerance {
		return Event{}, fmt.Errorf("billing: webhook signed %s ago: %w", age.Round(time.Second), ErrStale)
	}
	if ev.ID == "" || ev.Type == "" || ev.Data == nil {
		return Event{}, fmt.Errorf("billing: webhook: no id, type or data: %w", ErrMalformedEvent)
	}
	e := Event{ID: ev.ID, Type: string(ev.Type), APIVersion: ev.APIVersion, Created: time.Unix(ev.Created, 0)}
	if !strings.HasPrefix(e.Type, "checkout.session.") {
		return e, nil
	}
	var obj struct {
		ID                string            `json:"id"`
		Object            string            `json:"object"`
		ClientReferenceID string            `json:"client_reference_id"`
		Metadata          map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(ev.Data.Raw, &obj); err != nil || obj.Object != "checkout.session" || obj.ID == "" {
		return Event{}, fmt.Errorf("billing: webhook %s: %s without a checkout session: %w", e.ID, e.Type, ErrMalformedEvent)
	}
	order := obj.Metadata["order_id"]
	switch {
	case order == "":
		order = obj.ClientReferenceID
	case obj.ClientReferenceID != "" && obj.ClientReferenceID != order:
		// CreateCheckout writes one id to both; two are not our session.
		return Event{}, fmt.Errorf("billing: webhook %s: metadata and client reference name different orders: %w", e.ID, ErrMalformedEvent)
	}
	e.SessionID, e.OrderID = obj.ID, order
	return e, nil
}

// signedAt is the timestamp of a Stripe-Signature header ("t=…,v1=…"),
// the last t as stripe-go reads it, so that it is the one the verified
// signature covers.
func signedAt(header string) (time.Time, bool) {
	var t time.Time
	ok := false
	for _, pair := range strings.Split(header, ",") {
		k, v, found := strings.Cut(pair, "=")
		if !found || k != "t" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return time.Time{}, false
		}
		t, ok = time.Unix(n, 0), true
	}
	return t, ok
}
