package billing

import (
	"context"
	"fmt"
	"regexp"
	"strconv"

	"github.com/stripe/stripe-go/v82"
)

// RefundRequest is one automatic refund of an order's payment: all of it,
// back to the buyer.
type RefundRequest struct {
	// OrderID is the order refunded, as Checkout.OrderID (1..200 of
	// [A-Za-z0-9_-]); metadata[order_id] of the refund and part of its
	// idempotency key.
	OrderID string
	// Cause says why, as one word of letters ([A-Za-z], at most
	// MaxCauseLen), e.g. "provisionfailed": metadata[cause] and the other
	// part of the idempotency key, so that one order's refunds for
	// different causes are different requests and a retry for one cause is
	// the same.
	Cause string
	// PaymentIntent is the paid session's Session.PaymentIntent, "pi_…".
	PaymentIntent string
	// Generation counts the refunds of this order and cause that Stripe
	// itself failed (status failed or canceled: no money moved). Each has
	// its own key, or Stripe would answer the failed one again for a day.
	Generation int
}

// Refund is a refund as Stripe reports it.
type Refund struct {
	ID            string // re_…
	Status        string // one of the Refund* statuses below
	PaymentIntent string
	OrderID       string // metadata[order_id]
	Cause         string // metadata[cause]
	// FailureReason is Stripe's reason once Status is "failed" or
	// "canceled", e.g. "expired_or_canceled_card"; empty otherwise.
	FailureReason string
	Amount        int64 // minor units of the charge's currency
}

// The values of Refund.Status (and Event.RefundStatus). A refund is done
// only when "succeeded"; "pending" and "requires_action" end later in one
// of the others (refund.updated or refund.failed says when), and "failed"
// or "canceled" give the money back to the platform's balance: the buyer
// has not been refunded.
const (
	RefundPending        = string(stripe.RefundStatusPending)
	RefundSucceeded      = string(stripe.RefundStatusSucceeded)
	RefundFailed         = string(stripe.RefundStatusFailed)
	RefundRequiresAction = string(stripe.RefundStatusRequiresAction)
	RefundCanceled       = string(stripe.RefundStatusCanceled)
)

// MaxCauseLen bounds RefundRequest.Cause so that RefundKey stays within
// Stripe's 255 characters of an idempotency key with the longest order id:
// 15 + 200 + 1 + 32.
const MaxCauseLen = 32

var (
	causePattern = regexp.MustCompile(`^[A-Za-z]{1,32}$`)
	// paymentIntentPattern is a PaymentIntent id (pi_3…); Refund sends it
	// only in a form, but a malformed one is a caller's bug, not a
	// question for Stripe.
	paymentIntentPattern = regexp.MustCompile(`^pi_[A-Za-z0-9_]{1,250}$`)
)

// RefundKey is the idempotency key of the refund of orderID for cause. It
// names both, so that a retry of one refund (a lost answer, a restart) is
// the same request and never a second refund, while another cause is
// another request. No two pairs share a key: a cause has no "-", so it is
// all that follows the key's last one.
//
// Stripe keeps a key for 24 hours and answers every repeat with the first
// answer, also a failed refund's: a refund that failed is final under its
// key, so the next one is the next generation, "-1", "-2"… after the cause
// (digits, which a cause never is, so no two keys meet).
func RefundKey(orderID, cause string, generation int) string {
	k := "vmshelf-refund-" + orderID + "-" + cause
	if generation > 0 {
		k += "-" + strconv.Itoa(generation)
	}
	return k
}

// Refund implements Payments: it refunds r.PaymentIntent in full. The
// payment was a destination charge, so the refund reverses the transfer
// (the host's share comes back from the host's account) and refunds the
// application fee (the platform's share); without both, the platform would
// pay the buyer the host's share out of its own balance.
//
// A PaymentIntent that is already fully refunded (by an earlier refund
// under another key, or by hand in the Dashboard) is an ErrRefused that is
// also ErrAlreadyRefunded: the caller may count the order as refunded. A
// charge its buyer's bank disputes is an ErrRefused that is also
// ErrChargeDisputed: nothing was refunded, and nothing will be while the
// dispute stands.
func (s *Stripe) Refund(ctx context.Context, r RefundRequest) (Refund, error) {
	switch {
	case !orderIDPattern.MatchString(r.OrderID):
		return Refund{}, fmt.Errorf("billing: refund: order id is empty or not 1..200 of [A-Za-z0-9_-]: %w", ErrBadID)
	case !causePattern.MatchString(r.Cause):
		return Refund{}, fmt.Errorf("billing: refund of order %s: cause %q is not 1..%d letters: %w", r.OrderID, r.Cause, MaxCauseLen, ErrBadID)
	case r.Generation < 0:
		return Refund{}, fmt.Errorf("billing: refund of order %s: generation %d: %w", r.OrderID, r.Generation, ErrBadID)
	case !paymentIntentPattern.MatchString(r.PaymentIntent):
		return Refund{}, fmt.Errorf("billing: refund of order %s: payment intent %q: %w", r.OrderID, r.PaymentIntent, ErrBadID)
	}
	p := &stripe.RefundCreateParams{
		PaymentIntent:        stripe.String(r.PaymentIntent),
		ReverseTransfer:      stripe.Bool(true),
		RefundApplicationFee: stripe.Bool(true),
		// On the refund, so that its webhook events name the order and
		// the cause without a second look-up.
		Metadata: map[string]string{"order_id": r.OrderID, "cause": r.Cause},
	}
	p.SetIdempotencyKey(RefundKey(r.OrderID, r.Cause, r.Generation))
	var rf *stripe.Refund
	err := s.call(ctx, callCreateRefund, func(ctx context.Context) (err error) {
		rf, err = s.client.V1Refunds.Create(ctx, p)
		return err
	})
	if err != nil {
		return Refund{}, err
	}
	return refundFrom(rf), nil
}

// refundFrom keeps what the market needs of Stripe's refund.
func refundFrom(rf *stripe.Refund) Refund {
	r := Refund{
		ID:            rf.ID,
		Status:        string(rf.Status),
		OrderID:       rf.Metadata["order_id"],
		Cause:         rf.Metadata["cause"],
		FailureReason: string(rf.FailureReason),
		Amount:        rf.Amount,
	}
	if rf.PaymentIntent != nil {
		r.PaymentIntent = rf.PaymentIntent.ID
	}
	return r
}
