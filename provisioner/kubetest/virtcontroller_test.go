package kubetest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/internal/testkit/fakeclock"
	"github.com/vmshelf/vmshelf/provisioner"
)

// TestVirtControllerRunsOurVM: KubeVirt v1.8.0's own virt-controller code —
// its VM controller (VirtualMachine → VirtualMachineInstance) and its VMI
// controller (VirtualMachineInstance → virt-launcher pod, rendered by its
// TemplateService), wired as pkg/virt-controller/watch/application.go
// wires them — runs against the API server and turns every VM the
// provisioner writes into a VMI and a launcher pod that carries the
// appliance's node selector, the compute-window toleration and the disk.
// The pods stay Pending: there are no nodes and no scheduler.
func TestVirtControllerRunsOurVM(t *testing.T) {
	start := time.Now()
	js := startJudge(t, judges[0])
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	startVirtController(t, ctx, js)

	clk := fakeclock.NewStill(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	m := newJudgeMarket(t, ctx, clk.Now(), 0)
	cluster, err := provisioner.ClusterFromConfig(js.srv.AsServiceAccount(vmshelfNamespace, vmshelfSA))
	if err != nil {
		t.Fatal(err)
	}
	p, err := provisioner.New(provisioner.Config{
		CPU: 2, MemoryMiB: 1024, DiskGiB: 20, StorageClass: vmStorageClass, FetchBase: testFetchBase,
		Catalogue: catalogue.Builtin(), ConsoleAvailable: true, Every: 30 * time.Second, Now: clk.Now, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, m.st, cluster, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ReconcileOnce(ctx); err != nil {
		t.Fatalf("ReconcileOnce: %v", err)
	}
	ns := fmt.Sprintf("market-%d", m.buyer.ID)
	admin, err := kubecli.GetKubevirtClientFromRESTConfig(rest.CopyConfig(js.srv.Admin))
	if err != nil {
		t.Fatal(err)
	}

	// Wait (bounded) for a launcher pod of every replica, playing CDI on
	// the way: each DataVolume that appears gets its PVC, bound, and the
	// phase Succeeded, which is what KubeVirt waits for before it starts
	// a VM on it.
	var pods []corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		// A conflict is KubeVirt writing the same object meanwhile: the
		// next round reads it again.
		if err := playCDI(ctx, js, admin, ns); err != nil && !apierrors.IsConflict(err) {
			return false, err
		}
		l, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kubevirtv1.AppLabel + "=virt-launcher"})
		if err != nil {
			return false, err
		}
		pods = l.Items
		return len(pods) == m.replicas(), nil
	})
	if err != nil {
		vmis, _ := js.dyn.Resource(kubevirtv1.VirtualMachineInstanceGroupVersionKind.GroupVersion().WithResource("virtualmachineinstances")).
			Namespace(ns).List(context.Background(), metav1.ListOptions{})
		n := 0
		if vmis != nil {
			n = len(vmis.Items)
		}
		t.Fatalf("%d launcher pods, %d VMIs, want %d of each: %v", len(pods), n, m.replicas(), err)
	}
	t.Logf("%d launcher pods %s after the server started", len(pods), time.Since(start).Round(time.Millisecond))

	for _, o := range m.orders {
		for i := range o.Quantity {
			name := fmt.Sprintf("vm-%s-%d", o.ID, i)
			vmiU, err := js.dyn.Resource(kubevirtv1.VirtualMachineInstanceGroupVersionKind.GroupVersion().WithResource("virtualmachineinstances")).
				Namespace(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Errorf("%s's VMI: %v", name, err)
				continue
			}
			var vmiObj kubevirtv1.VirtualMachineInstance
			if err := fromUnstructured(vmiU, &vmiObj); err != nil {
				t.Fatal(err)
			}
			pod := launcherOf(pods, vmiObj.UID)
			if pod == nil {
				t.Errorf("%s: no launcher pod owned by its VMI", name)
				continue
			}
			checkLauncher(t, name, pod, vmiObj)
		}
	}
}

// checkLauncher: the pod KubeVirt made for vmi will only land on the
// host's box (node selector), through its compute window (toleration),
// with the replica's disk as a PVC volume.
func checkLauncher(t *testing.T, name string, pod *corev1.Pod, vmiObj kubevirtv1.VirtualMachineInstance) {
	t.Helper()
	if got := pod.Spec.NodeSelector["losos.dev/appliance"]; got != testAppliance {
		t.Errorf("%s: launcher %s node selector %v, want losos.dev/appliance=%s", name, pod.Name, pod.Spec.NodeSelector, testAppliance)
	}
	tolerates := false
	for _, tol := range pod.Spec.Tolerations {
		if tol.Key == "losos.dev/compute-window" && tol.Operator == corev1.TolerationOpExists && tol.Effect == "" {
			tolerates = true
		}
	}
	if !tolerates {
		t.Errorf("%s: launcher %s tolerations %+v, want losos.dev/compute-window Exists", name, pod.Name, pod.Spec.Tolerations)
	}
	var disk string
	for _, v := range vmiObj.Spec.Volumes {
		if v.DataVolume != nil {
			disk = v.DataVolume.Name
		}
	}
	if disk == "" {
		t.Fatalf("%s: VMI volumes %+v, want a DataVolume", name, vmiObj.Spec.Volumes)
	}
	hasDisk := false
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == disk {
			hasDisk = true
		}
	}
	if !hasDisk {
		t.Errorf("%s: launcher %s volumes %+v, want the PVC %s", name, pod.Name, pod.Spec.Volumes, disk)
	}
	if pod.Status.Phase != corev1.PodPending {
		t.Errorf("%s: launcher %s phase %s, want Pending (no nodes)", name, pod.Name, pod.Status.Phase)
	}
}

func launcherOf(pods []corev1.Pod, vmiUID types.UID) *corev1.Pod {
	for i := range pods {
		for _, ref := range pods[i].OwnerReferences {
			if ref.Kind == "VirtualMachineInstance" && ref.UID == vmiUID {
				return &pods[i]
			}
		}
	}
	return nil
}

// playCDI does what CDI would for each DataVolume in ns not yet done
// (whoever wrote it: KubeVirt's VM controller from a VM's
// dataVolumeTemplates, or the provisioner for a standalone disk): a
// PVC of the DataVolume's name, owned by it and bound, and the
// DataVolume's phase Succeeded. (No CDI runs here: its main module is not
// served by the Go module proxy, and there is nothing to import from.)
func playCDI(ctx context.Context, js *judgeServer, admin kubecli.KubevirtClient, ns string) error {
	dvs := js.dyn.Resource(dvGVR).Namespace(ns)
	l, err := dvs.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list DataVolumes: %w", err)
	}
	for i := range l.Items {
		u := &l.Items[i]
		var dv cdiv1beta1.DataVolume
		if err := fromUnstructured(u, &dv); err != nil {
			return err
		}
		if dv.Status.Phase == cdiv1beta1.Succeeded {
			continue
		}
		var size corev1.ResourceList
		var class *string
		if dv.Spec.Storage != nil {
			size, class = dv.Spec.Storage.Resources.Requests, dv.Spec.Storage.StorageClassName
		}
		yes := true
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: dv.Name, Namespace: ns, OwnerReferences: []metav1.OwnerReference{{
				APIVersion: cdiv1beta1.SchemeGroupVersion.String(), Kind: "DataVolume", Name: dv.Name, UID: dv.UID, Controller: &yes}}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: class,
				Resources:        corev1.VolumeResourceRequirements{Requests: size},
				VolumeName:       "pv-" + dv.Name,
			},
		}
		got, err := admin.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			got, err = admin.CoreV1().PersistentVolumeClaims(ns).Get(ctx, dv.Name, metav1.GetOptions{})
		}
		if err != nil {
			return fmt.Errorf("PVC %s: %w", dv.Name, err)
		}
		got.Status.Phase = corev1.ClaimBound
		got.Status.AccessModes = got.Spec.AccessModes
		got.Status.Capacity = size
		if _, err := admin.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("PVC %s bound: %w", dv.Name, err)
		}
		if err := unstructured.SetNestedMap(u.Object, map[string]any{
			"phase": string(cdiv1beta1.Succeeded), "progress": "100.0%", "claimName": dv.Name,
		}, "status"); err != nil {
			return err
		}
		if _, err := dvs.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("DataVolume %s Succeeded: %w", dv.Name, err)
		}
	}
	return nil
}
