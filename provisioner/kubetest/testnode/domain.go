package testnode

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cloudinit "kubevirt.io/kubevirt/pkg/cloud-init"
	"kubevirt.io/kubevirt/pkg/defaults"
	diskutils "kubevirt.io/kubevirt/pkg/ephemeral-disk-utils"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/arch"
	convertertypes "kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/types"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/efi"
)

// domain is a VMI's libvirt domain on this node.
type domain struct {
	name    string // libvirt's name
	key     string // the VMI's namespace/name
	vmiUID  string
	podUID  string
	efi     bool
	serial  string // the serial console's socket (QEMU listens)
	vnc     string // the VNC socket (QEMU listens)
	log     string // the serial console's log file
	httpFwd string // 127.0.0.1:port, forwarded to the guest's port 80
	accel   string // KVM, or TCG
	started time.Time

	done     chan struct{} // closed when it stopped
	mu       sync.Mutex
	stopped  bool
	failed   bool
	reason   string // libvirt's event and detail, once stopped
	stopping bool   // the node asked it to stop
}

// markStopped records that d stopped, once: the first word on it (its
// lifecycle event, or the node's own destroy) stands.
func (d *domain) markStopped(reason string, failed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	close(d.done)
	d.stopped, d.failed, d.reason = true, failed, reason
}

func (d *domain) ended() (ended, failed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stopped, d.failed
}

// guestHTTPPort is the guest port the node forwards from the pod's
// address: the port the market sells (the order's Service's target).
const guestHTTPPort = 80

// KubeVirt's cloud-init and ephemeral-disk packages keep their settings
// in package variables (virt-launcher runs one VMI per process): the node
// sets them under this lock for each conversion.
var convertMu sync.Mutex

// syncVMI is virt-handler for a VMI virt-controller scheduled to this
// node: it starts the domain once the VMI is Scheduled here, reports it
// Running, reports its end (Succeeded, or Failed when the guest crashed
// or panicked, as virt-handler reads libvirt's reasons), and stops it
// when the VMI is deleted, gracefully first (ACPI), as virt-handler does
// within the VMI's grace period.
func (n *Node) syncVMI(ctx context.Context, key string) error {
	obj, exists, err := n.vmis.GetStore().GetByKey(key)
	if err != nil {
		return err
	}
	d := n.domainByKey(key)
	if !exists {
		if d != nil {
			return n.stopDomain(ctx, d, 0)
		}
		return nil
	}
	var vmi kubevirtv1.VirtualMachineInstance
	if err := kruntime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).Object, &vmi); err != nil {
		return err
	}
	if vmi.Status.NodeName != n.cfg.Name {
		return nil
	}
	if d != nil && d.vmiUID != string(vmi.UID) {
		// An earlier VMI of this name (a restart): its domain is done.
		if err := n.stopDomain(ctx, d, 0); err != nil {
			return err
		}
		d = nil
	}
	switch {
	case vmi.DeletionTimestamp != nil:
		if d != nil {
			grace := int64(kubevirtv1.DefaultGracePeriodSeconds)
			if vmi.Spec.TerminationGracePeriodSeconds != nil {
				grace = *vmi.Spec.TerminationGracePeriodSeconds
			}
			if err := n.stopDomain(ctx, d, time.Duration(grace)*time.Second); err != nil {
				return err
			}
			return n.setVMIPhase(ctx, &vmi, kubevirtv1.Succeeded, "")
		}
	case vmi.IsFinal():
	case d != nil:
		if ended, failed := d.ended(); ended {
			phase := kubevirtv1.Succeeded
			if failed {
				phase = kubevirtv1.Failed
			}
			return n.setVMIPhase(ctx, &vmi, phase, d.reason)
		}
		if vmi.Status.Phase != kubevirtv1.Running {
			return n.setVMIPhase(ctx, &vmi, kubevirtv1.Running, "")
		}
	case vmi.Status.Phase == kubevirtv1.Scheduled:
		pod := n.launcherOf(&vmi)
		if pod == nil {
			return errRetryLater
		}
		d, err := n.startDomain(ctx, &vmi, pod)
		if err != nil {
			return n.syncFailed(ctx, &vmi, err)
		}
		n.mu.Lock()
		n.domains[key] = d
		n.mu.Unlock()
		n.logf("testnode: domain %s started for %s under %s (EFI %v, port 80 at %s)", d.name, key, d.accel, d.efi, d.httpFwd)
		n.proxy.q.add(proxyResync)
		return n.setVMIPhase(ctx, &vmi, kubevirtv1.Running, "")
	}
	return nil
}

// syncFailed reports a domain that could not start as virt-handler
// does: the VMI's Synchronized condition False with the reason, retried.
func (n *Node) syncFailed(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, cause error) error {
	n.logf("testnode: %s/%s: %v", vmi.Namespace, vmi.Name, cause)
	err := n.updateVMI(ctx, vmi, func(v *kubevirtv1.VirtualMachineInstance) {
		setVMICondition(v, kubevirtv1.VirtualMachineInstanceCondition{Type: kubevirtv1.VirtualMachineInstanceSynchronized,
			Status: corev1.ConditionFalse, Reason: "Synchronizing with the Domain failed.", Message: cause.Error()})
	})
	return errors.Join(cause, err)
}

func setVMICondition(v *kubevirtv1.VirtualMachineInstance, c kubevirtv1.VirtualMachineInstanceCondition) {
	c.LastTransitionTime = metav1.Now()
	for i := range v.Status.Conditions {
		if v.Status.Conditions[i].Type == c.Type {
			v.Status.Conditions[i] = c
			return
		}
	}
	v.Status.Conditions = append(v.Status.Conditions, c)
}

// setVMIPhase writes the VMI's phase (and, for a Failed one, libvirt's
// reason as the Synchronized condition's message).
func (n *Node) setVMIPhase(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, phase kubevirtv1.VirtualMachineInstancePhase, reason string) error {
	if vmi.Status.Phase == phase {
		return nil
	}
	err := n.updateVMI(ctx, vmi, func(v *kubevirtv1.VirtualMachineInstance) {
		v.Status.Phase = phase
		v.Status.PhaseTransitionTimestamps = append(v.Status.PhaseTransitionTimestamps,
			kubevirtv1.VirtualMachineInstancePhaseTransitionTimestamp{Phase: phase, PhaseTransitionTimestamp: metav1.Now()})
		if phase == kubevirtv1.Failed && reason != "" {
			setVMICondition(v, kubevirtv1.VirtualMachineInstanceCondition{Type: kubevirtv1.VirtualMachineInstanceSynchronized,
				Status: corev1.ConditionFalse, Reason: "The VirtualMachineInstance crashed.", Message: reason})
		}
	})
	if err == nil {
		n.logf("testnode: VMI %s/%s %s %s", vmi.Namespace, vmi.Name, phase, reason)
	}
	return err
}

// updateVMI applies change to the VMI as stored and writes it (KubeVirt's
// VMI status is no subresource: virt-handler updates the object).
func (n *Node) updateVMI(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, change func(*kubevirtv1.VirtualMachineInstance)) error {
	vmis := n.dyn.Resource(vmiGVR).Namespace(vmi.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u, err := vmis.Get(ctx, vmi.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var cur kubevirtv1.VirtualMachineInstance
		if err := kruntime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cur); err != nil {
			return err
		}
		if cur.UID != vmi.UID {
			return apierrors.NewNotFound(vmiGVR.GroupResource(), vmi.Name)
		}
		change(&cur)
		obj, err := kruntime.DefaultUnstructuredConverter.ToUnstructured(&cur)
		if err != nil {
			return err
		}
		_, err = vmis.Update(ctx, &unstructured.Unstructured{Object: obj}, metav1.UpdateOptions{})
		return err
	})
}

func (n *Node) domainByKey(key string) *domain {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.domains[key]
}

func (n *Node) domainOfPod(pod *corev1.Pod) *domain {
	d := n.domainByKey(vmiKeyOf(pod))
	if d == nil || d.podUID != string(pod.UID) {
		return nil
	}
	return d
}

// stopDomainOf stops the domain the pod runs, if any, at once: the pod
// is going, and the launcher with it.
func (n *Node) stopDomainOf(ctx context.Context, pod *corev1.Pod) error {
	if d := n.domainOfPod(pod); d != nil {
		return n.stopDomain(ctx, d, 0)
	}
	return nil
}

// stopDomain shuts d down: an ACPI shutdown first when grace allows,
// then destroyed; its definition goes, its disk stays.
func (n *Node) stopDomain(ctx context.Context, d *domain, grace time.Duration) error {
	d.mu.Lock()
	d.stopping = true
	stopped := d.stopped
	d.mu.Unlock()
	if !stopped && grace > 0 {
		if _, err := n.cfg.Libvirt.virsh(ctx, "shutdown", d.name); err == nil {
			select {
			case <-d.done:
			case <-time.After(grace):
				n.logf("testnode: %s did not shut down within %s: destroyed", d.name, grace)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	if err := n.cfg.Libvirt.destroy(ctx, d.name); err != nil {
		return err
	}
	// Its lifecycle event may come after it left the node's map (and
	// find nothing): whoever else waits for it to stop is told here.
	d.markStopped("libvirt: Stopped Destroyed", false)
	n.mu.Lock()
	if n.domains[d.key] == d {
		delete(n.domains, d.key)
	}
	n.mu.Unlock()
	n.logf("testnode: domain %s stopped", d.name)
	n.proxy.q.add(proxyResync)
	return nil
}

// domainEvent records that one of the node's domains stopped or crashed
// and hands its VMI and pod to virt-handler and the kubelet. A domain
// stopped for a crash or a guest panic is Failed, as virt-handler reads
// libvirt's reasons; one the guest shut down is Succeeded.
func (n *Node) domainEvent(e lifecycle) {
	n.mu.Lock()
	var d *domain
	for _, cand := range n.domains {
		if cand.name == e.domain {
			d = cand
		}
	}
	n.mu.Unlock()
	if d == nil || (e.event != "Stopped" && e.event != "Crashed") {
		return
	}
	d.mu.Lock()
	failed := e.detail == "Crashed" || e.detail == "Panicked" || e.detail == "Failed" || (e.detail == "Destroyed" && !d.stopping)
	d.mu.Unlock()
	d.markStopped("libvirt: "+e.event+" "+e.detail, failed)
	n.logf("testnode: domain %s: %s %s", d.name, e.event, e.detail)
	n.handler.add(d.key)
	ns, _, _ := strings.Cut(d.key, "/")
	for _, obj := range n.pods.GetStore().List() {
		if pod := obj.(*corev1.Pod); pod.Namespace == ns && string(pod.UID) == d.podUID {
			n.kubelet.add(ns + "/" + pod.Name)
		}
	}
}

// startDomain is virt-launcher's part: the VMI, with the defaults
// virt-api's mutating webhook gives it (KubeVirt's own pkg/defaults),
// its cloud-init NoCloud disk made by KubeVirt's own pkg/cloud-init from
// the Secret the kubelet wrote into the pod, and its domain made by
// KubeVirt's own converter (pkg/virt-launcher/virtwrap/converter, with
// the context virtwrap/manager.go's generateConverterContext builds and
// the domain defaults SyncVMI applies after it); then defined and started
// with libvirt. What the node changes in the converter's domain, and
// nothing else, is what a pod would give virt-launcher: the paths of the
// container's mounts, made this host's (hostPath), and the pod network's
// interface (network below).
func (n *Node) startDomain(ctx context.Context, orig *kubevirtv1.VirtualMachineInstance, pod *corev1.Pod) (*domain, error) {
	vmi := orig.DeepCopy()
	if err := defaults.SetDefaultVirtualMachineInstance(n.cfg.ClusterConfig, vmi); err != nil {
		return nil, fmt.Errorf("KubeVirt's VMI defaults: %w", err)
	}
	kubevirtv1.SetObjectDefaults_VirtualMachineInstance(vmi)
	mac, err := masqueradeInterface(vmi)
	if err != nil {
		return nil, err
	}
	d := &domain{done: make(chan struct{}), key: vmi.Namespace + "/" + vmi.Name, vmiUID: string(vmi.UID), podUID: string(pod.UID), efi: vmi.IsBootloaderEFI()}
	c, err := n.converterContext(vmi)
	if err != nil {
		return nil, err
	}
	secrets, err := n.hostPath(pod, "/var/run/kubevirt-private/secret")
	if err != nil {
		return nil, err
	}
	dom, err := n.convert(vmi, secrets, c)
	if err != nil {
		return nil, err
	}

	// The converter asks for KVM where /dev/kvm is, for QEMU's software
	// emulation (TCG) where it is not (AllowEmulation).
	d.accel = "TCG (software emulation: no /dev/kvm)"
	if dom.Spec.Type == "kvm" {
		d.accel = "KVM"
	}
	d.name = domainPrefix(n.cfg.Name, os.Getpid()) + dom.Spec.Name
	dom.Spec.Name = d.name
	if d.httpFwd, err = freeLoopbackAddr(); err != nil {
		return nil, err
	}
	network(&dom.Spec, mac, d.httpFwd)
	out, err := xml.MarshalIndent(dom.Spec, "", "  ")
	if err != nil {
		return nil, err
	}
	domXML, err := n.hostPaths(pod, string(out), d)
	if err != nil {
		return nil, err
	}
	file := filepath.Join(n.podDir(string(pod.UID)), "domain.xml")
	if err := os.WriteFile(file, []byte(domXML), 0o600); err != nil {
		return nil, err
	}
	// A domain of the name left by an earlier start of this VMI goes first.
	if err := n.cfg.Libvirt.destroy(ctx, d.name); err != nil {
		return nil, err
	}
	if _, err := n.cfg.Libvirt.virsh(ctx, "define", file); err != nil {
		return nil, err
	}
	if _, err := n.cfg.Libvirt.virsh(ctx, "start", d.name); err != nil {
		return nil, err
	}
	d.started = time.Now()
	return d, nil
}

// converterContext is the context virt-launcher's manager gives KubeVirt's
// converter for vmi (generateConverterContext): the OVMF files of its EFI
// boot, its claims as file systems, software emulation allowed.
func (n *Node) converterContext(vmi *kubevirtv1.VirtualMachineInstance) (*convertertypes.ConverterContext, error) {
	var efiConf *convertertypes.EFIConfiguration
	if vmi.IsBootloaderEFI() {
		secureBoot := vmi.Spec.Domain.Firmware.Bootloader.EFI.SecureBoot == nil || *vmi.Spec.Domain.Firmware.Bootloader.EFI.SecureBoot
		env := efi.DetectEFIEnvironment(runtime.GOARCH, OVMFDir)
		if !env.Bootable(secureBoot, efi.None) {
			return nil, fmt.Errorf("EFI OVMF roms missing for booting in EFI mode with SecureBoot=%v", secureBoot)
		}
		efiConf = &convertertypes.EFIConfiguration{EFICode: env.EFICode(secureBoot, efi.None),
			EFIVars: env.EFIVars(secureBoot, efi.None), SecureLoader: secureBoot}
	}
	isBlock := map[string]bool{}
	for _, v := range vmi.Spec.Volumes {
		if v.DataVolume != nil || v.PersistentVolumeClaim != nil {
			isBlock[v.Name] = false // the claims here are file systems, disk.img in them
		}
	}
	return &convertertypes.ConverterContext{
		Architecture:     arch.NewConverter(runtime.GOARCH),
		VirtualMachine:   vmi,
		AllowEmulation:   true, // no /dev/kvm here: QEMU emulates (TCG)
		EFIConfiguration: efiConf,
		IsBlockPVC:       isBlock,
		IsBlockDV:        isBlock,
		SerialConsoleLog: (vmi.Spec.Domain.Devices.LogSerialConsole == nil && !n.cfg.ClusterConfig.IsSerialConsoleLogDisabled()) ||
			(vmi.Spec.Domain.Devices.LogSerialConsole != nil && *vmi.Spec.Domain.Devices.LogSerialConsole),
	}, nil
}

// convert turns vmi into its libvirt domain with KubeVirt's converter,
// and writes its cloud-init NoCloud disk with KubeVirt's cloud-init, from
// the Secrets mounted at secrets. KubeVirt's packages keep state of their
// own (a local directory, an ownership manager): one conversion at a time.
func (n *Node) convert(vmi *kubevirtv1.VirtualMachineInstance, secrets string, c *convertertypes.ConverterContext) (api.Domain, error) {
	convertMu.Lock()
	defer convertMu.Unlock()
	var dom api.Domain
	// There is no user qemu (107) here: libvirt gives the files to
	// libvirt-qemu itself (its dynamic ownership).
	diskutils.MockDefaultOwnershipManager()
	if err := cloudinit.SetLocalDirectory(filepath.Join(n.cfg.Dir, "cloud-init")); err != nil {
		return dom, err
	}
	data, err := cloudinit.ReadCloudInitVolumeDataSource(vmi, secrets)
	if err != nil {
		return dom, fmt.Errorf("KubeVirt's cloud-init: %w", err)
	}
	if data != nil {
		if err := cloudinit.PrepareLocalPath(vmi.Name, vmi.Namespace); err != nil {
			return dom, err
		}
	}
	if err := converter.Convert_v1_VirtualMachineInstance_To_api_Domain(vmi, &dom, c); err != nil {
		return dom, fmt.Errorf("KubeVirt's converter: %w", err)
	}
	api.NewDefaulter(c.Architecture.GetArchitecture()).SetObjectDefaults_Domain(&dom)
	if data != nil {
		if err := cloudinit.GenerateLocalData(vmi, "", data); err != nil {
			return dom, fmt.Errorf("KubeVirt's cloud-init NoCloud disk: %w", err)
		}
	}
	return dom, nil
}

// masqueradeInterface checks that vmi's only interface binds the pod
// network with masquerade, and returns its MAC address ("" for QEMU's
// default). The node plays that binding (the guest behind NAT, the pod's
// ports forwarded to it: network); KubeVirt's bridge binding gives the
// guest the pod's own address, which one host's loopback cannot.
func masqueradeInterface(vmi *kubevirtv1.VirtualMachineInstance) (string, error) {
	ifaces := vmi.Spec.Domain.Devices.Interfaces
	if len(ifaces) != 1 || len(vmi.Spec.Networks) != 1 || vmi.Spec.Networks[0].Pod == nil || ifaces[0].Name != vmi.Spec.Networks[0].Name {
		return "", fmt.Errorf("the test node plays one pod-network interface bound with masquerade; the VMI has interfaces %+v on networks %+v",
			ifaces, vmi.Spec.Networks)
	}
	if ifaces[0].Masquerade == nil {
		binding := "an unknown binding"
		switch {
		case ifaces[0].Bridge != nil:
			binding = "bridge (KubeVirt's default when a VM names none)"
		case ifaces[0].Binding != nil:
			binding = "the plugin " + ifaces[0].Binding.Name
		}
		return "", fmt.Errorf("the test node plays KubeVirt's masquerade binding of the pod network; interface %q binds %s", ifaces[0].Name, binding)
	}
	return ifaces[0].MacAddress, nil
}

// qemuNS is the XML namespace of libvirt's QEMU passthrough.
const qemuNS = "http://libvirt.org/schemas/domain/qemu/1.0"

// network replaces the converter's pod-network interface (a tap device
// that virt-launcher's network setup would make in the pod) with QEMU's
// user network: the guest behind NAT, as masquerade puts it, with the
// pod's port 80 (here httpFwd) forwarded to the guest's, as masquerade's
// nftables rules forward the pod's ports. libvirt 9.0 ignores
// <portForward> of a user interface, hence QEMU's own arguments.
func network(spec *api.DomainSpec, mac, httpFwd string) {
	spec.Devices.Interfaces = nil
	netdev := fmt.Sprintf("user,id=unet0,hostfwd=tcp:%s-:%d", httpFwd, guestHTTPPort)
	device := "virtio-net-pci,netdev=unet0,bus=pcie.0,addr=0x10"
	if mac != "" {
		device += ",mac=" + mac
	}
	spec.XmlNS = qemuNS
	if spec.QEMUCmd == nil {
		spec.QEMUCmd = &api.Commandline{}
	}
	spec.QEMUCmd.QEMUArg = append(spec.QEMUCmd.QEMUArg,
		api.Arg{Value: "-netdev"}, api.Arg{Value: netdev}, api.Arg{Value: "-device"}, api.Arg{Value: device})
}

// containerPath is a path of virt-launcher's container in the domain.
var containerPath = regexp.MustCompile(`/var/run/[^"<>\s]*`)

// hostPaths rewrites every path of the launcher's container in the
// domain's XML to where it is on this host (hostPath: through the pod's
// mounts), making the folders QEMU creates sockets and NVRAM in, and
// notes d's console sockets and log.
func (n *Node) hostPaths(pod *corev1.Pod, domXML string, d *domain) (string, error) {
	var errs []error
	out := containerPath.ReplaceAllStringFunc(domXML, func(p string) string {
		h, err := n.hostPath(pod, p)
		if err != nil {
			errs = append(errs, err)
			return p
		}
		// QEMU (libvirt-qemu) creates sockets, logs and NVRAM there.
		if err := mkdirAllMode(filepath.Dir(h), n.cfg.Dir); err != nil {
			errs = append(errs, err)
		}
		switch {
		case strings.HasSuffix(p, "/virt-serial0"):
			d.serial = h
		case strings.HasSuffix(p, "/virt-serial0-log"):
			d.log = h
		case strings.HasSuffix(p, "/virt-vnc"):
			d.vnc = h
		}
		return h
	})
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	if d.serial == "" || d.vnc == "" {
		return "", fmt.Errorf("the converter's domain has no serial console or VNC socket (serial %q, vnc %q)", d.serial, d.vnc)
	}
	return out, nil
}

// mkdirAllMode makes dir and its missing parents below root, each open to
// QEMU's user (the node's folders are the test's own).
func mkdirAllMode(dir, root string) error {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	for p := dir; strings.HasPrefix(p, root+"/"); p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o777); err != nil {
			return err
		}
	}
	return nil
}

// freeLoopbackAddr is a 127.0.0.1 port nothing listens on now.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// SerialLog is the file the serial console of VMI ns/name is logged to
// (KubeVirt's guest-console-log reads the same), "" while the node runs
// no domain for it.
func (n *Node) SerialLog(ns, name string) string {
	if d := n.domainByKey(ns + "/" + name); d != nil {
		return d.log
	}
	return ""
}

// Started is when the domain of VMI ns/name started, and how QEMU runs it
// (KVM or TCG); ok is false while the node runs no domain for it.
func (n *Node) Started(ns, name string) (at time.Time, accel string, ok bool) {
	if d := n.domainByKey(ns + "/" + name); d != nil {
		return d.started, d.accel, true
	}
	return time.Time{}, "", false
}

// Disk is the disk file of claim ns/name on this node: disk.img in its
// PersistentVolume's folder, as CDI writes it.
func (n *Node) Disk(ns, claim string) (string, error) {
	pv, err := n.boundVolume(ns, claim)
	if err != nil {
		return "", err
	}
	return filepath.Join(n.volumeDir(pv), "disk.img"), nil
}
