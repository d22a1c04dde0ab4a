package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// chargedOrder is paidOrder of one replica with its PaymentIntent
// recorded, as the webhook does.
func chargedOrder(t *testing.T, s imagestore.Store, l imagestore.Listing, h, b imagestore.Tenant, id string) imagestore.Order {
	t.Helper()
	paidOrder(t, s, l, h, b, id, 1)
	must(t, "SetOrderPaymentIntent", s.SetOrderPaymentIntent(t.Context(), id, "pi_"+id))
	return getOrder(t, s, id)
}

// refundTo moves the paid order o to state (refunding, refundFailed or
// refunded) through the store's own changes at now, and sets in o what
// the store should now say.
func refundTo(t *testing.T, s imagestore.Store, o *imagestore.Order, state imagestore.OrderState, now time.Time) {
	t.Helper()
	ctx := t.Context()
	must(t, "SetOrderPaymentIntent", s.SetOrderPaymentIntent(ctx, o.ID, "pi_"+o.ID))
	if moved, err := s.StartRefund(ctx, o.ID, imagestore.RefundNotProvisioned, now); err != nil || !moved {
		t.Fatalf("StartRefund = %v, %v", moved, err)
	}
	o.PaymentIntent, o.RefundFrom, o.RefundCause = "pi_"+o.ID, o.State, imagestore.RefundNotProvisioned
	o.State, o.RefundNextAt = imagestore.OrderRefunding, now
	switch state {
	case imagestore.OrderRefundFailed:
		must(t, "SettleRefund", s.SettleRefund(ctx, o.ID, imagestore.RefundOutcome{Error: "stripe unavailable", RetryAt: now.Add(time.Minute)}, now))
		o.State, o.RefundError, o.RefundNextAt = imagestore.OrderRefundFailed, "stripe unavailable", now.Add(time.Minute)
	case imagestore.OrderRefunded:
		must(t, "SettleRefund", s.SettleRefund(ctx, o.ID, imagestore.RefundOutcome{RefundID: "re_" + o.ID, Status: "succeeded"}, now))
		o.State, o.RefundID, o.RefundedAt, o.RefundNextAt = imagestore.OrderRefunded, "re_"+o.ID, now, time.Time{}
	}
}

func testPaymentIntent(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h, b := newHost(t, s, "host"), newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 5, t0)
	o := chargedOrder(t, s, l, h, b, "o1")
	if o.PaymentIntent != "pi_o1" {
		t.Errorf("PaymentIntent %q, want pi_o1", o.PaymentIntent)
	}
	must(t, "SetOrderPaymentIntent again", s.SetOrderPaymentIntent(ctx, o.ID, "pi_o1"))
	if err := s.SetOrderPaymentIntent(ctx, o.ID, "pi_other"); !errors.Is(err, imagestore.ErrOrderState) {
		t.Errorf("another PaymentIntent: %v, want ErrOrderState", err)
	}
	if err := s.SetOrderPaymentIntent(ctx, "o-none", "pi_x"); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("unknown order: %v, want ErrNotFound", err)
	}
	got, err := s.OrderByPaymentIntent(ctx, "pi_o1")
	if err != nil || got.ID != o.ID {
		t.Errorf("OrderByPaymentIntent = %q, %v; want %s", got.ID, err, o.ID)
	}
	for _, pi := range []string{"pi_none", ""} {
		if _, err := s.OrderByPaymentIntent(ctx, pi); !errors.Is(err, imagestore.ErrNotFound) {
			t.Errorf("OrderByPaymentIntent(%q): %v, want ErrNotFound", pi, err)
		}
	}
}

func testOrderBlocked(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h, b := newHost(t, s, "host"), newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 5, t0)
	o := chargedOrder(t, s, l, h, b, "o1")
	must(t, "SetOrderBlocked", s.SetOrderBlocked(ctx, o.ID, imagestore.BlockedImageGone, t0))
	must(t, "SetOrderBlocked again later", s.SetOrderBlocked(ctx, o.ID, imagestore.BlockedImageGone, t0.Add(time.Hour)))
	if got := getOrder(t, s, o.ID); got.BlockedCause != imagestore.BlockedImageGone || !got.BlockedSince.Equal(t0) {
		t.Errorf("blocked %q since %v, want %q since the first report %v", got.BlockedCause, got.BlockedSince, imagestore.BlockedImageGone, t0)
	}
	must(t, "SetOrderBlocked another cause", s.SetOrderBlocked(ctx, o.ID, imagestore.BlockedHostGone, t0.Add(2*time.Hour)))
	if got := getOrder(t, s, o.ID); !got.BlockedSince.Equal(t0.Add(2 * time.Hour)) {
		t.Errorf("a new cause keeps since %v, want its own %v", got.BlockedSince, t0.Add(2*time.Hour))
	}
	must(t, "SetOrderBlocked clear", s.SetOrderBlocked(ctx, o.ID, "", t0.Add(3*time.Hour)))
	if got := getOrder(t, s, o.ID); got.BlockedCause != "" || !got.BlockedSince.IsZero() {
		t.Errorf("cleared: %q since %v, want none", got.BlockedCause, got.BlockedSince)
	}
	if err := s.SetOrderBlocked(ctx, o.ID, "cannotAsk", t0); err == nil {
		t.Error("a cause that is not one of BlockedCauses was stored")
	}
	if err := s.SetOrderBlocked(ctx, "o-none", imagestore.BlockedHostGone, t0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("unknown order: %v, want ErrNotFound", err)
	}
}

// testRefundStates walks a refund through every state and every refusal.
func testRefundStates(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h, b := newHost(t, s, "host"), newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 5, t0)
	o := chargedOrder(t, s, l, h, b, "o1")
	if got := getListing(t, s, l.ID); got.Running != 1 {
		t.Fatalf("running %d before the refund, want 1", got.Running)
	}

	now := t0.Add(time.Hour)
	if moved, err := s.StartRefund(ctx, o.ID, "whim", now); err == nil || moved {
		t.Errorf("StartRefund with an unknown cause = %v, %v; want an error", moved, err)
	}
	if moved, err := s.StartRefund(ctx, o.ID, imagestore.RefundNotProvisioned, now); err != nil || !moved {
		t.Fatalf("StartRefund = %v, %v; want true, nil", moved, err)
	}
	if moved, err := s.StartRefund(ctx, o.ID, imagestore.RefundNotProvisioned, now); err != nil || moved {
		t.Errorf("StartRefund again = %v, %v; want false, nil", moved, err)
	}
	if err := s.MarkOrderActive(ctx, o.ID); !errors.Is(err, imagestore.ErrOrderState) {
		t.Errorf("MarkOrderActive of a refunding order: %v, want ErrOrderState", err)
	}
	got := getOrder(t, s, o.ID)
	if got.State != imagestore.OrderRefunding || got.RefundFrom != imagestore.OrderPaid || got.RefundCause != imagestore.RefundNotProvisioned ||
		!got.RefundNextAt.Equal(now) || !got.PaidAt.Equal(t0) {
		t.Errorf("after StartRefund: %s from %s, cause %q, next %v, paid %v", got.State, got.RefundFrom, got.RefundCause, got.RefundNextAt, got.PaidAt)
	}
	if got := getListing(t, s, l.ID); got.Running != 0 || got.Reserved != 0 {
		t.Errorf("a refunding order holds %d running, %d reserved; want none", got.Running, got.Reserved)
	}
	if n, err := s.OrderCounts(ctx); err != nil || n[imagestore.OrderRefunding] != 1 || n[imagestore.OrderRefunded] != 0 {
		t.Errorf("OrderCounts = %v, %v", n, err)
	}

	// Due at now, claimed once, due again at until.
	if due, err := s.DueRefunds(ctx, now.Add(-time.Nanosecond)); err != nil || len(due) != 0 {
		t.Errorf("DueRefunds before its time = %v, %v; want none", orderIDs(due), err)
	}
	if due, err := s.DueRefunds(ctx, now); err != nil || len(due) != 1 {
		t.Fatalf("DueRefunds = %v, %v; want o1", orderIDs(due), err)
	}
	until := now.Add(time.Minute)
	c, claimed, err := s.ClaimRefund(ctx, o.ID, now, until)
	if err != nil || !claimed || c.RefundAttempts != 1 || !c.RefundNextAt.Equal(until) {
		t.Fatalf("ClaimRefund = %v, %v (attempts %d, next %v)", claimed, err, c.RefundAttempts, c.RefundNextAt)
	}
	if _, claimed, err := s.ClaimRefund(ctx, o.ID, now, until); err != nil || claimed {
		t.Errorf("a second claim = %v, %v; want false, nil", claimed, err)
	}

	// Stripe failed the refund: refundFailed, a new key, due at RetryAt.
	retry := now.Add(10 * time.Minute)
	must(t, "SettleRefund failed", s.SettleRefund(ctx, o.ID, imagestore.RefundOutcome{RefundID: "re_1", Status: "failed",
		Error: "insufficient funds", NewKey: true, RetryAt: retry}, now))
	got = getOrder(t, s, o.ID)
	if got.State != imagestore.OrderRefundFailed || got.RefundGeneration != 1 || got.RefundError != "insufficient funds" ||
		!got.RefundNextAt.Equal(retry) || got.RefundID != "re_1" {
		t.Errorf("after a failed refund: %s gen %d error %q next %v id %q", got.State, got.RefundGeneration, got.RefundError, got.RefundNextAt, got.RefundID)
	}
	// Stripe did not answer: refundFailed, the same key.
	must(t, "SettleRefund unanswered", s.SettleRefund(ctx, o.ID, imagestore.RefundOutcome{Error: "stripe unavailable", RetryAt: retry}, now))
	if got := getOrder(t, s, o.ID); got.RefundGeneration != 1 || got.RefundID != "re_1" {
		t.Errorf("an unanswered attempt changed the key (gen %d) or the refund id (%q)", got.RefundGeneration, got.RefundID)
	}
	// Pending: refunding again.
	must(t, "SettleRefund pending", s.SettleRefund(ctx, o.ID, imagestore.RefundOutcome{RefundID: "re_2", Status: "pending", RetryAt: retry}, now))
	if got := getOrder(t, s, o.ID); got.State != imagestore.OrderRefunding || got.RefundError != "" {
		t.Errorf("after a pending refund: %s, error %q", got.State, got.RefundError)
	}
	done := now.Add(20 * time.Minute)
	must(t, "SettleRefund succeeded", s.SettleRefund(ctx, o.ID, imagestore.RefundOutcome{RefundID: "re_2", Status: "succeeded"}, done))
	got = getOrder(t, s, o.ID)
	if got.State != imagestore.OrderRefunded || !got.RefundedAt.Equal(done) || !got.RefundNextAt.IsZero() || got.RefundID != "re_2" {
		t.Errorf("after the refund: %s at %v, next %v, id %q", got.State, got.RefundedAt, got.RefundNextAt, got.RefundID)
	}
	must(t, "SettleRefund replayed", s.SettleRefund(ctx, o.ID, imagestore.RefundOutcome{Status: "failed", RetryAt: retry}, done))
	if got := getOrder(t, s, o.ID); got.State != imagestore.OrderRefunded {
		t.Errorf("a late failure moved a refunded order to %s", got.State)
	}
	if moved, err := s.StartRefund(ctx, o.ID, imagestore.RefundPaidAfterCancel, done); err != nil || moved {
		t.Errorf("StartRefund of a refunded order = %v, %v; want false, nil", moved, err)
	}
	if due, err := s.DueRefunds(ctx, done.Add(time.Hour)); err != nil || len(due) != 0 {
		t.Errorf("DueRefunds after the refund = %v, %v; want none", orderIDs(due), err)
	}

	// Refused: an active order, one awaiting payment, one cancelled
	// without a payment, one paid without a recorded PaymentIntent.
	a := chargedOrder(t, s, l, h, b, "o2")
	must(t, "MarkOrderActive", s.MarkOrderActive(ctx, a.ID))
	u := placeOrder(t, s, orderOf(l, h, b, "o3", 1, t0), "")
	c3 := placeOrder(t, s, orderOf(l, h, b, "o4", 1, t0), "")
	must(t, "CancelOrder", s.CancelOrder(ctx, c3.ID, "checkoutExpired", t0))
	p := paidOrder(t, s, l, h, b, "o5", 1)
	for _, id := range []string{a.ID, u.ID, c3.ID, p.ID} {
		if moved, err := s.StartRefund(ctx, id, imagestore.RefundNotProvisioned, now); !errors.Is(err, imagestore.ErrOrderState) || moved {
			t.Errorf("StartRefund of %s (%s) = %v, %v; want ErrOrderState", id, getOrder(t, s, id).State, moved, err)
		}
	}
	if _, err := s.StartRefund(ctx, "o-none", imagestore.RefundNotProvisioned, now); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("StartRefund of no order: %v, want ErrNotFound", err)
	}
	if err := s.SettleRefund(ctx, a.ID, imagestore.RefundOutcome{Status: "succeeded"}, now); !errors.Is(err, imagestore.ErrOrderState) {
		t.Errorf("SettleRefund of an active order: %v, want ErrOrderState", err)
	}

	// A payment that came for a cancelled order: refunded from cancelled,
	// keeping its end.
	must(t, "SetOrderPaymentIntent", s.SetOrderPaymentIntent(ctx, c3.ID, "pi_o4"))
	if moved, err := s.StartRefund(ctx, c3.ID, imagestore.RefundPaidAfterCancel, now); err != nil || !moved {
		t.Fatalf("StartRefund of a paid cancelled order = %v, %v", moved, err)
	}
	if got := getOrder(t, s, c3.ID); got.RefundFrom != imagestore.OrderCancelled || !got.EndedAt.Equal(t0) || got.Reason != "checkoutExpired" {
		t.Errorf("refunding from cancelled: from %s, ended %v, reason %q", got.RefundFrom, got.EndedAt, got.Reason)
	}
}

// testRefundExcludesActive: the refund and the provisioner race for the
// same paid orders; each order ends in exactly one of the two.
func testRefundExcludesActive(t *testing.T, s imagestore.Store) {
	const n = 12
	ctx := t.Context()
	h, b := newHost(t, s, "host"), newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", n, t0)
	ids := make([]string, n)
	for i := range n {
		ids[i] = chargedOrder(t, s, l, h, b, "o"+string(rune('a'+i))).ID
	}
	start := make(chan struct{})
	refunded := make([]bool, n)
	activeErr := make([]error, n)
	refundErr := make([]error, n)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { <-start; activeErr[i] = s.MarkOrderActive(ctx, id) })
		wg.Go(func() {
			<-start
			refunded[i], refundErr[i] = s.StartRefund(ctx, id, imagestore.RefundNotProvisioned, t0)
		})
	}
	close(start)
	wg.Wait()
	for i, id := range ids {
		activated := activeErr[i] == nil
		if activeErr[i] != nil && !errors.Is(activeErr[i], imagestore.ErrOrderState) {
			t.Errorf("%s: MarkOrderActive: %v", id, activeErr[i])
		}
		if refundErr[i] != nil && !errors.Is(refundErr[i], imagestore.ErrOrderState) {
			t.Errorf("%s: StartRefund: %v", id, refundErr[i])
		}
		want := imagestore.OrderActive
		if refunded[i] {
			want = imagestore.OrderRefunding
		}
		got := getOrder(t, s, id).State
		if activated == refunded[i] || got != want {
			t.Errorf("%s: activated %v, refund started %v, state %s: want exactly one of the two", id, activated, refunded[i], got)
		}
	}
}

// testClaimRefundConcurrent: of concurrent claims of one due refund (two
// replicas, a restart) exactly one gets the attempt.
func testClaimRefundConcurrent(t *testing.T, s imagestore.Store) {
	const n = 10
	ctx := t.Context()
	h, b := newHost(t, s, "host"), newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 5, t0)
	o := chargedOrder(t, s, l, h, b, "o1")
	if _, err := s.StartRefund(ctx, o.ID, imagestore.RefundImportFailed, t0); err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	claimed := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { <-start; _, claimed[i], errs[i] = s.ClaimRefund(ctx, o.ID, t0, t0.Add(time.Minute)) })
	}
	close(start)
	wg.Wait()
	count := 0
	for i := range n {
		must(t, "ClaimRefund", errs[i])
		if claimed[i] {
			count++
		}
	}
	if count != 1 {
		t.Errorf("%d of %d concurrent claims got the refund, want exactly 1", count, n)
	}
	if got := getOrder(t, s, o.ID); got.RefundAttempts != 1 {
		t.Errorf("attempts %d, want 1", got.RefundAttempts)
	}
}

func testOrderDisputed(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h, b := newHost(t, s, "host"), newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 5, t0)
	o := chargedOrder(t, s, l, h, b, "o1")
	must(t, "MarkOrderActive", s.MarkOrderActive(ctx, o.ID))
	if moved, err := s.MarkOrderDisputed(ctx, o.ID, "du_1", t0); err != nil || !moved {
		t.Fatalf("MarkOrderDisputed = %v, %v", moved, err)
	}
	if moved, err := s.MarkOrderDisputed(ctx, o.ID, "du_2", t0.Add(time.Hour)); err != nil || moved {
		t.Errorf("a second dispute = %v, %v; want false, nil", moved, err)
	}
	got := getOrder(t, s, o.ID)
	if got.DisputeID != "du_1" || !got.DisputedAt.Equal(t0) || got.State != imagestore.OrderActive {
		t.Errorf("disputed: %q at %v, state %s; want du_1 at %v, still active", got.DisputeID, got.DisputedAt, got.State, t0)
	}
	if _, err := s.MarkOrderDisputed(ctx, "o-none", "du_3", t0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("unknown order: %v, want ErrNotFound", err)
	}
	if _, err := s.MarkOrderDisputed(ctx, o.ID, "", t0); err == nil {
		t.Error("a dispute without an id was recorded")
	}
}

// testDisputeHoldsRefund: a disputed order is never refunded by the
// store's moves: its refund is not started, a refund already decided is
// neither due nor claimed again, a failure of one sent before stays
// refunding (held) rather than refundFailed, and Stripe's own refusal
// (charge_disputed) holds the refund and marks the order before the
// dispute's event does. Money that did move is still recorded.
func testDisputeHoldsRefund(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h, b := newHost(t, s, "host"), newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 10, t0)
	now := t0.Add(time.Hour)

	// Disputed before the decision: the refund is never started.
	p := chargedOrder(t, s, l, h, b, "o1")
	if moved, err := s.MarkOrderDisputed(ctx, p.ID, "du_1", t0); err != nil || !moved {
		t.Fatalf("MarkOrderDisputed = %v, %v", moved, err)
	}
	if moved, err := s.StartRefund(ctx, p.ID, imagestore.RefundNotProvisioned, now); !errors.Is(err, imagestore.ErrDisputed) || moved {
		t.Errorf("StartRefund of a disputed order = %v, %v; want ErrDisputed", moved, err)
	}
	if got := getOrder(t, s, p.ID); got.State != imagestore.OrderPaid || got.RefundHeld() {
		t.Errorf("the disputed order is %s (held %v), want paid", got.State, got.RefundHeld())
	}

	// Disputed after the decision, with an attempt failed: held.
	f := chargedOrder(t, s, l, h, b, "o2")
	refundTo(t, s, &f, imagestore.OrderRefundFailed, now)
	if moved, err := s.MarkOrderDisputed(ctx, f.ID, "du_2", now); err != nil || !moved {
		t.Fatalf("MarkOrderDisputed of a refund that failed = %v, %v", moved, err)
	}
	got := getOrder(t, s, f.ID)
	if got.State != imagestore.OrderRefunding || !got.RefundHeld() || got.DisputeID != "du_2" || !got.DisputedAt.Equal(now) {
		t.Errorf("after the dispute: %s, held %v, dispute %q at %v; want refunding, held", got.State, got.RefundHeld(), got.DisputeID, got.DisputedAt)
	}
	later := now.Add(24 * time.Hour)
	if due, err := s.DueRefunds(ctx, later); err != nil || len(due) != 0 {
		t.Errorf("DueRefunds = %v, %v; want none: the refund is held", orderIDs(due), err)
	}
	if _, claimed, err := s.ClaimRefund(ctx, f.ID, later, later.Add(time.Minute)); err != nil || claimed {
		t.Errorf("ClaimRefund of a held refund = %v, %v; want false, nil", claimed, err)
	}
	// The answer to an attempt sent before the dispute: a failure keeps
	// it held, a success is the money back.
	must(t, "SettleRefund failed", s.SettleRefund(ctx, f.ID, imagestore.RefundOutcome{RefundID: "re_2", Status: "failed",
		Error: "insufficient funds", NewKey: true, RetryAt: later}, later))
	if got := getOrder(t, s, f.ID); got.State != imagestore.OrderRefunding || !got.RefundHeld() {
		t.Errorf("a failure of a held refund made it %s, want refunding, held", got.State)
	}
	must(t, "SettleRefund succeeded", s.SettleRefund(ctx, f.ID, imagestore.RefundOutcome{RefundID: "re_2", Status: "succeeded"}, later))
	if got := getOrder(t, s, f.ID); got.State != imagestore.OrderRefunded || got.RefundHeld() || got.DisputeID != "du_2" {
		t.Errorf("a success of a held refund: %s (held %v, dispute %q), want refunded, still disputed", got.State, got.RefundHeld(), got.DisputeID)
	}

	// Stripe refused the refund for the dispute before its event came.
	r := chargedOrder(t, s, l, h, b, "o3")
	refundTo(t, s, &r, imagestore.OrderRefunding, now)
	c, claimed, err := s.ClaimRefund(ctx, r.ID, now, now.Add(time.Minute))
	if err != nil || !claimed {
		t.Fatalf("ClaimRefund = %v, %v", claimed, err)
	}
	must(t, "SettleRefund disputed", s.SettleRefund(ctx, r.ID, imagestore.RefundOutcome{Disputed: true,
		Error: "Stripe refused the refund: the charge is disputed", RetryAt: later}, now))
	got = getOrder(t, s, r.ID)
	if got.State != imagestore.OrderRefunding || !got.RefundHeld() || !got.DisputedAt.Equal(now) || got.DisputeID != "" ||
		got.RefundError == "" || got.RefundGeneration != c.RefundGeneration || got.RefundAttempts != 1 {
		t.Errorf("after charge_disputed: %+v; want refunding, held, disputed at %v without an id yet", got, now)
	}
	if due, err := s.DueRefunds(ctx, later); err != nil || len(due) != 0 {
		t.Errorf("DueRefunds after charge_disputed = %v, %v; want none", orderIDs(due), err)
	}
	// Its event then records the dispute, once, keeping when vmshelf
	// first knew.
	if moved, err := s.MarkOrderDisputed(ctx, r.ID, "du_3", later); err != nil || !moved {
		t.Errorf("MarkOrderDisputed after charge_disputed = %v, %v; want the dispute recorded", moved, err)
	}
	if got := getOrder(t, s, r.ID); got.DisputeID != "du_3" || !got.DisputedAt.Equal(now) || !got.RefundHeld() {
		t.Errorf("dispute %q at %v (held %v), want du_3 at %v", got.DisputeID, got.DisputedAt, got.RefundHeld(), now)
	}
	if moved, err := s.MarkOrderDisputed(ctx, r.ID, "du_3", later); err != nil || moved {
		t.Errorf("the same dispute again = %v, %v; want false, nil", moved, err)
	}
	if n, err := s.OrderCounts(ctx); err != nil || n[imagestore.OrderRefundFailed] != 0 || n[imagestore.OrderRefunding] != 1 {
		t.Errorf("OrderCounts = %v, %v; want the held refund refunding, none refundFailed", n, err)
	}
}

// testDisputeRacesRefund: the dispute's mark and the claim of a due
// refund race; either the claim wins (the attempt goes to Stripe, which
// decides) or the mark does, and then nothing is claimed after it.
func testDisputeRacesRefund(t *testing.T, s imagestore.Store) {
	const n = 8
	ctx := t.Context()
	h, b := newHost(t, s, "host"), newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", n, t0)
	ids := make([]string, n)
	for i := range n {
		o := chargedOrder(t, s, l, h, b, "o"+string(rune('a'+i)))
		refundTo(t, s, &o, imagestore.OrderRefundFailed, t0)
		ids[i] = o.ID
	}
	now := t0.Add(time.Hour)
	start := make(chan struct{})
	claimed := make([]bool, n)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			<-start
			var err error
			_, claimed[i], err = s.ClaimRefund(ctx, id, now, now.Add(time.Minute))
			must(t, "ClaimRefund", err)
		})
		wg.Go(func() {
			<-start
			_, err := s.MarkOrderDisputed(ctx, id, "du_"+id, now)
			must(t, "MarkOrderDisputed", err)
		})
	}
	close(start)
	wg.Wait()
	for i, id := range ids {
		got := getOrder(t, s, id)
		if got.State != imagestore.OrderRefunding || !got.RefundHeld() || got.RefundAttempts != map[bool]int{true: 1}[claimed[i]] {
			t.Errorf("%s: claimed %v, then %s, held %v, %d attempts", id, claimed[i], got.State, got.RefundHeld(), got.RefundAttempts)
		}
		if _, again, err := s.ClaimRefund(ctx, id, now.Add(time.Hour), now.Add(2*time.Hour)); err != nil || again {
			t.Errorf("%s: claimed after the dispute (%v, %v)", id, again, err)
		}
	}
}

// testDisputeClosed: the bank's decision is recorded once, with when,
// only for an order whose dispute is recorded, and only as one of
// DisputeOutcomes; it changes nothing else of the order.
func testDisputeClosed(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h, b := newHost(t, s, "host"), newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 10, t0)
	o := chargedOrder(t, s, l, h, b, "o1")
	if moved, err := s.CloseOrderDispute(ctx, o.ID, imagestore.DisputeWon, t0); !errors.Is(err, imagestore.ErrOrderState) || moved {
		t.Errorf("CloseOrderDispute without a dispute = %v, %v; want ErrOrderState", moved, err)
	}
	if _, err := s.MarkOrderDisputed(ctx, o.ID, "du_1", t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CloseOrderDispute(ctx, o.ID, "needs_response", t0); err == nil {
		t.Error("an open status was recorded as a decision")
	}
	closed := t0.Add(40 * 24 * time.Hour)
	if moved, err := s.CloseOrderDispute(ctx, o.ID, imagestore.DisputeLost, closed); err != nil || !moved {
		t.Fatalf("CloseOrderDispute = %v, %v", moved, err)
	}
	if moved, err := s.CloseOrderDispute(ctx, o.ID, imagestore.DisputeWon, closed.Add(time.Hour)); err != nil || moved {
		t.Errorf("a second decision = %v, %v; want false, nil", moved, err)
	}
	want := getOrder(t, s, o.ID)
	if want.DisputeStatus != imagestore.DisputeLost || !want.DisputeClosedAt.Equal(closed) || want.State != imagestore.OrderPaid ||
		want.DisputeID != "du_1" || !want.DisputedAt.Equal(t0) {
		t.Errorf("after the decision: %+v; want lost at %v, still paid", want, closed)
	}
	for _, outcome := range imagestore.DisputeOutcomes[1:] {
		id := "o-" + outcome[:3]
		chargedOrder(t, s, l, h, b, id)
		if _, err := s.MarkOrderDisputed(ctx, id, "du_"+id, t0); err != nil {
			t.Fatal(err)
		}
		if moved, err := s.CloseOrderDispute(ctx, id, outcome, closed); err != nil || !moved || getOrder(t, s, id).DisputeStatus != outcome {
			t.Errorf("CloseOrderDispute(%s) = %v, %v", outcome, moved, err)
		}
	}
	if _, err := s.CloseOrderDispute(ctx, "o-none", imagestore.DisputeWon, t0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("unknown order: %v, want ErrNotFound", err)
	}
}

// testRefundOfActiveOrder: an active order is refunded only for an import
// that failed for good, and only while no replica ever ran; the first
// running state and that refund exclude each other.
func testRefundOfActiveOrder(t *testing.T, s imagestore.Store) {
	ctx := t.Context()
	h, b := newHost(t, s, "host"), newTenant(t, s, "buyer")
	l := newListing(t, s, h, "l1", 20, t0)
	running := []imagestore.ReplicaState{{Index: 0, Name: "vm-0", State: imagestore.ReplicaRunning, Detail: "Running", ObservedAt: t0}}
	failedDisk := []imagestore.ReplicaState{{Index: 0, Name: "vm-0", State: imagestore.ReplicaFailed, Detail: "DataVolumeFailed", ObservedAt: t0}}

	o := chargedOrder(t, s, l, h, b, "o1")
	must(t, "MarkOrderActive", s.MarkOrderActive(ctx, o.ID))
	must(t, "SetReplicaStates", s.SetReplicaStates(ctx, o.ID, failedDisk))
	if moved, err := s.StartRefund(ctx, o.ID, imagestore.RefundNotProvisioned, t0); !errors.Is(err, imagestore.ErrOrderState) || moved {
		t.Errorf("StartRefund of an active order for %s = %v, %v; want ErrOrderState", imagestore.RefundNotProvisioned, moved, err)
	}
	if moved, err := s.StartRefund(ctx, o.ID, imagestore.RefundImportFailed, t0); err != nil || !moved {
		t.Fatalf("StartRefund of an active order that never ran = %v, %v", moved, err)
	}
	if got := getOrder(t, s, o.ID); got.RefundFrom != imagestore.OrderActive || !got.RanAt.IsZero() {
		t.Errorf("refunding from %s, ran at %v", got.RefundFrom, got.RanAt)
	}
	// A running state of a refunding order marks nothing.
	must(t, "SetReplicaStates running", s.SetReplicaStates(ctx, o.ID, running))
	if got := getOrder(t, s, o.ID); !got.RanAt.IsZero() || got.State != imagestore.OrderRefunding {
		t.Errorf("after a running state: %s, ran at %v", got.State, got.RanAt)
	}

	r := chargedOrder(t, s, l, h, b, "o2")
	must(t, "MarkOrderActive", s.MarkOrderActive(ctx, r.ID))
	must(t, "SetReplicaStates running", s.SetReplicaStates(ctx, r.ID, running))
	must(t, "SetReplicaStates running later", s.SetReplicaStates(ctx, r.ID,
		[]imagestore.ReplicaState{{Index: 0, Name: "vm-0", State: imagestore.ReplicaRunning, ObservedAt: t0.Add(time.Hour)}}))
	if got := getOrder(t, s, r.ID); !got.RanAt.Equal(t0) {
		t.Errorf("RanAt %v, want the first running state's %v", got.RanAt, t0)
	}
	if moved, err := s.StartRefund(ctx, r.ID, imagestore.RefundImportFailed, t0); !errors.Is(err, imagestore.ErrOrderState) || moved {
		t.Errorf("StartRefund of an order that ran = %v, %v; want ErrOrderState", moved, err)
	}

	// Raced: each order ends refunding with RanAt zero, or active with it set.
	const n = 8
	ids := make([]string, n)
	for i := range n {
		ids[i] = chargedOrder(t, s, l, h, b, "r"+string(rune('a'+i))).ID
		must(t, "MarkOrderActive", s.MarkOrderActive(ctx, ids[i]))
	}
	start := make(chan struct{})
	refunded := make([]bool, n)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { <-start; must(t, "SetReplicaStates", s.SetReplicaStates(ctx, id, running)) })
		wg.Go(func() {
			<-start
			var err error
			refunded[i], err = s.StartRefund(ctx, id, imagestore.RefundImportFailed, t0)
			if err != nil && !errors.Is(err, imagestore.ErrOrderState) {
				t.Errorf("%s: StartRefund: %v", id, err)
			}
		})
	}
	close(start)
	wg.Wait()
	for i, id := range ids {
		got := getOrder(t, s, id)
		ran := !got.RanAt.IsZero()
		if ran == refunded[i] || (refunded[i] && got.State != imagestore.OrderRefunding) || (ran && got.State != imagestore.OrderActive) {
			t.Errorf("%s: ran %v, refund started %v, state %s: want exactly one of the two", id, ran, refunded[i], got.State)
		}
	}
}
