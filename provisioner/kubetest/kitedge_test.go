package kubetest

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/vmshelf/vmshelf/internal/imagespec"
	"github.com/vmshelf/vmshelf/provisioner"
)

// The kit's edge: the image the Deployments run and the Ingresses of
// vmshelf's two planes (Traefik's settings: kittraefik_test.go).

// TestKitImage: the Deployment of every overlay runs make image's image as
// it is made: its name and the kit's tag, imported (IfNotPresent), as its
// user, its entrypoint given a command, the store where the image's
// environment puts it (so kubectl exec'd tenant commands find it), its
// ports.
func TestKitImage(t *testing.T) {
	want := imagespec.Repository + ":" + imagespec.KitTag
	for _, name := range kitOverlays {
		dep := kitFind[*appsv1.Deployment](t, loadOverlay(t, name), "vmshelf")
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

// TestKitIngress: in every overlay, each plane has an Ingress on the
// public name its Deployment gives it, with TLS for that name from
// Traefik's letsencrypt resolver on websecure (the provisioner's
// annotations), routing the requests users make to the plane's Service
// and port, and nothing of /metrics, /healthz, /readyz.
func TestKitIngress(t *testing.T) {
	for _, overlay := range kitOverlays {
		objs := loadOverlay(t, overlay)
		args := kitFind[*appsv1.Deployment](t, objs, "vmshelf").Spec.Template.Spec.Containers[0].Args
		hosts := map[string]string{} // Ingress name → the host the Deployment names
		for ing, flag := range map[string]string{"vmshelf-data": "--public-url", "vmshelf-control": "--checkout-return-url"} {
			v, _ := argValue(args, flag)
			u, err := url.Parse(v)
			if err != nil || u.Scheme != "https" || u.Host == "" {
				t.Fatalf("%s: %s %q, want an https URL", overlay, flag, v)
			}
			hosts[ing] = u.Host
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
					t.Errorf("%s: %s: path %s goes to %+v, want Service %s's port to the container's %s", overlay, name, path.Path, b, svc.Name, want.port)
				}
			}
			for _, r := range want.requests {
				if !ingressRoutes(ing, r, false) {
					t.Errorf("%s: %s does not route %s, which users need", overlay, name, r)
				}
			}
			for _, r := range privateRequests {
				if ingressRoutes(ing, r, true) {
					t.Errorf("%s: %s routes %s to the internet", overlay, name, r)
				}
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
