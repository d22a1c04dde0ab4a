package main

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// kitHostingDeployment is docs/deploy/base/vmshelf.yaml's Deployment: the
// pod kubectl apply -k docs/deploy/overlays/hosting runs (provisioner/
// kubetest checks that the overlay builds it as the file holds it).
func kitHostingDeployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	deps := kitObjects[appsv1.Deployment](t, "base/vmshelf.yaml", "Deployment")
	if len(deps) == 0 {
		t.Fatal("docs/deploy/base/vmshelf.yaml has no Deployment")
	}
	return &deps[0]
}

// kitObjects decodes the objects of kind in file, a path below docs/deploy,
// as the file holds them (the placeholders of values.env in place).
func kitObjects[T any](t *testing.T, file, kind string) []T {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "docs", "deploy", filepath.FromSlash(file)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var objs []T
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		var head struct {
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if head.Kind != kind {
			continue
		}
		var obj T
		if err := json.Unmarshal(raw, &obj); err != nil {
			t.Fatalf("%s: %s: %v", file, kind, err)
		}
		objs = append(objs, obj)
	}
}

// TestKitHostingServes: the kit's image hosting, as its Deployment runs
// serve, starts where no Stripe Secret and no cluster exist (no STRIPE_*
// variable, no service account, no kubeconfig), is ready, and hands out
// upload tickets; only the pod's own places (its data dir and addresses)
// are this test's.
func TestKitHostingServes(t *testing.T) {
	dep := kitHostingDeployment(t)
	c := dep.Spec.Template.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("args %q, want serve …", c.Args)
	}
	var args []string
	for _, a := range c.Args[1:] {
		name, _, _ := strings.Cut(a, "=")
		switch name {
		case "--data-dir", "--data-addr", "--control-addr": // the pod's
		default:
			args = append(args, a)
		}
	}
	for _, e := range c.Env {
		t.Errorf("the Deployment sets %s: image hosting needs no variable of its own", e.Name)
	}
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "STRIPE_") || strings.HasPrefix(k, "KUBERNETES_") || k == "KUBECONFIG" {
			env = append(env, k+"=") // cleared: serve must not find them
		}
	}
	s := startServe(t, t.TempDir(), args, env...)
	resp, err := httpClient.Get(s.ctlBase + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz %d with the kit's hosting flags %q", resp.StatusCode, args)
	}
	tk := s.ticket(t, "kit-hosting")
	if !strings.HasPrefix(tk.UploadURL, "https://vmshelf.example.net/market/vm-images/upload/") {
		t.Errorf("upload URL %q, want it on the kit's --public-url", tk.UploadURL)
	}
}
