package provisioner

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/imagestore"
)

// wantVM is what one replica's VirtualMachine must be, field by field.
type wantVM struct {
	order     string
	namespace string
	replica   int
	appliance string
	cores     uint32
	memory    string // a quantity: "2Gi"
	efi       bool
	disk      string // a quantity: "20Gi"
	class     string
	// Exactly one of httpURL and registryURL; headers and checksum go
	// with httpURL.
	httpURL, registryURL string
	headers              []string
	checksum             string // "sha256:<hex>" of an own image, else ""
	// iso is the https address of an installation ISO: then the disk is
	// blank (no httpURL or registryURL) and the ISO is the CD-ROM.
	iso string
}

func labelsOf(order string, replica int) map[string]string {
	l := map[string]string{"app.kubernetes.io/managed-by": "vmshelf", "losos.dev/order": order}
	if replica >= 0 {
		l["losos.dev/replica"] = strconv.Itoa(replica)
	}
	return l
}

func quantityIs(t *testing.T, what string, got resource.Quantity, want string) {
	t.Helper()
	if w := resource.MustParse(want); got.Cmp(w) != 0 {
		t.Errorf("%s = %s, want %s", what, got.String(), want)
	}
}

// checkVM checks every field vmshelf sets on a replica, and that it sets
// no other of those that decide where and how it runs.
func checkVM(t *testing.T, vm *kubevirtv1.VirtualMachine, w wantVM) {
	t.Helper()
	name := fmt.Sprintf("vm-%s-%d", w.order, w.replica)
	if vm.Name != name || vm.Namespace != w.namespace {
		t.Errorf("VM %s/%s, want %s/%s", vm.Namespace, vm.Name, w.namespace, name)
	}
	labels := labelsOf(w.order, w.replica)
	if !maps.Equal(vm.Labels, labels) {
		t.Errorf("%s: labels %v, want %v", name, vm.Labels, labels)
	}
	if vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyAlways || vm.Spec.Running != nil {
		t.Errorf("%s: runStrategy %v, running %v; want Always and no running", name, vm.Spec.RunStrategy, vm.Spec.Running)
	}
	if vm.Spec.Instancetype != nil || vm.Spec.Preference != nil {
		t.Errorf("%s: an instancetype or preference is set", name)
	}
	tpl := vm.Spec.Template
	if tpl == nil {
		t.Fatalf("%s: no template", name)
	}
	if !maps.Equal(tpl.ObjectMeta.Labels, labels) {
		t.Errorf("%s: template labels %v, want %v (the Service selects by them)", name, tpl.ObjectMeta.Labels, labels)
	}
	spec := tpl.Spec
	if want := map[string]string{"losos.dev/appliance": w.appliance}; !maps.Equal(spec.NodeSelector, want) {
		t.Errorf("%s: nodeSelector %v, want %v", name, spec.NodeSelector, want)
	}
	wantTol := []corev1.Toleration{{Key: "losos.dev/compute-window", Operator: corev1.TolerationOpExists}}
	if !reflect.DeepEqual(spec.Tolerations, wantTol) {
		t.Errorf("%s: tolerations %+v, want %+v (any effect)", name, spec.Tolerations, wantTol)
	}
	if spec.Affinity != nil {
		t.Errorf("%s: affinity %+v, want none", name, spec.Affinity)
	}
	d := spec.Domain
	if d.CPU == nil || d.CPU.Cores != w.cores || d.CPU.Sockets != 0 || d.CPU.Threads != 0 {
		t.Errorf("%s: cpu %+v, want %d cores", name, d.CPU, w.cores)
	}
	if len(d.Resources.Requests) != 1 || len(d.Resources.Limits) != 0 {
		t.Errorf("%s: resources %+v, want a memory request only", name, d.Resources)
	}
	quantityIs(t, name+" memory request", d.Resources.Requests[corev1.ResourceMemory], w.memory)
	switch {
	case w.efi:
		f := d.Firmware
		if f == nil || f.Bootloader == nil || f.Bootloader.BIOS != nil || f.Bootloader.EFI == nil ||
			f.Bootloader.EFI.SecureBoot == nil || *f.Bootloader.EFI.SecureBoot {
			t.Errorf("%s: firmware %+v, want UEFI with secure boot off", name, f)
		}
	default:
		// BIOS, which writes to the serial port too: a disk it cannot
		// boot says so on the buyer's serial console.
		f := d.Firmware
		if f == nil || f.Bootloader == nil || f.Bootloader.EFI != nil || f.Bootloader.BIOS == nil ||
			f.Bootloader.BIOS.UseSerial == nil || !*f.Bootloader.BIOS.UseSerial {
			t.Errorf("%s: firmware %+v, want BIOS with useSerial", name, f)
		}
	}
	virtio := &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}
	wantDisks := []kubevirtv1.Disk{
		{Name: "rootdisk", DiskDevice: kubevirtv1.DiskDevice{Disk: virtio}},
		{Name: "cloudinitdisk", DiskDevice: kubevirtv1.DiskDevice{Disk: virtio}},
	}
	wantVolumes := []kubevirtv1.Volume{
		{Name: "rootdisk", VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: name + "-disk"}}},
		{Name: "cloudinitdisk", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{
			UserDataSecretRef: &corev1.LocalObjectReference{Name: "vm-" + w.order + "-cloudinit"}}}},
	}
	if w.iso != "" {
		// The disk boots first, the ISO second: a blank disk falls
		// through to the installer, an installed one boots itself. No
		// cloud-init: an installer reads none.
		first, second := uint(1), uint(2)
		wantDisks = []kubevirtv1.Disk{
			{Name: "rootdisk", BootOrder: &first, DiskDevice: kubevirtv1.DiskDevice{Disk: virtio}},
			{Name: "installer", BootOrder: &second, DiskDevice: kubevirtv1.DiskDevice{CDRom: &kubevirtv1.CDRomTarget{Bus: kubevirtv1.DiskBusSATA}}},
		}
		wantVolumes = []kubevirtv1.Volume{wantVolumes[0],
			{Name: "installer", VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: name + "-iso"}}}}
	}
	if !reflect.DeepEqual(d.Devices.Disks, wantDisks) {
		t.Errorf("%s: disks %+v, want %+v", name, d.Devices.Disks, wantDisks)
	}
	if !reflect.DeepEqual(spec.Volumes, wantVolumes) {
		t.Errorf("%s: volumes %+v, want %+v", name, spec.Volumes, wantVolumes)
	}
	// One interface on the pod network, bound with masquerade: the guest
	// behind the pod's address, the Service's port forwarded to it. With
	// none, KubeVirt binds the pod network by bridge, its default.
	wantIfaces := []kubevirtv1.Interface{{Name: "default",
		InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}}}}
	wantNets := []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}}
	if !reflect.DeepEqual(d.Devices.Interfaces, wantIfaces) || !reflect.DeepEqual(spec.Networks, wantNets) {
		t.Errorf("%s: interfaces %+v on networks %+v, want %+v on %+v", name, d.Devices.Interfaces, spec.Networks, wantIfaces, wantNets)
	}

	if len(vm.Spec.DataVolumeTemplates) != 0 {
		t.Errorf("%s: %d dataVolumeTemplates, want none (its disk is a DataVolume of its own)", name, len(vm.Spec.DataVolumeTemplates))
	}
}

// checkDataVolume checks replica w.replica's disk: a standalone
// DataVolume with the replica's labels, its storage and its source.
func checkDataVolume(t *testing.T, dv *cdiv1.DataVolume, w wantVM) {
	t.Helper()
	checkVolume(t, dv, fmt.Sprintf("vm-%s-%d-disk", w.order, w.replica), w)
}

// checkISOVolume checks replica w.replica's CD-ROM: like its disk, of the
// disk's size, imported from the ISO's address and nothing else.
func checkISOVolume(t *testing.T, dv *cdiv1.DataVolume, w wantVM) {
	t.Helper()
	iso := w
	iso.httpURL, iso.iso = w.iso, ""
	checkVolume(t, dv, fmt.Sprintf("vm-%s-%d-iso", w.order, w.replica), iso)
}

func checkVolume(t *testing.T, dv *cdiv1.DataVolume, name string, w wantVM) {
	t.Helper()
	if dv.Name != name || dv.Namespace != w.namespace {
		t.Errorf("DataVolume %s/%s, want %s/%s", dv.Namespace, dv.Name, w.namespace, name)
	}
	if labels := labelsOf(w.order, w.replica); !maps.Equal(dv.Labels, labels) {
		t.Errorf("%s: labels %v, want %v", name, dv.Labels, labels)
	}
	if len(dv.OwnerReferences) != 0 || len(dv.Annotations) != 0 || len(dv.Finalizers) != 0 {
		t.Errorf("%s: owners %v, annotations %v, finalizers %v; want none (nothing collects the buyer's disk)",
			name, dv.OwnerReferences, dv.Annotations, dv.Finalizers)
	}
	if dv.Spec.PVC != nil || dv.Spec.SourceRef != nil || dv.Spec.Storage == nil || dv.Spec.ContentType != "" ||
		dv.Spec.Preallocation != nil || dv.Spec.PriorityClassName != "" || dv.Spec.Checkpoints != nil {
		t.Fatalf("%s: spec %+v, want storage and a source only", name, dv.Spec)
	}
	st := dv.Spec.Storage
	if st.StorageClassName == nil || *st.StorageClassName != w.class {
		t.Errorf("%s: storage class %v, want %s", name, st.StorageClassName, w.class)
	}
	if len(st.Resources.Requests) != 1 || len(st.Resources.Limits) != 0 {
		t.Errorf("%s: storage resources %+v, want a storage request only", name, st.Resources)
	}
	quantityIs(t, name+" disk request", st.Resources.Requests[corev1.ResourceStorage], w.disk)
	src := dv.Spec.Source
	if src == nil {
		t.Fatalf("%s: no source", name)
	}
	switch {
	case w.iso != "":
		if !reflect.DeepEqual(*src, cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}) {
			t.Errorf("%s: source %+v, want blank (the installer writes the disk)", name, src)
		}
	case w.httpURL != "":
		if src.HTTP == nil || src.Registry != nil || src.S3 != nil || src.PVC != nil || src.Blank != nil {
			t.Fatalf("%s: source %+v, want http only", name, src)
		}
		if src.HTTP.URL != w.httpURL || !slices.Equal(src.HTTP.SecretExtraHeaders, w.headers) ||
			len(src.HTTP.ExtraHeaders) != 0 || src.HTTP.SecretRef != "" || src.HTTP.CertConfigMap != "" {
			t.Errorf("%s: http source %+v, want url %s with secretExtraHeaders %v", name, src.HTTP, w.httpURL, w.headers)
		}
		if src.HTTP.Checksum != w.checksum {
			t.Errorf("%s: http source checksum %q, want %q", name, src.HTTP.Checksum, w.checksum)
		}
	default:
		if src.Registry == nil || src.HTTP != nil || src.Registry.URL == nil || *src.Registry.URL != w.registryURL ||
			src.Registry.SecretRef != nil || src.Registry.PullMethod != nil {
			t.Errorf("%s: source %+v, want registry %s", name, src, w.registryURL)
		}
	}
}

func testOrder(kind imagestore.ImageKind, image string) imagestore.Order {
	return imagestore.Order{ID: "o00000000000000aa", BuyerID: 7, HostID: 3, Quantity: 2, ImageKind: kind, Image: image}
}

var testSizes = sizes{cpu: 2, memoryMiB: 2048, diskGiB: 20, storageClass: "losos-vm-local", fetchBase: "https://edge.example.org"}

// TestVirtualMachine: the replicas of each kind of image, field by field,
// with the sizes the image asks for.
func TestVirtualMachine(t *testing.T) {
	host := imagestore.Tenant{ID: 3, Appliance: "box-1"}
	const upload = "0123456789abcdef01234567"
	// The image's stored SHA-256 (hex), which its DataVolume pins.
	const sum = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	tests := []struct {
		name  string
		o     imagestore.Order
		entry *catalogue.Entry
		img   *imagestore.Image
		want  wantVM
	}{
		{"catalogue cloud, edge sizes", testOrder(imagestore.ImageCatalogue, "debian-13"),
			&catalogue.Entry{ID: "debian-13", Source: catalogue.SourceCloud, URL: "https://cloud.debian.org/d.qcow2", MinDiskGiB: 3},
			nil, wantVM{memory: "2Gi", disk: "20Gi", httpURL: "https://cloud.debian.org/d.qcow2"}},
		{"catalogue cloud needing more", testOrder(imagestore.ImageCatalogue, "big"),
			&catalogue.Entry{ID: "big", Source: catalogue.SourceCloud, URL: "https://example.org/big.img", EFI: true,
				MinMemoryMiB: 3072, MinDiskGiB: 40},
			nil, wantVM{memory: "3Gi", disk: "40Gi", efi: true, httpURL: "https://example.org/big.img"}},
		{"catalogue losos registry", testOrder(imagestore.ImageCatalogue, "losos-demo"),
			&catalogue.Entry{ID: "losos-demo", Source: catalogue.SourceLosOS, URL: "docker://ghcr.io/vmshelf/demo:stable",
				EFI: true, MinMemoryMiB: 4096},
			nil, wantVM{memory: "4Gi", disk: "20Gi", efi: true, registryURL: "docker://ghcr.io/vmshelf/demo:stable"}},
		{"catalogue installation ISO", testOrder(imagestore.ImageCatalogue, "nixos"),
			&catalogue.Entry{ID: "nixos", Source: catalogue.SourceISO, URL: "https://channels.nixos.org/n/minimal.iso",
				MinMemoryMiB: 4096, MinDiskGiB: 30},
			nil, wantVM{memory: "4Gi", disk: "30Gi", iso: "https://channels.nixos.org/n/minimal.iso"}},
		{"catalogue installation ISO, efi, edge sizes", testOrder(imagestore.ImageCatalogue, "efi-iso"),
			&catalogue.Entry{ID: "efi-iso", Source: catalogue.SourceISO, URL: "https://example.org/x.iso", EFI: true, MinDiskGiB: 1},
			nil, wantVM{memory: "2Gi", disk: "20Gi", efi: true, iso: "https://example.org/x.iso"}},
		{"own image, small", testOrder(imagestore.ImageUpload, upload), nil,
			&imagestore.Image{UploadID: upload, VirtualSize: 2 << 30, SHA256: sum},
			wantVM{memory: "2Gi", disk: "20Gi", httpURL: "https://edge.example.org/market/vm-images/fetch/" + upload,
				headers: []string{"vm-o00000000000000aa-fetch"}, checksum: "sha256:" + sum}},
		{"own image larger than the disk, efi", testOrder(imagestore.ImageUpload, upload), nil,
			&imagestore.Image{UploadID: upload, VirtualSize: 30<<30 + 1, EFI: true, SHA256: sum}, // rounded up to whole GiB
			wantVM{memory: "2Gi", disk: "31Gi", efi: true, httpURL: "https://edge.example.org/market/vm-images/fetch/" + upload,
				headers: []string{"vm-o00000000000000aa-fetch"}, checksum: "sha256:" + sum}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := machineFor(testSizes, tc.o, host, tc.entry, tc.img)
			if err != nil {
				t.Fatalf("machineFor: %v", err)
			}
			for i := range tc.o.Quantity {
				w := tc.want
				w.order, w.namespace, w.replica, w.appliance, w.cores, w.class = tc.o.ID, "market-7", i, "box-1", 2, "losos-vm-local"
				checkVM(t, virtualMachine(m, i), w)
				checkDataVolume(t, dataVolume(m, i), w)
				if w.iso != "" {
					checkISOVolume(t, isoVolume(m, i), w)
				}
				// No secret field anywhere: the URL names only the image.
				if strings.Contains(tc.want.httpURL, "token") || strings.Contains(tc.want.httpURL, "?") {
					t.Errorf("the fetch URL %s carries more than the image", tc.want.httpURL)
				}
			}
			// Replicas share no pointers: changing one changes no other.
			a, b := dataVolume(m, 0), dataVolume(m, 1)
			if tc.want.iso != "" {
				a, b = isoVolume(m, 0), isoVolume(m, 1)
			}
			if src := a.Spec.Source; src.HTTP != nil {
				src.HTTP.URL = "changed"
			} else {
				*src.Registry.URL = "changed"
			}
			*a.Spec.Storage.StorageClassName = "changed"
			if src := b.Spec.Source; (src.HTTP != nil && src.HTTP.URL == "changed") ||
				(src.Registry != nil && *src.Registry.URL == "changed") || *b.Spec.Storage.StorageClassName == "changed" {
				t.Error("two replicas share their DataVolume source or storage")
			}
		})
	}
}

// TestMachineForRefused: an order whose replicas cannot be built is an
// error, never a VM with a guessed field.
func TestMachineForRefused(t *testing.T) {
	host := imagestore.Tenant{ID: 3, Appliance: "box-1"}
	cloud := &catalogue.Entry{ID: "debian-13", Source: catalogue.SourceCloud, URL: "https://x.example/d.qcow2"}
	tests := []struct {
		name  string
		o     imagestore.Order
		host  imagestore.Tenant
		entry *catalogue.Entry
		img   *imagestore.Image
		want  string
	}{
		{"host without appliance", testOrder(imagestore.ImageCatalogue, "debian-13"), imagestore.Tenant{ID: 3}, cloud, nil, "appliance"},
		{"catalogue entry gone", testOrder(imagestore.ImageCatalogue, "gone"), host, nil, nil, `"gone"`},
		{"unknown source", testOrder(imagestore.ImageCatalogue, "x"), host, &catalogue.Entry{ID: "x", Source: "ftp"}, nil, "ftp"},
		{"image gone", testOrder(imagestore.ImageUpload, "0123456789abcdef01234567"), host, nil, nil, "not stored"},
		{"unknown kind", testOrder("iso", "x"), host, cloud, nil, "iso"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := machineFor(testSizes, tc.o, tc.host, tc.entry, tc.img)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("machineFor: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

func TestSecrets(t *testing.T) {
	o := testOrder(imagestore.ImageUpload, "0123456789abcdef01234567")
	for _, tc := range []struct {
		name     string
		userData string
		want     string
	}{
		{"user data", "#cloud-config\npassword: hunter2\n", "#cloud-config\npassword: hunter2\n"},
		{"none", "", "#cloud-config\n"},
	} {
		t.Run("cloud-init "+tc.name, func(t *testing.T) {
			s := cloudInitSecret(o, tc.userData)
			if s.Name != "vm-o00000000000000aa-cloudinit" || s.Namespace != "market-7" || !maps.Equal(s.Labels, labelsOf(o.ID, -1)) ||
				s.Type != corev1.SecretTypeOpaque || len(s.Data) != 1 || string(s.Data["userdata"]) != tc.want || len(s.StringData) != 0 {
				t.Errorf("cloud-init Secret %+v, want userdata %q", s, tc.want)
			}
		})
	}
	s := fetchSecret(o, "f00dcafe")
	if s.Name != "vm-o00000000000000aa-fetch" || s.Namespace != "market-7" || !maps.Equal(s.Labels, labelsOf(o.ID, -1)) ||
		s.Type != corev1.SecretTypeOpaque || len(s.Data) != 1 || string(s.Data["authorization"]) != "Authorization: Bearer f00dcafe" {
		t.Errorf("fetch Secret %+v, want one header line with the token", s)
	}
	ns := namespaceObject("market-7")
	if ns.Name != "market-7" || !maps.Equal(ns.Labels, map[string]string{"app.kubernetes.io/managed-by": "vmshelf"}) {
		t.Errorf("namespace %+v", ns)
	}
}

func TestServiceAndIngress(t *testing.T) {
	o := testOrder(imagestore.ImageCatalogue, "debian-13")
	svc := service(o)
	wantPorts := []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}}
	if svc.Name != "vm-o00000000000000aa" || svc.Namespace != "market-7" || !maps.Equal(svc.Labels, labelsOf(o.ID, -1)) ||
		!maps.Equal(svc.Spec.Selector, map[string]string{"losos.dev/order": o.ID}) || !reflect.DeepEqual(svc.Spec.Ports, wantPorts) ||
		svc.Spec.Type != "" {
		t.Errorf("Service %+v", svc)
	}
	checkIngress(t, ingress(o, "vms.example.org"), o.ID, "market-7", "vms.example.org")
}

// checkIngress checks the Ingress of order at host vm-<order>.<domain>.
func checkIngress(t *testing.T, ing *networkingv1.Ingress, order, ns, domain string) {
	t.Helper()
	host := "vm-" + order + "." + domain
	wantAnn := map[string]string{
		"traefik.ingress.kubernetes.io/router.entrypoints":      "websecure",
		"traefik.ingress.kubernetes.io/router.tls":              "true",
		"traefik.ingress.kubernetes.io/router.tls.certresolver": "letsencrypt",
	}
	if ing.Name != "vm-"+order || ing.Namespace != ns || !maps.Equal(ing.Labels, labelsOf(order, -1)) || !maps.Equal(ing.Annotations, wantAnn) {
		t.Errorf("Ingress %s/%s labels %v annotations %v", ing.Namespace, ing.Name, ing.Labels, ing.Annotations)
	}
	wantTLS := []networkingv1.IngressTLS{{Hosts: []string{host}, SecretName: "vm-" + order + "-tls"}}
	if !reflect.DeepEqual(ing.Spec.TLS, wantTLS) || ing.Spec.DefaultBackend != nil {
		t.Errorf("Ingress TLS %+v, want %+v", ing.Spec.TLS, wantTLS)
	}
	prefix := networkingv1.PathTypePrefix
	wantRules := []networkingv1.IngressRule{{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{
		HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{{Path: "/", PathType: &prefix,
			Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "vm-" + order,
				Port: networkingv1.ServiceBackendPort{Number: 80}}}}}}}}}
	if !reflect.DeepEqual(ing.Spec.Rules, wantRules) {
		t.Errorf("Ingress rules %+v, want %+v", ing.Spec.Rules, wantRules)
	}
}
