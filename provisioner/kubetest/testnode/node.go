// Package testnode plays, for tests only, one hosting box of a KubeVirt
// cluster: the node that kube-scheduler would bind a replica's
// virt-launcher pod to, its kubelet, its virt-handler and virt-launcher,
// CDI's importer for the replica's disk, and kube-proxy for the order's
// Service; beside them virt-api's console and vnc subresources, served as
// the aggregated API the real API server proxies.
//
// It runs against a real kube-apiserver (package kubetest) in which
// KubeVirt's own virt-controller turns VirtualMachines into
// VirtualMachineInstances and launcher pods, and it boots each VMI for
// real: KubeVirt v1.8.0's own converter makes the libvirt domain and its
// own cloud-init package the NoCloud disk, and a real libvirtd and QEMU
// (software emulation) run it. What it writes back (pod, PVC, DataVolume
// and VMI status) is what those components write, so that virt-controller
// and the provisioner see a machine start, run and stop.
//
// Where it differs from a real box, it says so where the difference is:
// the pod network is the host's loopback, KubeVirt's masquerade binding is
// QEMU's user network with the pod's ports forwarded from 127.0.0.1, a
// pod's mounts are folders under the node's directory, and storage is a
// folder per PersistentVolume.
package testnode

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"

	"github.com/vmshelf/vmshelf/provisioner/kubetest/virtapi"
)

// Config is what a node is.
type Config struct {
	// Admin reaches the API server as its administrator (the components a
	// node runs each have rights of their own in a cluster; here they
	// share one identity).
	Admin *rest.Config
	// Name is the Node's name.
	Name string
	// Labels are the Node's labels beside those virt-handler sets
	// (kubevirt.io/schedulable): the appliance label of the box.
	Labels map[string]string
	// Taints are the Node's taints, e.g. the box's compute window.
	Taints []corev1.Taint
	// Allocatable is what the box offers its pods (memory, cpu, pods,
	// ephemeral storage, and the devices virt-handler's device plugins
	// advertise on a box with KVM); the scheduler fits pods into it.
	Allocatable corev1.ResourceList
	// StorageClasses are the classes whose claims this node provisions (a
	// local provisioner's); a claim of another class stays Pending.
	StorageClasses []string
	// Dir holds the node's state: volumes, pods' folders, sockets. It must
	// be short (a Unix socket's path has at most 107 bytes) and reachable
	// by QEMU's user (libvirt-qemu): Start makes it 0755.
	Dir string
	// ClusterConfig is KubeVirt's configuration (the KubeVirt CR), read by
	// the defaults and the converter as virt-handler reads it.
	ClusterConfig *virtconfig.ClusterConfig
	// CACertsPEM are the certificates (PEM) the importer trusts for https
	// sources, beside the system's roots (a test's own https server).
	CACertsPEM []byte
	// Libvirt runs the domains.
	Libvirt *Libvirt
	// Logf is told what the node does.
	Logf func(format string, args ...any)
}

var (
	dvGVR  = schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datavolumes"}
	vmiGVR = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
)

// Node is a running test node. Close stops it.
type Node struct {
	cfg  Config
	kube kubernetes.Interface
	dyn  dynamic.Interface
	logf func(string, ...any)

	factory    informers.SharedInformerFactory
	dynFactory dynamicinformer.DynamicSharedInformerFactory
	pods       cache.SharedIndexInformer
	services   cache.SharedIndexInformer
	dvs        cache.SharedIndexInformer
	vmis       cache.SharedIndexInformer

	rootCAs *x509.CertPool // the system's and CACertsPEM
	caFile  string         // CACertsPEM as a file, for nbdkit

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	sched    *queue
	kubelet  *queue
	handler  *queue
	importer *importer
	proxy    *proxy
	api      *virtapi.Server

	mu      sync.Mutex
	domains map[string]*domain // by VMI namespace/name
}

// trustCAs adds the Config's CA certificates to the system's, for the
// importer's downloads, and writes them where nbdkit's curl reads them.
func (n *Node) trustCAs() error {
	if len(n.cfg.CACertsPEM) == 0 {
		return nil
	}
	var err error
	if n.rootCAs, err = x509.SystemCertPool(); err != nil {
		n.rootCAs = x509.NewCertPool()
	}
	if !n.rootCAs.AppendCertsFromPEM(n.cfg.CACertsPEM) {
		return errors.New("testnode: CACertsPEM holds no certificate")
	}
	n.caFile = filepath.Join(n.cfg.Dir, "ca.pem")
	if err := os.WriteFile(n.caFile, n.cfg.CACertsPEM, 0o644); err != nil {
		return fmt.Errorf("testnode: %w", err)
	}
	return nil
}

// Start registers the Node with the API server and runs its parts until
// Close.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("testnode: %w", err)
	}
	// QEMU runs as libvirt-qemu and must reach the sockets' and disks'
	// folders below.
	if err := os.Chmod(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("testnode: %w", err)
	}
	admin := rest.CopyConfig(cfg.Admin)
	// Custom resources (KubeVirt's, CDI's) speak JSON only.
	admin.ContentType, admin.AcceptContentTypes = "", ""
	kube, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, kube: kube, dyn: dyn, logf: cfg.Logf, domains: map[string]*domain{}}
	if err := n.trustCAs(); err != nil {
		return nil, err
	}
	if err := cfg.Libvirt.destroyOrphans(ctx, cfg.Name); err != nil {
		return nil, err
	}
	n.ctx, n.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := n.register(ctx); err != nil {
		n.cancel()
		return nil, err
	}

	n.factory = informers.NewSharedInformerFactory(kube, 0)
	n.pods = n.factory.Core().V1().Pods().Informer()
	n.services = n.factory.Core().V1().Services().Informer()
	n.dynFactory = dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	n.dvs = n.dynFactory.ForResource(dvGVR).Informer()
	n.vmis = n.dynFactory.ForResource(vmiGVR).Informer()

	n.sched = newQueue("scheduler", n.schedule, n.logf)
	n.kubelet = newQueue("kubelet", n.syncPod, n.logf)
	n.handler = newQueue("virt-handler", n.syncVMI, n.logf)
	n.importer = newImporter(n)
	n.proxy = newProxy(n)
	n.api, err = startSubresources(n)
	if err != nil {
		n.cancel()
		return nil, err
	}
	if err := n.watch(); err != nil {
		n.Close()
		return nil, err
	}
	n.factory.Start(n.ctx.Done())
	n.dynFactory.Start(n.ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), n.pods.HasSynced, n.services.HasSynced, n.dvs.HasSynced, n.vmis.HasSynced) {
		n.Close()
		return nil, errors.New("testnode: informers did not sync within a minute")
	}
	events, err := cfg.Libvirt.events(n.ctx, n.domainEvent)
	if err != nil {
		n.Close()
		return nil, err
	}
	n.wg.Add(1)
	go func() { defer n.wg.Done(); <-events }()
	for _, q := range []*queue{n.sched, n.kubelet, n.handler, n.importer.q, n.proxy.q} {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); q.run(n.ctx) }()
	}
	n.logf("testnode: node %s ready", cfg.Name)
	return n, nil
}

// register creates the Node (or takes over one of its name) with its
// labels, taints and a Ready condition, as kubelet and virt-handler make
// it.
func (n *Node) register(ctx context.Context) error {
	labels := maps.Clone(n.cfg.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	// virt-handler's label: this node runs virtual machines.
	labels["kubevirt.io/schedulable"] = "true"
	labels[corev1.LabelHostname] = n.cfg.Name
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.cfg.Name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: n.cfg.Taints},
	}
	created, err := n.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("testnode: register Node %s: %w", n.cfg.Name, err)
	}
	now := metav1.Now()
	created.Status = corev1.NodeStatus{
		Capacity: n.cfg.Allocatable, Allocatable: n.cfg.Allocatable,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "the test node is ready", LastHeartbeatTime: now, LastTransitionTime: now}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: n.cfg.Name}},
	}
	ready, err := n.kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("testnode: Node %s status: %w", n.cfg.Name, err)
	}
	// The API server's admission taints a new Node not-ready; the node
	// lifecycle controller lifts the taint once the Node reports Ready.
	// It does not run here, so the node lifts it itself.
	taints := slices.DeleteFunc(slices.Clone(ready.Spec.Taints), func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeNotReady })
	if len(taints) != len(ready.Spec.Taints) {
		ready.Spec.Taints = taints
		if _, err := n.kube.CoreV1().Nodes().Update(ctx, ready, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("testnode: Node %s's not-ready taint: %w", n.cfg.Name, err)
		}
	}
	return nil
}

// watch connects the informers to the parts: a pod to the scheduler and
// the kubelet, a VMI to virt-handler, a DataVolume to the importer (and to
// the kubelet of the pods that wait for it), a Service to kube-proxy.
func (n *Node) watch() error {
	podKey := func(obj any) {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			n.sched.add(k)
			n.kubelet.add(k)
			n.proxy.q.add(proxyResync)
		}
	}
	if _, err := n.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: podKey, UpdateFunc: func(_, o any) { podKey(o) }, DeleteFunc: podKey,
	}); err != nil {
		return err
	}
	vmiKey := func(obj any) {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			n.handler.add(k)
		}
	}
	if _, err := n.vmis.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: vmiKey, UpdateFunc: func(_, o any) { vmiKey(o) }, DeleteFunc: vmiKey,
	}); err != nil {
		return err
	}
	dvKey := func(obj any) {
		k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			return
		}
		n.importer.q.add(k)
		// A launcher pod waits for its disks as a kubelet waits for its
		// volumes: each change of a disk looks at the pods again.
		ns, _, _ := cache.SplitMetaNamespaceKey(k)
		for _, p := range n.pods.GetStore().List() {
			if pod := p.(*corev1.Pod); pod.Namespace == ns {
				n.kubelet.add(ns + "/" + pod.Name)
			}
		}
	}
	if _, err := n.dvs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: dvKey, UpdateFunc: func(_, o any) { dvKey(o) }, DeleteFunc: dvKey,
	}); err != nil {
		return err
	}
	svcKey := func(any) { n.proxy.q.add(proxyResync) }
	if _, err := n.services.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: svcKey, UpdateFunc: func(_, o any) { svcKey(o) }, DeleteFunc: svcKey,
	}); err != nil {
		return err
	}
	return nil
}

// Close stops every domain the node runs (their disks stay), its
// listeners and its loops, and removes the Node.
func (n *Node) Close() {
	n.cancel()
	// The listeners first: their accept loops are among what wg waits for.
	if n.proxy != nil {
		n.proxy.close()
	}
	if n.api != nil {
		n.api.Close()
	}
	n.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n.mu.Lock()
	doms := slices.Collect(maps.Values(n.domains))
	n.domains = map[string]*domain{}
	n.mu.Unlock()
	for _, d := range doms {
		if err := n.cfg.Libvirt.destroy(ctx, d.name); err != nil {
			n.logf("testnode: destroying %s: %v", d.name, err)
		}
	}
	if err := n.kube.CoreV1().Nodes().Delete(ctx, n.cfg.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		n.logf("testnode: removing Node %s: %v", n.cfg.Name, err)
	}
}

// podDir is the folder that stands for pod uid's private mounts. Its
// name is short, and so is each volume's below it (podVolumeDir): the
// domain's sockets live there, under the VMI's UID, and a Unix socket's
// path has at most 107 bytes. The UID's first 8 hex digits tell the few
// pods of one test apart.
func (n *Node) podDir(uid string) string {
	return filepath.Join(n.cfg.Dir, "p", uid[:min(8, len(uid))])
}

// podVolumeDir is the folder of the pod's volume name (an emptyDir, a
// Secret) below podDir.
func (n *Node) podVolumeDir(uid, name string) string { return filepath.Join(n.podDir(uid), "v", name) }

// volumeDir is the folder of PersistentVolume name: the claim's file
// system, holding disk.img as CDI writes it.
func (n *Node) volumeDir(name string) string { return filepath.Join(n.cfg.Dir, "volumes", name) }

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
