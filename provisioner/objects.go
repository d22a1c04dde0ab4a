package provisioner

import (
	"errors"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/imagestore"
)

// The objects of an order, as pure functions of the order and what it
// resolved to: the reconciler only decides whether to create them.

// Labels and keys vmshelf puts on and expects in the cluster.
const (
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "vmshelf"
	labelOrder     = "losos.dev/order"
	labelReplica   = "losos.dev/replica"
	// labelAppliance is the node label of the box that runs a host's
	// replicas (the host's Tenant.Appliance).
	labelAppliance = "losos.dev/appliance"
	// taintComputeWindow is the taint a box carries outside the hours it
	// lends its CPU to the mesh. A machine bought for a month runs
	// around the clock, so its replicas tolerate it, with any effect.
	taintComputeWindow = "losos.dev/compute-window"
)

// CertResolver is the name of Traefik's certificate resolver (Let's
// Encrypt) that the replicas' Ingresses ask for; the edge's Traefik
// configuration defines it under this name.
const CertResolver = "letsencrypt"

// Names of the objects of order o (docs/operations.md "Provisioning"
// lists them for the cluster's operator).
func namespaceName(buyerID int64) string { return "market-" + strconv.FormatInt(buyerID, 10) }
func vmName(o string, i int) string      { return fmt.Sprintf("vm-%s-%d", o, i) }
func diskName(o string, i int) string    { return vmName(o, i) + "-disk" }
func isoName(o string, i int) string     { return vmName(o, i) + "-iso" }
func cloudInitName(o string) string      { return "vm-" + o + "-cloudinit" }
func fetchSecretName(o string) string    { return "vm-" + o + "-fetch" }
func serviceName(o string) string        { return "vm-" + o }
func tlsSecretName(o string) string      { return "vm-" + o + "-tls" }

// The disks and volumes of a replica.
const (
	rootDisk      = "rootdisk"
	cloudInitDisk = "cloudinitdisk"
	// installerDisk is the CD-ROM of an installation ISO's replica.
	installerDisk = "installer"
	// userDataKey is the key of the cloud-init Secret KubeVirt reads.
	userDataKey = "userdata"
	// fetchHeaderKey is the key of the fetch Secret; CDI sends each value
	// of a secretExtraHeaders Secret as one header line.
	fetchHeaderKey = "authorization"
	// minimalUserData is the user data of an order without any: cloud-init
	// runs with its defaults.
	minimalUserData = "#cloud-config\n"
)

// checksumPrefix is the algorithm part of a CDI http source's checksum
// ("sha256:<hex>"); the store keeps each image's SHA-256 in hex.
const checksumPrefix = "sha256:"

// fetchPath is the data plane's route an own image is imported from; the
// URL names only the image, the token travels in a header.
const fetchPath = "/market/vm-images/fetch/"

func orderLabels(orderID string) map[string]string {
	return map[string]string{labelManagedBy: managedBy, labelOrder: orderID}
}

func replicaLabels(orderID string, i int) map[string]string {
	l := orderLabels(orderID)
	l[labelReplica] = strconv.Itoa(i)
	return l
}

// machine is what the replicas of an order are built from, resolved from
// the order, its host, its image and the edge's sizes.
type machine struct {
	orderID      string
	namespace    string
	appliance    string
	cpu          int
	memoryMiB    int
	diskGiB      int
	storageClass string
	efi          bool
	// source is where the disk comes from: an import, or blank for an
	// installation ISO, whose installer writes the disk.
	source cdiv1.DataVolumeSource
	// iso is the installation ISO's source, which becomes the replica's
	// CD-ROM; nil for a disk image.
	iso *cdiv1.DataVolumeSource
}

// sizes are the edge's sizes of a replica (--vm-cpu, --vm-memory-mib,
// --vm-disk-gib, --vm-storage-class) and the data plane's public URL.
type sizes struct {
	cpu, memoryMiB, diskGiB int
	storageClass            string
	fetchBase               string
}

// machineFor resolves order o: for a catalogue image entry is its entry,
// for an own image img is the stored image (the other is nil). A replica
// gets at least what the image needs: the catalogue's minimum memory and
// disk, an own image's virtual size rounded up to whole GiB.
func machineFor(sz sizes, o imagestore.Order, host imagestore.Tenant, entry *catalogue.Entry, img *imagestore.Image) (machine, error) {
	if host.Appliance == "" {
		// An empty nodeSelector value would match no box, or the wrong one.
		return machine{}, blocked(imagestore.BlockedHostGone, errors.New("the host has no appliance node to run the replicas on"))
	}
	m := machine{orderID: o.ID, namespace: namespaceName(o.BuyerID), appliance: host.Appliance, cpu: sz.cpu,
		memoryMiB: sz.memoryMiB, diskGiB: sz.diskGiB, storageClass: sz.storageClass}
	switch o.ImageKind {
	case imagestore.ImageCatalogue:
		if entry == nil {
			return machine{}, blocked(imagestore.BlockedImageNotOffered, fmt.Errorf("the catalogue has no system %q (any more)", o.Image))
		}
		m.efi = entry.EFI
		m.memoryMiB = max(m.memoryMiB, entry.MinMemoryMiB)
		m.diskGiB = max(m.diskGiB, entry.MinDiskGiB)
		switch entry.Source {
		case catalogue.SourceCloud:
			m.source.HTTP = &cdiv1.DataVolumeSourceHTTP{URL: entry.URL}
		case catalogue.SourceLosOS:
			u := entry.URL // docker://registry/path:tag
			m.source.Registry = &cdiv1.DataVolumeSourceRegistry{URL: &u}
		case catalogue.SourceISO:
			m.source.Blank = &cdiv1.DataVolumeBlankImage{}
			m.iso = &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: entry.URL}}
		default:
			return machine{}, fmt.Errorf("catalogue system %q has source %q, none of %q, %q and %q",
				entry.ID, entry.Source, catalogue.SourceCloud, catalogue.SourceLosOS, catalogue.SourceISO)
		}
	case imagestore.ImageUpload:
		if img == nil {
			return machine{}, blocked(imagestore.BlockedImageGone, fmt.Errorf("the image %s is not stored", o.Image))
		}
		m.efi = img.EFI
		const gib = 1 << 30
		m.diskGiB = max(m.diskGiB, int((img.VirtualSize+gib-1)/gib))
		m.source.HTTP = &cdiv1.DataVolumeSourceHTTP{
			URL:                sz.fetchBase + fetchPath + img.UploadID,
			SecretExtraHeaders: []string{fetchSecretName(o.ID)},
			// CDI's importer hashes the bytes it downloads, which the
			// fetch route serves as stored, and fails the import on a
			// mismatch: a disk is never made of a file that changed
			// or was cut on the way.
			Checksum: checksumPrefix + img.SHA256,
		}
	default:
		return machine{}, fmt.Errorf("image kind %q", o.ImageKind)
	}
	return m, nil
}

// namespaceObject is the buyer's namespace. It holds every order of the
// buyer, so it carries no order's label.
func namespaceObject(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{labelManagedBy: managedBy}}}
}

// cloudInitSecret holds the order's user data for KubeVirt's NoCloud
// source; "" becomes a minimal #cloud-config.
func cloudInitSecret(o imagestore.Order, userData string) *corev1.Secret {
	if userData == "" {
		userData = minimalUserData
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: cloudInitName(o.ID), Namespace: namespaceName(o.BuyerID), Labels: orderLabels(o.ID)},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{userDataKey: []byte(userData)},
	}
}

// fetchSecret holds the header CDI's importer sends to the fetch route of
// an own image: the order's fetch token, which appears nowhere else.
func fetchSecret(o imagestore.Order, token string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: fetchSecretName(o.ID), Namespace: namespaceName(o.BuyerID), Labels: orderLabels(o.ID)},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{fetchHeaderKey: []byte("Authorization: Bearer " + token)},
	}
}

func mib(n int) resource.Quantity { return *resource.NewQuantity(int64(n)<<20, resource.BinarySI) }
func gib(n int) resource.Quantity { return *resource.NewQuantity(int64(n)<<30, resource.BinarySI) }

// dataVolume is replica i's disk: a CDI DataVolume of its own, imported
// from m's source (a copy: replicas share no pointers) into a PVC of the
// replica's size and class. It is made before the VM, which names it in
// volumes[].dataVolume; it is not a dataVolumeTemplate of the VM, for two
// reasons. KubeVirt's VirtualMachine schema (v1.8.0 and v1.9.0) embeds an
// older CDI API without the http source's checksum, so a template carrying
// it is refused under strict field validation and silently pruned without.
// And a standalone DataVolume has no owner reference to the VM: deleting a
// VM never deletes the buyer's disk, where KubeVirt garbage-collects the
// DataVolumes it made from a VM's templates with the VM.
func dataVolume(m machine, i int) *cdiv1.DataVolume {
	return volume(m, diskName(m.orderID, i), &m.source, i)
}

// isoVolume is replica i's CD-ROM for an installation ISO (m.iso): a
// DataVolume of its own, imported from the ISO's https address, made with
// the disk and under the same rules. Its size is the disk's: the ISO's is
// not known before the download, and an installer's ISO is smaller than
// the system it installs. Each replica has its own, as it has its own
// disk: a DataVolume is one PVC, which one VM at a time may write.
func isoVolume(m machine, i int) *cdiv1.DataVolume {
	return volume(m, isoName(m.orderID, i), m.iso, i)
}

// volume is a DataVolume of replica i named name, from a copy of src (the
// replicas share no pointers), of the replica's disk size and class.
func volume(m machine, name string, src *cdiv1.DataVolumeSource, i int) *cdiv1.DataVolume {
	storageClass := m.storageClass
	return &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.namespace, Labels: replicaLabels(m.orderID, i)},
		Spec: cdiv1.DataVolumeSpec{
			Source: src.DeepCopy(),
			Storage: &cdiv1.StorageSpec{
				StorageClassName: &storageClass,
				Resources: corev1.VolumeResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceStorage: gib(m.diskGiB)},
				},
			},
		},
	}
}

// virtualMachine is replica i of m: always running, bound to the host's
// box, tolerating its compute window, booting from its DataVolume
// (dataVolume, made first) with the order's cloud-init. It has no
// dataVolumeTemplates. The replica of an installation ISO has no
// cloud-init (an installer reads none) but a CD-ROM (isoVolume, made
// first too) and boots from the disk first, the CD-ROM second: a blank
// disk does not boot, so the installer starts, and once it has installed
// the system, that boots, the ISO staying in the drive.
func virtualMachine(m machine, i int) *kubevirtv1.VirtualMachine {
	always := kubevirtv1.RunStrategyAlways
	labels := replicaLabels(m.orderID, i)
	// BIOS writes to the serial port as well as the screen (UEFI does by
	// itself): a disk the firmware cannot boot says so on the buyer's
	// serial console, where the page's console shows it.
	serial := true
	firmware := &kubevirtv1.Firmware{Bootloader: &kubevirtv1.Bootloader{BIOS: &kubevirtv1.BIOS{UseSerial: &serial}}}
	if m.efi {
		secureBoot := false
		firmware = &kubevirtv1.Firmware{Bootloader: &kubevirtv1.Bootloader{EFI: &kubevirtv1.EFI{SecureBoot: &secureBoot}}}
	}
	disks := []kubevirtv1.Disk{
		{Name: rootDisk, DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
		{Name: cloudInitDisk, DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
	}
	volumes := []kubevirtv1.Volume{
		{Name: rootDisk, VolumeSource: kubevirtv1.VolumeSource{
			DataVolume: &kubevirtv1.DataVolumeSource{Name: diskName(m.orderID, i)}}},
		{Name: cloudInitDisk, VolumeSource: kubevirtv1.VolumeSource{
			CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{
				UserDataSecretRef: &corev1.LocalObjectReference{Name: cloudInitName(m.orderID)}}}},
	}
	if m.iso != nil {
		first, second := uint(1), uint(2)
		// SATA: every installer's kernel has AHCI, where a virtio CD-ROM
		// needs drivers some (Windows) lack.
		disks = []kubevirtv1.Disk{
			{Name: rootDisk, BootOrder: &first, DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
			{Name: installerDisk, BootOrder: &second, DiskDevice: kubevirtv1.DiskDevice{CDRom: &kubevirtv1.CDRomTarget{Bus: kubevirtv1.DiskBusSATA}}},
		}
		volumes = []kubevirtv1.Volume{volumes[0], {Name: installerDisk, VolumeSource: kubevirtv1.VolumeSource{
			DataVolume: &kubevirtv1.DataVolumeSource{Name: isoName(m.orderID, i)}}}}
	}
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: vmName(m.orderID, i), Namespace: m.namespace, Labels: labels},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &always,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: replicaLabels(m.orderID, i)},
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{
						CPU: &kubevirtv1.CPU{Cores: uint32(m.cpu)},
						Resources: kubevirtv1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceMemory: mib(m.memoryMiB)},
						},
						Firmware: firmware,
						Devices:  kubevirtv1.Devices{Disks: disks, Interfaces: []kubevirtv1.Interface{*kubevirtv1.DefaultMasqueradeNetworkInterface()}},
					},
					// The pod network, bound with masquerade: the guest sits
					// behind the pod's address and the Service's port is
					// forwarded to it. Named nothing, KubeVirt binds it by
					// bridge (its default), which gives the guest the pod's
					// own address and the pod none of its own.
					Networks:     []kubevirtv1.Network{*kubevirtv1.DefaultPodNetwork()},
					NodeSelector: map[string]string{labelAppliance: m.appliance},
					Tolerations:  []corev1.Toleration{{Key: taintComputeWindow, Operator: corev1.TolerationOpExists}},
					Volumes:      volumes,
				},
			},
		},
	}
}

// service is port 80 in front of all replicas of the order.
func service(o imagestore.Order) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: serviceName(o.ID), Namespace: namespaceName(o.BuyerID), Labels: orderLabels(o.ID)},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{labelOrder: o.ID},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromInt32(80)}},
		},
	}
}

// ingress publishes the order's Service at https://vm-<order>.<domain>
// through Traefik, with a Let's Encrypt certificate (CertResolver).
func ingress(o imagestore.Order, domain string) *networkingv1.Ingress {
	host := serviceName(o.ID) + "." + domain
	prefix := networkingv1.PathTypePrefix
	return &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Name: serviceName(o.ID), Namespace: namespaceName(o.BuyerID), Labels: orderLabels(o.ID),
			Annotations: map[string]string{
				"traefik.ingress.kubernetes.io/router.entrypoints":      "websecure",
				"traefik.ingress.kubernetes.io/router.tls":              "true",
				"traefik.ingress.kubernetes.io/router.tls.certresolver": CertResolver,
			}},
		Spec: networkingv1.IngressSpec{
			TLS: []networkingv1.IngressTLS{{Hosts: []string{host}, SecretName: tlsSecretName(o.ID)}},
			Rules: []networkingv1.IngressRule{{
				Host: host,
				IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
					Paths: []networkingv1.HTTPIngressPath{{
						Path:     "/",
						PathType: &prefix,
						Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
							Name: serviceName(o.ID), Port: networkingv1.ServiceBackendPort{Number: 80}}},
					}},
				}},
			}},
		},
	}
}
