package provisioner

import (
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// TestReplicaState: every printable status and DataVolume phase the
// mapping names, and values it does not know.
func TestReplicaState(t *testing.T) {
	vm := func(s kubevirtv1.VirtualMachinePrintableStatus) *kubevirtv1.VirtualMachine {
		v := &kubevirtv1.VirtualMachine{}
		v.Status.PrintableStatus = s
		return v
	}
	dv := func(p cdiv1.DataVolumePhase, progress string) *cdiv1.DataVolume {
		d := &cdiv1.DataVolume{}
		d.Status.Phase, d.Status.Progress = p, cdiv1.DataVolumeProgress(progress)
		return d
	}
	succeeded := dv(cdiv1.Succeeded, "100.0%")
	tests := []struct {
		name string
		vm   *kubevirtv1.VirtualMachine
		dv   *cdiv1.DataVolume
		want observed
	}{
		{"no VM yet", nil, nil, observed{"starting", "", ""}},
		{"no VM yet, DataVolume failed", nil, dv(cdiv1.Failed, ""), observed{"starting", "", ""}},

		{"Running", vm("Running"), succeeded, observed{"running", "Running", ""}},
		{"Paused", vm("Paused"), succeeded, observed{"paused", "Paused", ""}},
		{"Stopped", vm("Stopped"), succeeded, observed{"stopped", "Stopped", ""}},
		{"Stopping", vm("Stopping"), succeeded, observed{"stopped", "Stopping", ""}},
		{"Terminating", vm("Terminating"), succeeded, observed{"stopped", "Terminating", ""}},

		{"ErrorUnschedulable", vm("ErrorUnschedulable"), nil, observed{"failed", "ErrorUnschedulable", ""}},
		{"ErrImagePull", vm("ErrImagePull"), nil, observed{"failed", "ErrImagePull", ""}},
		{"ImagePullBackOff", vm("ImagePullBackOff"), nil, observed{"failed", "ImagePullBackOff", ""}},
		{"CrashLoopBackOff", vm("CrashLoopBackOff"), succeeded, observed{"failed", "CrashLoopBackOff", ""}},
		{"ErrorPvcNotFound", vm("ErrorPvcNotFound"), nil, observed{"failed", "ErrorPvcNotFound", ""}},
		{"ErrorDataVolumeNotFound", vm("ErrorDataVolumeNotFound"), nil, observed{"failed", "ErrorDataVolumeNotFound", ""}},
		{"DataVolumeError", vm("DataVolumeError"), dv(cdiv1.ImportInProgress, "3%"), observed{"failed", "DataVolumeError", ""}},
		// What KubeVirt's virt-controller reports once CDI failed the import
		// for good: the DataVolume's failure is the cause (a refund's).
		{"DataVolumeError, DataVolume Failed", vm("DataVolumeError"), dv(cdiv1.Failed, ""), observed{"failed", "DataVolumeFailed", ""}},

		{"Starting", vm("Starting"), succeeded, observed{"starting", "Starting", ""}},
		{"Provisioning", vm("Provisioning"), nil, observed{"starting", "Provisioning", ""}},
		{"WaitingForVolumeBinding", vm("WaitingForVolumeBinding"), dv(cdiv1.WaitForFirstConsumer, ""), observed{"starting", "WaitingForVolumeBinding", ""}},
		{"Migrating", vm("Migrating"), succeeded, observed{"starting", "Migrating", ""}},
		{"empty status", vm(""), nil, observed{"starting", "", ""}},
		{"empty status, DataVolume pending", vm(""), dv(cdiv1.Pending, ""), observed{"starting", "Pending", ""}},

		// While the VM waits, the DataVolume says more.
		{"Provisioning, ImportScheduled", vm("Provisioning"), dv(cdiv1.ImportScheduled, "N/A"), observed{"importing", "ImportScheduled", "N/A"}},
		{"Provisioning, ImportInProgress", vm("Provisioning"), dv(cdiv1.ImportInProgress, "42.50%"), observed{"importing", "ImportInProgress", "42.50%"}},
		{"Starting, ImportInProgress", vm("Starting"), dv(cdiv1.ImportInProgress, "7.00%"), observed{"importing", "ImportInProgress", "7.00%"}},
		{"WaitingForVolumeBinding, CloneInProgress", vm("WaitingForVolumeBinding"), dv(cdiv1.CloneInProgress, "10%"), observed{"importing", "CloneInProgress", "10%"}},
		{"Migrating, ImportInProgress", vm("Migrating"), dv(cdiv1.ImportInProgress, "1%"), observed{"importing", "ImportInProgress", "1%"}},
		{"empty status, ImportInProgress", vm(""), dv(cdiv1.ImportInProgress, "0.00%"), observed{"importing", "ImportInProgress", "0.00%"}},
		{"Provisioning, DataVolume Failed", vm("Provisioning"), dv(cdiv1.Failed, "12%"), observed{"failed", "DataVolumeFailed", ""}},
		{"empty status, DataVolume Failed", vm(""), dv(cdiv1.Failed, ""), observed{"failed", "DataVolumeFailed", ""}},
		// A running VM's import is over, whatever the DataVolume says.
		{"Running, ImportInProgress", vm("Running"), dv(cdiv1.ImportInProgress, "99%"), observed{"running", "Running", ""}},

		// Values this mapping does not know: starting, with the value.
		{"unknown status", vm("WaitingForReceiver"), nil, observed{"starting", "WaitingForReceiver", ""}},
		{"Unknown", vm("Unknown"), succeeded, observed{"starting", "Unknown", ""}},
		{"future status", vm("SomethingNew"), nil, observed{"starting", "SomethingNew", ""}},
		{"unknown status, importing", vm("SomethingNew"), dv(cdiv1.ImportInProgress, "5%"), observed{"importing", "ImportInProgress", "5%"}},
		{"unknown phase", vm("Provisioning"), dv("SomethingNew", "5%"), observed{"starting", "Provisioning", ""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := replicaState(tc.vm, tc.dv, nil); got != tc.want {
				t.Errorf("replicaState = %+v, want %+v", got, tc.want)
			}
		})
	}
	// An installation ISO: its blank disk is ready at once, and the ISO's
	// import is what the replica waits for; the disk speaks first.
	blank := dv(cdiv1.Succeeded, "")
	for _, tc := range []struct {
		name      string
		vm        *kubevirtv1.VirtualMachine
		disk, iso *cdiv1.DataVolume
		want      observed
	}{
		{"ISO importing", vm("Provisioning"), blank, dv(cdiv1.ImportInProgress, "31.00%"), observed{"importing", "ImportInProgress", "31.00%"}},
		{"ISO scheduled, no status yet", vm(""), blank, dv(cdiv1.ImportScheduled, ""), observed{"importing", "ImportScheduled", ""}},
		{"ISO failed", vm("Provisioning"), blank, dv(cdiv1.Failed, ""), observed{"failed", "DataVolumeFailed", ""}},
		{"disk failed, ISO importing", vm("Provisioning"), dv(cdiv1.Failed, ""), dv(cdiv1.ImportInProgress, "5%"), observed{"failed", "DataVolumeFailed", ""}},
		{"disk pending, ISO importing", vm("Provisioning"), dv(cdiv1.Pending, ""), dv(cdiv1.ImportInProgress, "5%"), observed{"importing", "ImportInProgress", "5%"}},
		{"ISO imported, starting", vm("Starting"), blank, succeeded, observed{"starting", "Starting", ""}},
		{"ISO gone, empty status", vm(""), blank, nil, observed{"starting", "Succeeded", ""}},
		{"running", vm("Running"), blank, dv(cdiv1.ImportInProgress, "99%"), observed{"running", "Running", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := replicaState(tc.vm, tc.disk, tc.iso); got != tc.want {
				t.Errorf("replicaState = %+v, want %+v", got, tc.want)
			}
		})
	}
	// Every status of the mapping's table is in the test's.
	tested := map[kubevirtv1.VirtualMachinePrintableStatus]bool{}
	for _, tc := range tests {
		if tc.vm != nil {
			tested[tc.vm.Status.PrintableStatus] = true
		}
	}
	for s := range vmStates {
		if !tested[s] {
			t.Errorf("printable status %q is mapped but not tested", s)
		}
	}
}
