package provisioner

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/imagestore"
)

// imageLost is a store that no longer has any image record.
type imageLost struct{ Store }

func (imageLost) Image(_ context.Context, id string) (imagestore.Image, error) {
	return imagestore.Image{}, fmt.Errorf("image %s: %w", id, imagestore.ErrNotFound)
}

// setHosting sets whether the harness's host hosts machines.
func (h *harness) setHosting(on bool) {
	h.t.Helper()
	host := h.host
	host.HostsVMs = on
	if err := h.st.UpdateTenant(h.t.Context(), host); err != nil {
		h.t.Fatal(err)
	}
}

// TestBlockedCauses: the provisioner names the causes that will not pass
// by themselves on the order (what the market refunds after its
// deadline), clears them once they are gone, and never names one for a
// failure to ask.
func TestBlockedCauses(t *testing.T) {
	tests := []struct {
		name  string
		setup func(h *harness) imagestore.Order
		cause string
		// mend undoes the cause, if it can be undone; the next pass then
		// provisions the order and clears the cause.
		mend func(h *harness, o imagestore.Order)
	}{
		{"the own image was removed", func(h *harness) imagestore.Order {
			img := h.image(1<<30, false)
			o := h.order(1, imagestore.ImageUpload, img.UploadID, "")
			// The store keeps an ordered image from its tenant's remove;
			// an operator's, or a lost record, is what remains: the store
			// answers NotFound for it.
			p, err := New(h.cfg, imageLost{h.st}, NewCluster(h.k, h.kv, h.cdi), prometheus.NewRegistry())
			if err != nil {
				h.t.Fatal(err)
			}
			h.p = p
			return o
		}, imagestore.BlockedImageGone, nil},
		{"the host stopped hosting", func(h *harness) imagestore.Order {
			o := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
			h.setHosting(false)
			return o
		}, imagestore.BlockedHostGone, func(h *harness, _ imagestore.Order) { h.setHosting(true) }},
		{"the catalogue no longer offers the image", func(h *harness) imagestore.Order {
			return h.order(1, imagestore.ImageCatalogue, "withdrawn-os", "")
		}, imagestore.BlockedImageNotOffered, nil},
		{"the cluster refuses the VM as invalid", func(h *harness) imagestore.Order {
			o := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
			h.react("create", "virtualmachines", func(a k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewInvalid(kubevirtv1.SchemeGroupVersion.WithKind("VirtualMachine").GroupKind(), "vm", nil)
			})
			return o
		}, imagestore.BlockedClusterRefused, nil},
		{"the cluster refuses the disk as a bad request", func(h *harness) imagestore.Order {
			o := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
			h.react("create", "datavolumes", failing(apierrors.NewBadRequest(`strict decoding error: unknown field "spec.checksum"`)).react)
			return o
		}, imagestore.BlockedClusterRefused, nil},
		{"a refusal that may pass is no cause", func(h *harness) imagestore.Order {
			o := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
			h.react("create", "virtualmachines", failing(apierrors.NewForbidden(testGR, "vm", errors.New("exceeded quota"))).react)
			return o
		}, "", nil},
		{"could not ask is no cause", func(h *harness) imagestore.Order {
			o := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
			h.react("get", "virtualmachines", failing(apierrors.NewTooManyRequests("slow down", 1)).react)
			return o
		}, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			o := tc.setup(h)
			_ = h.p.ReconcileOnce(t.Context())
			got := h.stored(o.ID)
			if got.BlockedCause != tc.cause || got.State != imagestore.OrderPaid {
				t.Fatalf("after a pass: %s, blocked %q; want paid, blocked %q", got.State, got.BlockedCause, tc.cause)
			}
			if tc.cause != "" && !got.BlockedSince.Equal(t0) {
				t.Errorf("blocked since %v, want the pass's %v", got.BlockedSince, t0)
			}
			if tc.mend == nil {
				return
			}
			tc.mend(h, o)
			h.clock.Advance(maxBackoff)
			h.reconcile()
			if got := h.stored(o.ID); got.BlockedCause != "" || got.State != imagestore.OrderActive {
				t.Errorf("after the cause was mended: %s, blocked %q; want active, none", got.State, got.BlockedCause)
			}
		})
	}
}

// TestImportFailedIsACause: CDI failing an own image's import names
// importFailed on the (active) order; a catalogue image's failure does
// not, it is the catalogue's source, not the buyer's bytes.
func TestImportFailedIsACause(t *testing.T) {
	h := newHarness(t)
	img := h.image(1<<30, false)
	own := h.order(1, imagestore.ImageUpload, img.UploadID, "")
	cat := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
	h.reconcile()
	for _, o := range []imagestore.Order{own, cat} {
		h.setDataVolume(namespaceName(o.BuyerID), diskName(o.ID, 0), cdiv1.Failed, "")
	}
	h.clock.Advance(maxBackoff)
	h.reconcile()
	if got := h.stored(own.ID); got.BlockedCause != imagestore.BlockedImportFailed || got.State != imagestore.OrderActive {
		t.Errorf("own image: %s, blocked %q; want active, %q", got.State, got.BlockedCause, imagestore.BlockedImportFailed)
	}
	if got := h.stored(cat.ID); got.BlockedCause != "" {
		t.Errorf("catalogue image: blocked %q, want none", got.BlockedCause)
	}
	h.setDataVolume(namespaceName(own.BuyerID), diskName(own.ID, 0), cdiv1.ImportInProgress, "10.00%")
	h.clock.Advance(maxBackoff)
	h.reconcile()
	if got := h.stored(own.ID); got.BlockedCause != "" {
		t.Errorf("import retried: blocked %q, want none", got.BlockedCause)
	}
}

// TestRefundWinsOverActive: a refund that starts while a pass makes the
// order's objects wins (the store refuses the move to active), and the
// pass halts what it made: nothing runs for money given back.
func TestRefundWinsOverActive(t *testing.T) {
	h := newHarness(t)
	o := h.order(2, imagestore.ImageCatalogue, "debian-13", "")
	ctx := t.Context()
	h.react("create", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		if err := h.st.SetOrderPaymentIntent(ctx, o.ID, "pi_"+o.ID); err != nil {
			t.Error(err)
		}
		if moved, err := h.st.StartRefund(ctx, o.ID, imagestore.RefundNotProvisioned, h.clock.Now()); err != nil || !moved {
			t.Errorf("StartRefund = %v, %v", moved, err)
		}
		return false, nil, nil
	})
	h.reconcile()
	if got := h.stored(o.ID); got.State != imagestore.OrderRefunding {
		t.Fatalf("order %s, want refunding", got.State)
	}
	ns := namespaceName(o.BuyerID)
	for i := range o.Quantity {
		if vm := h.vm(ns, vmName(o.ID, i)); vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyHalted {
			t.Errorf("%s runStrategy %v, want Halted", vm.Name, vm.Spec.RunStrategy)
		}
	}
	states, err := h.st.ReplicaStates(ctx, o.ID)
	if err != nil || len(states) != 2 || states[0].State != imagestore.ReplicaStopped || states[1].State != imagestore.ReplicaStopped {
		t.Errorf("replica states %+v, %v; want both stopped", states, err)
	}
}

// TestRefundedImportIsHalted: an order refunded from active for a failed
// import gets its replicas halted, once: CDI retrying the import must not
// start a machine whose money went back.
func TestRefundedImportIsHalted(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	img := h.image(1<<30, false)
	o := h.order(1, imagestore.ImageUpload, img.UploadID, "")
	h.reconcile()
	h.setDataVolume(namespaceName(o.BuyerID), diskName(o.ID, 0), cdiv1.Failed, "")
	h.clock.Advance(maxBackoff)
	h.reconcile()
	if err := h.st.SetOrderPaymentIntent(ctx, o.ID, "pi_"+o.ID); err != nil {
		t.Fatal(err)
	}
	if moved, err := h.st.StartRefund(ctx, o.ID, imagestore.RefundImportFailed, h.clock.Now()); err != nil || !moved {
		t.Fatalf("StartRefund = %v, %v", moved, err)
	}
	h.clearActions()
	h.reconcile()
	vm := h.vm(namespaceName(o.BuyerID), vmName(o.ID, 0))
	if vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyHalted {
		t.Errorf("runStrategy %v, want Halted", vm.Spec.RunStrategy)
	}
	h.clearActions()
	h.reconcile()
	if w := h.writes(); len(w) != 0 {
		t.Errorf("a second pass wrote %v, want nothing: the replicas are halted", w)
	}
}
