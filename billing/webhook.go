package billing

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v82"
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

// The event types besides checkout.session.* whose data.object
// ParseEvent reads into Event.
const (
	// EventChargeRefunded: a charge was refunded, in part or in full
	// (object: the charge).
	EventChargeRefunded = "charge.refunded"
	// EventRefundCreated, EventRefundUpdated, EventRefundFailed: a refund
	// was made, changed its status (pending → succeeded, …), or failed
	// (object: the refund).
	EventRefundCreated = "refund.created"
	EventRefundUpdated = "refund.updated"
	EventRefundFailed  = "refund.failed"
	// EventDisputeCreated: the buyer disputed a charge with their bank
	// (object: the dispute).
	EventDisputeCreated = "charge.dispute.created"
	// EventDisputeClosed: the bank decided a dispute; its status says how
	// (object: the dispute; see the Dispute* statuses).
	EventDisputeClosed = "charge.dispute.closed"
	// EventAccountUpdated: a Connect account changed, e.g. finished
	// onboarding (object: the account).
	EventAccountUpdated = "account.updated"
)

// The statuses of a closed dispute (Event.DisputeStatus of
// charge.dispute.closed): won, the money stays; lost, the bank gave it
// back to the buyer; warning_closed, an inquiry ended without becoming a
// dispute; prevented, the dispute was stopped before it began (the money
// stays).
const (
	DisputeWon           = string(stripe.DisputeStatusWon)
	DisputeLost          = string(stripe.DisputeStatusLost)
	DisputeWarningClosed = string(stripe.DisputeStatusWarningClosed)
	DisputePrevented     = string(stripe.DisputeStatusPrevented)
)

// Event is a verified Stripe event. The market acts on the
// checkout.session.* types (completed, async_payment_succeeded,
// async_payment_failed, expired) and the types above, and ignores the
// others; it re-reads the session with Payments.Session (an account with
// Payments.Account) before it believes anything, so an event mostly says
// what to look at. Only the fields of the event's type are set.
type Event struct {
	ID   string // evt_…; the market handles each id once
	Type string
	// APIVersion is the version the endpoint renders events in. It may
	// differ from stripe-go's: the fields read here are the same in every
	// version, and the session is re-read with the library's own.
	APIVersion string
	Created    time.Time
	// SessionID is set for checkout.session.* events: data.object.id.
	SessionID string
	// OrderID is the order: for checkout.session.* events the session's
	// metadata[order_id] (or client_reference_id); for refund.* events the
	// refund's metadata[order_id], empty for a refund vmshelf did not make
	// (one by hand in the Dashboard).
	OrderID string

	// PaymentIntent is the pi_… the object belongs to (its payment_intent,
	// an id or expanded) for charge.refunded, refund.* and
	// charge.dispute.*; empty when Stripe has none.
	PaymentIntent string
	// Amount is, for charge.refunded, the charge's amount_refunded (all its
	// refunds so far, minor units); for charge.dispute.* the disputed
	// amount.
	Amount int64
	// Refunded is, for charge.refunded, whether the charge is refunded in
	// full (Stripe's refunded).
	Refunded bool

	// RefundID, RefundStatus (one of the Refund* statuses), Cause (the
	// refund's metadata[cause]) and FailureReason (Stripe's
	// failure_reason, once failed) are set for refund.* events.
	RefundID      string
	RefundStatus  string
	Cause         string
	FailureReason string

	// DisputeID, DisputeReason (Stripe's reason, e.g. "fraudulent",
	// "product_not_received") and DisputeStatus (Stripe's status: for
	// charge.dispute.closed one of the Dispute* statuses above, as Stripe
	// sends it) are set for charge.dispute.*.
	DisputeID     string
	DisputeReason string
	DisputeStatus string

	// Account (acct_…) and its flags, as in AccountState, are set for
	// account.updated.
	Account          string
	ChargesEnabled   bool
	PayoutsEnabled   bool
	DetailsSubmitted bool
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
	if strings.HasPrefix(e.Type, "checkout.session.") {
		return sessionEvent(e, ev.Data.Raw)
	}
	want, ok := eventObjects[e.Type]
	if !ok {
		return e, nil
	}
	var obj eventObject
	if err := json.Unmarshal(ev.Data.Raw, &obj); err != nil || obj.Object != want || obj.ID == "" {
		return Event{}, fmt.Errorf("billing: webhook %s: %s without a %s: %w", e.ID, e.Type, want, ErrMalformedEvent)
	}
	switch e.Type {
	case EventChargeRefunded:
		e.PaymentIntent, e.Amount, e.Refunded = string(obj.PaymentIntent), obj.AmountRefunded, obj.Refunded
	case EventRefundCreated, EventRefundUpdated, EventRefundFailed:
		e.RefundID, e.RefundStatus, e.PaymentIntent = obj.ID, obj.Status, string(obj.PaymentIntent)
		e.OrderID, e.Cause, e.FailureReason = obj.Metadata["order_id"], obj.Metadata["cause"], obj.FailureReason
	case EventDisputeCreated, EventDisputeClosed:
		e.DisputeID, e.PaymentIntent, e.DisputeReason, e.Amount = obj.ID, string(obj.PaymentIntent), obj.Reason, obj.Amount
		e.DisputeStatus = obj.Status
	case EventAccountUpdated:
		e.Account, e.ChargesEnabled, e.PayoutsEnabled, e.DetailsSubmitted = obj.ID, obj.ChargesEnabled, obj.PayoutsEnabled, obj.DetailsSubmitted
	}
	return e, nil
}

// eventObjects is the data.object each type above carries.
var eventObjects = map[string]string{
	EventChargeRefunded: "charge",
	EventRefundCreated:  "refund", EventRefundUpdated: "refund", EventRefundFailed: "refund",
	EventDisputeCreated: "dispute", EventDisputeClosed: "dispute",
	EventAccountUpdated: "account",
}

// eventObject is the fields ParseEvent reads of a charge, refund, dispute
// or account: only these, so that a field another API version renders
// differently cannot make an authentic event malformed.
type eventObject struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	PaymentIntent    expandableID      `json:"payment_intent"`
	Amount           int64             `json:"amount"`
	AmountRefunded   int64             `json:"amount_refunded"`
	Refunded         bool              `json:"refunded"`
	Status           string            `json:"status"`
	FailureReason    string            `json:"failure_reason"`
	Reason           string            `json:"reason"`
	Metadata         map[string]string `json:"metadata"`
	ChargesEnabled   bool              `json:"charges_enabled"`
	PayoutsEnabled   bool              `json:"payouts_enabled"`
	DetailsSubmitted bool              `json:"details_submitted"`
}

// expandableID is the id of a field Stripe renders as an id, as the
// expanded object, or null.
type expandableID string

func (x *expandableID) UnmarshalJSON(b []byte) error {
	var id string
	if err := json.Unmarshal(b, &id); err == nil {
		*x = expandableID(id)
		return nil
	}
	var obj *struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &obj); err != nil {
		return err
	}
	if obj != nil {
		*x = expandableID(obj.ID)
	}
	return nil
}

// sessionEvent reads a checkout.session.* event's session and order.
func sessionEvent(e Event, raw json.RawMessage) (Event, error) {
	var obj struct {
		ID                string            `json:"id"`
		Object            string            `json:"object"`
		ClientReferenceID string            `json:"client_reference_id"`
		Metadata          map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Object != "checkout.session" || obj.ID == "" {
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
