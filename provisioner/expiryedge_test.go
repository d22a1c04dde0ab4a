package provisioner

import (
	"strings"
	"testing"
	"time"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestExpiryNotBeforeItsEnd: the buyer paid for the month up to its
// ExpiresAt, so a pass a nanosecond before it halts nothing and leaves the
// order active with its fetch token; the pass at ExpiresAt halts it.
// TestExpiry sits only on the end itself and an hour away, so a
// provisioner that halted a pass (or minutes) early passed it.
func TestExpiryNotBeforeItsEnd(t *testing.T) {
	h := newHarness(t)
	img := h.image(1<<30, false)
	o := h.order(2, imagestore.ImageUpload, img.UploadID, "")
	h.reconcile()
	ns := namespaceName(o.BuyerID)
	token := h.fetchToken(o)
	h.clearActions()

	h.clock.Set(o.ExpiresAt.Add(-time.Nanosecond))
	h.reconcile()
	for _, w := range h.writes() {
		if strings.HasPrefix(w, "patch ") {
			t.Errorf("a nanosecond before the month's end: %s", w)
		}
	}
	if got := h.stored(o.ID); got.State != imagestore.OrderActive || got.Note != "" {
		t.Errorf("a nanosecond before the month's end the order is %s (note %q), want active", got.State, got.Note)
	}
	for i := range o.Quantity {
		if vm := h.vm(ns, vmName(o.ID, i)); vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyAlways {
			t.Errorf("%s runStrategy %v before the month's end, want Always", vm.Name, vm.Spec.RunStrategy)
		}
	}
	if _, _, err := h.st.ImageForToken(t.Context(), imagestore.HashSecret(token), h.clock.Now()); err != nil {
		t.Errorf("the fetch token is dead before the month's end: %v", err)
	}

	h.clock.Set(o.ExpiresAt)
	h.reconcile()
	if got := h.stored(o.ID); got.State != imagestore.OrderExpired || !got.EndedAt.Equal(o.ExpiresAt) {
		t.Errorf("at the month's end the order is %s (ended %v), want expired at %v", got.State, got.EndedAt, o.ExpiresAt)
	}
	for i := range o.Quantity {
		if vm := h.vm(ns, vmName(o.ID, i)); vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyHalted {
			t.Errorf("%s runStrategy %v at the month's end, want Halted", vm.Name, vm.Spec.RunStrategy)
		}
	}
}
