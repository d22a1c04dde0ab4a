package billing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/stripe/stripe-go/v82"
)

// The three kinds of a failed Stripe call. Every error of a Stripe method
// other than a gate refusal is a *StripeError of exactly one kind.
var (
	// ErrUnavailable is "could not ask": no answer (network, timeout, the
	// caller's context) or one that says "later" (429, 409, 5xx, an answer
	// that is not Stripe's JSON). Retry later; it is never a negative
	// answer. After a CreateCheckout of this kind the session may exist:
	// a retry with the same Checkout gets the same one.
	ErrUnavailable = errors.New("could not ask Stripe")
	// ErrNotFound is Stripe's own answer that the object does not exist
	// (404 resource_missing). Only this may be read as absence.
	ErrNotFound = errors.New("no such object at Stripe")
	// ErrRefused is any other refusal by Stripe (4xx): a bad key, an
	// invalid destination, a changed retry. Code and Param say which.
	ErrRefused = errors.New("refused by Stripe")
	// ErrBadID is a session, account or PaymentIntent id that is not of
	// Stripe's shape, or another argument that goes into one of Stripe's
	// ids or keys (a refund's order or cause, a tenant id, a country
	// code); Stripe is not asked.
	ErrBadID = errors.New("malformed Stripe id")
	// ErrBadURL is an onboarding return or refresh URL that is not an
	// absolute http(s) URL; Stripe is not asked.
	ErrBadURL = errors.New("not an absolute http(s) URL")
	// ErrAlreadyRefunded is Stripe's answer that the charge is refunded
	// already (code charge_already_refunded): a refund before this one, by
	// vmshelf under another cause or by hand. It comes as a *StripeError of
	// kind ErrRefused that errors.Is also matches to this, so that the
	// caller can count the refund as done and not as refused.
	ErrAlreadyRefunded = errors.New("the charge is already refunded")
	// ErrChargeDisputed is Stripe's answer that the charge has a dispute
	// its buyer's bank opened (code charge_disputed): while the dispute
	// runs, or once it is lost, the bank and not a refund decides where
	// the money goes. Asking again gets the same answer. It comes as a
	// *StripeError of kind ErrRefused that errors.Is also matches to this.
	ErrChargeDisputed = errors.New("the charge is disputed")
)

// StripeError is a failed Stripe call. errors.Is matches its Kind; Unwrap
// gives the cause (context.DeadlineExceeded, a *url.Error, a
// *stripe.Error). Its text carries Stripe's message and the transport's
// error, scrubbed of API keys, never a request body.
type StripeError struct {
	// Op is the call: create_checkout, get_session, expire_session,
	// get_account, create_refund, create_account, create_account_link.
	Op        string
	Kind      error  // ErrUnavailable, ErrNotFound or ErrRefused
	Status    int    // Stripe's HTTP status; 0 when no answer came
	Type      string // Stripe's error type, e.g. invalid_request_error
	Code      string // Stripe's error code, e.g. resource_missing
	Param     string // the parameter Stripe refused, if it says
	RequestID string // Stripe's request id, for its support
	Message   string // scrubbed
	cause     error
	// answer is the sentinel of one of Stripe's answers that the caller
	// acts on (ErrAlreadyRefunded, ErrChargeDisputed), or nil.
	answer error
}

func (e *StripeError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "billing: %s: %s", e.Op, e.Kind)
	if e.Status != 0 {
		fmt.Fprintf(&b, " (%d", e.Status)
		for _, s := range []string{e.Type, e.Code} {
			if s != "" {
				b.WriteString(" " + s)
			}
		}
		if e.Param != "" {
			b.WriteString(", param " + e.Param)
		}
		if e.RequestID != "" {
			b.WriteString(", request " + e.RequestID)
		}
		b.WriteString(")")
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrUnavailable) etc. work, and
// errors.Is(err, ErrAlreadyRefunded) or ErrChargeDisputed for those
// answers.
func (e *StripeError) Is(target error) bool {
	return target == e.Kind || (e.answer != nil && target == e.answer)
}

func (e *StripeError) Unwrap() error { return e.cause }

// keyPattern is any Stripe secret or restricted key, so that a key that is
// not ours (a message quoting another) is scrubbed as well.
var keyPattern = regexp.MustCompile(`\b(sk|rk)_(test|live)_[0-9A-Za-z]+`)

// scrub removes key and anything shaped like a secret key from s.
func scrub(s, key string) string {
	if key != "" {
		s = strings.ReplaceAll(s, key, "[redacted]")
	}
	return keyPattern.ReplaceAllString(s, "[redacted]")
}

// classify turns the error of a stripe-go call into a *StripeError. ctx is
// the call's context: once it is done, no answer counts.
func classify(ctx context.Context, op string, err error, key string) *StripeError {
	e := &StripeError{Op: op, Kind: ErrUnavailable, cause: err}
	var se *stripe.Error
	switch {
	case ctx.Err() != nil:
		// The deadline or the caller ended the call; the error stripe-go
		// built on the way says no more than that.
		e.cause = fmt.Errorf("%w (%w)", ctx.Err(), err)
		e.Message = scrub(err.Error(), key)
		return e
	case errors.As(err, &se):
		e.Status, e.Type, e.Code = se.HTTPStatusCode, string(se.Type), string(se.Code)
		e.Param, e.RequestID, e.Message = se.Param, se.RequestID, scrub(se.Msg, key)
		e.Kind = kindOf(se)
		if e.Kind == ErrRefused {
			e.answer = refusalAnswers[se.Code]
		}
		return e
	default:
		// A transport error, or an answer that is not Stripe's JSON (a
		// proxy's error page): nobody with authority answered.
		e.Message = scrub(err.Error(), key)
		return e
	}
}

// refusalAnswers are the refusals a caller tells from the others, by
// Stripe's error code.
var refusalAnswers = map[stripe.ErrorCode]error{
	stripe.ErrorCodeChargeAlreadyRefunded: ErrAlreadyRefunded,
	stripe.ErrorCodeChargeDisputed:        ErrChargeDisputed,
}

// kindOf sorts Stripe's answer: only a 404 resource_missing is absence,
// and an answer that says "try again" is not a refusal.
func kindOf(se *stripe.Error) error {
	if se.LastResponse != nil {
		switch se.LastResponse.Header.Get("Stripe-Should-Retry") {
		case "true":
			return ErrUnavailable
		case "false":
			if se.HTTPStatusCode < 500 {
				return refusedOrMissing(se)
			}
		}
	}
	switch s := se.HTTPStatusCode; {
	case s == http.StatusTooManyRequests, s == http.StatusConflict, s >= 500, s < 400:
		// 409: a request with the same idempotency key is still running,
		// or a lock timed out. Below 400 is no Stripe error at all.
		return ErrUnavailable
	}
	return refusedOrMissing(se)
}

func refusedOrMissing(se *stripe.Error) error {
	if se.HTTPStatusCode == http.StatusNotFound && se.Code == stripe.ErrorCodeResourceMissing {
		return ErrNotFound
	}
	return ErrRefused
}

// outcome is the metric label of a call's result.
func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrRefused):
		return "refused"
	default:
		return "unavailable"
	}
}
