package kubetest

import (
	"encoding/json"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// kubeVirtJudge is one version of KubeVirt's CRDs in the API server.
type kubeVirtJudge struct {
	name string
	crds func(TB) []*apiextensionsv1.CustomResourceDefinition
}

// judges: KubeVirt v1.8.0's CRDs as its own generator makes them, and the
// same with v1.9.0's schemas (the edge's KubeVirt). In both, v1.8.0's VM
// admitter is the validating webhook (v1.9.0's cannot be built here).
var judges = []kubeVirtJudge{
	{name: "KubeVirt " + kubeVirtLinked + " CRDs", crds: kubeVirtCRDs},
	{name: "KubeVirt " + kubeVirtOfEdge + " schemas", crds: kubeVirtCRDsOfEdge},
}

// judgeServer is an API server with KubeVirt's CRDs of one judge, the
// stand-ins, the kit's RBAC and KubeVirt CR, and KubeVirt's VM admitter as
// its validating webhook.
type judgeServer struct {
	srv       *Server
	admission *vmAdmission
	dyn       dynamic.Interface
}

func startJudge(t TB, j kubeVirtJudge) *judgeServer {
	t.Helper()
	srv := Start(t)
	registerCRDs(t, srv.Admin, append(j.crds(t), standInCRDs()...))
	s := kitScheme(t)
	applyKit(t, srv.Admin, s, operatorNamespaces())
	applyKit(t, srv.Admin, s, provisionerIdentity(t, s))
	kvCR := loadKitFile(t, s, "components/market/kubevirt-cr.yaml")
	applyKit(t, srv.Admin, s, kvCR)
	kv, ok := kvCR[0].obj.(*kubevirtv1.KubeVirt)
	if len(kvCR) != 1 || !ok {
		t.Fatalf("kubevirt-cr.yaml holds %v, want the one KubeVirt CR", kvCR)
	}
	dyn, err := dynamic.NewForConfig(srv.Admin)
	if err != nil {
		t.Fatal(err)
	}
	return &judgeServer{srv: srv, admission: serveVMAdmission(t, srv.Admin, kv), dyn: dyn}
}

func fromUnstructured(u *unstructured.Unstructured, into any) error {
	b, err := json.Marshal(u.Object)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, into)
}
