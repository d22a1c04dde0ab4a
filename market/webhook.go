package market

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// maxWebhookBody caps a Stripe event: Stripe's own are a few KiB, and the
// route is the only one of the control plane a stranger may post to.
const maxWebhookBody = 1 << 20

// The Checkout Session events the market acts on; every other type is
// acknowledged and ignored.
const (
	eventCompleted      = "checkout.session.completed"
	eventAsyncSucceeded = "checkout.session.async_payment_succeeded"
	eventAsyncFailed    = "checkout.session.async_payment_failed"
	eventExpired        = "checkout.session.expired"
)

// WebhookEvents are the Stripe events the webhook acts on, in the order
// docs/api.md lists them: the events the endpoint in Stripe's dashboard
// must send (account.updated from connected accounts). Any other is
// acknowledged and counted as "other".
func WebhookEvents() []string {
	return []string{eventCompleted, eventAsyncSucceeded, eventAsyncFailed, eventExpired,
		billing.EventRefundCreated, billing.EventRefundUpdated, billing.EventRefundFailed, billing.EventChargeRefunded,
		billing.EventDisputeCreated, billing.EventDisputeClosed, billing.EventAccountUpdated}
}

// What the webhook did with an event: the result label of
// vmshelf_webhook_events_total and of the stored event.
const (
	resultPaid          = "paid"          // the order is paid now
	resultAlreadyPaid   = "alreadyPaid"   // it was already (another event or delivery, the sweeper)
	resultUnpaid        = "unpaid"        // completed, but the payment is still pending (async methods)
	resultCancelled     = "cancelled"     // the unpaid order is cancelled, its capacity back
	resultIgnored       = "ignored"       // a type we do not act on, or nothing left to do
	resultDuplicate     = "duplicate"     // an event id handled before: nothing changes
	resultUnknownOrder  = "unknownOrder"  // no order of ours: logged, never provisioned
	resultInconsistent  = "inconsistent"  // amount, fee, destination or session do not match the order
	resultPaidCancelled = "paidCancelled" // paid for an order already cancelled: refunded automatically
	resultRefused       = "refused"       // bad signature, stale, malformed: 400
	resultRefunded      = "refunded"      // Stripe confirmed the order's refund
	resultRefundFailed  = "refundFailed"  // Stripe failed the order's refund: a new one follows
	resultDisputed      = "disputed"      // the buyer's bank disputed the charge: marked, alerted
	resultDisputeClosed = "disputeClosed" // the bank decided the dispute: its outcome recorded
)

var (
	errWebhookNotConfigured = apierr.New(reason.WebhookNotConfigured)
	errBadSignature         = apierr.New(reason.BadSignature)
	errWebhookTooLarge      = apierr.New(reason.TooLarge).WithMsg("the event is larger than 1 MiB")
)

type webhookAnswer struct {
	Received bool   `json:"received"`
	Result   string `json:"result"`
}

// webhookBound is how long an event is handled once Stripe's request
// was read, whether or not Stripe still waits for the answer: one
// session read from Stripe (billing.DefaultTimeout, 15 s, bounds it) and
// a few store transactions (each bounded by the store: SQLite's busy
// timeout and PostgreSQL's statement timeout are 10 s) fit with room to
// spare. Past it something is wedged; the event is then not recorded, so
// Stripe's next delivery handles it again.
const webhookBound = time.Minute

// webhook is POST /market/stripe/webhook. The body is read raw (the
// signature covers its exact bytes), verified, and each event id handled
// once: an event seen before is answered 200 and changes nothing. An event
// only says which session to look at: the session is read again from
// Stripe and checked against the order before the order counts as paid.
// Failures Stripe should retry (Stripe or the store did not answer) are a
// 5xx and are not recorded; every other outcome is a 200, so Stripe stops
// resending, and is counted by result.
func (s *Server) webhook(w http.ResponseWriter, r *http.Request) {
	if s.cfg.WebhookSecret == "" {
		s.fail(w, r, errWebhookNotConfigured)
		return
	}
	body, err := s.readWebhookBody(w, r)
	if err != nil {
		s.metrics.webhook("unknown", resultRefused)
		s.fail(w, r, err)
		return
	}
	ev, err := billing.ParseEvent(body, r.Header.Get("Stripe-Signature"), s.cfg.WebhookSecret, s.cfg.Now())
	switch {
	case errors.Is(err, billing.ErrBadSignature), errors.Is(err, billing.ErrStale):
		s.metrics.webhook("unknown", resultRefused)
		s.fail(w, r, errBadSignature.WithCause(err))
		return
	case err != nil:
		s.metrics.webhook("unknown", resultRefused)
		s.fail(w, r, apierr.Wrap(err, reason.BadRequest).WithMsg("the body is not a Stripe event"))
		return
	}
	// Stripe hanging up must not cut a state change in half, so the
	// event is handled to its end; but not for ever: see webhookBound.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), webhookBound)
	defer cancel()
	seen, err := s.st.WebhookEventSeen(ctx, ev.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	result, order := resultDuplicate, ev.OrderID
	if !seen {
		if result, order, err = s.handleEvent(ctx, ev); err != nil {
			if errors.Is(err, billing.ErrUnavailable) {
				err = stripeUnavailable(err)
			}
			if imagestore.ValidOrderID(order) {
				err = aboutOrder(order, err)
			}
			s.fail(w, r, err) // 5xx: Stripe retries
			return
		}
		if err := s.st.RecordWebhookEvent(ctx, imagestore.WebhookEvent{ID: ev.ID, Type: ev.Type, Result: result, At: s.cfg.Now().UTC()}); err != nil {
			// Handled but not remembered: a replay is handled again,
			// which the state changes allow (each is idempotent).
			s.log.Error("webhook event handled but not recorded", "event", ev.ID, "order_id", orderForLog(order), "err", err.Error())
		}
	}
	s.metrics.webhook(ev.Type, result)
	s.log.Info("stripe event", "event", logText(ev.ID), "type", logText(ev.Type), "order_id", orderForLog(order), "result", result)
	s.writeJSON(w, r, http.StatusOK, webhookAnswer{Received: true, Result: result})
}

// orderForLog is an event's order id for a log line: ours have a known
// form (and are no secret); anything else is shown as such, not echoed.
func orderForLog(id string) string {
	if imagestore.ValidOrderID(id) {
		return id
	}
	if id == "" {
		return "none"
	}
	return "notOurs"
}

// readWebhookBody reads the raw event under its own cap and the control
// plane's body deadline.
func (s *Server) readWebhookBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > maxWebhookBody {
		return nil, errWebhookTooLarge
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWebhookBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, errWebhookTooLarge
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			return nil, errRequestTimeout
		}
		return nil, badRequest("the request body could not be read")
	}
	bodyRead(w)
	return body, nil
}

// handleEvent acts on one verified event and says what it did, and which
// order it was about: the event's own (a checkout session's metadata, a
// refund's) or, for an event that names only a PaymentIntent (a charge's,
// a dispute's), the order found by it; "" when none. An error means "not
// now" (Stripe or the store did not answer): the event is not recorded
// and Stripe sends it again.
func (s *Server) handleEvent(ctx context.Context, ev billing.Event) (result, orderID string, err error) {
	switch ev.Type {
	case billing.EventRefundCreated, billing.EventRefundUpdated, billing.EventRefundFailed:
		return s.refundEvent(ctx, ev)
	case billing.EventChargeRefunded:
		return s.chargeRefunded(ctx, ev)
	case billing.EventDisputeCreated:
		return s.disputeCreated(ctx, ev)
	case billing.EventDisputeClosed:
		return s.disputeClosed(ctx, ev)
	}
	result, err = s.handleCheckoutOrAccount(ctx, ev)
	return result, ev.OrderID, err
}

// handleCheckoutOrAccount is handleEvent for the checkout session events,
// which name their order, account.updated, which names none, and the
// types the market ignores.
func (s *Server) handleCheckoutOrAccount(ctx context.Context, ev billing.Event) (string, error) {
	switch ev.Type {
	case eventCompleted, eventAsyncSucceeded:
		o, result, err := s.eventOrder(ctx, ev)
		if result != "" || err != nil {
			return result, err
		}
		sess, err := s.cfg.Payments.Session(ctx, ev.SessionID)
		if err != nil {
			if errors.Is(err, billing.ErrNotFound) || errors.Is(err, billing.ErrBadID) {
				s.log.Error("stripe event names a session Stripe does not know; not provisioned",
					"event", ev.ID, "order_id", o.ID, "err", err.Error())
				return resultInconsistent, nil
			}
			return "", fmt.Errorf("re-read checkout session of order %s: %w", o.ID, err) // 503 when Stripe did not answer
		}
		return s.settle(ctx, o, sess)
	case eventAsyncFailed, eventExpired:
		o, result, err := s.eventOrder(ctx, ev)
		if result != "" || err != nil {
			return result, err
		}
		why := reason.PaymentFailed
		if ev.Type == eventExpired {
			why = reason.CheckoutExpired
		}
		return s.release(ctx, o, why)
	case billing.EventAccountUpdated:
		return s.accountUpdated(ctx, ev)
	}
	return resultIgnored, nil
}

// eventOrder finds the order a checkout event is about. A result instead
// of an order means there is nothing to act on.
func (s *Server) eventOrder(ctx context.Context, ev billing.Event) (imagestore.Order, string, error) {
	if s.cfg.Payments == nil {
		return imagestore.Order{}, "", errPaymentsUnavailable // 503: Stripe retries once keys are set
	}
	o, err := s.st.Order(ctx, ev.OrderID)
	switch {
	case errors.Is(err, imagestore.ErrNotFound) || ev.OrderID == "":
		s.log.Error("stripe event for no order of this edge; not provisioned", "event", ev.ID, "type", logText(ev.Type))
		return o, resultUnknownOrder, nil
	case err != nil:
		return o, "", err
	case o.CheckoutID != "" && o.CheckoutID != ev.SessionID:
		s.log.Error("stripe event names another checkout session than the order's; not provisioned",
			"event", ev.ID, "order_id", o.ID)
		return o, resultInconsistent, nil
	}
	return o, "", nil
}

// settle marks o paid if sess is its paid destination charge: the total,
// the platform's half and the host's account exactly as the order says.
// Anything else is refused, logged and counted, and never provisioned.
func (s *Server) settle(ctx context.Context, o imagestore.Order, sess billing.Session) (string, error) {
	err := sess.PaidFor(s.checkoutFor(o, "", time.Time{}))
	switch {
	case errors.Is(err, billing.ErrNotPaid):
		return resultUnpaid, nil // an async method: its own event follows
	case err != nil:
		s.log.Error("checkout session does not match its order; not provisioned",
			"order_id", o.ID, "session", sess.ID, "err", err.Error())
		return resultInconsistent, nil
	}
	// The PaymentIntent first, in any state: what a refund refunds and
	// what dispute and charge events name.
	if sess.PaymentIntent != "" {
		switch err := s.st.SetOrderPaymentIntent(ctx, o.ID, sess.PaymentIntent); {
		case errors.Is(err, imagestore.ErrOrderState):
			s.log.Error("checkout session names another PaymentIntent than the order's; not provisioned",
				"order_id", o.ID, "session", sess.ID)
			return resultInconsistent, nil
		case err != nil:
			return "", err
		}
	}
	now := s.cfg.Now().UTC()
	moved, err := s.st.PayOrder(ctx, o.ID, now, now.AddDate(0, 1, 0))
	switch {
	case errors.Is(err, imagestore.ErrOrderState):
		return s.refundPaidCancelled(ctx, o, sess)
	case err != nil:
		return "", err
	case !moved:
		// The store's answer, not the state read before: of concurrent
		// deliveries (or a delivery and the sweeper) only the one whose
		// update moved the order reports the payment.
		return resultAlreadyPaid, nil
	}
	s.log.Info("order paid", "order_id", o.ID, "total", o.Total, "fee", o.Fee)
	if s.cfg.OnPaid != nil {
		s.cfg.OnPaid(o.ID)
	}
	return resultPaid, nil
}

// release cancels the unpaid order o with reason; a paid one stays paid.
func (s *Server) release(ctx context.Context, o imagestore.Order, reason string) (string, error) {
	switch err := s.st.CancelOrder(ctx, o.ID, reason, s.cfg.Now().UTC()); {
	case errors.Is(err, imagestore.ErrOrderState):
		return resultIgnored, nil
	case err != nil:
		return "", err
	}
	if o.State == imagestore.OrderCancelled {
		return resultIgnored, nil
	}
	s.log.Info("order cancelled", "order_id", o.ID, "reason", reason)
	return resultCancelled, nil
}

// sweepCheckouts ends the reservations Stripe never reported on: for
// every unpaid order past its ReserveUntil, the session is expired at
// Stripe (so it can no longer be paid) and the order settled by what
// Stripe answers — paid if the buyer paid first, else cancelled. An order
// whose checkout never opened is cancelled at once. When Stripe does not
// answer, the order stays as it is until the next sweep: "could not ask"
// is never "not paid".
func (s *Server) sweepCheckouts(ctx context.Context) {
	overdue, err := s.st.OverdueOrders(ctx, s.cfg.Now().UTC())
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("listing overdue checkouts failed", "err", err.Error())
		}
		return
	}
	for _, o := range overdue {
		if ctx.Err() != nil {
			return
		}
		if o.CheckoutID == "" {
			s.cancel(ctx, o.ID, reason.CheckoutFailed, nil)
			continue
		}
		if s.cfg.Payments == nil {
			continue // keys removed since: cannot ask, so cannot release
		}
		sess, err := s.cfg.Payments.ExpireSession(ctx, o.CheckoutID)
		switch {
		case errors.Is(err, billing.ErrNotFound):
			s.cancel(ctx, o.ID, reason.CheckoutExpired, err) // Stripe's own word: no such session
			continue
		case err != nil:
			s.log.Warn("overdue checkout: Stripe did not settle it; retried at the next sweep",
				"order_id", o.ID, "err", err.Error())
			continue
		}
		var result string
		if sess.Status == billing.StatusComplete {
			result, err = s.settle(ctx, o, sess)
		} else {
			result, err = s.release(ctx, o, reason.CheckoutExpired)
		}
		if err != nil {
			s.log.Warn("overdue checkout not settled; retried at the next sweep", "order_id", o.ID, "err", err.Error())
			continue
		}
		s.log.Info("overdue checkout settled", "order_id", o.ID, "result", result)
	}
}

// refundPaidCancelled refunds a payment that came for an order already
// cancelled (its capacity may be gone): the refund is decided here and its
// first attempt made at once; RunRefunds retries it if Stripe does not
// answer now.
func (s *Server) refundPaidCancelled(ctx context.Context, o imagestore.Order, sess billing.Session) (string, error) {
	moved, err := s.st.StartRefund(ctx, o.ID, imagestore.RefundPaidAfterCancel, s.cfg.Now().UTC())
	switch {
	case errors.Is(err, imagestore.ErrDisputed):
		// Its buyer's bank disputes the payment already: the dispute
		// gives the money back, or decides it stays.
		s.log.Error("payment for an order already cancelled, and disputed: not refunded; answer the dispute in Stripe",
			"order_id", o.ID, "session", sess.ID)
		return resultPaidCancelled, nil
	case errors.Is(err, imagestore.ErrOrderState):
		// No PaymentIntent to refund: the session had none. Only a
		// person can sort this out; the alert on paidCancelled says so.
		s.log.Error("payment for an order already cancelled, and no PaymentIntent to refund: refund it in Stripe",
			"order_id", o.ID, "session", sess.ID)
		return resultPaidCancelled, nil
	case err != nil:
		return "", err
	case moved:
		s.metrics.refund(imagestore.RefundPaidAfterCancel, refundStarted)
		s.log.Warn("payment for an order already cancelled: refunding it", "order_id", o.ID, "session", sess.ID)
		s.attemptRefund(ctx, o.ID)
	}
	return resultPaidCancelled, nil
}

// refundOrderOf finds the order a refund or charge event is about: by its
// metadata's order id (our refunds carry it), else by its PaymentIntent.
// ok is false when it is none of ours.
func (s *Server) refundOrderOf(ctx context.Context, ev billing.Event) (imagestore.Order, bool, error) {
	var (
		o   imagestore.Order
		err error
	)
	if imagestore.ValidOrderID(ev.OrderID) {
		o, err = s.st.Order(ctx, ev.OrderID)
	} else {
		o, err = s.st.OrderByPaymentIntent(ctx, ev.PaymentIntent)
	}
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		s.log.Error("stripe event for no order of this edge", "event", ev.ID, "type", logText(ev.Type))
		return o, false, nil
	case err != nil:
		return o, false, err
	}
	return o, true, nil
}

// refundEvent settles an order's refund by Stripe's word on it: succeeded
// is refunded; failed or canceled is refundFailed, and the next attempt
// uses a new key. An event about another refund than the order's current
// one (an earlier generation's) changes nothing.
func (s *Server) refundEvent(ctx context.Context, ev billing.Event) (string, string, error) {
	o, ok, err := s.refundOrderOf(ctx, ev)
	if !ok || err != nil {
		return resultUnknownOrder, ev.OrderID, err
	}
	result, err := s.settleRefundEvent(ctx, o, ev)
	return result, o.ID, err
}

// settleRefundEvent is refundEvent once the order o is found.
func (s *Server) settleRefundEvent(ctx context.Context, o imagestore.Order, ev billing.Event) (string, error) {
	if !o.State.Refunding() || (o.RefundID != "" && ev.RefundID != o.RefundID) {
		return resultIgnored, nil
	}
	now := s.cfg.Now().UTC()
	var (
		out    imagestore.RefundOutcome
		result string
	)
	switch ev.RefundStatus {
	case billing.RefundSucceeded:
		out, result = imagestore.RefundOutcome{RefundID: ev.RefundID, Status: ev.RefundStatus}, resultRefunded
	case billing.RefundFailed, billing.RefundCanceled:
		out = imagestore.RefundOutcome{RefundID: ev.RefundID, Status: ev.RefundStatus, NewKey: true,
			RetryAt: now.Add(refundBackoff(o.RefundAttempts)),
			Error:   fmt.Sprintf("Stripe %s the refund: %s", ev.RefundStatus, logText(ev.FailureReason))}
		result = resultRefundFailed
	default:
		return resultIgnored, nil // pending: its end follows
	}
	if err := s.st.SettleRefund(ctx, o.ID, out, now); err != nil {
		return "", err
	}
	switch {
	case result == resultRefunded:
		s.metrics.refund(o.RefundCause, refundDone)
		s.log.Info("order refunded", "order_id", o.ID, "cause", o.RefundCause, "refund", ev.RefundID)
	case o.RefundHeld():
		s.metrics.refund(o.RefundCause, refundFailed)
		s.log.Error("refund failed at Stripe; none follows, the charge is disputed", "order_id", o.ID, "cause", o.RefundCause,
			"refund", ev.RefundID, "err", out.Error)
	default:
		s.metrics.refund(o.RefundCause, refundFailed)
		s.log.Error("refund failed at Stripe; a new one follows", "order_id", o.ID, "cause", o.RefundCause,
			"refund", ev.RefundID, "err", out.Error)
	}
	return result, nil
}

// chargeRefunded is charge.refunded: the whole charge went back. An order
// being refunded is refunded; any other order was refunded outside vmshelf
// (the Dashboard), which is logged and left to the person who did it.
func (s *Server) chargeRefunded(ctx context.Context, ev billing.Event) (string, string, error) {
	o, ok, err := s.refundOrderOf(ctx, ev)
	if !ok || err != nil {
		return resultUnknownOrder, ev.OrderID, err
	}
	if !ev.Refunded {
		return resultIgnored, o.ID, nil // a partial refund: not ours, ours are whole
	}
	if !o.State.Refunding() {
		if o.State != imagestore.OrderRefunded {
			s.log.Warn("charge refunded outside vmshelf; the order is left as it is", "order_id", o.ID, "state", string(o.State))
		}
		return resultIgnored, o.ID, nil
	}
	// Also a refund held by a dispute, which a person made by hand.
	if err := s.st.SettleRefund(ctx, o.ID, imagestore.RefundOutcome{Status: billing.RefundSucceeded}, s.cfg.Now().UTC()); err != nil {
		return "", o.ID, err
	}
	s.metrics.refund(o.RefundCause, refundDone)
	s.log.Info("order refunded", "order_id", o.ID, "cause", o.RefundCause)
	return resultRefunded, o.ID, nil
}

// disputeCreated is charge.dispute.created: the buyer's bank disputes the
// charge. The order is marked, the line logged at Error and counted (an
// alert); nothing is halted or deleted: answering a dispute is a person's
// work, in Stripe's Dashboard. From then on the order is never refunded
// automatically: a refund not yet started never is, and one decided
// before is held (the dispute gives the money back, or decides it stays).
func (s *Server) disputeCreated(ctx context.Context, ev billing.Event) (string, string, error) {
	o, ok, err := s.disputedOrder(ctx, ev)
	if !ok || err != nil {
		return resultUnknownOrder, "", err
	}
	if err := s.markDisputed(ctx, o, ev); err != nil {
		return "", o.ID, err
	}
	return resultDisputed, o.ID, nil
}

// disputedOrder finds the order of a dispute event by its PaymentIntent.
// ok is false when it is none of ours.
func (s *Server) disputedOrder(ctx context.Context, ev billing.Event) (imagestore.Order, bool, error) {
	o, err := s.st.OrderByPaymentIntent(ctx, ev.PaymentIntent)
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		s.log.Error("dispute of a charge of no order of this edge", "event", ev.ID, "type", logText(ev.Type), "dispute", logText(ev.DisputeID))
		return o, false, nil
	case err != nil:
		return o, false, err
	}
	return o, true, nil
}

// markDisputed records ev's dispute on o; the first time, it is counted
// and logged at Error.
func (s *Server) markDisputed(ctx context.Context, o imagestore.Order, ev billing.Event) error {
	moved, err := s.st.MarkOrderDisputed(ctx, o.ID, ev.DisputeID, s.cfg.Now().UTC())
	if err != nil || !moved {
		return err
	}
	s.metrics.disputes.Inc()
	attrs := []any{"order_id", o.ID, "dispute", logText(ev.DisputeID), "reason", logText(ev.DisputeReason),
		"amount", ev.Amount, "state", string(o.State)}
	if o.State.Refunding() {
		s.log.Error("payment disputed by the buyer's bank; its refund is held, never sent again: answer the dispute in Stripe", attrs...)
	} else {
		s.log.Error("payment disputed by the buyer's bank; answer it in Stripe", attrs...)
	}
	return nil
}

// disputeClosed is charge.dispute.closed: the bank decided the dispute.
// Its outcome is recorded (the first one: a late copy of another changes
// nothing), shown, counted and logged. Nothing is refunded because of it,
// then or later: lost, the bank has given the money back already; won
// (or warning_closed, prevented), it stays, and giving it back is a
// person's decision, made in Stripe's Dashboard. A closed event that
// comes before its created one records the dispute too.
func (s *Server) disputeClosed(ctx context.Context, ev billing.Event) (string, string, error) {
	o, ok, err := s.disputedOrder(ctx, ev)
	if !ok || err != nil {
		return resultUnknownOrder, "", err
	}
	if !slices.Contains(imagestore.DisputeOutcomes, ev.DisputeStatus) {
		s.log.Error("dispute closed with a status that is no decision; not recorded", "order_id", o.ID,
			"dispute", logText(ev.DisputeID), "status", logText(ev.DisputeStatus))
		return resultIgnored, o.ID, nil
	}
	if err := s.markDisputed(ctx, o, ev); err != nil {
		return "", o.ID, err
	}
	moved, err := s.st.CloseOrderDispute(ctx, o.ID, ev.DisputeStatus, s.cfg.Now().UTC())
	switch {
	case err != nil:
		return "", o.ID, err
	case !moved:
		return resultIgnored, o.ID, nil
	}
	s.metrics.disputeClosed(ev.DisputeStatus)
	attrs := []any{"order_id", o.ID, "dispute", logText(ev.DisputeID), "outcome", ev.DisputeStatus,
		"amount", ev.Amount, "state", string(o.State)}
	if ev.DisputeStatus == imagestore.DisputeLost {
		s.log.Warn("dispute closed: the buyer's bank gave the payment back; vmshelf refunds nothing", attrs...)
	} else {
		s.log.Info("dispute closed: the payment stays; vmshelf refunds nothing by itself", attrs...)
	}
	return resultDisputeClosed, o.ID, nil
}
