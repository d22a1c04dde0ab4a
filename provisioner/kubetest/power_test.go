package kubetest

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	kubevirtclient "kubevirt.io/client-go/kubevirt"

	"github.com/vmshelf/vmshelf/provisioner/kubetest/virtapi"
)

// TestPowerThroughKubeVirt: a buyer's stop, start and restart, through the
// binary ('vmshelf orders stop|start|restart' against serve), as vmshelf's
// ServiceAccount with the kit's RBAC, reach KubeVirt's own virt-api
// handlers (the aggregated API the real API server proxies), and the VM
// and VMI change as those handlers and KubeVirt's own virt-controller make
// them change: a stop halts the VM and its VMI goes; a start brings a new
// VMI on the same DataVolume; a restart replaces the running VMI; what a
// machine cannot take is KubeVirt's own 409, told in words; the order's
// host is told the order is unknown. No node runs: the VMIs stay Pending,
// as in TestVirtControllerRunsOurVM.
func TestPowerThroughKubeVirt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	js := startJudge(t, judges[0])
	clusterConfig := startVirtController(t, ctx, js)
	api, err := virtapi.Start(virtapi.Config{Dir: t.TempDir(), Admin: js.srv.Admin, ClusterConfig: clusterConfig, NodeName: nodeName})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Close)
	js.srv.Route(virtapi.Namespace, virtapi.Service, virtapi.Port, api.Addr())
	regCtx, regCancel := context.WithTimeout(ctx, time.Minute)
	defer regCancel()
	if err := api.Register(regCtx); err != nil {
		t.Fatal(err)
	}
	kv, err := kubevirtclient.NewForConfig(js.srv.Admin)
	if err != nil {
		t.Fatal(err)
	}

	e := startEdge(t, &bootCluster{js: js})
	host := e.addHost(t)
	listing := e.listing(t, host, 2)
	var o struct {
		OrderID string `json:"order_id"`
	}
	e.must(t, "/market/vms/orders", e.token, `{"listing_id":"`+listing+`","quantity":2,"image":"debian-13","name":"web"}`, 201, &o)
	e.pay(t, o.OrderID)
	e.waitMachine(t, ctx, o.OrderID, "active", func(m machine) bool { return m.State == "active" })
	vm0, vm1 := "vm-"+o.OrderID+"-0", "vm-"+o.OrderID+"-1"
	all, err := kv.KubevirtV1().VirtualMachines("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := ""
	for _, v := range all.Items {
		if v.Name == vm0 {
			ns = v.Namespace
		}
	}
	if ns == "" {
		t.Fatalf("the provisioner made no VM %s", vm0)
	}
	vms := kv.KubevirtV1().VirtualMachines(ns)
	vmis := kv.KubevirtV1().VirtualMachineInstances(ns)
	// vmiOf waits (bounded by ctx) until virt-controller's VMI of vm is
	// there (not one of old), and returns its UID.
	vmiOf := func(vm string, old types.UID) types.UID {
		t.Helper()
		for {
			vmi, err := vmis.Get(ctx, vm, metav1.GetOptions{})
			if err == nil && vmi.UID != old && vmi.DeletionTimestamp == nil {
				return vmi.UID
			}
			if err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			select {
			case <-ctx.Done():
				t.Fatalf("virt-controller made no new VMI of %s (old %s): %v", vm, old, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	// gone waits (bounded by ctx) until vm's VMI is gone.
	gone := func(vm string) {
		t.Helper()
		for {
			_, err := vmis.Get(ctx, vm, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the VMI of %s is still there: %v", vm, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	runStrategy := func(vm string) kubevirtv1.VirtualMachineRunStrategy {
		t.Helper()
		v, err := vms.Get(ctx, vm, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rs, err := v.RunStrategy()
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	disk := func(vm string) types.UID {
		t.Helper()
		dv, err := js.dyn.Resource(dvGVR).Namespace(ns).Get(ctx, vm+"-disk", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return dv.GetUID()
	}
	orders := func(action, target string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(e.bin, "orders", action, target, "--control", e.ctlBase, "--token-file", filepath.Join(e.dataDir, "dev-token"))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		code := 0
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, stdout.String(), stderr.String()
	}
	want := func(what string, code int, stdout, stderr string, wantCode int, wantOut string) {
		t.Helper()
		if code != wantCode || !strings.Contains(stdout+stderr, wantOut) {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want exit %d saying %q", what, code, stdout, stderr, wantCode, wantOut)
		}
	}

	first0, first1 := vmiOf(vm0, ""), vmiOf(vm1, "")
	disk0 := disk(vm0)

	code, out, errOut := orders("stop", o.OrderID+"/0")
	want("stop of replica 0", code, out, errOut, 0, "stopped "+vm0)
	if rs := runStrategy(vm0); rs != kubevirtv1.RunStrategyHalted {
		t.Errorf("after the stop %s's runStrategy is %s, want Halted", vm0, rs)
	}
	gone(vm0)
	code, out, errOut = orders("stop", o.OrderID+"/0")
	want("stop of a stopped machine", code, out, errOut, 1, "the machine is stopped already (409 alreadyStopped)")
	code, out, errOut = orders("restart", o.OrderID+"/0")
	want("restart of a stopped machine", code, out, errOut, 1, "")
	if !strings.Contains(errOut, "start it instead") {
		t.Errorf("restart of a stopped machine said %q, want machineStopped's words", errOut)
	}

	code, out, errOut = orders("start", o.OrderID)
	want("start of every replica", code, out, errOut, 1, "started "+vm0)
	if !strings.Contains(out, "not started "+vm1+": the machine is running already (or still starting) (alreadyRunning)") &&
		!strings.Contains(out, "not started "+vm1+": the machine is running already (alreadyRunning)") {
		t.Errorf("start of every replica said %q; want replica 1 refused as running already", out)
	}
	if rs := runStrategy(vm0); rs != kubevirtv1.RunStrategyAlways {
		t.Errorf("after the start %s's runStrategy is %s, want Always", vm0, rs)
	}
	second0 := vmiOf(vm0, first0)
	if d := disk(vm0); d != disk0 {
		t.Errorf("after the start %s's DataVolume is %s, was %s: a new disk", vm0, d, disk0)
	}

	code, out, errOut = orders("restart", o.OrderID+"/1")
	want("restart of replica 1", code, out, errOut, 0, "restarted "+vm1)
	vmiOf(vm1, first1)
	if vmi, err := vmis.Get(ctx, vm0, metav1.GetOptions{}); err != nil || vmi.UID != second0 {
		t.Errorf("the restart of replica 1 touched replica 0's VMI: %v", err)
	}

	status, body := e.call(t, "/market/vms/orders/power", host, `{"order_id":"`+o.OrderID+`","action":"stop"}`)
	if status != 404 || !strings.Contains(string(body), `"orderUnknown"`) {
		t.Errorf("the host's stop: %d %s, want 404 orderUnknown", status, body)
	}
	if rs := runStrategy(vm1); rs != kubevirtv1.RunStrategyAlways {
		t.Errorf("after the host's refused stop %s's runStrategy is %s", vm1, rs)
	}
	if n := e.metric(t, `vmshelf_power_actions_total{action="stop",outcome="accepted"}`); n != 1 {
		t.Errorf("accepted stops counted %v, want 1", n)
	}
	e.assertNoSecrets(t)
	t.Logf("replica 0's VMIs %s → %s; replica 1 restarted", first0, second0)
}
