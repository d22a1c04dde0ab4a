package provisioner

import (
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestPower: each action reaches KubeVirt's subresource of its name on the
// replica's VirtualMachine in the buyer's namespace, and nothing else; a
// 409 is ErrPowerRefused, a NotFound of that VM ErrNoMachine, and a 404
// of anything else (no virt-api serving the route) neither: could not ask
// is never absent.
func TestPower(t *testing.T) {
	h := newHarness(t)
	o := h.order(2, imagestore.ImageCatalogue, "debian-12", "")
	name := vmName(o.ID, 1)
	var answer error
	var got []string
	h.react("put", "virtualmachines", func(a k8stesting.Action) (bool, runtime.Object, error) {
		got = append(got, fmt.Sprintf("%s %s/%s/%s", a.GetVerb(), a.GetNamespace(), a.(interface{ GetName() string }).GetName(), a.GetSubresource()))
		return true, nil, answer
	})
	vmGR := schema.GroupResource{Group: "kubevirt.io", Resource: "virtualmachine"}
	for _, tc := range []struct {
		action imagestore.PowerAction
		answer error
		want   error
	}{
		{imagestore.PowerStart, nil, nil},
		{imagestore.PowerStop, nil, nil},
		{imagestore.PowerRestart, nil, nil},
		{imagestore.PowerStart, apierrors.NewConflict(vmGR, name, errors.New("VM is already running")), imagestore.ErrPowerRefused},
		{imagestore.PowerStop, apierrors.NewNotFound(vmGR, name), imagestore.ErrNoMachine},
		{imagestore.PowerRestart, apierrors.NewNotFound(schema.GroupResource{}, ""), nil},
		{imagestore.PowerStop, apierrors.NewServiceUnavailable("virt-api is starting"), nil},
	} {
		got, answer = nil, tc.answer
		err := h.p.Power(t.Context(), o, 1, tc.action)
		want := fmt.Sprintf("put %s/%s/%s", namespaceName(o.BuyerID), name, tc.action)
		if len(got) != 1 || got[0] != want {
			t.Errorf("%s: the cluster was sent %v, want [%s]", tc.action, got, want)
		}
		switch {
		case tc.answer == nil && err != nil:
			t.Errorf("%s: %v", tc.action, err)
		case tc.answer != nil && tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%s answered %v: %v, want %v", tc.action, tc.answer, err, tc.want)
		case tc.answer != nil && tc.want == nil && (err == nil || errors.Is(err, imagestore.ErrNoMachine) || errors.Is(err, imagestore.ErrPowerRefused)):
			t.Errorf("%s answered %v: %v, want the cluster's error", tc.action, tc.answer, err)
		}
	}
	got = nil
	if err := h.p.Power(t.Context(), o, 2, imagestore.PowerStop); err == nil || len(got) != 0 {
		t.Errorf("a replica the order does not have: %v, and the cluster was sent %v", err, got)
	}
}
