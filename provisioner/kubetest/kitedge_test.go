package kubetest

import (
	"bytes"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/vmshelf/vmshelf/internal/imagespec"
	"github.com/vmshelf/vmshelf/provisioner"
)

// The kit's edge: the image the Deployments run, the Ingresses of
// vmshelf's two planes, Traefik's settings on k3s and rke2, and the
// kustomization kubectl apply -k reads.

// kitDeployments are the two Deployments of vmshelf (vmshelf.yaml and
// vmshelf-scale-out.yaml).
var kitDeployments = []string{"vmshelf", "vmshelf-replicas"}

// TestKitImage: both Deployments run make image's image as it is made:
// its name and the kit's tag, imported (IfNotPresent), as its user, its
// entrypoint given a command, the store where the image's environment
// puts it (so kubectl exec'd tenant commands find it), its ports.
func TestKitImage(t *testing.T) {
	objs := loadKit(t)
	want := imagespec.Repository + ":" + imagespec.KitTag
	for _, name := range kitDeployments {
		dep := kitFind[*appsv1.Deployment](t, objs, name)
		spec := dep.Spec.Template.Spec
		c := spec.Containers[0]
		if c.Image != want || c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("%s runs %q (%s), want %q with IfNotPresent: the imported image, never a pull", name, c.Image, c.ImagePullPolicy, want)
		}
		if len(c.Command) > 0 || len(c.Args) == 0 || c.Args[0] != "serve" {
			t.Errorf("%s: command %q args %q; want the image's entrypoint (vmshelf) and args serve …", name, c.Command, c.Args)
		}
		sc := spec.SecurityContext
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != imagespec.UID || sc.RunAsGroup == nil || *sc.RunAsGroup != imagespec.GID {
			t.Errorf("%s runs as %+v, want the image's user %d:%d", name, sc, imagespec.UID, imagespec.GID)
		}
		if v, _ := argValue(c.Args, "--data-dir"); v != imagespec.StoreDir {
			t.Errorf("%s: --data-dir %q, but the image's VMSHELF_DATA_DIR (what kubectl exec'd commands use) is %q", name, v, imagespec.StoreDir)
		}
		ports := map[string]int32{}
		for _, p := range c.Ports {
			ports[p.Name] = p.ContainerPort
		}
		if ports["data"] != imagespec.DataPort || ports["control"] != imagespec.ControlPort {
			t.Errorf("%s ports %v, want data %d and control %d as the image exposes", name, ports, imagespec.DataPort, imagespec.ControlPort)
		}
	}
}

// The requests each public name must route to vmshelf (the data plane's
// three routes, gateway's prefixes; the control plane's API, webhook and
// page), and those no public name may route: the probes and the metrics.
var (
	dataRequests    = []string{"/market/vm-images/upload/t", "/market/vm-images/upload-sessions/s", "/market/vm-images/fetch/f"}
	controlRequests = []string{"/machines", "/machines/app.js", "/market/vm-images", "/market/vm-images/ticket",
		"/market/stripe/webhook", "/market/vms/status", "/market/vms/orders"}
	privateRequests = []string{"/metrics", "/healthz", "/readyz"}
)

// TestKitIngress: each plane has an Ingress on the public name the
// Deployments give it, with TLS for that name from Traefik's letsencrypt
// resolver on websecure (the provisioner's annotations), routing the
// requests users make to the plane's Service and port, and nothing of
// /metrics, /healthz, /readyz.
func TestKitIngress(t *testing.T) {
	objs := loadKit(t)
	hosts := map[string]string{} // Ingress name → the host the Deployments name
	for _, name := range kitDeployments {
		args := kitFind[*appsv1.Deployment](t, objs, name).Spec.Template.Spec.Containers[0].Args
		for ing, flag := range map[string]string{"vmshelf-data": "--public-url", "vmshelf-control": "--checkout-return-url"} {
			v, _ := argValue(args, flag)
			u, err := url.Parse(v)
			if err != nil || u.Scheme != "https" || u.Host == "" {
				t.Fatalf("%s: %s %q, want an https URL", name, flag, v)
			}
			if h, seen := hosts[ing]; seen && h != u.Host {
				t.Errorf("%s: %s names %s, the other Deployment %s", name, flag, u.Host, h)
			}
			hosts[ing] = u.Host
		}
	}
	for name, want := range map[string]struct {
		service, port string
		requests      []string
	}{"vmshelf-data": {"vmshelf-data", "data", dataRequests}, "vmshelf-control": {"vmshelf-control", "control", controlRequests}} {
		ing := kitFind[*networkingv1.Ingress](t, objs, name)
		checkIngressTLS(t, ing, hosts[name])
		svc := kitFind[*corev1.Service](t, objs, want.service)
		for _, path := range ing.Spec.Rules[0].HTTP.Paths {
			b := path.Backend.Service
			if b == nil || b.Name != svc.Name || svc.Namespace != ing.Namespace || !servesPort(svc, b.Port, want.port) {
				t.Errorf("%s: path %s goes to %+v, want Service %s's port to the container's %s", name, path.Path, b, svc.Name, want.port)
			}
		}
		for _, r := range want.requests {
			if !ingressRoutes(ing, r, false) {
				t.Errorf("%s does not route %s, which users need", name, r)
			}
		}
		for _, r := range privateRequests {
			if ingressRoutes(ing, r, true) {
				t.Errorf("%s routes %s to the internet", name, r)
			}
		}
	}
}

func checkIngressTLS(t *testing.T, ing *networkingv1.Ingress, host string) {
	t.Helper()
	wantAnn := map[string]string{
		"traefik.ingress.kubernetes.io/router.entrypoints":      "websecure",
		"traefik.ingress.kubernetes.io/router.tls":              "true",
		"traefik.ingress.kubernetes.io/router.tls.certresolver": provisioner.CertResolver,
	}
	for k, v := range wantAnn {
		if ing.Annotations[k] != v {
			t.Errorf("%s: annotation %s = %q, want %q (as the provisioner's Ingresses)", ing.Name, k, ing.Annotations[k], v)
		}
	}
	if len(ing.Spec.Rules) != 1 || ing.Spec.Rules[0].Host != host || ing.Spec.Rules[0].HTTP == nil {
		t.Fatalf("%s: rules %+v, want one, for %s", ing.Name, ing.Spec.Rules, host)
	}
	if len(ing.Spec.TLS) != 1 || !slices.Equal(ing.Spec.TLS[0].Hosts, []string{host}) {
		t.Errorf("%s: TLS %+v, want %s", ing.Name, ing.Spec.TLS, host)
	}
}

// servesPort: the Service's port p goes to the container's port named want.
func servesPort(svc *corev1.Service, p networkingv1.ServiceBackendPort, want string) bool {
	for _, sp := range svc.Spec.Ports {
		if (p.Name != "" && sp.Name == p.Name || p.Number != 0 && sp.Port == p.Number) && sp.TargetPort.String() == want {
			return true
		}
	}
	return false
}

// ingressRoutes: a path of the Ingress takes the request path r. A Prefix
// path matches element by element as the Ingress API defines it; with
// loose, also as a plain string prefix, as Traefik matches by default (a
// stricter test for what must stay private).
func ingressRoutes(ing *networkingv1.Ingress, r string, loose bool) bool {
	for _, p := range ing.Spec.Rules[0].HTTP.Paths {
		switch {
		case p.PathType != nil && *p.PathType == networkingv1.PathTypeExact:
			if p.Path == r {
				return true
			}
		case prefixElements(p.Path, r) || loose && strings.HasPrefix(r, p.Path):
			return true
		}
	}
	return false
}

func prefixElements(prefix, path string) bool {
	if prefix == "/" {
		return true
	}
	pe, re := strings.Split(strings.Trim(prefix, "/"), "/"), strings.Split(strings.Trim(path, "/"), "/")
	return len(pe) <= len(re) && slices.Equal(pe, re[:len(pe)])
}

// traefikValues is the part of the Traefik Helm chart's values the kit
// sets (traefik/traefik-helm-chart's values.yaml: ports.<entry
// point>.transport.respondingTimeouts, persistence, additionalArguments),
// read strictly: a misspelt key fails instead of being a value the chart
// never reads.
type traefikValues struct {
	Ports struct {
		Websecure struct {
			Transport struct {
				RespondingTimeouts struct {
					ReadTimeout string `json:"readTimeout"`
				} `json:"respondingTimeouts"`
			} `json:"transport"`
		} `json:"websecure"`
	} `json:"ports"`
	Persistence struct {
		Enabled bool   `json:"enabled"`
		Path    string `json:"path"`
		Size    string `json:"size"`
	} `json:"persistence"`
	AdditionalArguments []string `json:"additionalArguments"`
}

// TestKitTraefik: k3s's HelmChartConfig (traefik) and rke2's
// (rke2-traefik), both in kube-system, give Traefik's websecure entry
// point a read timeout of at least six hours and the ACME resolver the
// Ingresses name, with its storage on Traefik's persistent volume; the
// two hold the same values.
func TestKitTraefik(t *testing.T) {
	objs := loadKit(t)
	var contents []string
	for _, name := range []string{"traefik", "rke2-traefik"} {
		h := kitFind[*helmChartConfig](t, objs, name)
		if h.Namespace != "kube-system" {
			t.Errorf("HelmChartConfig %s in %q: helm-controller merges it into the HelmChart of its name in kube-system", name, h.Namespace)
		}
		contents = append(contents, h.Spec.ValuesContent)
		var v traefikValues
		if err := yaml.UnmarshalStrict([]byte(h.Spec.ValuesContent), &v); err != nil {
			t.Fatalf("%s valuesContent: %v", name, err)
		}
		rt := v.Ports.Websecure.Transport.RespondingTimeouts.ReadTimeout
		if d, err := time.ParseDuration(rt); err != nil || d < 6*time.Hour {
			t.Errorf("%s: websecure readTimeout %q, want at least 6h for a big upload", name, rt)
		}
		checkResolver(t, name, v)
	}
	if contents[0] != contents[1] {
		t.Errorf("k3s's and rke2's Traefik values differ:\n%s\n---\n%s", contents[0], contents[1])
	}
}

// checkResolver: --certificatesresolvers.<name>.acme.<key>=<value>
// arguments define the provisioner's resolver fully, kept on the volume.
func checkResolver(t *testing.T, name string, v traefikValues) {
	t.Helper()
	acme := map[string]string{}
	prefix := "--certificatesresolvers." + provisioner.CertResolver + ".acme."
	for _, a := range v.AdditionalArguments {
		if k, val, ok := strings.Cut(strings.TrimPrefix(a, prefix), "="); ok && strings.HasPrefix(a, prefix) {
			acme[strings.ToLower(k)] = val
		}
	}
	if !strings.Contains(acme["email"], "@") {
		t.Errorf("%s: resolver %s has no e-mail address (arguments %q)", name, provisioner.CertResolver, v.AdditionalArguments)
	}
	if acme["tlschallenge"] != "true" && acme["httpchallenge.entrypoint"] == "" && acme["dnschallenge.provider"] == "" {
		t.Errorf("%s: resolver %s has no challenge", name, provisioner.CertResolver)
	}
	if !v.Persistence.Enabled || v.Persistence.Path == "" || !strings.HasPrefix(acme["storage"], strings.TrimSuffix(v.Persistence.Path, "/")+"/") {
		t.Errorf("%s: ACME storage %q not on Traefik's volume (persistence %+v): a restart would ask Let's Encrypt again", name, acme["storage"], v.Persistence)
	}
}

// kustomization is the part of kustomize's Kustomization the kit uses,
// read strictly.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name   string `json:"name"`
		NewTag string `json:"newTag"`
	} `json:"images"`
}

// kustomized are the files kubectl apply -k docs/deploy applies: the kit
// in the guide's order without vmshelf-scale-out.yaml (it replaces
// vmshelf.yaml's Deployment) and the distributions' Traefik files.
var kustomized = []string{"rbac.yaml", "storageclass.yaml", "kubevirt-cr.yaml", "cdi-cr.yaml", "vmshelf.yaml", "ingress.yaml"}

// TestKitKustomization: kustomization.yaml lists exactly those files and
// names the image the Deployments run; kustomize's own Go API (what
// kubectl apply -k runs) builds from it the very objects of those files,
// which a real kube-apiserver accepts.
func TestKitKustomization(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(kitDir, kustomizationFile))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatalf("%s: %v", kustomizationFile, err)
	}
	if !slices.Equal(k.Resources, kustomized) {
		t.Errorf("resources %q, want %q", k.Resources, kustomized)
	}
	if len(k.Images) != 1 || k.Images[0].Name != imagespec.Repository || k.Images[0].NewTag != imagespec.KitTag {
		t.Errorf("images %+v, want %s with tag %s", k.Images, imagespec.Repository, imagespec.KitTag)
	}
	s := kitScheme(t)
	var want []kitObject
	for _, f := range kustomized {
		want = append(want, loadKitFile(t, s, f)...)
	}
	got := kustomize(t)
	if len(got) != len(want) {
		t.Fatalf("kustomize builds %d objects, the files hold %d", len(got), len(want))
	}
	for i := range want {
		if got[i].gvk != want[i].gvk || !apiequality.Semantic.DeepEqual(got[i].obj, want[i].obj) {
			t.Errorf("object %d: kustomize builds %v, the file holds %v (or they differ)", i, got[i], want[i])
		}
	}
	applyReadBack(t, got)
}

// kustomize runs kustomize's build of the kit and decodes its output as
// the kit's files are decoded.
func kustomize(t *testing.T) []kitObject {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), kitDir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", kitDir, err)
	}
	y, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStrict(kitScheme(t), "kustomize build", bytes.NewReader(y))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}
