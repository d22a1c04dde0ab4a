package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2EPower: 'vmshelf orders stop|start|restart' through the binary,
// its control plane and provisioner, against the stand-in cluster's power
// subresources: a replica or every replica of an order is stopped,
// started and restarted, each line saying what became of it, the VM's run
// strategy following, and the buyer's status showing the new state after
// the provisioner's next pass, which the action kicks; a machine that
// cannot take an action is named with the reason and exit 1; another
// tenant's action is refused as an unknown order; malformed arguments are
// usage errors (2). KubeVirt's own handlers judge the same calls in
// provisioner/kubetest.
func TestE2EPower(t *testing.T) {
	t.Parallel()
	m, o, vm0, vm1, host := startPowerMarket(t, "acct_e2ePowerHost", "evt_e2e_power")
	s, kube := m.s, m.kube

	control := []string{"--control", s.ctlBase, "--token-file", filepath.Join(s.dataDir, "dev-token")}
	run := func(args ...string) result {
		t.Helper()
		return vmshelf(t, append(append([]string{"orders"}, args...), control...)...)
	}
	if r := run("stop", o.OrderID+"/1"); r.code != 0 || r.stdout != "stopped "+vm1+"\n" {
		t.Fatalf("orders stop ORDER/1: exit %d, stdout %q; stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if got := kube.runStrategyOf(vm1); got != "Halted" {
		t.Errorf("after the stop %s's runStrategy is %q, want Halted", vm1, got)
	}
	m.waitPower(t, o.OrderID, vm0, vm1, replicaRunning, replicaStopped)

	r := run("stop", o.OrderID)
	if r.code != 1 || !strings.Contains(r.stdout, "stopped "+vm0+"\n") ||
		!strings.Contains(r.stdout, "not stopped "+vm1+": the machine is stopped already (alreadyStopped)") ||
		!strings.Contains(r.stderr, "1 of the machines named not stopped") {
		t.Errorf("orders stop ORDER with replica 1 stopped: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = run("restart", o.OrderID+"/0")
	if r.code != 1 || !strings.Contains(r.stderr, "cannot be restarted; start it instead") || r.stdout != "" {
		t.Errorf("orders restart of a stopped machine: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := run("start", o.OrderID); r.code != 0 || r.stdout != "started "+vm0+"\nstarted "+vm1+"\n" {
		t.Fatalf("orders start ORDER: exit %d, stdout %q; stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	m.waitPower(t, o.OrderID, vm0, vm1, replicaRunning, replicaRunning)
	if r := run("restart", o.OrderID+"/0"); r.code != 0 || r.stdout != "restarted "+vm0+"\n" {
		t.Fatalf("orders restart ORDER/0: exit %d, stdout %q; stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if n0, n1 := kube.restartsOf(vm0), kube.restartsOf(vm1); n0 != 1 || n1 != 0 {
		t.Errorf("restarts: %s %d, %s %d; want 1 and 0", vm0, n0, vm1, n1)
	}

	code, body := s.ctl(t, "/market/vms/orders/power", host, `{"order_id":"`+o.OrderID+`","action":"stop"}`)
	wantError(t, "the host's stop", code, body, http.StatusNotFound, "orderUnknown")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"a replica that is no number", []string{"stop", o.OrderID + "/x"}, 2, "the replica after '/' is a number"},
		{"a malformed ORDER_ID", []string{"stop", "../vmshelf.db"}, 2, "is not an ORDER_ID"},
		{"no ORDER_ID", []string{"restart"}, 2, "orders restart needs the ORDER_ID[/N]s"},
		{"a replica the order lacks", []string{"start", o.OrderID + "/2"}, 1, "the order has replicas 0 to 1"},
	} {
		if r := run(tc.args...); r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("orders %s: exit %d, stdout %q, stderr %q; want exit %d saying %q", tc.name, r.code, r.stdout, r.stderr, tc.code, tc.want)
		}
	}
	if n := kube.restartsOf(vm0); n != 1 {
		t.Errorf("%s restarted %d times in all, want once", vm0, n)
	}
}

// The states of a replica the stand-in cluster runs or has stopped, as
// status shows them.
var (
	replicaRunning = replicaStatus{State: "running", Detail: "Running"}
	replicaStopped = replicaStatus{State: "stopped", Detail: "Stopped"}
)

// startPowerMarket is startKubeMarket with an active order of the dev box
// of two running replicas (vm0, vm1) from the host's listing (host, its
// token), paid with the webhook event eventID.
func startPowerMarket(t *testing.T, account, eventID string) (m *kubeMarket, o orderAnswer, vm0, vm1, host string) {
	t.Helper()
	m = startKubeMarket(t, account)
	host = addHost(t, m.s, "host", account)
	l := m.s.listing(t, host, `{"unit_price":600,"capacity":2}`)
	o = m.order(t, l.ListingID, "debian-13", "web", 2, "")
	vm0, vm1 = "vm-"+o.OrderID+"-0", "vm-"+o.OrderID+"-1"
	m.kube.setVMStatus("", vm0, "Running")
	m.kube.setVMStatus("", vm1, "Running")
	m.pay(t, o.OrderID, eventID)
	m.waitPower(t, o.OrderID, vm0, vm1, replicaRunning, replicaRunning)
	return m, o, vm0, vm1, host
}

// waitPower waits (bounded) until the buyer's status shows order id
// active with its two replicas vm0 and vm1 as r0 and r1.
func (m *kubeMarket) waitPower(t *testing.T, id, vm0, vm1 string, r0, r1 replicaStatus) {
	t.Helper()
	r0.Name, r1.Name = vm0, vm1
	m.waitMachine(t, m.s.token, id, "active", []replicaStatus{r0, r1})
}
