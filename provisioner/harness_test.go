package provisioner

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdifake "kubevirt.io/client-go/containerizeddataimporter/fake"
	kvfake "kubevirt.io/client-go/kubevirt/fake"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
	"github.com/vmshelf/vmshelf/internal/testkit/fakeclock"
	"github.com/vmshelf/vmshelf/internal/testkit/syncbuf"
)

// The tests run the provisioner over the real SQLite store in a temp dir
// and the generated fake clientsets of Kubernetes, KubeVirt and CDI
// (object trackers that behave like an API server without controllers),
// wrapped by NewCluster exactly as production wraps the real ones. What
// they check is what the fakes were asked (their Actions), what objects
// they hold, and what the store ends up holding.

// t0 is the test clock's start.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// month is how long the tests' orders run.
const month = 30 * 24 * time.Hour

// fetchBase is the data plane's public URL in the tests.
const fetchBase = "https://edge.example.org:8480"

// clock is the provisioner's time, moved by the test.
type clock = fakeclock.Still

// syncBuffer collects log output.
type syncBuffer = syncbuf.Buffer

type harness struct {
	t     *testing.T
	k     *k8sfake.Clientset
	kv    *kvfake.Clientset
	cdi   *cdifake.Clientset
	st    *sqlite.Store
	p     *Provisioner
	cfg   Config
	clock *clock
	logs  *syncBuffer
	reg   *prometheus.Registry

	host, buyer           imagestore.Tenant
	hostToken, buyerToken string
	listing               imagestore.Listing
	n                     int // orders placed
}

// newHarness builds a provisioner over fresh fakes and a fresh store with
// a host (appliance "box-1") and a buyer. mod may change the config
// before New. Every test's cleanup checks that no fake was asked to
// delete anything, and that every write asked for strict field
// validation.
func newHarness(t *testing.T, mod ...func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, k: k8sfake.NewSimpleClientset(), kv: kvfake.NewSimpleClientset(), cdi: cdifake.NewSimpleClientset(),
		clock: fakeclock.NewStill(t0), logs: &syncBuffer{}, reg: prometheus.NewRegistry()}
	t.Cleanup(h.checkNoDeletes)
	var err error
	if h.st, err = sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "vmshelf.db")); err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() { _ = h.st.Close() })
	h.hostToken, h.buyerToken = imagestore.NewSecret(), imagestore.NewSecret()
	if h.host, err = h.st.CreateTenant(t.Context(), imagestore.Tenant{Name: "host", InMesh: true, Sharing: true, HostsVMs: true,
		Appliance: "box-1", StripeAccount: "acct_host"}, imagestore.HashSecret(h.hostToken)); err != nil {
		t.Fatal(err)
	}
	if h.buyer, err = h.st.CreateTenant(t.Context(), imagestore.Tenant{Name: "buyer", InMesh: true, Sharing: true},
		imagestore.HashSecret(h.buyerToken)); err != nil {
		t.Fatal(err)
	}
	if h.listing, err = h.st.CreateListing(t.Context(), imagestore.Listing{ID: "l0000000000000001", HostID: h.host.ID,
		UnitPrice: 600, Currency: "eur", Capacity: 20, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	h.cfg = Config{CPU: 2, MemoryMiB: 2048, DiskGiB: 20, StorageClass: "losos-vm-local", FetchBase: fetchBase + "/",
		Every: 30 * time.Second, Now: h.clock.Now,
		Log: slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, m := range mod {
		m(&h.cfg)
	}
	if h.p, err = New(h.cfg, h.st, NewCluster(h.k, h.kv, h.cdi), h.reg); err != nil {
		t.Fatalf("New: %v", err)
	}
	return h
}

// checkNoDeletes fails the test if any action of any fake deleted
// anything (nothing vmshelf does deletes), or wrote without strict field
// validation (fieldValidationOf).
func (h *harness) checkNoDeletes() {
	for name, f := range h.fakes() {
		for _, a := range f.Actions() {
			if v := a.GetVerb(); v == "delete" || v == "delete-collection" || v == "deletecollection" {
				h.t.Errorf("the %s fake was asked to %s %s %v", name, v, a.GetResource().Resource, a)
			}
			if fv, write := fieldValidationOf(a); write && fv != metav1.FieldValidationStrict {
				h.t.Errorf("the %s fake was sent %s with fieldValidation %q, want Strict", name, describe(a), fv)
			}
		}
	}
}

// fieldValidationOf is the fieldValidation option a write action was sent
// with; write is false for a read.
func fieldValidationOf(a k8stesting.Action) (fv string, write bool) {
	switch a := a.(type) {
	case k8stesting.CreateActionImpl:
		return a.GetCreateOptions().FieldValidation, true
	case k8stesting.UpdateActionImpl:
		return a.GetUpdateOptions().FieldValidation, true
	case k8stesting.PatchActionImpl:
		return a.GetPatchOptions().FieldValidation, true
	}
	switch a.GetVerb() {
	case "get", "list", "watch", "delete", "delete-collection", "deletecollection":
		return "", false
	case "put":
		// KubeVirt's start, stop and restart subresources take options,
		// not an object: there is no field to validate.
		if sub := a.GetSubresource(); sub == "start" || sub == "stop" || sub == "restart" {
			return metav1.FieldValidationStrict, true
		}
	}
	return "", true // a write of a shape the check does not know: not Strict
}

func (h *harness) fakes() map[string]*k8stesting.Fake {
	return map[string]*k8stesting.Fake{"kubernetes": &h.k.Fake, "kubevirt": &h.kv.Fake, "cdi": &h.cdi.Fake}
}

// clearActions forgets what the fakes were asked so far (the delete
// check runs first, so nothing is lost).
func (h *harness) clearActions() {
	h.checkNoDeletes()
	for _, f := range h.fakes() {
		f.ClearActions()
	}
}

// writes are the actions that changed something (anything but get, list
// and watch), as "verb resource namespace/name".
func (h *harness) writes() []string {
	var out []string
	for _, f := range h.fakes() {
		for _, a := range f.Actions() {
			switch a.GetVerb() {
			case "get", "list", "watch":
				continue
			}
			out = append(out, describe(a))
		}
	}
	return out
}

func describe(a k8stesting.Action) string {
	name := ""
	switch a := a.(type) {
	case k8stesting.CreateAction:
		if o, ok := a.GetObject().(interface{ GetName() string }); ok {
			name = o.GetName()
		}
	case k8stesting.UpdateAction:
		if o, ok := a.GetObject().(interface{ GetName() string }); ok {
			name = o.GetName()
		}
	case k8stesting.PatchAction:
		name = a.GetName()
	case k8stesting.DeleteAction:
		name = a.GetName()
	}
	return fmt.Sprintf("%s %s %s/%s", a.GetVerb(), a.GetResource().Resource, a.GetNamespace(), name)
}

// creates are the create actions, described.
func (h *harness) creates() []string {
	var out []string
	for _, w := range h.writes() {
		if strings.HasPrefix(w, "create ") {
			out = append(out, w)
		}
	}
	return out
}

// order places an order of quantity replicas and pays it at the clock's
// now for a month. kind/image pick the image; userData is stored with it.
func (h *harness) order(quantity int, kind imagestore.ImageKind, image, userData string) imagestore.Order {
	h.t.Helper()
	h.n++
	now := h.clock.Now()
	o := imagestore.Order{ID: fmt.Sprintf("o%016x", h.n), ListingID: h.listing.ID, BuyerID: h.buyer.ID, HostID: h.host.ID,
		Quantity: quantity, ImageKind: kind, Image: image, Name: "web", UnitPrice: 600, Total: 600 * int64(quantity),
		Fee: 300 * int64(quantity), Currency: "eur", Destination: h.host.StripeAccount, ReserveUntil: now.Add(time.Hour),
		CreatedAt: now.Add(time.Duration(h.n))} // distinct, so the store's order is the placing order
	ctx := h.t.Context()
	if err := h.st.CreateOrder(ctx, o, userData, 0); err != nil {
		h.t.Fatalf("CreateOrder: %v", err)
	}
	if _, err := h.st.PayOrder(ctx, o.ID, now, now.Add(month)); err != nil {
		h.t.Fatalf("PayOrder: %v", err)
	}
	return h.stored(o.ID)
}

// image stores an own image of the buyer with the virtual size given.
func (h *harness) image(virtualSize int64, efi bool) imagestore.Image {
	h.t.Helper()
	img := imagestore.Image{UploadID: imagestore.NewUploadID(), TenantID: h.buyer.ID, Name: "own", EFI: efi, Size: 1 << 20,
		VirtualSize: virtualSize, SHA256: strings.Repeat("ab", 32), CreatedAt: t0}
	if err := h.st.AddImage(h.t.Context(), img, 0); err != nil {
		h.t.Fatalf("AddImage: %v", err)
	}
	return img
}

func (h *harness) stored(id string) imagestore.Order {
	h.t.Helper()
	o, err := h.st.Order(h.t.Context(), id)
	if err != nil {
		h.t.Fatalf("Order(%s): %v", id, err)
	}
	return o
}

// reconcile runs one pass that must succeed.
func (h *harness) reconcile() {
	h.t.Helper()
	if err := h.p.ReconcileOnce(h.t.Context()); err != nil {
		h.t.Fatalf("ReconcileOnce: %v", err)
	}
}

// reconcileFailing runs one pass that must fail, and returns its error.
func (h *harness) reconcileFailing() error {
	h.t.Helper()
	err := h.p.ReconcileOnce(h.t.Context())
	if err == nil {
		h.t.Fatal("ReconcileOnce succeeded, want an error")
	}
	return err
}

var (
	vmResource = kubevirtv1.SchemeGroupVersion.WithResource("virtualmachines")
	dvResource = cdiv1.SchemeGroupVersion.WithResource("datavolumes")
)

func (h *harness) vm(ns, name string) *kubevirtv1.VirtualMachine {
	h.t.Helper()
	obj, err := h.kv.Tracker().Get(vmResource, ns, name)
	if err != nil {
		h.t.Fatalf("VirtualMachine %s/%s: %v", ns, name, err)
	}
	return obj.(*kubevirtv1.VirtualMachine)
}

func (h *harness) secret(ns, name string) *corev1.Secret {
	h.t.Helper()
	obj, err := h.k.Tracker().Get(corev1.SchemeGroupVersion.WithResource("secrets"), ns, name)
	if err != nil {
		h.t.Fatalf("Secret %s/%s: %v", ns, name, err)
	}
	return obj.(*corev1.Secret)
}

func (h *harness) service(ns, name string) *corev1.Service {
	h.t.Helper()
	obj, err := h.k.Tracker().Get(corev1.SchemeGroupVersion.WithResource("services"), ns, name)
	if err != nil {
		h.t.Fatalf("Service %s/%s: %v", ns, name, err)
	}
	return obj.(*corev1.Service)
}

func (h *harness) ingress(ns, name string) (*networkingv1.Ingress, error) {
	obj, err := h.k.Tracker().Get(networkingv1.SchemeGroupVersion.WithResource("ingresses"), ns, name)
	if err != nil {
		return nil, err
	}
	return obj.(*networkingv1.Ingress), nil
}

// setVMStatus writes a VM's printable status into the fake, as KubeVirt
// would (through the tracker: not an action of the provisioner).
func (h *harness) setVMStatus(ns, name string, s kubevirtv1.VirtualMachinePrintableStatus) {
	h.t.Helper()
	vm := h.vm(ns, name)
	vm.Status.PrintableStatus = s
	if err := h.kv.Tracker().Update(vmResource, vm, ns); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) dataVolume(ns, name string) *cdiv1.DataVolume {
	h.t.Helper()
	obj, err := h.cdi.Tracker().Get(dvResource, ns, name)
	if err != nil {
		h.t.Fatalf("DataVolume %s/%s: %v", ns, name, err)
	}
	return obj.(*cdiv1.DataVolume)
}

// setDataVolume gives a replica's DataVolume a phase and progress in the
// fake, as CDI would (through the tracker: not an action of the
// provisioner); one that is not there is made, as by somebody else.
func (h *harness) setDataVolume(ns, name string, phase cdiv1.DataVolumePhase, progress string) {
	h.t.Helper()
	if obj, err := h.cdi.Tracker().Get(dvResource, ns, name); err == nil {
		dv := obj.(*cdiv1.DataVolume).DeepCopy()
		dv.Status.Phase, dv.Status.Progress = phase, cdiv1.DataVolumeProgress(progress)
		if err := h.cdi.Tracker().Update(dvResource, dv, ns); err != nil {
			h.t.Fatal(err)
		}
		return
	}
	dv := &cdiv1.DataVolume{}
	dv.Name, dv.Namespace = name, ns
	dv.Status.Phase, dv.Status.Progress = phase, cdiv1.DataVolumeProgress(progress)
	if err := h.cdi.Tracker().Create(dvResource, dv, ns); err != nil {
		h.t.Fatal(err)
	}
}

// react puts a reaction before the trackers' on the fake that serves
// resource: it handles the actions for which fn returns handled.
func (h *harness) react(verb, resource string, fn k8stesting.ReactionFunc) {
	f := h.fakeFor(resource)
	f.PrependReactor(verb, resource, fn)
}

func (h *harness) fakeFor(resource string) *k8stesting.Fake {
	switch resource {
	case "virtualmachines":
		return &h.kv.Fake
	case "datavolumes":
		return &h.cdi.Fake
	}
	return &h.k.Fake
}

// errorsOf is vmshelf_reconcile_errors_total{step}.
func (h *harness) errorsOf(step string) float64 {
	return testutil.ToFloat64(h.p.m.errors.WithLabelValues(step))
}

// allObjects is every object the three fakes hold, with its resource.
func (h *harness) allObjects() map[string]runtime.Object {
	out := map[string]runtime.Object{}
	for _, f := range []struct {
		tracker k8stesting.ObjectTracker
		gvrs    []schema.GroupVersionResource
	}{
		{h.k.Tracker(), []schema.GroupVersionResource{corev1.SchemeGroupVersion.WithResource("namespaces"),
			corev1.SchemeGroupVersion.WithResource("secrets"), corev1.SchemeGroupVersion.WithResource("services"),
			networkingv1.SchemeGroupVersion.WithResource("ingresses")}},
		{h.kv.Tracker(), []schema.GroupVersionResource{vmResource}},
		{h.cdi.Tracker(), []schema.GroupVersionResource{dvResource}},
	} {
		for _, gvr := range f.gvrs {
			list, err := f.tracker.List(gvr, gvr.GroupVersion().WithKind(kindOf(gvr.Resource)), "")
			if err != nil {
				h.t.Fatalf("listing %s: %v", gvr.Resource, err)
			}
			items, err := meta.ExtractList(list)
			if err != nil {
				h.t.Fatal(err)
			}
			for _, it := range items {
				m := it.(interface {
					GetNamespace() string
					GetName() string
				})
				out[gvr.Resource+" "+m.GetNamespace()+"/"+m.GetName()] = it
			}
		}
	}
	return out
}

func kindOf(resource string) string {
	switch resource {
	case "namespaces":
		return "Namespace"
	case "secrets":
		return "Secret"
	case "services":
		return "Service"
	case "ingresses":
		return "Ingress"
	case "virtualmachines":
		return "VirtualMachine"
	case "datavolumes":
		return "DataVolume"
	}
	panic("no kind for " + resource)
}
