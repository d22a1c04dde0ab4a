package kubetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
	"github.com/vmshelf/vmshelf/internal/testkit/fakeclock"
	"github.com/vmshelf/vmshelf/provisioner"
)

var (
	vmGVR = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	dvGVR = schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datavolumes"}
)

// marketFixture is a store with a host, a buyer and two paid orders: one
// of a catalogue image (2 replicas), one of the buyer's own upload (1).
type marketFixture struct {
	st              *sqlite.Store
	host, buyer     imagestore.Tenant
	cloud, own      imagestore.Order
	upload          imagestore.Image
	userData        string
	paidAt, expires time.Time
}

func newMarket(t *testing.T, ctx context.Context, now time.Time) *marketFixture {
	t.Helper()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "vmshelf.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f := &marketFixture{st: st, userData: "#cloud-config\nhostname: web\n", paidAt: now, expires: now.AddDate(0, 1, 0)}
	if f.host, err = st.CreateTenant(ctx, imagestore.Tenant{Name: "box1", InMesh: true, Sharing: true, HostsVMs: true,
		Appliance: testAppliance, StripeAccount: "acct_box1", CreatedAt: now}, imagestore.HashSecret(imagestore.NewSecret())); err != nil {
		t.Fatal(err)
	}
	if f.buyer, err = st.CreateTenant(ctx, imagestore.Tenant{Name: "buyer", InMesh: true, CreatedAt: now},
		imagestore.HashSecret(imagestore.NewSecret())); err != nil {
		t.Fatal(err)
	}
	l, err := st.CreateListing(ctx, imagestore.Listing{ID: imagestore.NewListingID(), HostID: f.host.ID, UnitPrice: 600,
		Currency: "eur", Capacity: 5, CreatedAt: now})
	if err != nil {
		t.Fatal(err)
	}
	f.upload = imagestore.Image{UploadID: imagestore.NewUploadID(), TenantID: f.buyer.ID, Name: "my disk", EFI: true,
		Size: 1 << 30, VirtualSize: 30<<30 + 1, SHA256: strings.Repeat("ab", 32), CreatedAt: now}
	if err := st.AddImage(ctx, f.upload, 3); err != nil {
		t.Fatal(err)
	}
	order := func(kind imagestore.ImageKind, image string, quantity int, userData string) imagestore.Order {
		return paidOrder(t, ctx, st, l, f.buyer, f.host, kind, image, quantity, userData, f.paidAt, f.expires)
	}
	f.cloud = order(imagestore.ImageCatalogue, "debian-13", 2, f.userData)
	f.own = order(imagestore.ImageUpload, f.upload.UploadID, 1, "")
	return f
}

// paidOrder is an order of quantity replicas of image on listing l of
// host, made by buyer at paidAt and paid then, for a month ending at
// expires.
func paidOrder(t *testing.T, ctx context.Context, st *sqlite.Store, l imagestore.Listing, buyer, host imagestore.Tenant,
	kind imagestore.ImageKind, image string, quantity int, userData string, paidAt, expires time.Time) imagestore.Order {
	t.Helper()
	total := l.UnitPrice * int64(quantity)
	o := imagestore.Order{ID: imagestore.NewOrderID(), ListingID: l.ID, BuyerID: buyer.ID, HostID: host.ID,
		Quantity: quantity, ImageKind: kind, Image: image, Name: "web", UnitPrice: l.UnitPrice, Total: total,
		Fee: total / 2, Currency: "eur", Destination: host.StripeAccount, ReserveUntil: paidAt.Add(time.Hour), CreatedAt: paidAt}
	if err := st.CreateOrder(ctx, o, userData, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PayOrder(ctx, o.ID, paidAt, expires); err != nil {
		t.Fatal(err)
	}
	return o
}

// TestProvisionerAgainstAPIServer: paid orders in a real SQLite store,
// reconciled by the provisioner as the ServiceAccount vmshelf:vmshelf
// bound only to the shipped ClusterRole, against a real kube-apiserver:
// every object of the design is made and reads back as designed; a second
// pass changes nothing; replica states written to the VMs' and
// DataVolumes' status come back through Store.ReplicaStates; at the end of
// the month every replica is halted and nothing is deleted.
func TestProvisionerAgainstAPIServer(t *testing.T) {
	srv := Start(t)
	registerCRDs(t, srv.Admin, operatorCRDs(t))
	s := kitScheme(t)
	applyKit(t, srv.Admin, s, provisionerIdentity(t, s))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	clk := fakeclock.NewStill(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	m := newMarket(t, ctx, clk.Now())

	cluster, err := provisioner.ClusterFromConfig(srv.AsServiceAccount(vmshelfNamespace, vmshelfSA))
	if err != nil {
		t.Fatal(err)
	}
	cat := catalogue.Builtin()
	p, err := provisioner.New(provisioner.Config{
		CPU: 2, MemoryMiB: 1024, DiskGiB: 20, StorageClass: vmStorageClass, Domain: testDomain, FetchBase: testFetchBase,
		Catalogue: cat, Every: 30 * time.Second, Now: clk.Now, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, m.st, cluster, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	pass := func(what string) {
		t.Helper()
		if err := p.ReconcileOnce(ctx); err != nil {
			t.Fatalf("%s: ReconcileOnce: %v", what, err)
		}
		if err := p.Ready(); err != nil {
			t.Fatalf("%s: Ready: %v", what, err)
		}
	}
	pass("first pass")

	admin, err := kubernetes.NewForConfig(srv.Admin)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(srv.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("market-%d", m.buyer.ID)

	t.Run("objects", func(t *testing.T) {
		n, err := admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("namespace %s: %v", ns, err)
		}
		checkManaged(t, "namespace", n.Labels, "", "")
		for _, o := range []imagestore.Order{m.cloud, m.own} {
			got, err := m.st.Order(ctx, o.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != imagestore.OrderActive || got.Note != "" {
				t.Errorf("order %s: state %s, note %q; want active without a note", o.ID, got.State, got.Note)
			}
			checkOrderObjects(t, ctx, admin, dyn, m, cat, ns, o)
		}
	})

	t.Run("second pass changes nothing", func(t *testing.T) {
		before := resourceVersions(t, ctx, admin, dyn, ns)
		pass("second pass")
		if after := resourceVersions(t, ctx, admin, dyn, ns); !maps(before, after) {
			t.Fatalf("resourceVersions changed:\nbefore %v\nafter  %v", before, after)
		}
	})

	t.Run("replica states", func(t *testing.T) {
		o := m.cloud
		setVMStatus(t, ctx, dyn, ns, fmt.Sprintf("vm-%s-0", o.ID), kubevirtv1.VirtualMachinePrintableStatus("Running"))
		setVMStatus(t, ctx, dyn, ns, fmt.Sprintf("vm-%s-1", o.ID), kubevirtv1.VirtualMachineStatusProvisioning)
		// CDI's status of an import under way, on the provisioner's DataVolume.
		dvName := fmt.Sprintf("vm-%s-1-disk", o.ID)
		setDataVolumeStatus(t, ctx, dyn, ns, dvName, cdiv1beta1.ImportInProgress, "42.50%")
		pass("after status")
		states, err := m.st.ReplicaStates(ctx, o.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := []imagestore.ReplicaState{
			{Index: 0, Name: fmt.Sprintf("vm-%s-0", o.ID), State: "running", Detail: "Running"},
			{Index: 1, Name: fmt.Sprintf("vm-%s-1", o.ID), State: "importing", Detail: string(cdiv1beta1.ImportInProgress), Progress: "42.50%"},
		}
		if len(states) != len(want) {
			t.Fatalf("replica states %+v, want %+v", states, want)
		}
		for i := range want {
			got := states[i]
			got.ObservedAt = time.Time{}
			if got != want[i] {
				t.Errorf("replica %d: %+v, want %+v", i, got, want[i])
			}
			if !states[i].ObservedAt.Equal(clk.Now()) {
				t.Errorf("replica %d observed at %v, want the provisioner's now %v", i, states[i].ObservedAt, clk.Now())
			}
		}
	})

	t.Run("expiry halts", func(t *testing.T) {
		before := resourceVersions(t, ctx, admin, dyn, ns)
		clk.Set(m.expires.Add(time.Second))
		pass("after the month")
		for _, o := range []imagestore.Order{m.cloud, m.own} {
			got, err := m.st.Order(ctx, o.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != imagestore.OrderExpired {
				t.Errorf("order %s: state %s, want expired", o.ID, got.State)
			}
			for i := range o.Quantity {
				vm := getVM(t, ctx, dyn, ns, fmt.Sprintf("vm-%s-%d", o.ID, i))
				if vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyHalted {
					t.Errorf("%s: runStrategy %v, want Halted", vm.Name, vm.Spec.RunStrategy)
				}
			}
		}
		// Nothing is gone; only the VMs changed.
		after := resourceVersions(t, ctx, admin, dyn, ns)
		for k, v := range before {
			a, ok := after[k]
			switch {
			case !ok:
				t.Errorf("%s is gone after the month", k)
			case !strings.HasPrefix(k, "VirtualMachine/") && a != v:
				t.Errorf("%s changed after the month (%s → %s)", k, v, a)
			}
		}
		// A further pass over expired orders touches nothing.
		before = after
		pass("after expiry")
		if after := resourceVersions(t, ctx, admin, dyn, ns); !maps(before, after) {
			t.Errorf("a pass after expiry changed: %v → %v", before, after)
		}
	})
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// checkManaged: the labels every object of an order carries.
func checkManaged(t *testing.T, what string, labels map[string]string, order, replica string) {
	t.Helper()
	if labels["app.kubernetes.io/managed-by"] != "vmshelf" {
		t.Errorf("%s: labels %v lack app.kubernetes.io/managed-by: vmshelf", what, labels)
	}
	if order != "" && labels["losos.dev/order"] != order {
		t.Errorf("%s: losos.dev/order %q, want %q", what, labels["losos.dev/order"], order)
	}
	if replica != "" && labels["losos.dev/replica"] != replica {
		t.Errorf("%s: losos.dev/replica %q, want %q", what, labels["losos.dev/replica"], replica)
	}
}

func checkOrderObjects(t *testing.T, ctx context.Context, admin kubernetes.Interface, dyn dynamic.Interface,
	m *marketFixture, cat *catalogue.Catalogue, ns string, o imagestore.Order) {
	t.Helper()
	ci, err := admin.CoreV1().Secrets(ns).Get(ctx, fmt.Sprintf("vm-%s-cloudinit", o.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("cloud-init Secret: %v", err)
	}
	checkManaged(t, ci.Name, ci.Labels, o.ID, "")
	wantUD := "#cloud-config\n"
	if o.ID == m.cloud.ID {
		wantUD = m.userData
	}
	if got := string(ci.Data["userdata"]); got != wantUD {
		t.Errorf("%s userdata %q, want %q", ci.Name, got, wantUD)
	}

	var fetchHeader string
	fetch, err := admin.CoreV1().Secrets(ns).Get(ctx, fmt.Sprintf("vm-%s-fetch", o.ID), metav1.GetOptions{})
	switch {
	case o.ImageKind == imagestore.ImageUpload && err != nil:
		t.Fatalf("fetch Secret: %v", err)
	case o.ImageKind == imagestore.ImageUpload:
		checkManaged(t, fetch.Name, fetch.Labels, o.ID, "")
		if len(fetch.Data) != 1 {
			t.Fatalf("fetch Secret has %d values, want one header line", len(fetch.Data))
		}
		for _, v := range fetch.Data {
			fetchHeader = string(v)
		}
		token, ok := strings.CutPrefix(fetchHeader, "Authorization: Bearer ")
		if !ok || len(token) != 64 {
			t.Fatalf("fetch Secret's header is not a bearer token line")
		}
		img, _, err := m.st.ImageForToken(ctx, imagestore.HashSecret(token), m.paidAt)
		if err != nil || img.UploadID != m.upload.UploadID {
			t.Fatalf("the fetch token names %q (%v), want image %s", img.UploadID, err, m.upload.UploadID)
		}
	case !apierrors.IsNotFound(err):
		t.Fatalf("a catalogue order's fetch Secret: %v, want NotFound", err)
	}

	for i := range o.Quantity {
		name := fmt.Sprintf("vm-%s-%d", o.ID, i)
		vm := getVM(t, ctx, dyn, ns, name)
		checkManaged(t, name, vm.Labels, o.ID, strconv.Itoa(i))
		checkManaged(t, name+" template", vm.Spec.Template.ObjectMeta.Labels, o.ID, strconv.Itoa(i))
		if vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyAlways {
			t.Errorf("%s runStrategy %v, want Always", name, vm.Spec.RunStrategy)
		}
		spec := vm.Spec.Template.Spec
		if spec.NodeSelector["losos.dev/appliance"] != testAppliance {
			t.Errorf("%s nodeSelector %v, want losos.dev/appliance: %s", name, spec.NodeSelector, testAppliance)
		}
		if !tolerates(spec.Tolerations, computeWindowTaint) {
			t.Errorf("%s tolerations %+v lack %s", name, spec.Tolerations, computeWindowTaint)
		}
		if c := spec.Domain.CPU; c == nil || c.Cores != 2 {
			t.Errorf("%s cpu %+v, want 2 cores", name, c)
		}
		if len(vm.Spec.DataVolumeTemplates) != 0 {
			t.Errorf("%s: %d dataVolumeTemplates, want none (its disk is a DataVolume of its own)", name, len(vm.Spec.DataVolumeTemplates))
		}
		dv := getDataVolume(t, ctx, dyn, ns, name+"-disk")
		checkManaged(t, dv.Name, dv.Labels, o.ID, strconv.Itoa(i))
		if len(dv.OwnerReferences) != 0 {
			t.Errorf("%s has owners %+v: deleting one would delete the buyer's disk", dv.Name, dv.OwnerReferences)
		}
		if dv.Spec.Storage == nil || dv.Spec.Storage.StorageClassName == nil || *dv.Spec.Storage.StorageClassName != vmStorageClass {
			t.Errorf("DataVolume %s storage %+v, want %s", dv.Name, dv.Spec.Storage, vmStorageClass)
		}
		if v := spec.Volumes; len(v) == 0 || v[0].DataVolume == nil || v[0].DataVolume.Name != dv.Name {
			t.Errorf("%s's first volume %+v, want DataVolume %s", name, v, dv.Name)
		}
		var volumes []string
		for _, v := range spec.Volumes {
			volumes = append(volumes, v.Name)
			if v.Name == "cloudinitdisk" && (v.CloudInitNoCloud == nil || v.CloudInitNoCloud.UserDataSecretRef == nil ||
				v.CloudInitNoCloud.UserDataSecretRef.Name != ci.Name) {
				t.Errorf("%s cloudinitdisk %+v, want secretRef %s", name, v.CloudInitNoCloud, ci.Name)
			}
		}
		slices.Sort(volumes)
		if !slices.Equal(volumes, []string{"cloudinitdisk", "rootdisk"}) {
			t.Errorf("%s volumes %v", name, volumes)
		}
		src := dv.Spec.Source
		switch o.ImageKind {
		case imagestore.ImageCatalogue:
			e, _ := cat.Lookup(o.Image)
			if src == nil || src.HTTP == nil || src.HTTP.URL != e.URL || src.HTTP.Checksum != "" {
				t.Errorf("%s source %+v, want http %s without a checksum", name, src, e.URL)
			}
		case imagestore.ImageUpload:
			wantURL := testFetchBase + "/market/vm-images/fetch/" + m.upload.UploadID
			if src == nil || src.HTTP == nil || src.HTTP.URL != wantURL || !slices.Equal(src.HTTP.SecretExtraHeaders, []string{fetch.Name}) ||
				src.HTTP.Checksum != "sha256:"+m.upload.SHA256 {
				t.Errorf("%s source %+v, want http %s with secretExtraHeaders [%s] and checksum sha256:%s",
					name, src, wantURL, fetch.Name, m.upload.SHA256)
			}
			want := resource.NewQuantity(31<<30, resource.BinarySI) // ceil(30 GiB + 1 byte)
			if got := dv.Spec.Storage.Resources.Requests[corev1.ResourceStorage]; got.Cmp(*want) != 0 {
				t.Errorf("%s disk %s, want %s (the image's virtual size, rounded up)", name, got.String(), want.String())
			}
			if fw := spec.Domain.Firmware; fw == nil || fw.Bootloader == nil || fw.Bootloader.EFI == nil ||
				fw.Bootloader.EFI.SecureBoot == nil || *fw.Bootloader.EFI.SecureBoot {
				t.Errorf("%s firmware %+v, want UEFI with secure boot off", name, fw)
			}
		}
		// The token is in the Secret only.
		if raw, _ := json.Marshal(vm); fetchHeader != "" && strings.Contains(string(raw), strings.TrimPrefix(fetchHeader, "Authorization: Bearer ")) {
			t.Errorf("%s carries the fetch token", name)
		}
	}

	svc, err := admin.CoreV1().Services(ns).Get(ctx, "vm-"+o.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Service: %v", err)
	}
	checkManaged(t, svc.Name, svc.Labels, o.ID, "")
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort.IntValue() != 80 ||
		svc.Spec.Selector["losos.dev/order"] != o.ID {
		t.Errorf("Service %s: ports %+v selector %v", svc.Name, svc.Spec.Ports, svc.Spec.Selector)
	}

	ing, err := admin.NetworkingV1().Ingresses(ns).Get(ctx, "vm-"+o.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Ingress: %v", err)
	}
	checkIngress(t, ing, o.ID)
}

func checkIngress(t *testing.T, ing *networkingv1.Ingress, order string) {
	t.Helper()
	checkManaged(t, ing.Name, ing.Labels, order, "")
	host := "vm-" + order + "." + testDomain
	for k, v := range map[string]string{
		"traefik.ingress.kubernetes.io/router.entrypoints":      "websecure",
		"traefik.ingress.kubernetes.io/router.tls":              "true",
		"traefik.ingress.kubernetes.io/router.tls.certresolver": "letsencrypt",
	} {
		if ing.Annotations[k] != v {
			t.Errorf("Ingress %s annotation %s = %q, want %q", ing.Name, k, ing.Annotations[k], v)
		}
	}
	if len(ing.Spec.TLS) != 1 || !slices.Equal(ing.Spec.TLS[0].Hosts, []string{host}) || ing.Spec.TLS[0].SecretName != "vm-"+order+"-tls" {
		t.Errorf("Ingress %s tls %+v", ing.Name, ing.Spec.TLS)
	}
	if len(ing.Spec.Rules) != 1 || ing.Spec.Rules[0].Host != host || ing.Spec.Rules[0].HTTP == nil || len(ing.Spec.Rules[0].HTTP.Paths) != 1 {
		t.Fatalf("Ingress %s rules %+v", ing.Name, ing.Spec.Rules)
	}
	path := ing.Spec.Rules[0].HTTP.Paths[0]
	if path.Path != "/" || path.Backend.Service == nil || path.Backend.Service.Name != "vm-"+order || path.Backend.Service.Port.Number != 80 {
		t.Errorf("Ingress %s path %+v", ing.Name, path)
	}
}

func getVM(t *testing.T, ctx context.Context, dyn dynamic.Interface, ns, name string) *kubevirtv1.VirtualMachine {
	t.Helper()
	u, err := dyn.Resource(vmGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("VirtualMachine %s: %v", name, err)
	}
	vm := &kubevirtv1.VirtualMachine{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, vm, true); err != nil {
		t.Fatalf("VirtualMachine %s is not a KubeVirt VM: %v", name, err)
	}
	return vm
}

// setVMStatus writes status.printableStatus through the status subresource,
// as virt-controller would.
func setVMStatus(t *testing.T, ctx context.Context, dyn dynamic.Interface, ns, name string, s kubevirtv1.VirtualMachinePrintableStatus) {
	t.Helper()
	patch := fmt.Sprintf(`{"status":{"printableStatus":%q}}`, s)
	if _, err := dyn.Resource(vmGVR).Namespace(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("status of %s: %v", name, err)
	}
}

// getDataVolume reads a DataVolume as CDI's types (v1.66.0), refusing a
// field they do not have.
func getDataVolume(t *testing.T, ctx context.Context, dyn dynamic.Interface, ns, name string) *cdiv1beta1.DataVolume {
	t.Helper()
	u, err := dyn.Resource(dvGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("DataVolume %s: %v", name, err)
	}
	dv := &cdiv1beta1.DataVolume{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, dv, true); err != nil {
		t.Fatalf("DataVolume %s is not CDI's: %v", name, err)
	}
	return dv
}

// setDataVolumeStatus gives a DataVolume CDI's status of an import.
func setDataVolumeStatus(t *testing.T, ctx context.Context, dyn dynamic.Interface, ns, name string, phase cdiv1beta1.DataVolumePhase, progress string) {
	t.Helper()
	patch := fmt.Sprintf(`{"status":{"phase":%q,"progress":%q}}`, phase, progress)
	if _, err := dyn.Resource(dvGVR).Namespace(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("status of DataVolume %s: %v", name, err)
	}
}

// resourceVersions of every object in the buyer's namespace (and the
// namespace), by kind/name.
func resourceVersions(t *testing.T, ctx context.Context, admin kubernetes.Interface, dyn dynamic.Interface, ns string) map[string]string {
	t.Helper()
	out := map[string]string{}
	n, err := admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out["Namespace/"+ns] = n.ResourceVersion
	for kind, gvr := range map[string]schema.GroupVersionResource{
		"Secret":         {Version: "v1", Resource: "secrets"},
		"Service":        {Version: "v1", Resource: "services"},
		"Ingress":        {Group: "networking.k8s.io", Version: "v1", Resource: "ingresses"},
		"VirtualMachine": vmGVR,
		"DataVolume":     dvGVR,
	} {
		list, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list %s: %v", kind, err)
		}
		for _, it := range list.Items {
			out[kind+"/"+it.GetName()] = it.GetResourceVersion()
		}
	}
	return out
}
