package stripetest

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Refund is a refund the fake made, as the create request's form
// described it, and its state since.
type Refund struct {
	ID            string
	Form          url.Values // the create request's form
	Idempotency   string     // its Idempotency-Key header
	PaymentIntent string
	Charge        string
	OrderID       string // metadata[order_id]
	Cause         string // metadata[cause]
	Amount        int64  // the whole PaymentIntent: the fake refunds in full only
	Currency      string
	// Status is "succeeded", or what RefundAs or SettleRefund made it;
	// FailureReason is set with "failed" or "canceled".
	Status, FailureReason string
	Created               int64
}

// Refunds returns copies of the refunds made so far, oldest first.
func (s *Server) Refunds() []Refund {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Refund, 0, len(s.refundOrder))
	for _, id := range s.refundOrder {
		out = append(out, *s.refunds[id])
	}
	return out
}

// FailRefunds makes the next n refund requests answer status (500, 503:
// an outage) without refunding anything.
func (s *Server) FailRefunds(n, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refundFail, s.refundFailStatus = n, status
}

// LoseRefunds makes the next n refund requests refund (or find the
// refund of their idempotency key) and then answer status all the same:
// the answer lost after Stripe acted, which only the idempotency key
// makes safe to retry.
func (s *Server) LoseRefunds(n, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refundLose, s.refundLoseStatus = n, status
}

// RefundAs makes the refunds made from now on come back with status
// ("pending", "failed", "requires_action", "canceled") and failureReason
// (Stripe's failure_reason, for "failed" and "canceled"); "" is
// "succeeded" again.
func (s *Server) RefundAs(status, failureReason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refundStatus, s.refundFailure = status, failureReason
}

// SettleRefund changes refund id's status later, as Stripe does when a
// pending refund succeeds or fails (then send RefundEvent of
// refund.updated or refund.failed).
func (s *Server) SettleRefund(id, status, failureReason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rf, ok := s.refunds[id]
	if !ok {
		return fmt.Errorf("stripetest: no refund %s", id)
	}
	rf.Status, rf.FailureReason = status, failureReason
	return nil
}

// RefundEvent returns a webhook event of type typ (refund.created,
// refund.updated, refund.failed) about refund id as it is now, signed as
// Event signs.
func (s *Server) RefundEvent(eventID, typ, refundID, secret string, signedAt time.Time) (payload []byte, signature string, err error) {
	s.mu.Lock()
	rf, ok := s.refunds[refundID]
	var obj map[string]any
	if ok {
		obj = refundJSON(rf)
	}
	s.mu.Unlock()
	if !ok {
		return nil, "", fmt.Errorf("stripetest: no refund %s", refundID)
	}
	return signedEvent(eventID, typ, obj, secret, signedAt)
}

// ChargeRefundedEvent returns a charge.refunded event about the charge of
// paymentIntent, with amount_refunded and refunded as its refunds make
// them now, signed as Event signs.
func (s *Server) ChargeRefundedEvent(eventID, paymentIntent, secret string, signedAt time.Time) (payload []byte, signature string, err error) {
	s.mu.Lock()
	cs := s.paidSession(paymentIntent)
	var obj map[string]any
	if cs != nil {
		refunded := s.refunded(paymentIntent)
		obj = map[string]any{
			"id": chargeOf(cs), "object": "charge", "amount": cs.PaidAmount, "currency": cs.Currency,
			"amount_refunded": refunded, "refunded": refunded >= cs.PaidAmount, "paid": true,
			"payment_intent": paymentIntent, "status": "succeeded",
			"metadata": map[string]string{"order_id": cs.OrderID},
		}
	}
	s.mu.Unlock()
	if cs == nil {
		return nil, "", fmt.Errorf("stripetest: no paid payment intent %s", paymentIntent)
	}
	return signedEvent(eventID, "charge.refunded", obj, secret, signedAt)
}

// Dispute is a dispute the buyer's bank opened on a charge (DisputeEvent)
// and what became of it (DisputeClosedEvent).
type Dispute struct {
	ID            string
	PaymentIntent string
	Charge        string
	Reason        string // e.g. "fraudulent"
	Amount        int64
	Currency      string
	// Status is Stripe's: "needs_response" while open, then "won",
	// "lost", "warning_closed" or "prevented" once closed.
	Status string
}

// refundable reports whether Stripe refunds a charge with this dispute:
// not while it is open, nor once the bank took the money back (lost).
func (d *Dispute) refundable() bool {
	switch d.Status {
	case "won", "warning_closed", "prevented":
		return true
	}
	return false
}

// DisputeEvent opens a dispute of the whole charge of paymentIntent for
// reason (e.g. "fraudulent"), as the buyer's bank does, and returns its
// charge.dispute.created event, signed as Event signs. From then on a new
// refund of that charge is refused with Stripe's charge_disputed, whether
// or not the event was posted: Stripe knows of the dispute before the
// webhook does. A second call reuses the dispute.
func (s *Server) DisputeEvent(eventID, paymentIntent, reason, secret string, signedAt time.Time) (payload []byte, signature string, err error) {
	s.mu.Lock()
	cs := s.paidSession(paymentIntent)
	var obj map[string]any
	if cs != nil {
		d, ok := s.disputes[paymentIntent]
		if !ok {
			d = &Dispute{ID: "dp_stripetest_" + strings.TrimPrefix(cs.ID, "cs_test_"), PaymentIntent: paymentIntent,
				Charge: chargeOf(cs), Reason: reason, Amount: cs.PaidAmount, Currency: cs.Currency, Status: "needs_response"}
			s.disputes[paymentIntent] = d
		}
		obj = disputeJSON(d)
	}
	s.mu.Unlock()
	if cs == nil {
		return nil, "", fmt.Errorf("stripetest: no paid payment intent %s", paymentIntent)
	}
	return signedEvent(eventID, "charge.dispute.created", obj, secret, signedAt)
}

// DisputeClosedEvent closes the dispute of paymentIntent's charge with
// status ("won", "lost", "warning_closed", "prevented"), as the bank's
// decision does, and returns its charge.dispute.closed event, signed as
// Event signs. A dispute lost keeps refusing refunds; the others let them
// through again.
func (s *Server) DisputeClosedEvent(eventID, paymentIntent, status, secret string, signedAt time.Time) (payload []byte, signature string, err error) {
	switch status {
	case "won", "lost", "warning_closed", "prevented":
	default:
		return nil, "", fmt.Errorf("stripetest: %q is not a closed dispute's status", status)
	}
	s.mu.Lock()
	d, ok := s.disputes[paymentIntent]
	var obj map[string]any
	if ok {
		d.Status = status
		obj = disputeJSON(d)
	}
	s.mu.Unlock()
	if !ok {
		return nil, "", fmt.Errorf("stripetest: no dispute of payment intent %s", paymentIntent)
	}
	return signedEvent(eventID, "charge.dispute.closed", obj, secret, signedAt)
}

// disputeJSON renders d as Stripe's Dispute object.
func disputeJSON(d *Dispute) map[string]any {
	return map[string]any{
		"id": d.ID, "object": "dispute", "amount": d.Amount, "currency": d.Currency, "charge": d.Charge,
		"payment_intent": d.PaymentIntent, "reason": d.Reason, "status": d.Status,
		"is_charge_refundable": d.refundable(), "metadata": map[string]string{},
	}
}

// paidSession is the session whose PaymentIntent is pi, nil if none.
// s.mu is held.
func (s *Server) paidSession(pi string) *Session {
	for _, cs := range s.sessions {
		if cs.Status == "complete" && paymentIntentOf(cs) == pi {
			return cs
		}
	}
	return nil
}

// refunded is what pi's refunds give back: those not failed or canceled.
// s.mu is held.
func (s *Server) refunded(pi string) int64 {
	var n int64
	for _, rf := range s.refunds {
		if rf.PaymentIntent == pi && rf.Status != "failed" && rf.Status != "canceled" {
			n += rf.Amount
		}
	}
	return n
}

// sameForm reports whether a repeat under an idempotency key asks the
// same as the first request: Stripe refuses a changed one.
func sameForm(a, b url.Values) bool { return a.Encode() == b.Encode() }

func idempotencyError(w http.ResponseWriter, key string) {
	stripeError(w, http.StatusBadRequest, "idempotency_error", "",
		"Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '"+key+"' if you meant to execute a different request.")
}

// HoldRefundRequests makes the next refund request wait, received but not
// yet looked at, until release is called or the caller goes away: a test
// opens a dispute in that moment, between vmshelf's send and Stripe's
// decision.
func (s *Server) HoldRefundRequests() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.refundHoldBefore = ch
	s.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// HoldRefunds makes the next refund request make its refund and then hold
// its answer until release is called or the caller goes away: a test kills
// the caller in that moment, when Stripe has refunded and the caller has
// recorded nothing.
func (s *Server) HoldRefunds() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.refundHold = ch
	s.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

func (s *Server) createRefund(w http.ResponseWriter, r *http.Request) {
	f := r.PostForm
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.refundHoldBefore; h != nil {
		s.refundHoldBefore = nil
		s.waitUnlocked(h, r)
	}
	if s.refundFail > 0 {
		s.refundFail--
		stripeError(w, s.refundFailStatus, "api_error", "", "An unknown error occurred (stripetest)")
		return
	}
	rf, ok := s.refunds[s.refundByKey[key]]
	switch {
	case ok && key != "" && !sameForm(rf.Form, f):
		idempotencyError(w, key)
		return
	case ok && key != "":
		// A retry: the same refund, never a second.
	default:
		if rf = s.newRefund(w, f, key); rf == nil {
			return
		}
	}
	if h := s.refundHold; h != nil {
		// Made, and the answer held: the test kills the caller now.
		s.refundHold = nil
		s.waitUnlocked(h, r)
	}
	if s.refundLose > 0 {
		s.refundLose--
		stripeError(w, s.refundLoseStatus, "api_error", "", "An unknown error occurred (stripetest)")
		return
	}
	writeJSON(w, refundJSON(rf))
}

// waitUnlocked lets go of s.mu until h is closed or r's client gives up.
func (s *Server) waitUnlocked(h <-chan struct{}, r *http.Request) {
	s.mu.Unlock()
	select {
	case <-h:
	case <-r.Context().Done():
	}
	s.mu.Lock()
}

// newRefund makes the refund form f asks for, under s.mu, or answers
// Stripe's refusal and returns nil: an unknown or unpaid PaymentIntent, a
// charge refunded already, or one the bank holds in a dispute.
func (s *Server) newRefund(w http.ResponseWriter, f url.Values, key string) *Refund {
	pi := f.Get("payment_intent")
	cs := s.paidSession(pi)
	switch {
	case pi == "":
		stripeParamError(w, http.StatusBadRequest, "invalid_request_error", "parameter_missing", "payment_intent",
			"One of the following params should be provided for this request: payment_intent or charge.")
		return nil
	case cs == nil:
		stripeParamError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "payment_intent",
			"No such payment_intent: '"+pi+"'")
		return nil
	case cs.PaymentStatus != "paid":
		stripeError(w, http.StatusBadRequest, "invalid_request_error", "",
			"This PaymentIntent ("+pi+") does not have a successful charge to refund.")
		return nil
	case s.refunded(pi) >= cs.PaidAmount:
		stripeError(w, http.StatusBadRequest, "invalid_request_error", "charge_already_refunded",
			"Charge "+chargeOf(cs)+" has already been refunded.")
		return nil
	case s.disputes[pi] != nil && !s.disputes[pi].refundable():
		// Stripe's answer while the bank holds the money: the
		// dispute, not a refund, decides where it goes.
		stripeError(w, http.StatusBadRequest, "invalid_request_error", "charge_disputed",
			"Charge "+chargeOf(cs)+" has been charged back.")
		return nil
	}
	status := s.refundStatus
	if status == "" {
		status = "succeeded"
	}
	rf := &Refund{ID: fmt.Sprintf("re_stripetest%04d", len(s.refundOrder)+1), Form: f, Idempotency: key,
		PaymentIntent: pi, Charge: chargeOf(cs), OrderID: f.Get("metadata[order_id]"), Cause: f.Get("metadata[cause]"),
		Amount: cs.PaidAmount - s.refunded(pi), Currency: cs.Currency, Status: status, FailureReason: s.refundFailure,
		Created: time.Now().Unix()}
	s.refunds[rf.ID] = rf
	s.refundOrder = append(s.refundOrder, rf.ID)
	if key != "" {
		s.refundByKey[key] = rf.ID
	}
	return rf
}

func (s *Server) getRefund(w http.ResponseWriter, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rf, ok := s.refunds[id]
	if !ok {
		stripeParamError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "id", "No such refund: '"+id+"'")
		return
	}
	writeJSON(w, refundJSON(rf))
}

// refundJSON renders rf as Stripe's Refund object.
func refundJSON(rf *Refund) map[string]any {
	obj := map[string]any{
		"id": rf.ID, "object": "refund", "amount": rf.Amount, "currency": rf.Currency,
		"payment_intent": rf.PaymentIntent, "charge": rf.Charge, "status": rf.Status, "created": rf.Created,
		"metadata":       map[string]string{"order_id": rf.OrderID, "cause": rf.Cause},
		"failure_reason": nil,
		"reason":         nil,
	}
	if rf.FailureReason != "" {
		obj["failure_reason"] = rf.FailureReason
	}
	return obj
}
