package main

import (
	"strings"
	"testing"
	"time"
)

// TestPagePower: the buyer's Machines page, in Chromium, stops, starts and
// restarts the machines of a running order through the binary and the
// stand-in cluster's power subresources: a running replica offers Stop and
// Restart, a stopped one Start, the order Stop all and Start all; each
// press says in words what became of each machine (one stopped already,
// a cluster that does not take the action), and the card shows the new
// states once the provisioner has read them.
func TestPagePower(t *testing.T) {
	t.Parallel()
	browserDir(t)
	m, o, vm0, vm1, _ := startPowerMarket(t, "acct_e2ePagePower", "evt_page_power")
	s, kube := m.s, m.kube
	wait := func(r0, r1 replicaStatus) action {
		return func([]byte) any {
			m.waitPower(t, o.OrderID, vm0, vm1, r0, r1)
			return map[string]string{}
		}
	}
	pr := startPage(t, "power", 2*time.Minute, map[string]string{
		"PAGE_URL": s.ctlBase + "/machines", "PAGE_TOKEN": s.token,
		"PAGE_ORDER": o.OrderID, "PAGE_VM0": vm0, "PAGE_VM1": vm1,
	}, map[string]action{
		"oneStopped": wait(replicaRunning, replicaStopped),
		"allStopped": wait(replicaStopped, replicaStopped),
		"allRunning": wait(replicaRunning, replicaRunning),
		"breakCluster": func([]byte) any {
			kube.failPower()
			return map[string]string{}
		},
	})
	pr.extra = s.logs
	var rep struct {
		commonReport
		Running struct {
			VM0   []string `json:"vm0"`
			VM1   []string `json:"vm1"`
			Order []string `json:"order"`
		} `json:"running"`
		StopOne    string `json:"stopOne"`
		OneStopped struct {
			VM0 []string `json:"vm0"`
			VM1 []string `json:"vm1"`
		} `json:"oneStopped"`
		StopAll  string `json:"stopAll"`
		StartAll string `json:"startAll"`
		Restart  string `json:"restart"`
		Refused  string `json:"refused"`
	}
	pr.wait(&rep)

	if strings.Join(rep.Running.VM0, ",") != "Stop,Restart" || strings.Join(rep.Running.VM1, ",") != "Stop,Restart" ||
		strings.Join(rep.Running.Order, ",") != "Stop all,Start all" {
		t.Errorf("running, the card offers %+v; want Stop and Restart on each replica, Stop all and Start all on the order", rep.Running)
	}
	if strings.Join(rep.OneStopped.VM1, ",") != "Start" || strings.Join(rep.OneStopped.VM0, ",") != "Stop,Restart" {
		t.Errorf("with replica 1 stopped the card offers %+v; want Start on it, Stop and Restart on replica 0", rep.OneStopped)
	}
	for name, tc := range map[string]struct{ got, want string }{
		"stop of replica 1":              {rep.StopOne, "Stopped: " + vm1 + ". It takes a moment to show."},
		"stop all":                       {rep.StopAll, "Stopped: " + vm0 + ". It takes a moment to show. Not stopped: " + vm1 + ": The machine is stopped already."},
		"start all":                      {rep.StartAll, "Started: " + vm0 + ", " + vm1 + ". It takes a moment to show."},
		"restart":                        {rep.Restart, "Restarted: " + vm0 + ". It takes a moment to show."},
		"a cluster that does not answer": {rep.Refused, "Stop of " + vm0 + " was not done: The cluster did not take the action; nothing changed. Try again in a minute."},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: the page says %q, want %q", name, tc.got, tc.want)
		}
	}
	if n0, n1 := kube.restartsOf(vm0), kube.restartsOf(vm1); n0 != 1 || n1 != 0 {
		t.Errorf("restarts: %s %d, %s %d; want 1 and 0", vm0, n0, vm1, n1)
	}
}
