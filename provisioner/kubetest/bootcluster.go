package kubetest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/vmshelf/vmshelf/provisioner/kubetest/guestimage"
	"github.com/vmshelf/vmshelf/provisioner/kubetest/testnode"
)

// cloudInitDone is the line cloud-init writes on the console when it has
// run everything, the user data included.
var cloudInitDone = regexp.MustCompile(`Cloud-init v\. \S+ finished at [^\n]*`)

// bootCluster is one hosting box's cluster, booting for real: the API
// server with KubeVirt's CRDs, the kit, KubeVirt's VM admitter and
// virt-controller (as TestVirtControllerRunsOurVM runs them), and a test
// node labelled as the box's appliance, tainted with its compute window,
// whose virt-api subresources the API server proxies.
type bootCluster struct {
	js   *judgeServer
	node *testnode.Node
}

// nodeName is the test node's Node.
const nodeName = "box1-node"

// boxAllocatable is what the test node offers: a box with 8 GiB for its
// replicas, and KubeVirt's devices (KVM: the node stands for a box with
// it, though it emulates).
var boxAllocatable = corev1.ResourceList{
	corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourceCPU: resource.MustParse("4"),
	corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	"devices.kubevirt.io/kvm": resource.MustParse("1k"), "devices.kubevirt.io/tun": resource.MustParse("1k"),
	"devices.kubevirt.io/vhost-net": resource.MustParse("1k"),
}

// guestImages are the guest's disks, built or from the cache.
func guestImages(t TB, ctx context.Context) *guestimage.Set {
	t.Helper()
	s, err := guestimage.Ensure(ctx, guestimage.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if s.Built {
		t.Logf("guest images built cold in %s (+ %s resolving versions)", s.Build.Round(time.Second), s.Resolve.Round(time.Second))
	} else {
		t.Logf("guest images from the cache (warm): %s resolving versions", s.Resolve.Round(time.Second))
	}
	return s
}

// startBootCluster starts the cluster; ctx must end before the test's
// cleanups run (virt-controller stops with it). caPEM is what the node's
// importer trusts beside the system's roots.
func startBootCluster(t TB, ctx context.Context, caPEM []byte) *bootCluster {
	t.Helper()
	js := startJudge(t, judges[0])
	clusterConfig := startVirtController(t, ctx, js)

	lv, err := testnode.StartLibvirt(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lv.Close)
	// Short: the domains' sockets live below it.
	dir, err := os.MkdirTemp("", "vn-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	node, err := testnode.Start(ctx, testnode.Config{
		Admin: js.srv.Admin, Name: nodeName,
		Labels:         map[string]string{"losos.dev/appliance": testAppliance},
		Taints:         []corev1.Taint{{Key: "losos.dev/compute-window", Effect: corev1.TaintEffectNoSchedule}},
		StorageClasses: []string{vmStorageClass},
		Allocatable:    boxAllocatable,
		Dir:            dir, ClusterConfig: clusterConfig, CACertsPEM: caPEM, Libvirt: lv, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Close)
	js.srv.Route(testnode.SubresourcesNamespace, testnode.SubresourcesService, testnode.SubresourcesPort, node.SubresourcesAddr())
	regCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := node.RegisterSubresources(regCtx); err != nil {
		t.Fatal(err)
	}
	return &bootCluster{js: js, node: node}
}

// serialUntil waits (bounded by ctx) until the serial log of VMI ns/name
// holds want, and returns the log; it fails t with the log's end if not.
// The log is KubeVirt's serial console log (the converter's <log>), which
// the guest writes to whether or not a console is open.
func (c *bootCluster) serialUntil(t TB, ctx context.Context, ns, name, want string) string {
	t.Helper()
	var got []byte
	for {
		if why := c.syncFailure(ctx, ns, name); why != "" {
			t.Fatalf("%s/%s did not start: %s", ns, name, why)
		}
		if p := c.node.SerialLog(ns, name); p != "" {
			got, _ = os.ReadFile(p)
			if strings.Contains(string(got), want) {
				return string(got)
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s/%s's serial console never showed %q; its end:\n%s", ns, name, want, tailOf(string(got), 3000))
		case <-time.After(time.Second):
		}
	}
}

// vmi is VMI ns/name as the API server has it.
func (c *bootCluster) vmi(t TB, ctx context.Context, ns, name string) *kubevirtv1.VirtualMachineInstance {
	t.Helper()
	u, err := c.js.dyn.Resource(kubevirtv1.VirtualMachineInstanceGroupVersionKind.GroupVersion().WithResource("virtualmachineinstances")).
		Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("VMI %s/%s: %v", ns, name, err)
	}
	var vmi kubevirtv1.VirtualMachineInstance
	if err := fromUnstructured(u, &vmi); err != nil {
		t.Fatal(err)
	}
	return &vmi
}

// syncFailure is why virt-handler (the node) could not start VMI ns/name,
// as its Synchronized condition says, or "".
func (c *bootCluster) syncFailure(ctx context.Context, ns, name string) string {
	u, err := c.js.dyn.Resource(kubevirtv1.VirtualMachineInstanceGroupVersionKind.GroupVersion().WithResource("virtualmachineinstances")).
		Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	var vmi kubevirtv1.VirtualMachineInstance
	if fromUnstructured(u, &vmi) != nil {
		return ""
	}
	for _, cond := range vmi.Status.Conditions {
		if cond.Type == kubevirtv1.VirtualMachineInstanceSynchronized && cond.Status == corev1.ConditionFalse {
			return cond.Message
		}
	}
	return ""
}

// httpThroughService GETs / from the order's Service (port 80) as a
// client in the cluster would: through the node's kube-proxy.
func (c *bootCluster) httpThroughService(t TB, ctx context.Context, ns, svc string) string {
	t.Helper()
	var last error
	for {
		addr, ok := c.node.ServiceAddr(ns, svc, 80)
		if ok {
			body, err := get(ctx, "http://"+addr+"/")
			if err == nil {
				return body
			}
			last = err
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Service %s/%s never answered on port 80: %v", ns, svc, last)
		case <-time.After(time.Second):
		}
	}
}

func get(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), nil
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// kube is a clientset of the API server as its administrator.
func (s *Server) kube(t TB) kubernetes.Interface {
	t.Helper()
	k, err := kubernetes.NewForConfig(s.Admin)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
