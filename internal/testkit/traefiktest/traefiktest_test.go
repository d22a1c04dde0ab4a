package traefiktest

import (
	"reflect"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestValues: the chart's values are read strictly, and give the
// arguments the chart's pod template writes, the volume's mount moved.
func TestValues(t *testing.T) {
	v, err := ParseValues(`
ports:
  websecure:
    transport:
      respondingTimeouts:
        readTimeout: 6h
persistence:
  enabled: true
  path: /data
additionalArguments:
  - --certificatesresolvers.le.acme.storage=/data/acme.json
  - --certificatesresolvers.le.acme.email=ops@example.net
  - --log.filePath=/database/x
`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"--entryPoints.websecure.transport.respondingTimeouts.readTimeout=6h",
		"--certificatesresolvers.le.acme.storage=/tmp/vol/acme.json",
		"--certificatesresolvers.le.acme.email=ops@example.net",
		"--log.filePath=/database/x",
	}
	if got := v.Args("/tmp/vol"); !reflect.DeepEqual(got, want) {
		t.Errorf("Args = %q, want %q", got, want)
	}
	for _, bad := range []string{
		"ports:\n  websecure:\n    transport:\n      respondingTimeout:\n        readTimeout: 6h\n",
		"additionalArgument:\n  - --x=y\n",
		"service:\n  spec:\n    externalTraficPolicy: Local\n",
	} {
		if _, err := ParseValues(bad); err == nil {
			t.Errorf("ParseValues(%q) took a key the chart does not have", bad)
		}
	}
}

// TestRoutes: an Ingress becomes the routers Traefik's Ingress provider
// makes of it; an annotation of Traefik's the routes do not follow, or a
// backend the test does not run, is an error.
func TestRoutes(t *testing.T) {
	prefix, exact := networkingv1.PathTypePrefix, networkingv1.PathTypeExact
	backend := func(name string, port int32) networkingv1.IngressBackend {
		return networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
			Name: name, Port: networkingv1.ServiceBackendPort{Number: port}}}
	}
	ing := networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", Annotations: map[string]string{
			entryPointsKey: "websecure", tlsKey: "true", certResolverKey: "le"}},
		Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{{
			Host: "a.example.net",
			IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{
				{Path: "/up/", PathType: &prefix, Backend: backend("svc", 80)},
				{Path: "/exact", PathType: &exact, Backend: backend("svc", 80)},
			}}},
		}}},
	}
	h, err := Routes([]networkingv1.Ingress{ing}, map[string]string{"svc:80": "127.0.0.1:9"})
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, r := range h.Routers {
		if r.Service != "ns-svc-80" || r.TLS == nil || !reflect.DeepEqual(r.EntryPoints, []string{"websecure"}) {
			t.Errorf("router %+v", r)
		}
		rules = append(rules, r.Rule)
	}
	for _, want := range []string{`Host("a.example.net") && PathPrefix("/up/")`, `Host("a.example.net") && Path("/exact")`} {
		if !strings.Contains(strings.Join(rules, "\n"), want) {
			t.Errorf("rules %q lack %s", rules, want)
		}
	}
	if s := h.Services["ns-svc-80"].LoadBalancer.Servers; len(s) != 1 || s[0].URL != "http://127.0.0.1:9" {
		t.Errorf("service servers %+v", s)
	}
	if _, err := Routes([]networkingv1.Ingress{ing}, nil); err == nil {
		t.Error("a backend the test does not run was routed")
	}
	ing.Annotations[annotationPrefix+"router.middlewares"] = "ns-strip@kubernetescrd"
	if _, err := Routes([]networkingv1.Ingress{ing}, map[string]string{"svc:80": "127.0.0.1:9"}); err == nil {
		t.Error("an annotation the routes do not follow was left out without a word")
	}
}
