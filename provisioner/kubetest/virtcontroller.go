package kubetest

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sfield "k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"
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

// startVirtController registers the CRDs virt-controller watches beyond
// the judge's, marks the kit's KubeVirt CR deployed and runs KubeVirt's VM
// and VMI controllers until ctx ends; it returns their cluster config.
func startVirtController(t TB, ctx context.Context, js *judgeServer) *virtconfig.ClusterConfig {
	t.Helper()
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, newCRD := range virtControllerCRDs {
		crd, err := newCRD()
		if err != nil {
			t.Fatalf("KubeVirt %s's CRD generator: %v", kubeVirtLinked, err)
		}
		crds = append(crds, crd)
	}
	registerCRDs(t, js.srv.Admin, crds)
	deployKubeVirt(t, ctx, js)
	return runVirtController(t, ctx, js.srv.Admin)
}

// deployKubeVirt gives the kit's KubeVirt CR the phase virt-operator gives
// it once KubeVirt is deployed: virt-controller's cluster config reads the
// CR's configuration only then.
func deployKubeVirt(t TB, ctx context.Context, js *judgeServer) {
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

// kubevirtClusterConfig is KubeVirt's cluster config as virt-controller
// builds it: from the CRD and KubeVirt CR informers of f, synced first.
func kubevirtClusterConfig(t TB, ctx context.Context, f controller.KubeInformerFactory, ns string) *virtconfig.ClusterConfig {
	t.Helper()
	crdInformer, kvInformer := f.CRD(), f.KubeVirt()
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), crdInformer.HasSynced, kvInformer.HasSynced) {
		t.Fatal("CRD and KubeVirt informers did not sync")
	}
	clusterConfig, err := virtconfig.NewClusterConfig(crdInformer, kvInformer, ns)
	if err != nil {
		t.Fatal(err)
	}
	if !clusterConfig.HasDataVolumeAPI() {
		t.Fatal("KubeVirt's cluster config sees no DataVolume API")
	}
	return clusterConfig
}

// runVirtController starts KubeVirt's VM and VMI controllers against cfg
// until ctx ends, with informers from KubeVirt's own informer factory and
// the cluster config from the KubeVirt CR, as virt-controller's
// application.go does (less leader election, certificates, metrics and
// the other dozen controllers). CDIConfig, DataSource and StorageProfile
// have no CRD here: KubeVirt's own dummy informers stand in, as when CDI
// is absent. It returns the cluster config, which virt-handler reads too.
func runVirtController(t TB, ctx context.Context, cfg *rest.Config) *virtconfig.ClusterConfig {
	t.Helper()
	client, err := kubecli.GetKubevirtClientFromRESTConfig(rest.CopyConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	const kubevirtNamespace = probeNamespace // the kit's KubeVirt CR lives there
	f := controller.NewKubeInformerFactory(client.RestClient(), client, nil, kubevirtNamespace)
	clusterConfig := kubevirtClusterConfig(t, ctx, f, kubevirtNamespace)
	kvInformer := f.KubeVirt()

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
