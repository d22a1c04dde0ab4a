package kubetest

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
)

// TestStrictDecoder: the decoder the kit is read with refuses what a
// lenient one would drop without a word.
func TestStrictDecoder(t *testing.T) {
	s := kitScheme(t)
	tests := []struct {
		name, doc string
		ok        bool
	}{
		{"known fields", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 80}]}\n", true},
		{"misspelt field", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {prots: [{port: 80}]}\n", false},
		{"duplicate field", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nmetadata: {name: b}\n", false},
		{"unknown kind", "apiVersion: v1\nkind: Servise\nmetadata: {name: a}\n", false},
		{"KubeVirt field misspelt", "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: k}\nspec: {workload: {}}\n", false},
		{"CDI field of KubeVirt's spelling", "apiVersion: cdi.kubevirt.io/v1beta1\nkind: CDI\nmetadata: {name: c}\nspec: {workloads: {}}\n", false},
		{"comments only", "# nothing\n---\n# still nothing\n", true},
		{"HelmChartConfig", "apiVersion: helm.cattle.io/v1\nkind: HelmChartConfig\nmetadata: {name: traefik}\nspec: {valuesContent: 'a: 1'}\n", true},
		{"HelmChartConfig field misspelt", "apiVersion: helm.cattle.io/v1\nkind: HelmChartConfig\nmetadata: {name: traefik}\nspec: {valueContent: 'a: 1'}\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeStrict(s, tt.name, strings.NewReader(tt.doc))
			if (err == nil) != tt.ok {
				t.Fatalf("decode: err = %v, want ok = %v", err, tt.ok)
			}
		})
	}
}

// TestKitAccepted: a real kube-apiserver accepts every object of each
// overlay, as kubectl apply -k renders it, with strict field validation,
// and serves it back: a fresh API server for each, as each is a cluster's
// whole kit. KubeVirt's CRDs are its own (kubeVirtCRDs); CDI's and
// helm-controller's are stand-ins (standInCRDs).
func TestKitAccepted(t *testing.T) {
	for _, name := range kitOverlays {
		t.Run(name, func(t *testing.T) { applyReadBack(t, loadOverlay(t, name)) })
	}
}

// applyReadBack creates objs on a fresh API server, in order, with
// strict field validation, and reads each back.
func applyReadBack(t *testing.T, objs []kitObject) {
	t.Helper()
	srv := Start(t)
	registerCRDs(t, srv.Admin, operatorCRDs(t))
	applyKit(t, srv.Admin, kitScheme(t), operatorNamespaces())
	applyKit(t, srv.Admin, kitScheme(t), objs)

	dc, err := dynamic.NewForConfig(srv.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, o := range objs {
		m := o.obj.(metav1.Object)
		got, err := resourceFor(t, dc, o.gvk, m.GetNamespace()).Get(ctx, m.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Errorf("%v: read back: %v", o, err)
			continue
		}
		if got.GetUID() == "" || got.GetKind() != o.gvk.Kind {
			t.Errorf("%v: read back as %s uid %q", o, got.GetKind(), got.GetUID())
		}
	}
}
