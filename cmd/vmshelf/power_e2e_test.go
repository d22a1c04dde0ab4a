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
	const account = "acct_e2ePowerHost"
	m := startKubeMarket(t, account)
	s, kube := m.s, m.kube
	host := addHost(t, s, "host", account)
	code, body := s.ctl(t, "/market/vms/listings", host, `{"unit_price":600,"capacity":5}`)
	if code != http.StatusCreated {
		t.Fatalf("listing: %d %s", code, body)
	}
	var l listingAnswer
	decode(t, body, &l)
	o := m.order(t, l.ListingID, "debian-13", "web", 2, "")
	vm0, vm1 := "vm-"+o.OrderID+"-0", "vm-"+o.OrderID+"-1"
	kube.setVMStatus("", vm0, "Running")
	kube.setVMStatus("", vm1, "Running")
	m.pay(t, o.OrderID, "evt_e2e_power")
	running := replicaStatus{State: "running", Detail: "Running"}
	stopped := replicaStatus{State: "stopped", Detail: "Stopped"}
	named := func(name string, r replicaStatus) replicaStatus { r.Name = name; return r }
	m.waitMachine(t, s.token, o.OrderID, "active", []replicaStatus{named(vm0, running), named(vm1, running)})

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
	m.waitMachine(t, s.token, o.OrderID, "active", []replicaStatus{named(vm0, running), named(vm1, stopped)})

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
	m.waitMachine(t, s.token, o.OrderID, "active", []replicaStatus{named(vm0, running), named(vm1, running)})
	if r := run("restart", o.OrderID+"/0"); r.code != 0 || r.stdout != "restarted "+vm0+"\n" {
		t.Fatalf("orders restart ORDER/0: exit %d, stdout %q; stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if n0, n1 := kube.restartsOf(vm0), kube.restartsOf(vm1); n0 != 1 || n1 != 0 {
		t.Errorf("restarts: %s %d, %s %d; want 1 and 0", vm0, n0, vm1, n1)
	}

	code, body = s.ctl(t, "/market/vms/orders/power", host, `{"order_id":"`+o.OrderID+`","action":"stop"}`)
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
