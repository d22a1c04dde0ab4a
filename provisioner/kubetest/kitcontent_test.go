package kubetest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// What the kit promises, read from its typed objects: the rules the guide
// and the design state, so that an edit that breaks one fails here and
// names it.

// provisionerRights: group → resources, each with exactly these verbs.
var (
	provisionerVerbs     = []string{"create", "get", "list", "patch", "update", "watch"}
	provisionerResources = map[string][]string{
		"":                  {"namespaces", "secrets", "services"},
		"networking.k8s.io": {"ingresses"},
		"kubevirt.io":       {"virtualmachines"},
		"cdi.kubevirt.io":   {"datavolumes"},
	}
	// consoleResources are the consoles' subresources: get (the
	// WebSocket's upgrade) and nothing else.
	consoleVerbs     = []string{"get"}
	consoleResources = map[string][]string{
		"subresources.kubevirt.io": {"virtualmachineinstances/vnc", "virtualmachineinstances/console"},
	}
	// powerResources are a buyer's start, stop and restart: a PUT of the
	// subresource, which RBAC calls update, and nothing else.
	powerVerbs     = []string{"update"}
	powerResources = map[string][]string{
		"subresources.kubevirt.io": {"virtualmachines/start", "virtualmachines/stop", "virtualmachines/restart"},
	}
)

// kitFind returns the one object of type T named name in the kit.
func kitFind[T runtime.Object](t *testing.T, objs []kitObject, name string) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		v, ok := o.obj.(T)
		if !ok {
			continue
		}
		if m, ok := any(v).(interface{ GetName() string }); ok && m.GetName() == name {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("the kit has %d %T named %q, want 1", len(found), zero, name)
	}
	return found[0]
}

func TestKitRBAC(t *testing.T) {
	objs := loadKit(t)
	role := kitFind[*rbacv1.ClusterRole](t, objs, provisionerRole)
	if role.AggregationRule != nil {
		t.Errorf("ClusterRole %s aggregates other roles", provisionerRole)
	}
	got := map[string][]string{} // "group/resource" → verbs
	for _, r := range role.Rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %v: resourceNames/nonResourceURLs are not part of the design", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				key := g + "/" + res
				if _, dup := got[key]; dup {
					t.Errorf("%s appears in two rules", key)
				}
				verbs := slices.Clone(r.Verbs)
				slices.Sort(verbs)
				got[key] = verbs
			}
		}
	}
	want := map[string][]string{}
	for g, rs := range provisionerResources {
		for _, r := range rs {
			want[g+"/"+r] = provisionerVerbs
		}
	}
	for g, rs := range consoleResources {
		for _, r := range rs {
			want[g+"/"+r] = consoleVerbs
		}
	}
	for g, rs := range powerResources {
		for _, r := range rs {
			want[g+"/"+r] = powerVerbs
		}
	}
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			t.Errorf("%s: verbs %v, want exactly %v", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: not a kind the provisioner uses", k)
		}
	}

	crb := kitFind[*rbacv1.ClusterRoleBinding](t, objs, provisionerRole)
	if crb.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: provisionerRole}) {
		t.Errorf("binding's roleRef = %+v", crb.RoleRef)
	}
	if want := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: vmshelfSA, Namespace: vmshelfNamespace}}; !slices.Equal(crb.Subjects, want) {
		t.Errorf("binding's subjects = %+v, want %+v", crb.Subjects, want)
	}
	kitFind[*corev1.Namespace](t, objs, vmshelfNamespace)
	if sa := kitFind[*corev1.ServiceAccount](t, objs, vmshelfSA); sa.Namespace != vmshelfNamespace {
		t.Errorf("ServiceAccount %s in namespace %q", vmshelfSA, sa.Namespace)
	}
}

// args returns the value after flag in args ("--flag v" or "--flag=v").
func argValue(args []string, flag string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
		if a == flag && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

func tolerates(ts []corev1.Toleration, key string) bool {
	for _, tl := range ts {
		// Any effect: the design's toleration names no effect.
		if tl.Key == key && tl.Operator == corev1.TolerationOpExists && tl.Effect == "" {
			return true
		}
	}
	return false
}

func TestKitStorageClass(t *testing.T) {
	objs := loadKit(t)
	sc := kitFind[*storagev1.StorageClass](t, objs, vmStorageClass)
	if sc.ReclaimPolicy == nil || *sc.ReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		t.Errorf("reclaimPolicy %v, want Retain: a buyer's disk is never deleted", sc.ReclaimPolicy)
	}
	if sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		t.Errorf("volumeBindingMode %v, want WaitForFirstConsumer", sc.VolumeBindingMode)
	}
	if sc.Provisioner != localPathProvisioner {
		t.Errorf("provisioner %q, want %q", sc.Provisioner, localPathProvisioner)
	}

	// The provisioner Deployment serves that name, as its own ServiceAccount,
	// from its own ConfigMap: each named one exists in its namespace.
	dep := kitFind[*appsv1.Deployment](t, objs, localPathDeployment)
	c := dep.Spec.Template.Spec.Containers[0]
	if c.Image != localPathImage {
		t.Errorf("image %q, want %q", c.Image, localPathImage)
	}
	for flag, want := range map[string]string{
		"--provisioner-name":     localPathProvisioner,
		"--service-account-name": dep.Spec.Template.Spec.ServiceAccountName,
	} {
		if v, _ := argValue(c.Command, flag); v != want {
			t.Errorf("%s %q, want %q", flag, v, want)
		}
	}
	sa := kitFind[*corev1.ServiceAccount](t, objs, dep.Spec.Template.Spec.ServiceAccountName)
	cmName, _ := argValue(c.Command, "--configmap-name")
	cm := kitFind[*corev1.ConfigMap](t, objs, cmName)
	if sa.Namespace != dep.Namespace || cm.Namespace != dep.Namespace {
		t.Errorf("ServiceAccount in %q, ConfigMap in %q, Deployment in %q", sa.Namespace, cm.Namespace, dep.Namespace)
	}
	if dep.Namespace == "local-path-storage" || sa.Name == "local-path-provisioner-service-account" || cm.Name == "local-path-config" {
		t.Errorf("upstream's names in use (namespace %s, %s, %s): they would meet a cluster's own local-path", dep.Namespace, sa.Name, cm.Name)
	}
	if vol := dep.Spec.Template.Spec.Volumes; len(vol) != 1 || vol[0].ConfigMap == nil || vol[0].ConfigMap.Name != cm.Name {
		t.Errorf("config volume %+v, want ConfigMap %s", vol, cm.Name)
	}

	var cfg struct {
		NodePathMap []struct {
			Node  string   `json:"node"`
			Paths []string `json:"paths"`
		} `json:"nodePathMap"`
	}
	dec := json.NewDecoder(strings.NewReader(cm.Data["config.json"]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("config.json: %v", err)
	}
	if len(cfg.NodePathMap) != 1 || cfg.NodePathMap[0].Node != "DEFAULT_PATH_FOR_NON_LISTED_NODES" ||
		!slices.Equal(cfg.NodePathMap[0].Paths, []string{vmDiskPath}) {
		t.Errorf("nodePathMap %+v, want every node at %s", cfg.NodePathMap, vmDiskPath)
	}

	// The helper pod template is a Pod, strictly, that runs on a box in its
	// compute window; local-path reads its logs from the container
	// "helper-pod".
	pods, err := decodeStrict(kitScheme(t), "helperPod.yaml", strings.NewReader(cm.Data["helperPod.yaml"]))
	if err != nil || len(pods) != 1 {
		t.Fatalf("helperPod.yaml: %d objects, %v", len(pods), err)
	}
	pod, ok := pods[0].obj.(*corev1.Pod)
	if !ok {
		t.Fatalf("helperPod.yaml is a %s", pods[0].gvk.Kind)
	}
	if !tolerates(pod.Spec.Tolerations, computeWindowTaint) {
		t.Errorf("helper pod tolerations %+v lack %s", pod.Spec.Tolerations, computeWindowTaint)
	}
	if len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Name != "helper-pod" {
		t.Errorf("helper pod containers %+v, want one named helper-pod", pod.Spec.Containers)
	}
	for _, key := range []string{"setup", "teardown"} {
		if !strings.Contains(cm.Data[key], "$VOL_DIR") {
			t.Errorf("%s script does not use $VOL_DIR: %q", key, cm.Data[key])
		}
	}
}

func TestKitKubeVirtAndCDI(t *testing.T) {
	objs := loadKit(t)
	kv := kitFind[*kubevirtv1.KubeVirt](t, objs, "kubevirt")
	if kv.Namespace != "kubevirt" {
		t.Errorf("KubeVirt CR in namespace %q, want kubevirt (the operator's)", kv.Namespace)
	}
	for name, cc := range map[string]*kubevirtv1.ComponentConfig{"workloads": kv.Spec.Workloads, "infra": kv.Spec.Infra} {
		if cc == nil || cc.NodePlacement == nil || !tolerates(cc.NodePlacement.Tolerations, computeWindowTaint) {
			t.Errorf("KubeVirt spec.%s.nodePlacement does not tolerate %s: %+v", name, computeWindowTaint, cc)
		}
	}
	if dc := kv.Spec.Configuration.DeveloperConfiguration; dc != nil && dc.UseEmulation {
		t.Error("useEmulation is on as shipped: replicas would run in software on every box")
	}

	cdi := kitFind[*cdiv1beta1.CDI](t, objs, "cdi")
	if !tolerates(cdi.Spec.Workloads.Tolerations, computeWindowTaint) {
		t.Errorf("CDI spec.workload does not tolerate %s: %+v", computeWindowTaint, cdi.Spec.Workloads)
	}
	if cdi.Spec.Config == nil || !slices.Contains(cdi.Spec.Config.FeatureGates, "HonorWaitForFirstConsumer") {
		t.Error("CDI lacks HonorWaitForFirstConsumer: importers would pick a node before the replica has one")
	}
}

// TestKitVmshelf: vmshelf's single pod, with image hosting alone and with
// the market: one replica over one volume on the edge's own box, locked
// down, its probes and Services; the market's flags and Stripe's secrets
// from a Secret in the market only (TestKitHosting says what hosting
// lacks).
func TestKitVmshelf(t *testing.T) {
	for _, name := range []string{"hosting", "market"} {
		t.Run(name, func(t *testing.T) { checkVmshelf(t, name, loadOverlay(t, name)) })
	}
}

func checkVmshelf(t *testing.T, overlay string, objs []kitObject) {
	dep := kitFind[*appsv1.Deployment](t, objs, "vmshelf")
	spec := dep.Spec.Template.Spec
	if dep.Namespace != vmshelfNamespace || spec.ServiceAccountName != vmshelfSA {
		t.Errorf("Deployment in %q as %q, want %s as %s", dep.Namespace, spec.ServiceAccountName, vmshelfNamespace, vmshelfSA)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("replicas %v, want 1: one store, one serve", dep.Spec.Replicas)
	}
	if dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("strategy %q, want Recreate: a rolling update runs two serves on one data dir", dep.Spec.Strategy.Type)
	}
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		t.Error("service links on: they put VMSHELF_* variables into the environment vmshelf reads flags from")
	}
	if len(spec.NodeSelector) != 1 || spec.NodeSelector[applianceLabel] == "" {
		t.Errorf("node selector %v, want %s of the edge's own box: the volume stays on the node it was made on", spec.NodeSelector, applianceLabel)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]

	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Errorf("args %v, want serve ...", c.Args)
	}
	if _, ok := argValue(c.Args, "--kubeconfig"); ok {
		t.Error("--kubeconfig set: in the cluster the ServiceAccount's in-cluster config is the one")
	}
	for _, a := range c.Args {
		if strings.Contains(strings.ToLower(a), "stripe") && !strings.HasPrefix(a, "--stripe-api-base") {
			t.Errorf("argument %q: Stripe's secrets never come from a flag", a)
		}
	}
	if len(c.EnvFrom) > 0 {
		t.Errorf("envFrom %+v: every variable is named", c.EnvFrom)
	}
	if overlay == "market" {
		checkMarketPod(t, spec)
	}

	// Locked down.
	psc, sc := spec.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("pod not runAsNonRoot")
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("root file system writable")
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("privilege escalation allowed")
	}
	if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Error("capabilities not all dropped")
	}

	// Sized for 64 MiB.
	if got := c.Resources.Requests[corev1.ResourceMemory]; got.Cmp(resource.MustParse("64Mi")) != 0 {
		t.Errorf("memory request %s, want 64Mi", got.String())
	}
	if lim, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok || lim.Cmp(resource.MustParse("64Mi")) < 0 || lim.Cmp(resource.MustParse("256Mi")) > 0 {
		t.Errorf("memory limit %s, want between 64Mi and 256Mi", lim.String())
	}

	// Probes on the data plane's own port (the control plane's could not
	// tell a dead data plane).
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	controlPort := int32(8481)
	if v, _ := argValue(c.Args, "--control-addr"); !strings.HasSuffix(v, fmt.Sprintf(":%d", controlPort)) || ports["control"] != controlPort {
		t.Errorf("--control-addr %q, port control %d, want :%d", v, ports["control"], controlPort)
	}
	if v, _ := argValue(c.Args, "--data-addr"); !strings.HasSuffix(v, fmt.Sprintf(":%d", ports["data"])) || ports["data"] == 0 {
		t.Errorf("--data-addr %q, port data %d", v, ports["data"])
	}
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		want := map[string]string{"liveness": "/healthz", "readiness": "/readyz"}[name]
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || p.HTTPGet.Port.String() != "data" {
			t.Errorf("%s probe %+v, want GET %s on port data", name, p, want)
		}
	}

	// The data dir is on the volume, and the volume is one pod's.
	dataDir, _ := argValue(c.Args, "--data-dir")
	var pvcName string
	for _, m := range c.VolumeMounts {
		if m.ReadOnly || (dataDir != m.MountPath && !strings.HasPrefix(dataDir, m.MountPath+"/")) {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.PersistentVolumeClaim != nil {
				pvcName = v.PersistentVolumeClaim.ClaimName
			}
		}
	}
	if pvcName == "" {
		t.Fatalf("--data-dir %q is not on a mounted PersistentVolumeClaim", dataDir)
	}
	pvc := kitFind[*corev1.PersistentVolumeClaim](t, objs, pvcName)
	if !slices.Equal(pvc.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) {
		t.Errorf("access modes %v, want ReadWriteOnce", pvc.Spec.AccessModes)
	}
	if pvc.Spec.StorageClassName != nil && *pvc.Spec.StorageClassName == vmStorageClass {
		t.Errorf("vmshelf's own store in %s, the class of the replicas' disks", vmStorageClass)
	}

	// Two Services, each to a port the container has, selecting the pod.
	for name, port := range map[string]string{"vmshelf-data": "data", "vmshelf-control": "control"} {
		svc := kitFind[*corev1.Service](t, objs, name)
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != port || ports[port] == 0 {
			t.Errorf("Service %s ports %+v, want one to the container's %s", name, svc.Spec.Ports, port)
		}
		for k, v := range svc.Spec.Selector {
			if dep.Spec.Template.Labels[k] != v {
				t.Errorf("Service %s selects %s=%s, which the pod does not carry", name, k, v)
			}
		}
		if len(svc.Spec.Selector) == 0 {
			t.Errorf("Service %s selects nothing", name)
		}
	}
}

// checkMarketPod: the market's vmshelf runs the provisioner, with its
// storage class and the ServiceAccount's token (its in-cluster config),
// and Stripe's secrets from the Secret, never a value in a file, and not
// optional: without the Secret the pod does not start, rather than sell
// machines it cannot charge for.
func checkMarketPod(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	c := spec.Containers[0]
	if !slices.Contains(c.Args, "--vms-enable") {
		t.Errorf("args %v, want --vms-enable", c.Args)
	}
	if v, _ := argValue(c.Args, "--vm-storage-class"); v != vmStorageClass {
		t.Errorf("--vm-storage-class %q, want %s", v, vmStorageClass)
	}
	if a := spec.AutomountServiceAccountToken; a != nil && !*a {
		t.Error("the ServiceAccount's token is not mounted: the provisioner has no in-cluster config")
	}
	stripe := map[string]bool{}
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, "STRIPE_") {
			continue
		}
		stripe[e.Name] = true
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("%s is not from a secretKeyRef (value %q)", e.Name, e.Value)
		} else if e.ValueFrom.SecretKeyRef.Optional != nil && *e.ValueFrom.SecretKeyRef.Optional {
			t.Errorf("%s is optional: a missing Secret would start vmshelf without payments", e.Name)
		}
	}
	for _, name := range []string{"STRIPE_SECRET_KEY", "STRIPE_WEBHOOK_SECRET"} {
		if !stripe[name] {
			t.Errorf("%s not in the environment", name)
		}
	}
}

// TestKitHosting: image hosting alone needs no Secret and nothing of the
// cluster: its pod names no Secret (it starts where no vmshelf-stripe
// exists), runs neither the provisioner nor any of its flags, mounts no
// ServiceAccount token, and the overlay grants no rights and makes no
// KubeVirt, CDI or storage class of the market.
func TestKitHosting(t *testing.T) {
	objs := loadOverlay(t, "hosting")
	spec := kitFind[*appsv1.Deployment](t, objs, "vmshelf").Spec.Template.Spec
	c := spec.Containers[0]
	for _, flag := range []string{"--vms-enable", "--vms-domain", "--vm-storage-class", "--kubeconfig"} {
		if _, ok := argValue(c.Args, flag); ok || slices.Contains(c.Args, flag) {
			t.Errorf("hosting runs with %s (args %q)", flag, c.Args)
		}
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "STRIPE_") || e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			t.Errorf("hosting's pod reads %s (%+v): it must start with no Secret in the namespace", e.Name, e.ValueFrom)
		}
	}
	for _, v := range spec.Volumes {
		if v.Secret != nil || v.Projected != nil {
			t.Errorf("hosting's pod mounts volume %s from a Secret", v.Name)
		}
	}
	if a := spec.AutomountServiceAccountToken; a == nil || *a {
		t.Error("hosting's pod mounts the ServiceAccount's token, which image hosting never uses")
	}
	for _, o := range objs {
		switch o.obj.(type) {
		case *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, *rbacv1.Role, *rbacv1.RoleBinding,
			*kubevirtv1.KubeVirt, *cdiv1beta1.CDI, *storagev1.StorageClass:
			t.Errorf("hosting holds %v, which only the market needs", o)
		}
	}
}

// TestKitScaleOut: the scaled-out Deployment runs several replicas over
// PostgreSQL and S3, every secret of it from a Secret, keeps nothing in
// the pod and is bound to no node; the single pod's volume is gone.
func TestKitScaleOut(t *testing.T) {
	objs := loadOverlay(t, "market-scale-out")
	dep := kitFind[*appsv1.Deployment](t, objs, "vmshelf")
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Errorf("replicas %v, want several", dep.Spec.Replicas)
	}
	spec := dep.Spec.Template.Spec
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		t.Error("service links on: they put VMSHELF_* variables into the environment vmshelf reads flags from")
	}
	c := spec.Containers[0]
	if v, _ := argValue(c.Args, "--blobs"); !strings.HasPrefix(v, "s3://") {
		t.Errorf("--blobs %q, want s3://bucket/prefix", v)
	}
	if v, ok := argValue(c.Args, "--blob-capacity-gib"); !ok || v == "" {
		t.Error("--blobs s3://… without --blob-capacity-gib: serve refuses it")
	}
	secret := map[string]bool{"VMSHELF_STORE_URL": true, "AWS_ACCESS_KEY_ID": true, "AWS_SECRET_ACCESS_KEY": true,
		"STRIPE_SECRET_KEY": true, "STRIPE_WEBHOOK_SECRET": true}
	for _, e := range c.Env {
		if secret[e.Name] {
			delete(secret, e.Name)
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				t.Errorf("%s is not from a secretKeyRef (value %q)", e.Name, e.Value)
			}
		}
	}
	for name := range secret {
		t.Errorf("%s not in the environment", name)
	}
	for _, a := range c.Args {
		if strings.Contains(a, "postgres://") || strings.Contains(strings.ToLower(a), "secret") {
			t.Errorf("argument %q: the store URL and the keys never come from a flag", a)
		}
	}
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			t.Errorf("volume %s is a PersistentVolumeClaim: a replica keeps nothing of its own", v.Name)
		}
	}
	for _, o := range objs {
		if _, ok := o.obj.(*corev1.PersistentVolumeClaim); ok {
			t.Errorf("the scale-out holds %v, which no replica uses", o)
		}
	}
	if len(spec.NodeSelector) > 0 {
		t.Errorf("node selector %v: with nothing on a volume, the replicas may run anywhere", spec.NodeSelector)
	}
	checkMarketPod(t, spec)
}
