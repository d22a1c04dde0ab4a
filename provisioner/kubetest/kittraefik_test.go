package kubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/vmshelf/vmshelf/internal/clientaddr"
	"github.com/vmshelf/vmshelf/internal/testkit/traefiktest"
	"github.com/vmshelf/vmshelf/provisioner"
)

// Traefik's settings, as k3s's and rke2's helm-controller hand them to
// Traefik's Helm chart, and what vmshelf believes of the addresses Traefik
// forwards.

// traefikStatic is the part of Traefik's static configuration the kit's
// arguments set (traefik/traefik's pkg/config/static:
// entryPoints.<name>.http.redirections.entryPoint,
// certificatesResolvers.<name>.acme and accessLog.fields), read strictly
// from the arguments:
// Traefik refuses to start on an argument it does not know, so a
// misspelt one fails here first. Traefik reads the names case-blind, so
// they are lower-cased; every value is kept as the string it is given.
type traefikStatic struct {
	EntryPoints map[string]struct {
		HTTP struct {
			Redirections struct {
				EntryPoint struct {
					To        string `json:"to"`
					Scheme    string `json:"scheme"`
					Permanent string `json:"permanent"`
					Priority  string `json:"priority"`
				} `json:"entrypoint"`
			} `json:"redirections"`
		} `json:"http"`
	} `json:"entrypoints"`
	CertificatesResolvers map[string]struct {
		ACME struct {
			Email         string `json:"email"`
			Storage       string `json:"storage"`
			CAServer      string `json:"caserver"`
			TLSChallenge  string `json:"tlschallenge"`
			HTTPChallenge struct {
				EntryPoint string `json:"entrypoint"`
			} `json:"httpchallenge"`
			DNSChallenge struct {
				Provider string `json:"provider"`
			} `json:"dnschallenge"`
		} `json:"acme"`
	} `json:"certificatesresolvers"`
	AccessLog *struct {
		Fields struct {
			DefaultMode string            `json:"defaultmode"`
			Names       map[string]string `json:"names"`
		} `json:"fields"`
	} `json:"accesslog"`
}

// parseTraefikArgs reads --a.b.c=value arguments into traefikStatic. A
// bare --a.b.c is "true", as Traefik reads it; an argument given twice,
// or both as a value and as the parent of another, is an error.
func parseTraefikArgs(args []string) (traefikStatic, error) {
	var st traefikStatic
	tree := map[string]any{}
	for _, a := range args {
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			return st, fmt.Errorf("argument %q is not --name=value", a)
		}
		name, value, hasValue := strings.Cut(name, "=")
		if !hasValue {
			value = "true"
		}
		parts := strings.Split(strings.ToLower(name), ".")
		node := tree
		for i, p := range parts {
			if i == len(parts)-1 {
				if _, set := node[p]; set {
					return st, fmt.Errorf("argument %q: --%s is set twice", a, name)
				}
				node[p] = value
				break
			}
			next, isMap := node[p].(map[string]any)
			if !isMap {
				if _, set := node[p]; set {
					return st, fmt.Errorf("argument %q: %s is a value already", a, strings.Join(parts[:i+1], "."))
				}
				next = map[string]any{}
				node[p] = next
			}
			node = next
		}
	}
	b, err := json.Marshal(tree)
	if err != nil {
		return st, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return st, fmt.Errorf("arguments %q: %w", args, err)
	}
	return st, nil
}

// traefikConfig is one HelmChartConfig of the kit, its values and the
// static configuration of their arguments.
type traefikConfig struct {
	name, namespace string
	content         string
	values          traefiktest.Values
	static          traefikStatic
}

// acmeEmail is the e-mail address of the resolver the Ingresses name.
func (c traefikConfig) acmeEmail() string {
	return c.static.CertificatesResolvers[provisioner.CertResolver].ACME.Email
}

func traefikOf(t *testing.T, objs []kitObject, name string) traefikConfig {
	t.Helper()
	h := kitFind[*helmChartConfig](t, objs, name)
	c := traefikConfig{name: name, namespace: h.Namespace, content: h.Spec.ValuesContent}
	var err error
	if c.values, err = traefiktest.ParseValues(h.Spec.ValuesContent); err != nil {
		t.Fatalf("%s valuesContent: %v", name, err)
	}
	if c.static, err = parseTraefikArgs(c.values.AdditionalArguments); err != nil {
		t.Fatalf("%s additionalArguments: %v", name, err)
	}
	return c
}

// TestTraefikArgsStrict: the arguments' reader refuses what Traefik
// refuses, so that a typo in the kit fails a test rather than Traefik's
// start on the edge.
func TestTraefikArgsStrict(t *testing.T) {
	for _, tt := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--entryPoints.web.http.redirections.entryPoint.to=:443", "--certificatesresolvers.le.acme.tlschallenge"}, true},
		{[]string{"--entryPoints.web.http.redirection.entryPoint.to=:443"}, false},
		{[]string{"--entryPoints.web.redirections.entryPoint.to=:443"}, false},
		{[]string{"--certificatesresolvers.le.acme.emial=a@b"}, false},
		{[]string{"--certificatesresolvers.le.acme.email=a@b", "--certificatesresolvers.le.acme.email=c@d"}, false},
		{[]string{"--certificatesresolvers.le.acme=x", "--certificatesresolvers.le.acme.email=a@b"}, false},
		{[]string{"certificatesresolvers.le.acme.email=a@b"}, false},
		{[]string{"--accesslog.fields.names.RequestPath=drop"}, true},
		{[]string{"--accesslog.field.names.RequestPath=drop"}, false},
		{[]string{"--accesslog.fields.RequestPath=drop"}, false},
	} {
		if _, err := parseTraefikArgs(tt.args); (err == nil) != tt.ok {
			t.Errorf("%q: err = %v, want ok = %v", tt.args, err, tt.ok)
		}
	}
}

// TestKitTraefik: k3s's HelmChartConfig (traefik) and rke2's
// (rke2-traefik), both in kube-system, give Traefik's websecure entry
// point a read timeout of at least six hours, redirect every request on
// web to https on the port clients reach, and define the ACME resolver
// the Ingresses name, with its storage on Traefik's persistent volume, and
// keep the request path, where the capabilities are, out of Traefik's
// access log. k3s's alone sets the Service's externalTrafficPolicy to
// Local; but for that the two hold the same values.
func TestKitTraefik(t *testing.T) {
	objs := loadKit(t)
	k3s, rke2 := traefikOf(t, objs, "traefik"), traefikOf(t, objs, "rke2-traefik")
	for _, c := range []traefikConfig{k3s, rke2} {
		if c.namespace != "kube-system" {
			t.Errorf("HelmChartConfig %s in %q: helm-controller merges it into the HelmChart of its name in kube-system", c.name, c.namespace)
		}
		rt := c.values.Ports.Websecure.Transport.RespondingTimeouts.ReadTimeout
		if d, err := time.ParseDuration(rt); err != nil || d < 6*time.Hour {
			t.Errorf("%s: websecure readTimeout %q, want at least 6h for a big upload", c.name, rt)
		}
		web, ok := c.static.EntryPoints["web"]
		if r := web.HTTP.Redirections.EntryPoint; !ok || r.To != ":443" || r.Scheme != "https" || r.Permanent != "true" {
			t.Errorf("%s: web redirects %+v, want permanently to https on :443 (the port clients reach; websecure's own is 8443)", c.name, r)
		}
		checkResolver(t, c)
		if al := c.static.AccessLog; al == nil || !strings.EqualFold(al.Fields.Names["requestpath"], "drop") {
			t.Errorf("%s: access log %+v, want the field RequestPath dropped: it holds every upload ticket and fetch token", c.name, al)
		}
		if !strings.HasSuffix(c.content, "\n  - --certificatesresolvers."+provisioner.CertResolver+".acme.email="+c.acmeEmail()) {
			t.Errorf("%s: the e-mail argument is not the last line of valuesContent, which the values' replacement needs", c.name)
		}
	}
	if k3s.values.Service == nil || k3s.values.Service.Spec == nil ||
		k3s.values.Service.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
		t.Errorf("k3s: service %+v, want spec.externalTrafficPolicy Local: with Cluster Traefik sees a node's address, not the client's", k3s.values.Service)
	} else if only := (corev1.ServiceSpec{ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal}); !apiequality.Semantic.DeepEqual(*k3s.values.Service.Spec, only) {
		t.Errorf("k3s: service.spec %+v, want externalTrafficPolicy alone", *k3s.values.Service.Spec)
	}
	if rke2.values.Service != nil {
		t.Errorf("rke2: service %+v: rke2's Traefik Service is a ClusterIP, on which the API server refuses an externalTrafficPolicy", rke2.values.Service)
	}
	k3sRest := k3s.values
	k3sRest.Service = nil
	if !apiequality.Semantic.DeepEqual(k3sRest, rke2.values) {
		t.Errorf("k3s's and rke2's Traefik values differ beyond the Service:\n%s\n---\n%s", k3s.content, rke2.content)
	}
	guide, err := os.ReadFile(filepath.Join(kitDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(guide), "```yaml\n"+k3s.content+"\n```") {
		t.Errorf("docs/deploy/README.md does not quote k3s's values as they are:\n%s", k3s.content)
	}
}

// checkResolver: the resolver the Ingresses and the provisioner name is
// fully defined, and kept on Traefik's volume.
func checkResolver(t *testing.T, c traefikConfig) {
	t.Helper()
	r, ok := c.static.CertificatesResolvers[provisioner.CertResolver]
	if !ok {
		t.Fatalf("%s: no resolver %s (arguments %q)", c.name, provisioner.CertResolver, c.values.AdditionalArguments)
	}
	if !strings.Contains(r.ACME.Email, "@") {
		t.Errorf("%s: resolver %s has no e-mail address", c.name, provisioner.CertResolver)
	}
	if r.ACME.TLSChallenge != "true" && r.ACME.HTTPChallenge.EntryPoint == "" && r.ACME.DNSChallenge.Provider == "" {
		t.Errorf("%s: resolver %s has no challenge", c.name, provisioner.CertResolver)
	}
	p := c.values.Persistence
	if !p.Enabled || p.Path == "" || !strings.HasPrefix(r.ACME.Storage, strings.TrimSuffix(p.Path, "/")+"/") {
		t.Errorf("%s: ACME storage %q not on Traefik's volume (persistence %+v): a restart would ask Let's Encrypt again", c.name, r.ACME.Storage, p)
	}
}

// chartService is the Service Traefik's chart makes, as each distribution
// configures it: k3s a LoadBalancer (served by its ServiceLB), rke2 a
// ClusterIP (its DaemonSet's pods take the node's ports themselves); with
// the values' service.spec merged into its spec, as the chart does.
func chartService(t *testing.T, name string, typ corev1.ServiceType, values traefiktest.Values) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
		Spec: corev1.ServiceSpec{
			Type:     typ,
			Selector: map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name + "-kube-system"},
			Ports: []corev1.ServicePort{
				{Name: "web", Port: 80, TargetPort: intstr.FromString("web"), Protocol: corev1.ProtocolTCP},
				{Name: "websecure", Port: 443, TargetPort: intstr.FromString("websecure"), Protocol: corev1.ProtocolTCP},
			},
		},
	}
	if values.Service != nil && values.Service.Spec != nil {
		b, err := json.Marshal(values.Service.Spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &svc.Spec); err != nil {
			t.Fatal(err)
		}
	}
	return svc
}

// TestKitTraefikService: the API server takes each distribution's
// Traefik Service with the kit's values (k3s's LoadBalancer with
// externalTrafficPolicy Local), and refuses k3s's values on rke2's
// ClusterIP Service: why traefik-rke2.yaml leaves the Service alone (a
// refused Service fails the chart's upgrade, and Traefik keeps its old
// settings).
func TestKitTraefikService(t *testing.T) {
	objs := loadKit(t)
	k3s, rke2 := traefikOf(t, objs, "traefik"), traefikOf(t, objs, "rke2-traefik")
	srv := Start(t)
	applyKit(t, srv.Admin, kitScheme(t), operatorNamespaces())
	kc, err := kubernetes.NewForConfig(srv.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict}
	for _, tt := range []struct {
		what string
		svc  *corev1.Service
		ok   bool
	}{
		{"k3s's Traefik with k3s's values", chartService(t, "traefik", corev1.ServiceTypeLoadBalancer, k3s.values), true},
		{"rke2's Traefik with rke2's values", chartService(t, "rke2-traefik", corev1.ServiceTypeClusterIP, rke2.values), true},
		{"rke2's Traefik with k3s's values", chartService(t, "rke2-traefik", corev1.ServiceTypeClusterIP, k3s.values), false},
	} {
		got, err := kc.CoreV1().Services("kube-system").Create(ctx, tt.svc, dryRun)
		switch {
		case tt.ok && err != nil:
			t.Errorf("%s: the API server refuses it: %v", tt.what, err)
		case tt.ok && tt.svc.Spec.ExternalTrafficPolicy != "" && got.Spec.ExternalTrafficPolicy != tt.svc.Spec.ExternalTrafficPolicy:
			t.Errorf("%s: stored with externalTrafficPolicy %q", tt.what, got.Spec.ExternalTrafficPolicy)
		case !tt.ok && (err == nil || !strings.Contains(err.Error(), "externalTrafficPolicy")):
			t.Errorf("%s: err = %v, want the API server's refusal of externalTrafficPolicy", tt.what, err)
		}
	}
}

// TestKitTrustedProxies: vmshelf believes the address Traefik forwards
// when, and only when, the connection comes from Traefik's pod network,
// and only in the header Traefik writes: every overlay's
// --trusted-proxies and --forwarded-header, read by vmshelf's own
// parsers, take a Traefik pod's address (k3s's and rke2's default
// cluster-cidr, 10.42.0.0/16) as a proxy and an outside address as the
// client, and ignore a Forwarded header, which Traefik passes on from the
// client untouched.
func TestKitTrustedProxies(t *testing.T) {
	client := netip.MustParseAddr("203.0.113.9")
	forwarded := func(name string) []string {
		switch name {
		case "X-Forwarded-For":
			return []string{"198.51.100.7"}
		case "Forwarded":
			return []string{"for=192.0.2.66"} // the client's own
		}
		return nil
	}
	for _, name := range kitOverlays {
		args := kitFind[*appsv1.Deployment](t, loadOverlay(t, name), "vmshelf").Spec.Template.Spec.Containers[0].Args
		list, _ := argValue(args, "--trusted-proxies")
		proxies, err := clientaddr.Parse(list)
		if err != nil {
			t.Fatalf("%s: --trusted-proxies %q: %v", name, list, err)
		}
		header, given := argValue(args, "--forwarded-header")
		trust := clientaddr.Trust{Proxies: proxies}
		if trust.Header, err = clientaddr.ParseHeader(header); err != nil || !given || trust.Header != clientaddr.XForwardedFor {
			t.Errorf("%s: --forwarded-header %q (given: %v, %v), want X-Forwarded-For, the one Traefik writes", name, header, given, err)
		}
		for _, pod := range []string{"10.42.0.17", "10.42.255.3"} {
			if got := trust.Client(netip.MustParseAddr(pod), forwarded); got.String() != "198.51.100.7" {
				t.Errorf("%s: from Traefik's pod %s vmshelf sees %s, not the client Traefik forwards", name, pod, got)
			}
		}
		if got := trust.Client(client, forwarded); got != client {
			t.Errorf("%s: from %s, outside the cluster, vmshelf believes a forwarded address (%s)", name, client, got)
		}
	}
}
