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
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	k8sfield "k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"kubevirt.io/kubevirt/pkg/controller"
	"kubevirt.io/kubevirt/pkg/hooks"
	instancetypecontroller "kubevirt.io/kubevirt/pkg/instancetype/controller/vm"
	netadmitter "kubevirt.io/kubevirt/pkg/network/admitter"
	netcontrollers "kubevirt.io/kubevirt/pkg/network/controllers"
	netmigration "kubevirt.io/kubevirt/pkg/network/migration"
	"kubevirt.io/kubevirt/pkg/network/netbinding"
	netannotations "kubevirt.io/kubevirt/pkg/network/pod/annotations"
	netresources "kubevirt.io/kubevirt/pkg/network/resources"
	storageannotations "kubevirt.io/kubevirt/pkg/storage/pod/annotations"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	"kubevirt.io/kubevirt/pkg/virt-controller/services"
	"kubevirt.io/kubevirt/pkg/virt-controller/watch/topology"
	"kubevirt.io/kubevirt/pkg/virt-controller/watch/vm"
	"kubevirt.io/kubevirt/pkg/virt-controller/watch/vmi"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"

	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/provisioner"
)

// virtControllerCRDs are the KubeVirt CRDs that virt-controller's VM and
// VMI controllers watch beyond those the judges register (migrations,
// instancetypes and preferences): without them their informers never sync
// and the controllers never start.
var virtControllerCRDs = []func() (*apiextensionsv1.CustomResourceDefinition, error){
	components.NewVirtualMachineInstanceMigrationCrd,
	components.NewVirtualMachineInstancetypeCrd,
	components.NewVirtualMachineClusterInstancetypeCrd,
	components.NewVirtualMachinePreferenceCrd,
	components.NewVirtualMachineClusterPreferenceCrd,
	components.NewMigrationPolicyCrd,
}

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
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, newCRD := range virtControllerCRDs {
		crd, err := newCRD()
		if err != nil {
			t.Fatalf("KubeVirt %s's CRD generator: %v", kubeVirtLinked, err)
		}
		crds = append(crds, crd)
	}
	registerCRDs(t, js.srv.Admin, crds)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	deployKubeVirt(t, ctx, js)
	runVirtController(t, ctx, js.srv.Admin)

	clk := &clock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
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

// deployKubeVirt gives the kit's KubeVirt CR the phase virt-operator gives
// it once KubeVirt is deployed: virt-controller's cluster config reads the
// CR's configuration only then.
func deployKubeVirt(t *testing.T, ctx context.Context, js *judgeServer) {
	t.Helper()
	kvs := js.dyn.Resource(kubevirtv1.KubeVirtGroupVersionKind.GroupVersion().WithResource("kubevirts")).Namespace(probeNamespace)
	kv, err := kvs.Get(ctx, "kubevirt", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the kit's KubeVirt CR: %v", err)
	}
	if err := unstructured.SetNestedField(kv.Object, string(kubevirtv1.KubeVirtPhaseDeployed), "status", "phase"); err != nil {
		t.Fatal(err)
	}
	if _, err := kvs.UpdateStatus(ctx, kv, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("KubeVirt CR status: %v", err)
	}
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

// runVirtController starts KubeVirt's VM and VMI controllers against cfg
// until ctx ends, with informers from KubeVirt's own informer factory and
// the cluster config from the KubeVirt CR, as virt-controller's
// application.go does (less leader election, certificates, metrics and
// the other dozen controllers). CDIConfig, DataSource and StorageProfile
// have no CRD here: KubeVirt's own dummy informers stand in, as when CDI
// is absent. It returns the cluster config, which virt-handler reads too.
func runVirtController(t *testing.T, ctx context.Context, cfg *rest.Config) *virtconfig.ClusterConfig {
	t.Helper()
	client, err := kubecli.GetKubevirtClientFromRESTConfig(rest.CopyConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	const kubevirtNamespace = probeNamespace // the kit's KubeVirt CR lives there
	f := controller.NewKubeInformerFactory(client.RestClient(), client, nil, kubevirtNamespace)
	crdInformer, kvInformer := f.CRD(), f.KubeVirt()
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), crdInformer.HasSynced, kvInformer.HasSynced) {
		t.Fatal("CRD and KubeVirt informers did not sync")
	}
	clusterConfig, err := virtconfig.NewClusterConfig(crdInformer, kvInformer, kubevirtNamespace)
	if err != nil {
		t.Fatal(err)
	}
	if !clusterConfig.HasDataVolumeAPI() {
		t.Fatal("KubeVirt's cluster config sees no DataVolume API")
	}

	vmiInformer, vmInformer := f.VMI(), f.VirtualMachine()
	podInformer, nodeInformer := f.KubeVirtPod(), f.KubeVirtNode()
	namespaceInformer, pvcInformer := f.Namespace(), f.PersistentVolumeClaim()
	migrationInformer, crInformer := f.VirtualMachineInstanceMigration(), f.ControllerRevision()
	storageClassInformer, quotaInformer := f.StorageClass(), f.ResourceQuota()
	dvInformer, cdiInformer := f.DataVolume(), f.CDI()
	cdiConfigInformer, dataSourceInformer, storageProfileInformer := f.DummyCDIConfig(), f.DummyDataSource(), f.DummyStorageProfile()
	instancetypes, clusterInstancetypes := f.VirtualMachineInstancetype(), f.VirtualMachineClusterInstancetype()
	preferences, clusterPreferences := f.VirtualMachinePreference(), f.VirtualMachineClusterPreference()

	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events(corev1.NamespaceAll)})
	t.Cleanup(broadcaster.Shutdown)
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "virt-controller"})

	netAnnotationsGenerator := netannotations.NewGenerator(clusterConfig)
	templateService := services.NewTemplateService("quay.io/kubevirt/virt-launcher:"+kubeVirtLinked,
		240, "/var/run/kubevirt", "/var/run/kubevirt-ephemeral-disks", "/var/run/kubevirt/container-disks",
		"/var/run/kubevirt/hotplug-disks", "", pvcInformer.GetStore(), client, clusterConfig, 107,
		"quay.io/kubevirt/virt-exportserver:"+kubeVirtLinked, quotaInformer.GetStore(), namespaceInformer.GetStore(),
		services.WithSidecarCreator(func(v *kubevirtv1.VirtualMachineInstance, _ *kubevirtv1.KubeVirtConfiguration) (hooks.HookSidecarList, error) {
			return hooks.UnmarshalHookSidecarList(v)
		}),
		services.WithSidecarCreator(netbinding.NetBindingPluginSidecarList),
		services.WithNetMemoryCalculator(netresources.MemoryCalculator{}),
		services.WithAnnotationsGenerators(netAnnotationsGenerator, storageannotations.Generator{}),
		services.WithNetTargetAnnotationsGenerator(netAnnotationsGenerator),
	)
	vmiController, err := vmi.NewController(templateService, vmiInformer, vmInformer, podInformer, pvcInformer,
		migrationInformer, storageClassInformer, recorder, client, dvInformer, storageProfileInformer, cdiInformer,
		cdiConfigInformer, kvInformer, clusterConfig,
		topology.NewTopologyHinter(nodeInformer.GetStore(), vmiInformer.GetStore(), clusterConfig),
		netAnnotationsGenerator, storageannotations.NewGenerator(clusterConfig), netcontrollers.UpdateVMIStatus,
		func(field *k8sfield.Path, spec *kubevirtv1.VirtualMachineInstanceSpec, c *virtconfig.ClusterConfig) []metav1.StatusCause {
			return netadmitter.ValidateCreation(field, spec, c)
		},
		netmigration.NewEvaluator(clusterConfig), nil, nil)
	if err != nil {
		t.Fatalf("KubeVirt's VMI controller: %v", err)
	}
	vmController, err := vm.NewController(vmiInformer, vmInformer, dvInformer, dataSourceInformer, kvInformer,
		namespaceInformer, pvcInformer, crInformer, recorder, client, clusterConfig,
		netcontrollers.NewVMController(client.GeneratedKubeVirtClient(), clusterConfig),
		vm.NewFirmwareController(client.GeneratedKubeVirtClient()),
		instancetypecontroller.New(instancetypes.GetStore(), clusterInstancetypes.GetStore(), preferences.GetStore(),
			clusterPreferences.GetStore(), crInformer.GetStore(), client, clusterConfig, recorder),
		nil, nil)
	if err != nil {
		t.Fatalf("KubeVirt's VM controller: %v", err)
	}
	f.Start(ctx.Done())
	done := make(chan struct{}, 2)
	go func() { vmiController.Run(2, ctx.Done()); done <- struct{}{} }()
	go func() { vmController.Run(2, ctx.Done()); done <- struct{}{} }()
	// Each Run returns once ctx ends; the test waits for both so that no
	// controller still writes to a server being torn down.
	t.Cleanup(func() {
		<-ctx.Done()
		<-done
		<-done
	})
	return clusterConfig
}
