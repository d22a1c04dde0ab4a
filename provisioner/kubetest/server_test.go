package kubetest

import (
	"testing"

	"k8s.io/client-go/kubernetes"
)

// TestStart: the API server answers with its version, the one this module builds.
func TestStart(t *testing.T) {
	s := Start(t)
	c, err := kubernetes.NewForConfig(s.Admin)
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	t.Logf("kube-apiserver %s", v.GitVersion)
}
