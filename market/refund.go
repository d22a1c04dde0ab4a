package market

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/imagestore"
)

// DefaultRefundDeadline is Config.RefundDeadline's default: a paid order
// that is not active a day after its payment, for a cause that will not
// pass by itself, is refunded.
const DefaultRefundDeadline = 24 * time.Hour

// The timing of refund attempts. A claim holds an attempt for longer than
// one Stripe call can take (billing.DefaultTimeout, 15 s), so a replica
// never takes over an attempt that is still running; one that died
// (kill -9 between Stripe's answer and the store) is taken over after it,
// with the same idempotency key, and Stripe answers with the refund it
// made. A pending refund is looked at again after refundRecheck (the
// refund.updated event normally settles it first).
const (
	refundClaim      = time.Minute
	refundRecheck    = time.Hour
	refundBackoffMin = time.Minute
	refundBackoffMax = time.Hour
)

// The outcomes of vmshelf_refunds_total: a refund decided (started), and
// what each attempt's answer was.
const (
	refundStarted  = "started"  // the order moved to refunding
	refundDone     = "refunded" // Stripe refunded it
	refundPending  = "pending"  // Stripe took it, not yet done
	refundFailed   = "failed"   // Stripe failed the refund itself; a new one follows
	refundError    = "error"    // Stripe did not answer, or refused the request
	refundDisputed = "disputed" // Stripe refused it for the charge's dispute: held, never sent again
	refundOutcomes = "started refunded pending failed error disputed"
)

// refundBackoff is the wait before attempt n+1 after n failed ones:
// doubling from a minute, at most an hour.
func refundBackoff(attempts int) time.Duration {
	d := refundBackoffMin
	for i := 1; i < attempts && d < refundBackoffMax; i++ {
		d *= 2
	}
	return min(d, refundBackoffMax)
}

// RunRefunds decides and sends refunds now and then every `every` until
// ctx is done (refundOnce). Every replica runs it: deciding a refund is
// one conditional move of the order, and each attempt is claimed in the
// store, so two replicas never send the same attempt, and the idempotency
// key makes even a repeat one refund at Stripe.
func (s *Server) RunRefunds(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.refundOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refundOnce decides the refunds that are due (decideRefunds) and sends
// every attempt whose time has come. Failures are logged; the next round
// tries again.
func (s *Server) refundOnce(ctx context.Context) {
	if s.cfg.Payments == nil {
		return // cannot refund; the orders stay as they are
	}
	s.decideRefunds(ctx)
	due, err := s.st.DueRefunds(ctx, s.cfg.Now().UTC())
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("listing due refunds failed", "err", err.Error())
		}
		return
	}
	for _, o := range due {
		if ctx.Err() != nil {
			return
		}
		s.attemptRefund(ctx, o.ID)
	}
	if s.afterRefunds != nil {
		s.afterRefunds()
	}
}

// decideRefunds starts the refund of every order that cannot run and will
// not: a paid order not active by its deadline whose provisioner named a
// cause (Order.BlockedCause), and an active order whose own image's import
// failed for good and that never ran. Without a named cause nothing is
// decided: the cluster not answering is no reason to give money back.
func (s *Server) decideRefunds(ctx context.Context) {
	now := s.cfg.Now().UTC()
	for _, st := range []imagestore.OrderState{imagestore.OrderPaid, imagestore.OrderActive} {
		orders, err := s.st.OrdersInState(ctx, st)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error("listing orders for refunds failed", "state", string(st), "err", err.Error())
			}
			return
		}
		for _, o := range orders {
			cause := refundCause(o, now, s.refundDeadline())
			if cause == "" {
				continue
			}
			s.startRefund(ctx, o, cause)
		}
	}
}

func (s *Server) refundDeadline() time.Duration {
	if s.cfg.RefundDeadline > 0 {
		return s.cfg.RefundDeadline
	}
	return DefaultRefundDeadline
}

// refundCause is the refund cause of o at now, or "" if o is not to be
// refunded: its deadline (deadline after its payment) has passed and its
// provisioner names a cause; an active order only for a failed import of a
// machine that never ran. A disputed order never is: the bank gives the
// money back through the dispute, or decides it stays, and a refund
// besides would pay the buyer twice (Stripe refuses it anyway:
// charge_disputed).
func refundCause(o imagestore.Order, now time.Time, deadline time.Duration) string {
	if o.BlockedCause == "" || !o.DisputedAt.IsZero() || now.Before(o.PaidAt.Add(deadline)) {
		return ""
	}
	switch {
	case o.State == imagestore.OrderPaid && o.BlockedCause == imagestore.BlockedImportFailed:
		return imagestore.RefundImportFailed
	case o.State == imagestore.OrderPaid:
		return imagestore.RefundNotProvisioned
	case o.State == imagestore.OrderActive && o.BlockedCause == imagestore.BlockedImportFailed && o.RanAt.IsZero():
		return imagestore.RefundImportFailed
	}
	return ""
}

// startRefund moves o to refunding for cause, first recording its
// PaymentIntent if the order was paid before vmshelf recorded them (read
// from its checkout session). Whether this replica or another moved it,
// the attempt follows in the same round.
func (s *Server) startRefund(ctx context.Context, o imagestore.Order, cause string) {
	if o.PaymentIntent == "" && o.CheckoutID != "" {
		sess, err := s.cfg.Payments.Session(ctx, o.CheckoutID)
		if err != nil || sess.PaymentIntent == "" {
			s.log.Warn("refund due but its PaymentIntent is unknown; retried", "order_id", o.ID, "cause", cause, "err", errText(err))
			return
		}
		if err := s.st.SetOrderPaymentIntent(ctx, o.ID, sess.PaymentIntent); err != nil {
			s.log.Error("recording the PaymentIntent of a refund failed", "order_id", o.ID, "err", err.Error())
			return
		}
	}
	moved, err := s.st.StartRefund(ctx, o.ID, cause, s.cfg.Now().UTC())
	switch {
	case errors.Is(err, imagestore.ErrDisputed):
		// Disputed since it was listed: the dispute decides.
		s.log.Info("refund not started: the order's charge is disputed", "order_id", o.ID, "cause", cause)
	case errors.Is(err, imagestore.ErrOrderState):
		// It became active (or ran) first: it runs, nothing to give back.
		s.log.Info("refund not started: the order runs", "order_id", o.ID, "cause", cause)
	case err != nil:
		s.log.Error("starting a refund failed; retried", "order_id", o.ID, "cause", cause, "err", err.Error())
	case moved:
		s.metrics.refund(cause, refundStarted)
		s.log.Warn("refund decided: the order cannot run", "order_id", o.ID, "cause", cause,
			"blocked", o.BlockedCause, "total", o.Total, "currency", o.Currency)
	}
}

// attemptRefund claims the due attempt of order id's refund and, if this
// caller got it, asks Stripe and records the answer. The claim is refused
// for an order whose charge is disputed, also when the dispute came after
// the order was listed as due; a dispute that comes after the claim is
// Stripe's to see: it refuses the refund (charge_disputed), or it made
// the refund first and the money moved once.
func (s *Server) attemptRefund(ctx context.Context, id string) {
	now := s.cfg.Now().UTC()
	claim := s.cfg.RefundClaim
	if claim <= 0 {
		claim = refundClaim
	}
	o, claimed, err := s.st.ClaimRefund(ctx, id, now, now.Add(claim))
	if err != nil {
		s.log.Error("claiming a refund attempt failed; retried", "order_id", id, "err", err.Error())
		return
	}
	if !claimed {
		return // another replica's, or not due any more
	}
	rf, err := s.cfg.Payments.Refund(ctx, billing.RefundRequest{OrderID: o.ID, Cause: o.RefundCause,
		PaymentIntent: o.PaymentIntent, Generation: o.RefundGeneration})
	out, outcome := refundOutcome(rf, err, s.cfg.Now().UTC(), o.RefundAttempts)
	if serr := s.st.SettleRefund(context.WithoutCancel(ctx), o.ID, out, s.cfg.Now().UTC()); serr != nil {
		// Stripe's answer is not recorded: the claim runs out, and the
		// next attempt sends the same key and hears the same refund.
		s.log.Error("recording Stripe's refund answer failed; asked again", "order_id", o.ID, "err", serr.Error())
		return
	}
	s.metrics.refund(o.RefundCause, outcome)
	attrs := []any{"order_id", o.ID, "cause", o.RefundCause, "attempt", o.RefundAttempts, "refund", out.RefundID, "outcome", outcome}
	switch outcome {
	case refundDone:
		s.log.Info("order refunded", append(attrs, "total", o.Total, "currency", o.Currency)...)
	case refundPending:
		s.log.Info("refund pending at Stripe", attrs...)
	case refundDisputed:
		s.log.Error("refund held: Stripe refused it, the buyer's bank disputes the charge (charge_disputed); "+
			"never sent again, the dispute decides: answer it in Stripe", attrs...)
	default:
		// An alert (vmshelf_orders{state="refundFailed"}) follows if it
		// stays so; the line says why.
		s.log.Error("refund failed; retried", append(attrs, "err", out.Error, "retry_at", out.RetryAt)...)
	}
}

// refundOutcome turns Stripe's answer to attempt n (1 the first) into the
// store's record and the metric's outcome.
func refundOutcome(rf billing.Refund, err error, now time.Time, attempts int) (imagestore.RefundOutcome, string) {
	retry := now.Add(refundBackoff(attempts))
	switch {
	case errors.Is(err, billing.ErrAlreadyRefunded):
		// Refunded already (an earlier key, or by hand): the money is back.
		return imagestore.RefundOutcome{Status: billing.RefundSucceeded}, refundDone
	case errors.Is(err, billing.ErrChargeDisputed):
		// Asking again gets the same answer, and if it did not, the buyer
		// would be paid twice: held, not retried.
		return imagestore.RefundOutcome{Disputed: true,
			Error: "Stripe refused the refund: the buyer's bank disputes the charge (charge_disputed)"}, refundDisputed
	case err != nil:
		return imagestore.RefundOutcome{Error: "Stripe: " + err.Error(), RetryAt: retry}, refundError
	}
	switch rf.Status {
	case billing.RefundSucceeded:
		return imagestore.RefundOutcome{RefundID: rf.ID, Status: rf.Status}, refundDone
	case billing.RefundPending, billing.RefundRequiresAction:
		return imagestore.RefundOutcome{RefundID: rf.ID, Status: rf.Status, RetryAt: now.Add(refundRecheck)}, refundPending
	}
	reason := rf.FailureReason
	if reason == "" {
		reason = "no reason given"
	}
	return imagestore.RefundOutcome{RefundID: rf.ID, Status: rf.Status, NewKey: true, RetryAt: retry,
		Error: fmt.Sprintf("Stripe %s the refund: %s", rf.Status, reason)}, refundFailed
}

// errText is err's text for a log line, or "".
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
