package kubetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
	"github.com/vmshelf/vmshelf/internal/testkit/fakeclock"
	"github.com/vmshelf/vmshelf/provisioner"
)

// judgeMarket is a store with a paid order of every kind of machine the
// provisioner builds: a catalogue cloud image, the LosOS containerDisk, an
// own BIOS image, an own UEFI image, and a catalogue image ten times.
type judgeMarket struct {
	st     *sqlite.Store
	orders []imagestore.Order
	bios   imagestore.Image
	uefi   imagestore.Image
	buyer  imagestore.Tenant
	expiry time.Time
}

// newJudgeMarket makes the market; spare tenants made first give its buyer
// a namespace of its own (market-<buyer ID>) beside another market's.
func newJudgeMarket(t *testing.T, ctx context.Context, now time.Time, spare int) *judgeMarket {
	t.Helper()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "vmshelf.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for i := range spare {
		if _, err := st.CreateTenant(ctx, imagestore.Tenant{Name: fmt.Sprintf("spare%d", i), CreatedAt: now},
			imagestore.HashSecret(imagestore.NewSecret())); err != nil {
			t.Fatal(err)
		}
	}
	m := &judgeMarket{st: st, expiry: now.AddDate(0, 1, 0)}
	host, err := st.CreateTenant(ctx, imagestore.Tenant{Name: "box1", InMesh: true, Sharing: true, HostsVMs: true,
		Appliance: testAppliance, StripeAccount: "acct_box1", CreatedAt: now}, imagestore.HashSecret(imagestore.NewSecret()))
	if err != nil {
		t.Fatal(err)
	}
	if m.buyer, err = st.CreateTenant(ctx, imagestore.Tenant{Name: "buyer", InMesh: true, CreatedAt: now},
		imagestore.HashSecret(imagestore.NewSecret())); err != nil {
		t.Fatal(err)
	}
	l, err := st.CreateListing(ctx, imagestore.Listing{ID: imagestore.NewListingID(), HostID: host.ID, UnitPrice: 600,
		Currency: "eur", Capacity: 20, CreatedAt: now})
	if err != nil {
		t.Fatal(err)
	}
	image := func(name string, efi bool, sum string) imagestore.Image {
		img := imagestore.Image{UploadID: imagestore.NewUploadID(), TenantID: m.buyer.ID, Name: name, EFI: efi,
			Size: 1 << 30, VirtualSize: 8 << 30, SHA256: strings.Repeat(sum, 32), CreatedAt: now}
		if err := st.AddImage(ctx, img, 3); err != nil {
			t.Fatal(err)
		}
		return img
	}
	m.bios, m.uefi = image("bios disk", false, "b1"), image("uefi disk", true, "e2")
	order := func(kind imagestore.ImageKind, image string, quantity int) {
		m.orders = append(m.orders, paidOrder(t, ctx, st, l, m.buyer, host, kind, image, quantity, "", now, m.expiry))
	}
	order(imagestore.ImageCatalogue, "debian-13", 1)
	order(imagestore.ImageCatalogue, "losos-demo", 1)
	order(imagestore.ImageUpload, m.bios.UploadID, 1)
	order(imagestore.ImageUpload, m.uefi.UploadID, 1)
	order(imagestore.ImageCatalogue, "debian-13", 10)
	// An installation ISO (the provisioner is told the console exists):
	// a blank disk booting first, the ISO as a SATA CD-ROM second.
	order(imagestore.ImageCatalogue, "nixos-26-05", 2)
	return m
}

func (m *judgeMarket) replicas() int {
	n := 0
	for _, o := range m.orders {
		n += o.Quantity
	}
	return n
}

// TestKubeVirtJudgesProvisioner: every VirtualMachine the provisioner
// writes — a catalogue cloud image, the LosOS containerDisk, an own BIOS
// image, an own UEFI image, ten replicas, with and without --vms-domain,
// and the month's-end Halted patch — is accepted by KubeVirt's own CRD
// schemas (v1.8.0's as generated, v1.9.0's as published) under the
// provisioner's strict field validation, and by KubeVirt v1.8.0's own
// VirtualMachine admitter as a validating webhook.
func TestKubeVirtJudgesProvisioner(t *testing.T) {
	for _, j := range judges {
		t.Run(j.name, func(t *testing.T) {
			js := startJudge(t, j)
			for spare, domain := range []string{"", testDomain} {
				t.Run("domain "+fmt.Sprintf("%q", domain), func(t *testing.T) {
					js.provision(t, domain, spare)
				})
			}
			t.Run("judge is on", js.judgeIsOn)
		})
	}
}

func (js *judgeServer) provision(t *testing.T, domain string, spare int) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	clk := fakeclock.NewStill(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	m := newJudgeMarket(t, ctx, clk.Now(), spare)
	cluster, err := provisioner.ClusterFromConfig(js.srv.AsServiceAccount(vmshelfNamespace, vmshelfSA))
	if err != nil {
		t.Fatal(err)
	}
	p, err := provisioner.New(provisioner.Config{
		CPU: 2, MemoryMiB: 1024, DiskGiB: 20, StorageClass: vmStorageClass, Domain: domain, FetchBase: testFetchBase,
		Catalogue: catalogue.Builtin(), ConsoleAvailable: true, Every: 30 * time.Second, Now: clk.Now, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, m.st, cluster, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("market-%d", m.buyer.ID)
	pass := func(what string, op string) {
		t.Helper()
		if err := p.ReconcileOnce(ctx); err != nil {
			t.Fatalf("%s: ReconcileOnce: %v", what, err)
		}
		if err := p.Ready(); err != nil {
			t.Fatalf("%s: Ready: %v", what, err)
		}
		reviews := js.admission.Reviews()
		if len(reviews) != m.replicas() {
			t.Errorf("%s: KubeVirt's admitter saw %d writes, want one %s of each of the %d VMs: %+v", what, len(reviews), op, m.replicas(), reviews)
		}
		for _, r := range reviews {
			if string(r.Operation) != op || !r.Allowed {
				t.Errorf("%s: KubeVirt's admitter: %s %s allowed=%v %q, want %s allowed", what, r.Operation, r.Name, r.Allowed, r.Message, op)
			}
		}
	}
	pass("first pass", "CREATE")
	for _, o := range m.orders {
		got, err := m.st.Order(ctx, o.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != imagestore.OrderActive || got.Note != "" {
			t.Errorf("order %s (%s): state %s, note %q; want active", o.ID, o.Image, got.State, got.Note)
		}
		for i := range o.Quantity {
			vm := getVM(t, ctx, js.dyn, ns, fmt.Sprintf("vm-%s-%d", o.ID, i))
			js.checkDisk(t, ctx, ns, m, o, vm)
		}
	}

	clk.Set(m.expiry.Add(time.Second))
	pass("after the month", "UPDATE")
	for _, o := range m.orders {
		for i := range o.Quantity {
			vm := getVM(t, ctx, js.dyn, ns, fmt.Sprintf("vm-%s-%d", o.ID, i))
			if vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyHalted {
				t.Errorf("%s: runStrategy %v, want Halted", vm.Name, vm.Spec.RunStrategy)
			}
		}
	}
}

// checkDisk: what the API server kept of a replica's disk is what CDI
// needs: its DataVolume (standalone: KubeVirt's VM schema has no http
// checksum in dataVolumeTemplates) with the own image's SHA-256 as the
// checksum CDI's importer verifies, UEFI firmware where the image needs it.
func (js *judgeServer) checkDisk(t *testing.T, ctx context.Context, ns string, m *judgeMarket, o imagestore.Order, vm *kubevirtv1.VirtualMachine) {
	t.Helper()
	if len(vm.Spec.DataVolumeTemplates) != 0 {
		t.Errorf("%s has dataVolumeTemplates; its disk is a DataVolume of its own", vm.Name)
	}
	vols := vm.Spec.Template.Spec.Volumes
	if len(vols) == 0 || vols[0].DataVolume == nil {
		t.Fatalf("%s: first volume %+v, want its DataVolume", vm.Name, vols)
	}
	u, err := js.dyn.Resource(cdiv1beta1.SchemeGroupVersion.WithResource("datavolumes")).Namespace(ns).
		Get(ctx, vols[0].DataVolume.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s's DataVolume: %v", vm.Name, err)
	}
	var dv cdiv1beta1.DataVolume
	if err := fromUnstructured(u, &dv); err != nil {
		t.Fatal(err)
	}
	var want *imagestore.Image
	switch o.Image {
	case m.bios.UploadID:
		want = &m.bios
	case m.uefi.UploadID:
		want = &m.uefi
	}
	fw := vm.Spec.Template.Spec.Domain.Firmware
	efi := fw != nil && fw.Bootloader != nil && fw.Bootloader.EFI != nil
	switch {
	case want == nil && dv.Spec.Source != nil && dv.Spec.Source.HTTP != nil && dv.Spec.Source.HTTP.Checksum != "":
		t.Errorf("%s: catalogue image with checksum %q", dv.Name, dv.Spec.Source.HTTP.Checksum)
	case want != nil && (dv.Spec.Source == nil || dv.Spec.Source.HTTP == nil || dv.Spec.Source.HTTP.Checksum != "sha256:"+want.SHA256):
		t.Errorf("%s: source %+v, want http with checksum sha256:%s", dv.Name, dv.Spec.Source, want.SHA256)
	case want != nil && efi != want.EFI:
		t.Errorf("%s: UEFI %v, want %v", vm.Name, efi, want.EFI)
	}
	if e, ok := catalogue.Builtin().WithConsole().Lookup(o.Image); ok && e.Source == catalogue.SourceISO {
		js.checkInstaller(t, ctx, ns, vm, dv, e)
	}
}

// checkInstaller: what the API server kept of an ISO replica: the blank
// disk boots first, the ISO, imported from its address into a DataVolume
// of its own, is a SATA CD-ROM booting second.
func (js *judgeServer) checkInstaller(t *testing.T, ctx context.Context, ns string, vm *kubevirtv1.VirtualMachine, disk cdiv1beta1.DataVolume, e catalogue.Entry) {
	t.Helper()
	if disk.Spec.Source == nil || disk.Spec.Source.Blank == nil || disk.Spec.Source.HTTP != nil || disk.Spec.Source.Registry != nil {
		t.Errorf("%s: disk source %+v, want blank", disk.Name, disk.Spec.Source)
	}
	disks, vols := vm.Spec.Template.Spec.Domain.Devices.Disks, vm.Spec.Template.Spec.Volumes
	if len(disks) != 2 || len(vols) != 2 {
		t.Fatalf("%s: disks %+v, volumes %+v; want the disk and the CD-ROM", vm.Name, disks, vols)
	}
	root, cd := disks[0], disks[1]
	switch {
	case root.BootOrder == nil || *root.BootOrder != 1 || root.Disk == nil:
		t.Errorf("%s: first disk %+v, want a disk with bootOrder 1", vm.Name, root)
	case cd.BootOrder == nil || *cd.BootOrder != 2 || cd.CDRom == nil || cd.CDRom.Bus != kubevirtv1.DiskBusSATA:
		t.Errorf("%s: second disk %+v, want a SATA cdrom with bootOrder 2", vm.Name, cd)
	case vols[1].DataVolume == nil || vols[1].Name != cd.Name:
		t.Fatalf("%s: CD-ROM volume %+v, want its DataVolume", vm.Name, vols[1])
	}
	u, err := js.dyn.Resource(cdiv1beta1.SchemeGroupVersion.WithResource("datavolumes")).Namespace(ns).
		Get(ctx, vols[1].DataVolume.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s's ISO DataVolume: %v", vm.Name, err)
	}
	var iso cdiv1beta1.DataVolume
	if err := fromUnstructured(u, &iso); err != nil {
		t.Fatal(err)
	}
	if iso.Name != vm.Name+"-iso" || iso.Spec.Source == nil || iso.Spec.Source.HTTP == nil || iso.Spec.Source.HTTP.URL != e.URL {
		t.Errorf("%s: source %+v, want http from %s", iso.Name, iso.Spec.Source, e.URL)
	}
}

// judgeIsOn: the judges refuse what KubeVirt refuses, in KubeVirt's (and
// the API server's) own words: an unknown field and a field of the wrong
// type by the CRD's schema under strict field validation, a UEFI VM with
// secure boot but without SMM by KubeVirt's admitter, and — the reason
// each disk is a DataVolume of its own — an http checksum in a
// dataVolumeTemplate, written through the provisioner's own client. A
// plain VM is accepted first, so that each refusal is the wrong part's.
func (js *judgeServer) judgeIsOn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster, err := provisioner.ClusterFromConfig(js.srv.AsServiceAccount(vmshelfNamespace, vmshelfSA))
	if err != nil {
		t.Fatal(err)
	}
	vms := js.dyn.Resource(kubevirtv1.VirtualMachineGroupVersionKind.GroupVersion().WithResource("virtualmachines")).Namespace(probeNamespace)
	strict := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	// unstructuredVM is vm as a client would send it that does not know
	// KubeVirt's types, with change made to its template's spec.
	unstructuredVM := func(vm *kubevirtv1.VirtualMachine, change func(spec map[string]any)) *unstructured.Unstructured {
		vm.TypeMeta = metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine"}
		b, _ := json.Marshal(vm) // a typed VM always marshals
		u := &unstructured.Unstructured{}
		_ = json.Unmarshal(b, &u.Object)
		change(u.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any))
		return u
	}

	if err := cluster.CreateVM(ctx, plainVM("plain")); err != nil {
		t.Fatalf("a plain VM: %v", err)
	}
	js.admission.Reviews()
	cases := []struct {
		name  string
		write func() error
		want  []string
	}{
		{"unknown field", func() error {
			_, err := vms.Create(ctx, unstructuredVM(plainVM("unknown-field"), func(spec map[string]any) {
				spec["domain"].(map[string]any)["firmwre"] = map[string]any{}
			}), strict)
			return err
		}, []string{`unknown field "spec.template.spec.domain.firmwre"`}},
		{"wrong type", func() error {
			_, err := vms.Create(ctx, unstructuredVM(plainVM("wrong-type"), func(spec map[string]any) {
				spec["domain"].(map[string]any)["cpu"] = map[string]any{"cores": "two"}
			}), strict)
			return err
		}, []string{"spec.template.spec.domain.cpu.cores", "must be of type integer"}},
		{"UEFI secure boot without SMM", func() error {
			vm := plainVM("secure-boot")
			yes := true
			vm.Spec.Template.Spec.Domain.Firmware = &kubevirtv1.Firmware{Bootloader: &kubevirtv1.Bootloader{
				EFI: &kubevirtv1.EFI{SecureBoot: &yes}}}
			return cluster.CreateVM(ctx, vm)
		}, []string{`admission webhook "` + vmValidatorName + `" denied the request`, "SecureBoot requires SMM, which is currently disabled"}},
		{"http checksum in a dataVolumeTemplate", func() error {
			vm := plainVM("template-checksum")
			vm.Spec.DataVolumeTemplates = []kubevirtv1.DataVolumeTemplateSpec{{
				ObjectMeta: metav1.ObjectMeta{Name: "plain-disk"},
				Spec: cdiv1beta1.DataVolumeSpec{
					Source: &cdiv1beta1.DataVolumeSource{HTTP: &cdiv1beta1.DataVolumeSourceHTTP{
						URL: testFetchBase + "/x", Checksum: "sha256:" + strings.Repeat("ab", 32)}},
					Storage: &cdiv1beta1.StorageSpec{Resources: corev1.VolumeResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
				},
			}}
			return cluster.CreateVM(ctx, vm)
		}, []string{`unknown field "spec.dataVolumeTemplates[0].spec.source.http.checksum"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.write()
			if err == nil {
				t.Fatalf("accepted; want refused with %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refused with\n%v\nwant %q in it", err, w)
				}
			}
			t.Logf("refused: %v", err)
		})
	}
}

// plainVM is a small VM that KubeVirt accepts, in probeNamespace.
func plainVM(name string) *kubevirtv1.VirtualMachine {
	halted := kubevirtv1.RunStrategyHalted
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: probeNamespace},
		Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &halted, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{
					Resources: kubevirtv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}},
					Devices: kubevirtv1.Devices{Disks: []kubevirtv1.Disk{{Name: "root",
						DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}}}},
				},
				Volumes: []kubevirtv1.Volume{{Name: "root", VolumeSource: kubevirtv1.VolumeSource{
					DataVolume: &kubevirtv1.DataVolumeSource{Name: "plain-disk"}}}},
			},
		}},
	}
}
