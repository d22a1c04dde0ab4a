package market

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// errOrderUnknown answers a cancel of an order the tenant did not buy:
// the host of the order, every other tenant and an id that names nothing
// hear the same.
var errOrderUnknown = apierr.New(reason.OrderUnknown)

// What became of a cancelled order's checkout at Stripe: the checkout
// label of vmshelf_orders_cancelled_total.
const (
	checkoutExpired     = "expired"     // Stripe expired it: it can be paid no more
	checkoutPaidFirst   = "paid"        // the buyer had paid it before the cancel: refunded
	checkoutUnconfirmed = "unconfirmed" // Stripe did not confirm the expiry: a payment before the checkout runs out is refunded
	checkoutNone        = "none"        // the order has no checkout Stripe knows
	checkoutOutcomes    = "expired paid unconfirmed none"
)

type orderIDRequest struct {
	OrderID string `json:"order_id"`
}

// cancelOrder is POST /market/vms/orders/cancel: the buyer gives up one of
// its orders awaiting payment. The store's cancel decides, in the
// conditional change a payment also needs, so of a cancel and a payment
// landing together exactly one wins, and it frees the replicas at once.
// The checkout is expired at Stripe afterwards, so the buyer can pay it no
// more; a payment that reached Stripe first is one for a cancelled order,
// refunded by that rule. Once the order is cancelled this runs to its end,
// within checkoutBound, whether or not the buyer still waits. The answer
// is the order as status shows it.
func (s *Server) cancelOrder(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	var req orderIDRequest
	if err := s.decodeBody(w, r, &req, false); err != nil {
		s.fail(w, r, err)
		return
	}
	if !imagestore.ValidOrderID(req.OrderID) {
		s.fail(w, r, errOrderUnknown)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), checkoutBound)
	defer cancel()
	if err := s.cancelByBuyer(ctx, t.ID, req.OrderID, reason.BuyerCancelled); err != nil {
		s.fail(w, r, err)
		return
	}
	o, err := s.st.Order(ctx, req.OrderID)
	if err != nil {
		s.fail(w, r, aboutOrder(req.OrderID, err))
		return
	}
	checkout := s.expireCheckout(ctx, o)
	s.metrics.ordersCancelled.WithLabelValues(checkout).Inc()
	s.log.Info("order cancelled by its buyer", "order_id", o.ID, "buyer", t.Name, "listing_id", o.ListingID,
		"quantity", o.Quantity, "checkout", checkout)
	if now, err := s.st.Order(ctx, o.ID); err == nil {
		o = now // refunding, when the buyer had paid first
	}
	host := ""
	if h, err := s.st.TenantByID(ctx, o.HostID); err == nil {
		host = h.Name
	}
	s.writeJSON(w, r, http.StatusOK, s.orderOf(o, host, nil))
}

// cancelByBuyer cancels buyerID's order orderID awaiting payment with
// reason, and says in the buyer's words why it could not.
func (s *Server) cancelByBuyer(ctx context.Context, buyerID int64, orderID, reason string) error {
	err := s.st.CancelOwnOrder(ctx, buyerID, orderID, reason, s.cfg.Now().UTC())
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		return errOrderUnknown
	case errors.Is(err, imagestore.ErrOrderState):
		o, rerr := s.st.Order(ctx, orderID)
		if rerr != nil {
			return rerr
		}
		return errNotAwaitingPayment(o)
	}
	return err
}

// errNotAwaitingPayment is the 409 of a cancel of o, which is not awaiting
// payment: what it is instead, and what that means for it.
func errNotAwaitingPayment(o imagestore.Order) error {
	var what string
	switch o.State {
	case imagestore.OrderCancelled:
		what = "this one is cancelled already"
		if o.Reason != "" {
			what += " (" + o.Reason + ")"
		}
	case imagestore.OrderPaid, imagestore.OrderActive:
		what = "this one is paid: its machines run until the paid month is over"
	case imagestore.OrderExpired:
		what = "this one's paid month is over"
	default: // refunding, refundFailed, refunded
		what = fmt.Sprintf("this one's payment is being given back (%s)", o.State)
	}
	return apierr.New(reason.OrderNotAwaitingPayment).
		WithMsg("only an order awaiting payment can be cancelled; " + what)
}

// expireCheckout makes sure the checkout of o, cancelled now, can no
// longer be paid, and says what became of it. What Stripe answers is
// settled as the sweeper settles an overdue checkout: a checkout the
// buyer completed first is a payment for a cancelled order, refunded now
// (settle's rule), and its event later refunds nothing more. When Stripe
// does not answer the order stays cancelled: the checkout runs out by
// itself, and a payment before that is refunded when its event comes.
func (s *Server) expireCheckout(ctx context.Context, o imagestore.Order) string {
	if o.CheckoutID == "" {
		return checkoutNone
	}
	sess, err := s.cfg.Payments.ExpireSession(ctx, o.CheckoutID)
	switch {
	case errors.Is(err, billing.ErrNotFound):
		return checkoutNone
	case err != nil:
		s.log.Warn("cancelled order's checkout not expired at Stripe; a payment before it runs out is refunded",
			"order_id", o.ID, "err", err.Error())
		return checkoutUnconfirmed
	case sess.Status != billing.StatusComplete:
		return checkoutExpired
	}
	result, err := s.settle(ctx, o, sess)
	switch {
	case err != nil:
		s.log.Warn("cancelled order was paid first; its refund is settled by Stripe's event or the next refund round",
			"order_id", o.ID, "err", err.Error())
	case result == resultPaidCancelled:
		return checkoutPaidFirst
	}
	return checkoutUnconfirmed
}
