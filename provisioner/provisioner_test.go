package provisioner

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobfs"
	"github.com/vmshelf/vmshelf/market"
)

// expectedCreates is what the first pass over order o must create, in
// the fakes' order of description, sorted.
func expectedCreates(o imagestore.Order, domain string) []string {
	ns := namespaceName(o.BuyerID)
	want := []string{
		"create namespaces /" + ns,
		"create secrets " + ns + "/vm-" + o.ID + "-cloudinit",
		"create services " + ns + "/vm-" + o.ID,
	}
	if o.ImageKind == imagestore.ImageUpload {
		want = append(want, "create secrets "+ns+"/vm-"+o.ID+"-fetch")
	}
	for i := range o.Quantity {
		want = append(want, fmt.Sprintf("create virtualmachines %s/vm-%s-%d", ns, o.ID, i),
			fmt.Sprintf("create datavolumes %s/vm-%s-%d-disk", ns, o.ID, i))
	}
	if domain != "" {
		want = append(want, "create ingresses "+ns+"/vm-"+o.ID)
	}
	slices.Sort(want)
	return want
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// recordCreates notes each create of a DataVolume or VirtualMachine as
// "<resource>/<name>", in the order the cluster got them (their fakes
// keep separate action lists).
func (h *harness) recordCreates() *[]string {
	var mu sync.Mutex
	got := new([]string)
	for _, resource := range []string{"datavolumes", "virtualmachines"} {
		h.react("create", resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			*got = append(*got, resource+"/"+a.(k8stesting.CreateAction).GetObject().(interface{ GetName() string }).GetName())
			return false, nil, nil
		})
	}
	return got
}

func withDomain(d string) func(*Config) { return func(c *Config) { c.Domain = d } }

var bearerLine = regexp.MustCompile(`^Authorization: Bearer ([0-9a-f]{64})$`)

// fetchToken is the token in order o's fetch Secret.
func (h *harness) fetchToken(o imagestore.Order) string {
	h.t.Helper()
	s := h.secret(namespaceName(o.BuyerID), "vm-"+o.ID+"-fetch")
	m := bearerLine.FindStringSubmatch(string(s.Data["authorization"]))
	if m == nil || len(s.Data) != 1 {
		h.t.Fatalf("fetch Secret data %q, want one Authorization: Bearer line", s.Data)
	}
	return m[1]
}

// TestPaidOrderCreatesObjects: a paid order of each kind of image gets
// exactly its objects, field by field, and becomes active.
func TestPaidOrderCreatesObjects(t *testing.T) {
	debian, _ := catalogue.Builtin().Lookup("debian-13")
	losos, _ := catalogue.Builtin().Lookup("losos-demo")
	const userData = "#cloud-config\nhostname: web\n"
	for _, domain := range []string{"", "vms.example.org"} {
		for _, kind := range []string{"catalogue cloud", "catalogue losos", "own image"} {
			t.Run(kind+" domain="+domain, func(t *testing.T) {
				h := newHarness(t, withDomain(domain))
				ns := namespaceName(h.buyer.ID)
				w := wantVM{namespace: ns, appliance: "box-1", cores: 2, memory: "2Gi", disk: "20Gi", class: "losos-vm-local"}
				var o imagestore.Order
				var img imagestore.Image
				switch kind {
				case "catalogue cloud":
					o = h.order(2, imagestore.ImageCatalogue, "debian-13", userData)
					w.httpURL = debian.URL
				case "catalogue losos":
					o = h.order(2, imagestore.ImageCatalogue, "losos-demo", userData)
					w.registryURL, w.efi, w.memory = losos.URL, true, "4Gi"
				case "own image":
					img = h.image(25<<30+1, true)
					o = h.order(2, imagestore.ImageUpload, img.UploadID, userData)
					w.httpURL = fetchBase + "/market/vm-images/fetch/" + img.UploadID
					w.headers = []string{"vm-" + o.ID + "-fetch"}
					w.checksum = "sha256:" + img.SHA256
					w.efi, w.disk = true, "26Gi"
				}
				created := h.recordCreates()
				h.reconcile()

				if got, want := sorted(h.creates()), expectedCreates(o, domain); !slices.Equal(got, want) {
					t.Errorf("creates:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
				if got := h.writes(); len(got) != len(expectedCreates(o, domain)) {
					t.Errorf("writes besides the creates: %v", got)
				}
				for i := range o.Quantity {
					w.order, w.replica = o.ID, i
					checkVM(t, h.vm(ns, fmt.Sprintf("vm-%s-%d", o.ID, i)), w)
					checkDataVolume(t, h.dataVolume(ns, diskName(o.ID, i)), w)
					// The disk before the VM that names it.
					dvAt, vmAt := slices.Index(*created, "datavolumes/"+diskName(o.ID, i)), slices.Index(*created, "virtualmachines/"+vmName(o.ID, i))
					if dvAt < 0 || vmAt < 0 || dvAt > vmAt {
						t.Errorf("creates in order %v, want %s before %s", *created, diskName(o.ID, i), vmName(o.ID, i))
					}
				}
				ci := h.secret(ns, "vm-"+o.ID+"-cloudinit")
				if string(ci.Data["userdata"]) != userData || len(ci.Data) != 1 {
					t.Errorf("cloud-init Secret data %q, want the order's user data", ci.Data)
				}
				svc := h.service(ns, "vm-"+o.ID)
				if svc.Spec.Selector["losos.dev/order"] != o.ID || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 80 {
					t.Errorf("Service %+v", svc.Spec)
				}
				ing, err := h.ingress(ns, "vm-"+o.ID)
				switch {
				case domain == "" && !apierrors.IsNotFound(err):
					t.Errorf("an Ingress without --vms-domain: %v %v", ing, err)
				case domain != "" && err != nil:
					t.Errorf("no Ingress with --vms-domain: %v", err)
				case domain != "":
					checkIngress(t, ing, o.ID, ns, domain)
				}
				if kind == "own image" {
					token := h.fetchToken(o)
					got, _, err := h.st.ImageForToken(t.Context(), imagestore.HashSecret(token), o.ExpiresAt.Add(-time.Nanosecond))
					if err != nil || got.UploadID != img.UploadID {
						t.Errorf("the fetch token names %+v, %v; want image %s until the order ends", got, err, img.UploadID)
					}
					if _, _, err := h.st.ImageForToken(t.Context(), imagestore.HashSecret(token), o.ExpiresAt); !errors.Is(err, imagestore.ErrNotFound) {
						t.Errorf("the fetch token outlives the order: %v", err)
					}
				} else if _, err := h.k.Tracker().Get(corev1.SchemeGroupVersion.WithResource("secrets"), ns, "vm-"+o.ID+"-fetch"); !apierrors.IsNotFound(err) {
					t.Errorf("a catalogue order has a fetch Secret: %v", err)
				}

				got := h.stored(o.ID)
				if got.State != imagestore.OrderActive || got.Note != "" {
					t.Errorf("order %s note %q, want active without a note", got.State, got.Note)
				}
				states, err := h.st.ReplicaStates(t.Context(), o.ID)
				if err != nil || len(states) != 2 || states[0].State != "starting" || states[1].Name != "vm-"+o.ID+"-1" ||
					!states[1].ObservedAt.Equal(t0) {
					t.Errorf("replica states %+v, %v; want both starting, seen at t0", states, err)
				}
			})
		}
	}
}

// TestSecondPassChangesNothing: a pass over an order whose objects exist
// gets them and writes nothing: no create, no update, no patch, even when
// an object differs from what the provisioner would build now.
func TestSecondPassChangesNothing(t *testing.T) {
	h := newHarness(t, withDomain("vms.example.org"))
	img := h.image(1<<30, false)
	o := h.order(2, imagestore.ImageUpload, img.UploadID, "")
	c := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
	h.reconcile()
	ns := namespaceName(h.buyer.ID)
	token := h.fetchToken(o)

	// KubeVirt reports, an operator edits a VM, the edge's sizes are
	// not what they were.
	h.setVMStatus(ns, "vm-"+o.ID+"-0", kubevirtv1.VirtualMachineStatusRunning)
	vm := h.vm(ns, "vm-"+c.ID+"-0")
	vm.Spec.Template.Spec.Domain.CPU.Cores = 8
	if err := h.kv.Tracker().Update(vmResource, vm, ns); err != nil {
		t.Fatal(err)
	}
	h.p.cfg.CPU, h.p.cfg.MemoryMiB = 4, 8192
	// A disk gone behind its VM (deleted, or a template's not made yet by
	// KubeVirt) is not made again: a fresh import would pass for the
	// buyer's data.
	gone := diskName(o.ID, 1)
	if err := h.cdi.Tracker().Delete(dvResource, ns, gone); err != nil {
		t.Fatal(err)
	}
	for pass := range 3 {
		h.clearActions()
		h.clock.Advance(time.Minute)
		h.reconcile()
		if w := h.writes(); len(w) != 0 {
			t.Errorf("pass %d wrote: %v", pass+2, w)
		}
	}
	if got := h.vm(ns, "vm-"+c.ID+"-0").Spec.Template.Spec.Domain.CPU.Cores; got != 8 {
		t.Errorf("the edited VM has %d cores, want the operator's 8", got)
	}
	if got := h.fetchToken(o); got != token {
		t.Error("the fetch Secret was replaced")
	}
	if _, err := h.cdi.Tracker().Get(dvResource, ns, gone); !apierrors.IsNotFound(err) {
		t.Errorf("DataVolume %s behind its VM: %v, want still NotFound", gone, err)
	}
	states, err := h.st.ReplicaStates(t.Context(), o.ID)
	if err != nil || len(states) != 2 || states[0].State != "running" || !states[0].ObservedAt.Equal(t0.Add(3*time.Minute)) {
		t.Errorf("replica states %+v, %v; want replica 0 running, seen at the last pass", states, err)
	}
}

// switchable is an error reaction that can be turned off.
type switchable struct {
	on  atomic.Bool
	err error
}

func (s *switchable) react(k8stesting.Action) (bool, runtime.Object, error) {
	if s.on.Load() {
		return true, nil, s.err
	}
	return false, nil, nil
}

func failing(err error) *switchable {
	s := &switchable{err: err}
	s.on.Store(true)
	return s
}

var testGR = schema.GroupResource{Group: "test", Resource: "things"}

// TestGetErrorIsNotAbsence: a Get that fails for any reason but NotFound
// creates nothing of its kind (and nothing after it); the order stays
// paid with a note naming the cause, the step is counted, and once the
// API answers again the order is provisioned.
func TestGetErrorIsNotAbsence(t *testing.T) {
	tests := []struct {
		resource, step string
		err            error
	}{
		{"namespaces", stepNamespace, apierrors.NewServiceUnavailable("etcd leader changed")},
		{"secrets", stepCloudInit, apierrors.NewForbidden(testGR, "vm-x", errors.New("RBAC says no"))},
		{"virtualmachines", stepVM, apierrors.NewInternalError(errors.New("webhook unreachable"))},
		{"services", stepService, apierrors.NewTimeoutError("the server was too slow", 1)},
		{"ingresses", stepIngress, errors.New("connection reset by peer")},
		{"datavolumes", stepDisk, apierrors.NewTooManyRequests("slow down", 1)},
		{"virtualmachines", stepVM, apierrors.NewUnauthorized("token expired")},
		{"virtualmachines", stepVM, context.DeadlineExceeded},
	}
	for _, tc := range tests {
		t.Run(tc.resource+" "+tc.err.Error(), func(t *testing.T) {
			h := newHarness(t, withDomain("vms.example.org"))
			img := h.image(1<<30, false)
			o := h.order(2, imagestore.ImageUpload, img.UploadID, "")
			fail := failing(tc.err)
			h.react("get", tc.resource, fail.react)

			err := h.reconcileFailing()
			if !strings.Contains(err.Error(), o.ID) {
				t.Errorf("the pass's error %q does not name the order", err)
			}
			for _, c := range h.creates() {
				if strings.HasPrefix(c, "create "+tc.resource+" ") {
					t.Errorf("created after a failed get: %s", c)
				}
				if tc.resource == "namespaces" {
					t.Errorf("created with no namespace known: %s", c)
				}
			}
			got := h.stored(o.ID)
			if got.State != imagestore.OrderPaid {
				t.Errorf("order %s, want it still paid", got.State)
			}
			if cause := strings.Fields(tc.err.Error())[0]; got.Note == "" || !strings.Contains(got.Note, cause) {
				t.Errorf("note %q, want one naming %q", got.Note, cause)
			}
			if n := h.errorsOf(tc.step); n != 1 {
				t.Errorf("errors{step=%s} = %v, want 1", tc.step, n)
			}

			fail.on.Store(false)
			h.clock.Advance(h.cfg.Every)
			h.reconcile()
			if got := h.stored(o.ID); got.State != imagestore.OrderActive || got.Note != "" {
				t.Errorf("after the API recovered: order %s note %q, want active without a note", got.State, got.Note)
			}
		})
	}
}

// TestAlreadyExistsIsSuccess: a create that meets an existing object (a
// pass of another process, a lost answer) is success.
func TestAlreadyExistsIsSuccess(t *testing.T) {
	for _, resource := range []string{"namespaces", "secrets", "datavolumes", "virtualmachines", "services", "ingresses"} {
		t.Run(resource, func(t *testing.T) {
			h := newHarness(t, withDomain("vms.example.org"))
			img := h.image(1<<30, false)
			o := h.order(2, imagestore.ImageUpload, img.UploadID, "")
			exists := failing(apierrors.NewAlreadyExists(testGR, "x"))
			h.react("create", resource, exists.react)
			h.reconcile()
			if got := h.stored(o.ID); got.State != imagestore.OrderActive || got.Note != "" {
				t.Errorf("order %s note %q, want active without a note", got.State, got.Note)
			}
			for _, s := range steps {
				if n := h.errorsOf(s); n != 0 {
					t.Errorf("errors{step=%s} = %v, want 0", s, n)
				}
			}
		})
	}
}

// expire provisions order o, gives each replica a disk and a running VM
// as KubeVirt and CDI would, and moves the clock to the end of its month.
func (h *harness) provisionedAndDue(o imagestore.Order) {
	h.t.Helper()
	h.reconcile()
	ns := namespaceName(o.BuyerID)
	for i := range o.Quantity {
		h.setVMStatus(ns, vmName(o.ID, i), kubevirtv1.VirtualMachineStatusRunning)
		h.setDataVolume(ns, diskName(o.ID, i), cdiv1.Succeeded, "100.0%")
	}
	h.clock.Set(o.ExpiresAt)
	h.clearActions()
}

// TestExpiry: at the end of its month every replica is halted
// (runStrategy Halted, by a patch and nothing else), the order expires,
// its capacity returns to the listing, its fetch token stops working,
// and every disk, VM, Secret, Service and Ingress is still there.
func TestExpiry(t *testing.T) {
	h := newHarness(t, withDomain("vms.example.org"))
	img := h.image(1<<30, false)
	o := h.order(3, imagestore.ImageUpload, img.UploadID, "")
	other := h.order(1, imagestore.ImageCatalogue, "debian-13", "") // paid at the same time
	h.clock.Advance(time.Hour)
	later := h.order(2, imagestore.ImageCatalogue, "debian-13", "") // an hour younger
	h.clock.Set(t0)
	h.reconcile() // later's month starts later, but it is provisioned too
	h.provisionedAndDue(o)
	ns := namespaceName(h.buyer.ID)
	token := h.fetchToken(o)
	before := h.allObjects()
	if l, _ := h.st.Listing(t.Context(), h.listing.ID); l.Free() != 20-6 {
		t.Fatalf("listing has %d free before expiry, want 14", l.Free())
	}

	h.reconcile()
	var want []string
	for _, x := range []imagestore.Order{o, other} {
		for i := range x.Quantity {
			want = append(want, fmt.Sprintf("patch virtualmachines %s/%s", ns, vmName(x.ID, i)))
		}
	}
	if got := sorted(h.writes()); !slices.Equal(got, sorted(want)) {
		t.Errorf("expiry wrote:\n%s\nwant only:\n%s", strings.Join(got, "\n"), strings.Join(sorted(want), "\n"))
	}
	for _, f := range h.fakes() {
		for _, a := range f.Actions() {
			if p, ok := a.(k8stesting.PatchAction); ok {
				if p.GetPatchType() != "application/merge-patch+json" || string(p.GetPatch()) != `{"spec":{"runStrategy":"Halted"}}` {
					t.Errorf("patch %s %s: %s", p.GetPatchType(), p.GetName(), p.GetPatch())
				}
			}
		}
	}
	for i := range o.Quantity {
		vm := h.vm(ns, vmName(o.ID, i))
		if vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyHalted {
			t.Errorf("%s runStrategy %v, want Halted", vm.Name, vm.Spec.RunStrategy)
		}
		if vol := vm.Spec.Template.Spec.Volumes[0]; vol.DataVolume == nil || vol.DataVolume.Name != diskName(o.ID, i) {
			t.Errorf("%s no longer boots from its DataVolume: %+v", vm.Name, vol)
		}
	}
	after := h.allObjects()
	for k := range before {
		if _, ok := after[k]; !ok {
			t.Errorf("%s is gone after expiry", k)
		}
	}
	for i := range o.Quantity {
		if _, ok := after["datavolumes "+ns+"/"+diskName(o.ID, i)]; !ok {
			t.Errorf("the disk %s is gone", diskName(o.ID, i))
		}
	}
	got := h.stored(o.ID)
	if got.State != imagestore.OrderExpired || !got.EndedAt.Equal(o.ExpiresAt) || got.Note != "" {
		t.Errorf("order %s ended %v note %q, want expired at %v", got.State, got.EndedAt, got.Note, o.ExpiresAt)
	}
	if got := h.stored(later.ID); got.State != imagestore.OrderActive {
		t.Errorf("the younger order is %s, want active", got.State)
	}
	if l, _ := h.st.Listing(t.Context(), h.listing.ID); l.Free() != 20-2 {
		t.Errorf("listing has %d free after expiry, want 18 (the younger order's 2 taken)", l.Free())
	}
	// Revoked, not just expired: dead even at a time its expiry allows.
	if _, _, err := h.st.ImageForToken(t.Context(), imagestore.HashSecret(token), o.ExpiresAt.Add(-time.Hour)); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("the fetch token still resolves after expiry: %v", err)
	}
	states, err := h.st.ReplicaStates(t.Context(), o.ID)
	if err != nil || len(states) != 3 {
		t.Fatalf("replica states %+v, %v", states, err)
	}
	for _, s := range states {
		if s.State != "stopped" || s.Detail != "Halted" {
			t.Errorf("replica state %+v, want stopped (Halted)", s)
		}
	}

	// An expired order is left alone afterwards (the younger order's
	// month ends an hour later).
	h.clearActions()
	h.clock.Advance(30 * time.Minute)
	h.reconcile()
	for _, w := range h.writes() {
		t.Errorf("a pass after expiry wrote %s", w)
	}
}

// TestExpiryHaltConflict: a conflict on the runStrategy patch is sent
// again, a bounded number of times; a VM that is not there has nothing to
// halt.
func TestExpiryHaltConflict(t *testing.T) {
	t.Run("once", func(t *testing.T) {
		h := newHarness(t)
		o := h.order(2, imagestore.ImageCatalogue, "debian-13", "")
		h.provisionedAndDue(o)
		var conflicts atomic.Int32
		h.react("patch", "virtualmachines", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.(k8stesting.PatchAction).GetName() == vmName(o.ID, 0) && conflicts.Add(1) == 1 {
				return true, nil, apierrors.NewConflict(testGR, vmName(o.ID, 0), errors.New("the object has been modified"))
			}
			return false, nil, nil
		})
		h.reconcile()
		ns := namespaceName(h.buyer.ID)
		want := []string{"patch virtualmachines " + ns + "/" + vmName(o.ID, 0), "patch virtualmachines " + ns + "/" + vmName(o.ID, 0),
			"patch virtualmachines " + ns + "/" + vmName(o.ID, 1)}
		if got := sorted(h.writes()); !slices.Equal(got, want) {
			t.Errorf("writes %v, want %v", got, want)
		}
		for i := range 2 {
			if vm := h.vm(ns, vmName(o.ID, i)); *vm.Spec.RunStrategy != kubevirtv1.RunStrategyHalted {
				t.Errorf("%s runStrategy %s, want Halted", vm.Name, *vm.Spec.RunStrategy)
			}
		}
		if got := h.stored(o.ID); got.State != imagestore.OrderExpired {
			t.Errorf("order %s, want expired", got.State)
		}
	})
	t.Run("always", func(t *testing.T) {
		h := newHarness(t)
		o := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
		h.provisionedAndDue(o)
		h.react("patch", "virtualmachines", failing(apierrors.NewConflict(testGR, "x", errors.New("modified"))).react)
		h.reconcileFailing()
		if n := len(h.writes()); n != conflictRetries {
			t.Errorf("%d patches, want %d", n, conflictRetries)
		}
		got := h.stored(o.ID)
		if got.State != imagestore.OrderActive || !strings.Contains(got.Note, "halting") {
			t.Errorf("order %s note %q, want still active with a note", got.State, got.Note)
		}
		if n := h.errorsOf(stepHalt); n != 1 {
			t.Errorf("errors{step=halt} = %v, want 1", n)
		}
	})
	t.Run("VM not there", func(t *testing.T) {
		h := newHarness(t)
		o := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
		h.provisionedAndDue(o)
		h.react("patch", "virtualmachines", failing(apierrors.NewNotFound(testGR, "x")).react)
		h.reconcile()
		if got := h.stored(o.ID); got.State != imagestore.OrderExpired {
			t.Errorf("order %s, want expired", got.State)
		}
	})
}

// TestFailingOrderDoesNotBlockOthers: whatever fails for one order, the
// other orders of the pass are provisioned.
func TestFailingOrderDoesNotBlockOthers(t *testing.T) {
	tests := []struct {
		name  string
		setup func(h *harness) imagestore.Order // places the failing order
		step  string
	}{
		{"its VM is refused", func(h *harness) imagestore.Order {
			o := h.order(2, imagestore.ImageCatalogue, "debian-13", "")
			h.react("create", "virtualmachines", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if vm := a.(k8stesting.CreateAction).GetObject().(*kubevirtv1.VirtualMachine); strings.HasPrefix(vm.Name, "vm-"+o.ID+"-") {
					return true, nil, apierrors.NewForbidden(testGR, vm.Name, errors.New("quota exceeded"))
				}
				return false, nil, nil
			})
			return o
		}, stepVM},
		{"its disk is refused, so is no VM made", func(h *harness) imagestore.Order {
			o := h.order(2, imagestore.ImageCatalogue, "debian-13", "")
			h.react("create", "datavolumes", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if dv := a.(k8stesting.CreateAction).GetObject().(*cdiv1.DataVolume); strings.HasPrefix(dv.Name, "vm-"+o.ID+"-") {
					return true, nil, apierrors.NewForbidden(testGR, dv.Name, errors.New("exceeded quota: requests.storage"))
				}
				return false, nil, nil
			})
			h.react("create", "virtualmachines", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if vm := a.(k8stesting.CreateAction).GetObject().(*kubevirtv1.VirtualMachine); strings.HasPrefix(vm.Name, "vm-"+o.ID+"-") {
					h.t.Errorf("the VM %s was made without its disk", vm.Name)
				}
				return false, nil, nil
			})
			return o
		}, stepDisk},
		{"its catalogue entry is gone", func(h *harness) imagestore.Order {
			return h.order(1, imagestore.ImageCatalogue, "withdrawn-os", "")
		}, stepResolve},
		{"its host has no appliance", func(h *harness) imagestore.Order {
			ctx := h.t.Context()
			host, err := h.st.CreateTenant(ctx, imagestore.Tenant{Name: "host2", StripeAccount: "acct_2"}, imagestore.HashSecret("h2"))
			if err != nil {
				h.t.Fatal(err)
			}
			l, err := h.st.CreateListing(ctx, imagestore.Listing{ID: "l0000000000000002", HostID: host.ID, UnitPrice: 600,
				Currency: "eur", Capacity: 5, CreatedAt: t0})
			if err != nil {
				h.t.Fatal(err)
			}
			saved := h.host
			h.host, h.listing = host, l
			defer func() { h.host = saved }() // the caller puts its listing back
			return h.order(1, imagestore.ImageCatalogue, "debian-13", "")
		}, stepResolve},
		{"its expiry cannot halt", func(h *harness) imagestore.Order {
			h.clock.Set(t0.Add(-month)) // its month ends now
			defer h.clock.Set(t0)
			o := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
			h.react("patch", "virtualmachines", failing(apierrors.NewServiceUnavailable("virt-api down")).react)
			return o
		}, stepHalt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			listing := h.listing
			first := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
			bad := tc.setup(h)
			h.listing = listing
			last := h.order(2, imagestore.ImageCatalogue, "ubuntu-24-04", "")

			err := h.reconcileFailing()
			if !strings.Contains(err.Error(), bad.ID) {
				t.Errorf("the pass's error %q does not name the failing order", err)
			}
			for _, o := range []imagestore.Order{first, last} {
				if got := h.stored(o.ID); got.State != imagestore.OrderActive || got.Note != "" {
					t.Errorf("order %s: %s note %q, want active without a note", o.ID, got.State, got.Note)
				}
			}
			got := h.stored(bad.ID)
			if got.State != imagestore.OrderPaid || got.Note == "" {
				t.Errorf("failing order: %s note %q, want still paid, with a note", got.State, got.Note)
			}
			if n := h.errorsOf(tc.step); n != 1 {
				t.Errorf("errors{step=%s} = %v, want 1", tc.step, n)
			}
		})
	}
}

// scanFor reports where secret appears in v, plain or base64 (a Secret's
// data is base64 in JSON).
func scanFor(v any, secret string) bool {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return strings.Contains(string(b), secret) || strings.Contains(string(b), base64.StdEncoding.EncodeToString([]byte(secret)))
}

// TestSecretsStayInSecrets: the fetch token and the user data appear in
// their Secrets and nowhere else: no other object (sent or stored), no
// log line, no error, no note, no metric, even when the API's refusal
// quotes the Secret it was sent.
func TestSecretsStayInSecrets(t *testing.T) {
	h := newHarness(t, withDomain("vms.example.org"))
	const userData = "#cloud-config\nchpasswd: {list: 'root:S3cretUserData9'}\n"
	img := h.image(1<<30, false)
	o := h.order(2, imagestore.ImageUpload, img.UploadID, userData)
	ns := namespaceName(h.buyer.ID)

	// The first create of each Secret is refused with an error that
	// quotes its data, as a validating webhook might.
	var mu sync.Mutex
	refused := map[string]string{}
	h.react("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*corev1.Secret)
		mu.Lock()
		defer mu.Unlock()
		if _, done := refused[s.Name]; done {
			return false, nil, nil
		}
		var data []string
		for _, v := range s.Data {
			data = append(data, string(v))
		}
		refused[s.Name] = strings.Join(data, "")
		return true, nil, apierrors.NewBadRequest("admission webhook denied the Secret: " + strings.Join(data, " "))
	})
	var errs []error
	for pass := range 3 {
		err := h.p.ReconcileOnce(t.Context())
		if pass < 2 && err == nil {
			t.Fatalf("pass %d succeeded, want the refusal", pass+1)
		}
		if err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, errors.New(h.stored(o.ID).Note))
		h.clock.Advance(time.Hour)
	}
	if got := h.stored(o.ID); got.State != imagestore.OrderActive {
		t.Fatalf("order %s after three passes, want active", got.State)
	}
	firstToken := strings.TrimPrefix(refused["vm-"+o.ID+"-fetch"], "Authorization: Bearer ")
	if len(firstToken) != 64 {
		t.Fatalf("the refused fetch Secret held %q", refused["vm-"+o.ID+"-fetch"])
	}
	token := h.fetchToken(o)
	if token == firstToken {
		t.Fatal("the token of the refused Secret was used again")
	}
	secrets := map[string]string{"user data": "S3cretUserData9", "fetch token": token, "refused fetch token": firstToken}
	// Where each may be: its own Secret, as stored and as sent.
	home := map[string]string{"user data": "secrets " + ns + "/vm-" + o.ID + "-cloudinit", "fetch token": "secrets " + ns + "/vm-" + o.ID + "-fetch"}

	for key, obj := range h.allObjects() {
		for what, s := range secrets {
			if scanFor(obj, s) && home[what] != key {
				t.Errorf("the %s is in %s", what, key)
			}
		}
	}
	for name, f := range h.fakes() {
		for _, a := range f.Actions() {
			ca, ok := a.(k8stesting.CreateAction)
			if !ok {
				continue
			}
			key := a.GetResource().Resource + " " + a.GetNamespace() + "/" + ca.GetObject().(interface{ GetName() string }).GetName()
			for what, s := range secrets {
				if scanFor(ca.GetObject(), s) && home[what] != key && !(what == "refused fetch token" && key == home["fetch token"]) {
					t.Errorf("the %s was sent to the %s fake in %s", what, name, key)
				}
			}
		}
	}
	families, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for what, s := range secrets {
		if logs := h.logs.String(); strings.Contains(logs, s) {
			t.Errorf("the %s is in the log:\n%s", what, logs)
		}
		for _, err := range errs {
			if strings.Contains(err.Error(), s) {
				t.Errorf("the %s is in an error or note: %v", what, err)
			}
		}
		if scanFor(families, s) {
			t.Errorf("the %s is in a metric", what)
		}
	}
	if !strings.Contains(h.logs.String(), "[redacted]") {
		t.Errorf("the refusals were not logged (redacted):\n%s", h.logs.String())
	}
}

// TestReplicaStatesRoundTrip: what KubeVirt and CDI report on the VMs and
// DataVolumes reaches the store at the next pass and the buyer's status.
func TestReplicaStatesRoundTrip(t *testing.T) {
	h := newHarness(t, withDomain("vms.example.org"))
	o := h.order(4, imagestore.ImageCatalogue, "debian-13", "")
	h.reconcile()
	ns := namespaceName(h.buyer.ID)
	h.setVMStatus(ns, vmName(o.ID, 0), kubevirtv1.VirtualMachineStatusRunning)
	h.setDataVolume(ns, diskName(o.ID, 0), cdiv1.Succeeded, "100.0%")
	h.setVMStatus(ns, vmName(o.ID, 1), kubevirtv1.VirtualMachineStatusProvisioning)
	h.setDataVolume(ns, diskName(o.ID, 1), cdiv1.ImportInProgress, "42.50%")
	h.setVMStatus(ns, vmName(o.ID, 2), kubevirtv1.VirtualMachineStatusErrImagePull)
	h.setVMStatus(ns, vmName(o.ID, 3), kubevirtv1.VirtualMachineStatusPaused)
	h.clock.Advance(time.Minute)
	h.reconcile()

	seen := t0.Add(time.Minute)
	want := []imagestore.ReplicaState{
		{Index: 0, Name: vmName(o.ID, 0), State: "running", Detail: "Running", ObservedAt: seen},
		{Index: 1, Name: vmName(o.ID, 1), State: "importing", Detail: "ImportInProgress", Progress: "42.50%", ObservedAt: seen},
		{Index: 2, Name: vmName(o.ID, 2), State: "failed", Detail: "ErrImagePull", ObservedAt: seen},
		{Index: 3, Name: vmName(o.ID, 3), State: "paused", Detail: "Paused", ObservedAt: seen},
	}
	got, err := h.st.ReplicaStates(t.Context(), o.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("replica states %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].ObservedAt.Equal(want[i].ObservedAt) {
			got[i].ObservedAt = want[i].ObservedAt
		}
		if got[i] != want[i] {
			t.Errorf("replica %d: %+v, want %+v", i, got[i], want[i])
		}
	}

	// The buyer's status through the control plane over the same store.
	blobs, err := blobfs.Open(filepath.Join(t.TempDir(), "vm-images"))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	mk, err := market.New(market.Config{PublicURL: "http://127.0.0.1:8480", TicketTTL: time.Hour, ImagesPerTenant: 3,
		VMsEnabled: true, VMsDomain: "vms.example.org", Now: h.clock.Now}, h.st, blobs, reg, reg)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/market/vms/status", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer "+h.buyerToken)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	mk.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("status: %d %s", rec.Code, rec.Body)
	}
	var st struct {
		Orders []struct {
			OrderID  string `json:"order_id"`
			State    string `json:"state"`
			Address  string `json:"address"`
			Replicas []struct {
				Name, State, Detail, Progress string
			} `json:"replicas"`
		} `json:"orders"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Orders) != 1 || st.Orders[0].State != "active" || len(st.Orders[0].Replicas) != 4 ||
		st.Orders[0].Address != "vm-"+o.ID+".vms.example.org" {
		t.Fatalf("status orders %s", rec.Body)
	}
	for i, r := range st.Orders[0].Replicas {
		if r.Name != want[i].Name || r.State != want[i].State || r.Detail != want[i].Detail || r.Progress != want[i].Progress {
			t.Errorf("status replica %d = %+v, want %+v", i, r, want[i])
		}
	}
}

// TestClusterUnreachable: while the API server does not answer, Ready
// says why, every paid order gets a note and stays paid, nothing else is
// asked; once it answers, the orders are provisioned and the notes go.
func TestClusterUnreachable(t *testing.T) {
	h := newHarness(t)
	if err := h.p.Ready(); err == nil {
		t.Error("Ready before any pass is nil, want not reached yet")
	}
	active := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
	h.reconcile()
	if err := h.p.Ready(); err != nil {
		t.Errorf("Ready after a pass that reached the cluster: %v", err)
	}
	paid := h.order(2, imagestore.ImageCatalogue, "debian-13", "")
	down := failing(errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"))
	h.k.PrependReactor("get", "version", down.react)
	h.clearActions()

	for range 2 {
		err := h.reconcileFailing()
		if !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("pass error %v", err)
		}
		ready := h.p.Ready()
		if ready == nil || !strings.Contains(ready.Error(), "cannot be reached") || !strings.Contains(ready.Error(), "connection refused") {
			t.Errorf("Ready = %v, want the reason", ready)
		}
		got := h.stored(paid.ID)
		if got.State != imagestore.OrderPaid || !strings.HasPrefix(got.Note, "the cluster cannot be reached: ") ||
			!strings.Contains(got.Note, "connection refused") {
			t.Errorf("paid order %s note %q, want paid with the cluster's note", got.State, got.Note)
		}
		if got := h.stored(active.ID); got.State != imagestore.OrderActive || got.Note != "" {
			t.Errorf("active order %s note %q, want untouched", got.State, got.Note)
		}
		for name, f := range h.fakes() {
			for _, a := range f.Actions() {
				if a.GetResource().Resource != "version" {
					t.Errorf("the %s fake was asked %s while the cluster was down", name, describe(a))
				}
			}
		}
	}
	if n := h.errorsOf(stepPing); n != 2 {
		t.Errorf("errors{step=ping} = %v, want 2", n)
	}

	down.on.Store(false)
	h.reconcile()
	if err := h.p.Ready(); err != nil {
		t.Errorf("Ready after recovery: %v", err)
	}
	if got := h.stored(paid.ID); got.State != imagestore.OrderActive || got.Note != "" {
		t.Errorf("after recovery: %s note %q, want active without a note", got.State, got.Note)
	}
}

// TestUnreachableCluster: the Cluster serve uses without a configured
// cluster fails every call with its reason, and the provisioner over it
// says so.
func TestUnreachableCluster(t *testing.T) {
	reason := errors.New("no --kubeconfig and not in a cluster")
	c := Unreachable(reason)
	ctx := t.Context()
	calls := map[string]error{"Ping": c.Ping(ctx), "CreateNamespace": c.CreateNamespace(ctx, nil),
		"CreateSecret": c.CreateSecret(ctx, nil), "CreateService": c.CreateService(ctx, nil),
		"CreateIngress": c.CreateIngress(ctx, nil), "CreateVM": c.CreateVM(ctx, nil),
		"CreateDataVolume": c.CreateDataVolume(ctx, nil),
		"SetRunStrategy":   c.SetRunStrategy(ctx, "ns", "vm", kubevirtv1.RunStrategyHalted)}
	_, calls["GetNamespace"] = c.GetNamespace(ctx, "x")
	_, calls["GetSecret"] = c.GetSecret(ctx, "x", "y")
	_, calls["GetService"] = c.GetService(ctx, "x", "y")
	_, calls["GetIngress"] = c.GetIngress(ctx, "x", "y")
	_, calls["GetVM"] = c.GetVM(ctx, "x", "y")
	_, calls["GetDataVolume"] = c.GetDataVolume(ctx, "x", "y")
	for name, err := range calls {
		if !errors.Is(err, reason) {
			t.Errorf("%s = %v, want the reason", name, err)
		}
	}
}

// TestEveryWriteIsStrict: each write the Cluster makes (a create of every
// kind, the runStrategy patch) asks the API server for strict field
// validation, so that a field its schema does not know (an http source's
// checksum in an older CDI API) is an error, not silently dropped. (The
// harness checks every other test's writes too.)
func TestEveryWriteIsStrict(t *testing.T) {
	h := newHarness(t, withDomain("vms.example.org"))
	o := h.order(1, imagestore.ImageUpload, h.image(1<<30, false).UploadID, "")
	h.reconcile() // its creates
	h.clock.Set(o.ExpiresAt)
	h.reconcile() // its expiry: the patch
	seen := map[string]int{}
	for name, f := range h.fakes() {
		for _, a := range f.Actions() {
			fv, write := fieldValidationOf(a)
			if !write {
				continue
			}
			seen[a.GetVerb()+" "+a.GetResource().Resource]++
			if fv != "Strict" {
				t.Errorf("the %s fake was sent %s with fieldValidation %q, want Strict", name, describe(a), fv)
			}
		}
	}
	for _, w := range []string{"create namespaces", "create secrets", "create services", "create ingresses",
		"create datavolumes", "create virtualmachines", "patch virtualmachines"} {
		if seen[w] == 0 {
			t.Errorf("no %s was sent; writes seen: %v", w, seen)
		}
	}
}

// TestRunAndKick: Run passes at once and on a Kick (the webhook's cue),
// and returns when its context ends.
func TestRunAndKick(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Every = time.Hour }) // the ticker never fires in the test
	passes := make(chan error, 10)
	h.p.afterPass = func(err error) { passes <- err }
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { h.p.Run(ctx); close(done) }()
	wait := func(what string) error {
		t.Helper()
		select {
		case err := <-passes:
			return err
		case <-time.After(20 * time.Second):
			t.Fatalf("no pass %s", what)
			return nil
		}
	}
	if err := wait("at start"); err != nil {
		t.Fatalf("first pass: %v", err)
	}
	o := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
	h.p.Kick(o.ID)
	h.p.Kick(o.ID) // a second Kick while one is pending does not block
	if err := wait("after Kick"); err != nil {
		t.Fatalf("pass after Kick: %v", err)
	}
	if got := h.stored(o.ID); got.State != imagestore.OrderActive {
		t.Errorf("order %s after the Kick's pass, want active", got.State)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if n := testutil.ToFloat64(h.p.m.runs); n < 2 {
		t.Errorf("runs = %v, want at least 2", n)
	}
}

// TestBackoff: an order that failed is tried again after Every, then after
// twice as long, never later than maxBackoff; a Kick or a success ends
// the backoff.
func TestBackoff(t *testing.T) {
	h := newHarness(t)
	o := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
	refuse := failing(apierrors.NewForbidden(testGR, "x", errors.New("no")))
	h.react("create", "virtualmachines", refuse.react)
	tries := func() int {
		n := 0
		for _, c := range h.creates() {
			if strings.HasPrefix(c, "create virtualmachines ") {
				n++
			}
		}
		h.clearActions()
		return n
	}
	every := h.cfg.Every
	steps := []struct {
		advance time.Duration
		tried   bool
	}{
		{0, true},          // first failure: wait every
		{every - 1, false}, //
		{1, true},          // second: wait 2×every
		{every, false},     //
		{every, true},      // third: 4×every
		{3 * every, false}, //
		{every, true},      // fourth: 8×every
		{8 * every, true},  // fifth: 16×every = 8 min
		{16 * every, true}, // sixth: 32×every, capped at 10 min
		{maxBackoff - 1, false},
		{1, true},
	}
	for i, st := range steps {
		h.clock.Advance(st.advance)
		_ = h.p.ReconcileOnce(t.Context())
		if got := tries() > 0; got != st.tried {
			t.Fatalf("step %d (+%v): tried %v, want %v", i, st.advance, got, st.tried)
		}
	}
	h.p.Kick(o.ID)
	_ = h.p.ReconcileOnce(t.Context())
	if tries() == 0 {
		t.Error("a Kick did not end the backoff")
	}
	refuse.on.Store(false)
	h.clock.Advance(maxBackoff)
	h.reconcile()
	if got := h.stored(o.ID); got.State != imagestore.OrderActive {
		t.Fatalf("order %s, want active", got.State)
	}
	if len(h.p.backoff) != 0 {
		t.Errorf("backoff %v after a success, want none", h.p.backoff)
	}
}

// refuseVMsOf makes the cluster refuse the VirtualMachines of order o.
func (h *harness) refuseVMsOf(o imagestore.Order) {
	h.react("create", "virtualmachines", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if vm := a.(k8stesting.CreateAction).GetObject().(*kubevirtv1.VirtualMachine); strings.HasPrefix(vm.Name, "vm-"+o.ID+"-") {
			return true, nil, apierrors.NewForbidden(testGR, vm.Name, errors.New("quota exceeded"))
		}
		return false, nil, nil
	})
}

// TestBackoffForgetsEndedOrders: the backoff of an order that left paid
// and active by another way than this provisioner (here its month ended
// and another replica expired it) is forgotten at the next pass, so the
// map does not grow with every order that ever failed.
func TestBackoffForgetsEndedOrders(t *testing.T) {
	h := newHarness(t)
	a := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
	b := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
	h.refuseVMsOf(a)
	h.refuseVMsOf(b)
	_ = h.reconcileFailing()
	if n := len(h.p.backoff); n != 2 {
		t.Fatalf("backoff holds %d orders after both failed, want 2", n)
	}
	h.clock.Set(a.ExpiresAt)
	for _, o := range []imagestore.Order{a, b} {
		if err := h.st.ExpireOrder(t.Context(), o.ID, a.ExpiresAt); err != nil {
			t.Fatalf("ExpireOrder(%s): %v", o.ID, err)
		}
	}
	h.reconcile()
	if n := len(h.p.backoff); n != 0 {
		t.Errorf("backoff %v after its orders ended, want empty", h.p.backoff)
	}
}

// TestBackoffSkipsOnlyItsOrder: an order in backoff is skipped, and the
// orders after it are reconciled in the same pass.
func TestBackoffSkipsOnlyItsOrder(t *testing.T) {
	h := newHarness(t)
	first := h.order(1, imagestore.ImageCatalogue, "debian-13", "")
	h.refuseVMsOf(first)
	_ = h.reconcileFailing()
	if h.p.due(first.ID, h.clock.Now()) {
		t.Fatal("the failed order is not in backoff")
	}
	h.clearActions()
	later := []imagestore.Order{
		h.order(1, imagestore.ImageCatalogue, "debian-13", ""),
		h.order(2, imagestore.ImageCatalogue, "ubuntu-24-04", ""),
	}
	h.reconcile() // the first order is still backing off
	for _, o := range later {
		if got := h.stored(o.ID); got.State != imagestore.OrderActive {
			t.Errorf("order %s after the backing-off one: %s, want active in the same pass", o.ID, got.State)
		}
	}
	for _, c := range h.creates() {
		if strings.Contains(c, first.ID) {
			t.Errorf("the order in backoff was tried: %s", c)
		}
	}
}

// TestNewRefuses: a config that cannot provision is refused at start.
func TestNewRefuses(t *testing.T) {
	good := Config{CPU: 1, MemoryMiB: 2048, DiskGiB: 20, StorageClass: "losos-vm-local", FetchBase: "https://edge.example.org"}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"no cpu", func(c *Config) { c.CPU = 0 }},
		{"tiny memory", func(c *Config) { c.MemoryMiB = 32 }},
		{"no disk", func(c *Config) { c.DiskGiB = 0 }},
		{"no storage class", func(c *Config) { c.StorageClass = "" }},
		{"no fetch base", func(c *Config) { c.FetchBase = "" }},
		{"fetch base with a query", func(c *Config) { c.FetchBase = "https://edge.example.org/?x=1" }},
		{"fetch base not http", func(c *Config) { c.FetchBase = "ftp://edge.example.org" }},
		{"negative every", func(c *Config) { c.Every = -time.Second }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.mod(&cfg)
			h := newHarness(t)
			if _, err := New(cfg, h.st, NewCluster(h.k, h.kv, h.cdi), prometheus.NewRegistry()); err == nil {
				t.Errorf("New(%+v) succeeded", cfg)
			}
		})
	}
	h := newHarness(t)
	if _, err := New(good, nil, NewCluster(h.k, h.kv, h.cdi), prometheus.NewRegistry()); err == nil {
		t.Error("New without a store succeeded")
	}
	// Its metrics are registered once: a second provisioner on the same
	// registry is an error, not a panic.
	if _, err := New(good, h.st, NewCluster(h.k, h.kv, h.cdi), h.reg); err == nil {
		t.Error("a second New on the same registry succeeded")
	}
}

// TestProvisionInstallationISO: an ISO order's replica is its blank disk
// and its CD-ROM, both made before the VM and only while it is missing;
// the ISO's import shows as importing; without the console the order is
// not provisioned at all.
func TestProvisionInstallationISO(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ConsoleAvailable = true })
	o := h.order(2, imagestore.ImageCatalogue, "nixos-26-05", "")
	recorded := h.recordCreates()
	h.reconcile()
	ns := namespaceName(h.buyer.ID)
	entry, _ := catalogue.Builtin().WithConsole().Lookup("nixos-26-05")
	created := *recorded
	for i := range o.Quantity {
		w := wantVM{order: o.ID, namespace: ns, replica: i, appliance: "box-1", cores: 2, class: "losos-vm-local",
			memory: "2Gi", disk: "20Gi", iso: entry.URL}
		checkVM(t, h.vm(ns, vmName(o.ID, i)), w)
		checkDataVolume(t, h.dataVolume(ns, diskName(o.ID, i)), w)
		checkISOVolume(t, h.dataVolume(ns, isoName(o.ID, i)), w)
		disk := slices.Index(created, "datavolumes/"+diskName(o.ID, i))
		iso := slices.Index(created, "datavolumes/"+isoName(o.ID, i))
		vm := slices.Index(created, "virtualmachines/"+vmName(o.ID, i))
		if disk < 0 || iso < 0 || vm < 0 || disk > vm || iso > vm {
			t.Errorf("creates %v: want %s and %s before %s", created, diskName(o.ID, i), isoName(o.ID, i), vmName(o.ID, i))
		}
	}
	// An installer runs no cloud-init: no Secret for it.
	if _, err := h.k.Tracker().Get(corev1.SchemeGroupVersion.WithResource("secrets"), ns, cloudInitName(o.ID)); !apierrors.IsNotFound(err) {
		t.Errorf("the cloud-init Secret of an installation ISO's order: %v, want none made", err)
	}

	// The blank disk is ready at once; the download of the ISO is what
	// the replica waits for.
	h.setVMStatus(ns, vmName(o.ID, 0), kubevirtv1.VirtualMachineStatusProvisioning)
	h.setDataVolume(ns, diskName(o.ID, 0), cdiv1.Succeeded, "")
	h.setDataVolume(ns, isoName(o.ID, 0), cdiv1.ImportInProgress, "12.00%")
	// A CD-ROM gone behind its VM is not made again, as a disk is not.
	if err := h.cdi.Tracker().Delete(dvResource, ns, isoName(o.ID, 1)); err != nil {
		t.Fatal(err)
	}
	h.clearActions()
	h.clock.Advance(time.Minute)
	h.reconcile()
	if w := h.writes(); len(w) != 0 {
		t.Errorf("the second pass wrote: %v", w)
	}
	states, err := h.st.ReplicaStates(t.Context(), o.ID)
	if err != nil || len(states) != 2 || states[0].State != "importing" || states[0].Progress != "12.00%" ||
		states[0].Detail != string(cdiv1.ImportInProgress) {
		t.Errorf("replica states %+v, %v; want replica 0 importing its ISO at 12.00%%", states, err)
	}

	// Without the console the ISO is not resolved: nothing is made.
	off := newHarness(t)
	blocked := off.order(1, imagestore.ImageCatalogue, "nixos-26-05", "")
	if err := off.reconcileFailing(); !strings.Contains(err.Error(), "nixos-26-05") {
		t.Errorf("the pass failed with %v, want the ISO not found", err)
	}
	if got := off.stored(blocked.ID); got.BlockedCause != imagestore.BlockedImageNotOffered {
		t.Errorf("ISO order without the console: blocked %q, want %q", got.BlockedCause, imagestore.BlockedImageNotOffered)
	}
	for _, c := range off.creates() {
		if strings.Contains(c, "datavolumes") || strings.Contains(c, "virtualmachines") {
			t.Errorf("without the console it made %s", c)
		}
	}
}
