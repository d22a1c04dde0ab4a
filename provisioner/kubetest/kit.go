package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/yaml"
)

// kitDir is the deployment kit, docs/deploy, seen from this package.
const kitDir = "../../docs/deploy"

// kitScheme knows every type a manifest of the kit may hold: Kubernetes'
// own, KubeVirt's and CDI's, CRDs, and k3s's and rke2's HelmChartConfig.
func kitScheme(t TB) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, kubevirtv1.AddToScheme, cdiv1beta1.AddToScheme, apiextensionsv1.AddToScheme, addHelmChartConfig,
	} {
		if err := add(s); err != nil {
			t.Fatalf("scheme: %v", err)
		}
	}
	return s
}

// kitObject is one document of a manifest, decoded into its type.
type kitObject struct {
	file string
	gvk  schema.GroupVersionKind
	obj  runtime.Object
}

func (o kitObject) String() string {
	m, _ := o.obj.(metav1.Object)
	if m == nil {
		return fmt.Sprintf("%s: %s", o.file, o.gvk.Kind)
	}
	return fmt.Sprintf("%s: %s %s/%s", o.file, o.gvk.Kind, m.GetNamespace(), m.GetName())
}

// decodeStrict decodes every document of a multi-document YAML stream into
// its typed object with the API machinery's strict decoder: an unknown or
// duplicated field, or a kind the scheme does not know, is an error, as it
// would be to `kubectl apply --validate=strict`.
func decodeStrict(s *runtime.Scheme, name string, r io.Reader) ([]kitObject, error) {
	dec := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, s, s, kjson.SerializerOptions{Yaml: true, Strict: true})
	docs := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var out []kitObject
	for i := 0; ; i++ {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if empty, err := isEmptyDocument(doc); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		} else if empty {
			continue
		}
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		out = append(out, kitObject{file: name, gvk: *gvk, obj: obj})
	}
}

// isEmptyDocument: a document of comments only (or nothing) between two
// "---" is no object.
func isEmptyDocument(doc []byte) (bool, error) {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return false, err
	}
	j = bytes.TrimSpace(j)
	return len(j) == 0 || string(j) == "null", nil
}

// loadKitFile decodes one manifest of the kit (a path below docs/deploy)
// strictly; the tests that need a part of the kit alone (the RBAC, the
// KubeVirt CR) read it so.
func loadKitFile(t TB, s *runtime.Scheme, name string) []kitObject {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(kitDir, name))
	if err != nil {
		t.Fatalf("read the kit: %v", err)
	}
	objs, err := decodeStrict(s, name, bytes.NewReader(b))
	if err != nil {
		t.Fatalf("decode the kit: %v", err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s holds no object", name)
	}
	return objs
}

// provisionerIdentity is vmshelf's ServiceAccount, in its namespace, bound
// to the provisioner's ClusterRole: base's namespace.yaml and the market's
// rbac.yaml, what the market overlay applies of them.
func provisionerIdentity(t TB, s *runtime.Scheme) []kitObject {
	t.Helper()
	return append(loadKitFile(t, s, "base/namespace.yaml"), loadKitFile(t, s, "components/market/rbac.yaml")...)
}

// kitResource is where the API server serves a kind of the kit.
type kitResource struct {
	resource   string
	namespaced bool
}

// kitResources maps every kind the kit holds (and the tests create) to its
// resource. A kind missing here fails the test that meets it.
var kitResources = map[schema.GroupVersionKind]kitResource{
	{Version: "v1", Kind: "Namespace"}:                                               {"namespaces", false},
	{Version: "v1", Kind: "ServiceAccount"}:                                          {"serviceaccounts", true},
	{Version: "v1", Kind: "ConfigMap"}:                                               {"configmaps", true},
	{Version: "v1", Kind: "Secret"}:                                                  {"secrets", true},
	{Version: "v1", Kind: "Service"}:                                                 {"services", true},
	{Version: "v1", Kind: "PersistentVolumeClaim"}:                                   {"persistentvolumeclaims", true},
	{Group: "apps", Version: "v1", Kind: "Deployment"}:                               {"deployments", true},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"}:                {"roles", true},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"}:         {"rolebindings", true},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"}:         {"clusterroles", false},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRoleBinding"}:  {"clusterrolebindings", false},
	{Group: "storage.k8s.io", Version: "v1", Kind: "StorageClass"}:                   {"storageclasses", false},
	{Group: "networking.k8s.io", Version: "v1", Kind: "Ingress"}:                     {"ingresses", true},
	{Group: "kubevirt.io", Version: "v1", Kind: "KubeVirt"}:                          {"kubevirts", true},
	{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"}:                    {"virtualmachines", true},
	{Group: "cdi.kubevirt.io", Version: "v1beta1", Kind: "CDI"}:                      {"cdis", false},
	{Group: "cdi.kubevirt.io", Version: "v1beta1", Kind: "DataVolume"}:               {"datavolumes", true},
	{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}: {"customresourcedefinitions", false},
	helmChartConfigGVK: {"helmchartconfigs", true},
}

// resourceFor is the dynamic client's handle on o's kind (namespaced
// where the kind is).
func resourceFor(t TB, dc dynamic.Interface, gvk schema.GroupVersionKind, namespace string) dynamic.ResourceInterface {
	t.Helper()
	r, ok := kitResources[gvk]
	if !ok {
		t.Fatalf("no resource known for %v: add it to kitResources", gvk)
	}
	nri := dc.Resource(gvk.GroupVersion().WithResource(r.resource))
	if r.namespaced {
		return nri.Namespace(namespace)
	}
	return nri
}

// applyKit creates every object on the server with the client behind cfg,
// in order, with the server's strict field validation on as well; an
// object that exists already is left as it is.
func applyKit(t TB, cfg *rest.Config, s *runtime.Scheme, objs []kitObject) {
	t.Helper()
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, o := range objs {
		u, err := toUnstructured(s, o)
		if err != nil {
			t.Fatalf("%v: %v", o, err)
		}
		_, err = resourceFor(t, dc, o.gvk, u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("the API server refuses %v: %v", o, err)
		}
	}
}

func toUnstructured(s *runtime.Scheme, o kitObject) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o.obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(o.gvk)
	return u, nil
}

// standInCRD is a minimal CRD for a kind whose real CRD an operator
// installs (KubeVirt's virt-operator, CDI's cdi-operator): every field is
// accepted, with a status subresource as the real ones have. It stands in
// for those CRDs so that the API server stores and serves the kind and
// RBAC applies to it; it does not validate like the real schema does.
func standInCRD(group, version, kind, plural string, scope apiextensionsv1.ResourceScope) *apiextensionsv1.CustomResourceDefinition {
	yes := true
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: plural, Singular: strings.ToLower(kind), Kind: kind, ListKind: kind + "List",
			},
			Scope: scope,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: version, Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: &yes,
				}},
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
			}},
		},
	}
}

// standInCRDs are the CRDs whose real schema no module served here holds:
// CDI's DataVolume and CDI (made by CDI's main module, which the Go module
// proxy does not serve; cdi-operator installs them) and helm-controller's
// HelmChartConfig (k3s and rke2 install it).
func standInCRDs() []*apiextensionsv1.CustomResourceDefinition {
	return []*apiextensionsv1.CustomResourceDefinition{
		standInCRD("helm.cattle.io", "v1", "HelmChartConfig", "helmchartconfigs", apiextensionsv1.NamespaceScoped),
		standInCRD("cdi.kubevirt.io", "v1beta1", "DataVolume", "datavolumes", apiextensionsv1.NamespaceScoped),
		standInCRD("cdi.kubevirt.io", "v1beta1", "CDI", "cdis", apiextensionsv1.ClusterScoped),
	}
}

// operatorCRDs are the CRDs the kit and the provisioner use: KubeVirt's
// own, as its code generates them (kubeVirtCRDs), and the stand-ins.
func operatorCRDs(t TB) []*apiextensionsv1.CustomResourceDefinition {
	return append(kubeVirtCRDs(t), standInCRDs()...)
}

// registerCRDs creates crds and waits (bounded) until the API server
// serves each: its Established condition, seen through a watch.
func registerCRDs(t TB, cfg *rest.Config, crds []*apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	c, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, crd := range crds {
		if _, err := c.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create CRD %s: %v", crd.Name, err)
		}
	}
	for _, crd := range crds {
		w, err := c.ApiextensionsV1().CustomResourceDefinitions().Watch(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("metadata.name", crd.Name).String(),
		})
		if err != nil {
			t.Fatalf("watch CRD %s: %v", crd.Name, err)
		}
		if !waitEstablished(ctx, w) {
			t.Fatalf("CRD %s not established: %v", crd.Name, ctx.Err())
		}
	}
}

func waitEstablished(ctx context.Context, w watch.Interface) bool {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false
			}
			crd, isCRD := ev.Object.(*apiextensionsv1.CustomResourceDefinition)
			if !isCRD {
				continue
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true
				}
			}
		}
	}
}

// operatorNamespaces are the namespaces the kit's objects go to that it
// does not make: kubevirt, which kubevirt-operator.yaml makes, and
// kube-system, where k3s's and rke2's Traefik lives (the API server makes
// it too, but in the background after its start).
func operatorNamespaces() []kitObject {
	var out []kitObject
	for _, ns := range []string{"kubevirt", "kube-system"} {
		out = append(out, kitObject{
			file: "a namespace the kit does not make (stand-in)",
			gvk:  schema.GroupVersionKind{Version: "v1", Kind: "Namespace"},
			obj:  &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		})
	}
	return out
}

// The names the kit and the design share (the provisioner's ClusterRole is
// docs/deploy/components/market/rbac.yaml).
const (
	provisionerRole      = "vmshelf-provisioner"
	vmshelfNamespace     = "vmshelf"
	vmshelfSA            = "vmshelf"
	computeWindowTaint   = "losos.dev/compute-window"
	vmStorageClass       = "losos-vm-local"
	vmDiskPath           = "/home/shared/vms"
	localPathImage       = "rancher/local-path-provisioner:v0.0.37"
	localPathProvisioner = "losos.dev/vm-local-path"
	localPathDeployment  = "losos-vm-local-path"
	applianceLabel       = "losos.dev/appliance"
)

const (
	testDomain    = "vms.example.net"
	testFetchBase = "https://vmshelf.example.net"
	testAppliance = "box1"
)
