package provisioner

import (
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/imagestore"
)

// The replica state mapping: a VirtualMachine's status.printableStatus,
// and while it waits its DataVolume's phase, to the machines page's six
// words. A value KubeVirt or CDI adds later is "starting" with the value as
// the detail, never a crash and never a guess of failure.

// vmStates are the printable statuses that decide by themselves.
var vmStates = map[kubevirtv1.VirtualMachinePrintableStatus]string{
	kubevirtv1.VirtualMachineStatusRunning:                 imagestore.ReplicaRunning,
	kubevirtv1.VirtualMachineStatusPaused:                  imagestore.ReplicaPaused,
	kubevirtv1.VirtualMachineStatusStopped:                 imagestore.ReplicaStopped,
	kubevirtv1.VirtualMachineStatusStopping:                imagestore.ReplicaStopped,
	kubevirtv1.VirtualMachineStatusTerminating:             imagestore.ReplicaStopped,
	kubevirtv1.VirtualMachineStatusUnschedulable:           imagestore.ReplicaFailed,
	kubevirtv1.VirtualMachineStatusErrImagePull:            imagestore.ReplicaFailed,
	kubevirtv1.VirtualMachineStatusImagePullBackOff:        imagestore.ReplicaFailed,
	kubevirtv1.VirtualMachineStatusCrashLoopBackOff:        imagestore.ReplicaFailed,
	kubevirtv1.VirtualMachineStatusPvcNotFound:             imagestore.ReplicaFailed,
	"ErrorDataVolumeNotFound":                              imagestore.ReplicaFailed, // KubeVirt's, without a constant
	kubevirtv1.VirtualMachineStatusDataVolumeError:         imagestore.ReplicaFailed,
	kubevirtv1.VirtualMachineStatusStarting:                imagestore.ReplicaStarting,
	kubevirtv1.VirtualMachineStatusProvisioning:            imagestore.ReplicaStarting,
	kubevirtv1.VirtualMachineStatusWaitingForVolumeBinding: imagestore.ReplicaStarting,
	kubevirtv1.VirtualMachineStatusMigrating:               imagestore.ReplicaStarting,
	"":                                                     imagestore.ReplicaStarting, // just created: KubeVirt has not looked yet
}

// importing are the DataVolume phases in which CDI copies the disk.
var importing = map[cdiv1.DataVolumePhase]bool{
	cdiv1.ImportScheduled:  true,
	cdiv1.ImportInProgress: true,
	cdiv1.CloneInProgress:  true,
}

// observed is one replica's state as read, before it gets its index,
// name and time.
type observed struct {
	state, detail, progress string
}

// replicaState maps a replica's VirtualMachine (nil: not found), its
// disk's DataVolume and, for an installation ISO, its CD-ROM's (nil: not
// found, or no CD-ROM) to its state. While the VM waits (starting, or a
// status unknown here) the DataVolumes say more: importing with CDI's
// progress, or failed. The disk speaks first; an ISO's disk is blank and
// ready at once, and the download of the ISO is what the buyer waits for.
// detailDiskFailed is a replica's detail when CDI failed its import.
const detailDiskFailed = "DataVolume" + string(cdiv1.Failed)

func replicaState(vm *kubevirtv1.VirtualMachine, disk, iso *cdiv1.DataVolume) observed {
	if vm == nil {
		return observed{state: imagestore.ReplicaStarting}
	}
	status := vm.Status.PrintableStatus
	state, known := vmStates[status]
	// KubeVirt reports the VM of a DataVolume CDI failed for good as
	// DataVolumeError: the disk's failure is the cause the market refunds.
	if state == imagestore.ReplicaFailed && diskFailed(disk, iso) {
		return observed{state: imagestore.ReplicaFailed, detail: detailDiskFailed}
	}
	if known && state != imagestore.ReplicaStarting {
		return observed{state: state, detail: string(status)}
	}
	for _, dv := range []*cdiv1.DataVolume{disk, iso} {
		if dv == nil {
			continue
		}
		switch phase := dv.Status.Phase; {
		case phase == cdiv1.Failed:
			return observed{state: imagestore.ReplicaFailed, detail: detailDiskFailed}
		case importing[phase]:
			return observed{state: imagestore.ReplicaImporting, detail: string(phase), progress: string(dv.Status.Progress)}
		}
	}
	detail := string(status)
	if detail == "" && disk != nil {
		detail = string(disk.Status.Phase)
	}
	return observed{state: imagestore.ReplicaStarting, detail: detail}
}

// diskFailed says whether CDI failed the import of either DataVolume.
func diskFailed(dvs ...*cdiv1.DataVolume) bool {
	for _, dv := range dvs {
		if dv != nil && dv.Status.Phase == cdiv1.Failed {
			return true
		}
	}
	return false
}
