package kubetest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
)

// The KubeVirt the edge installs is v1.9.0. Its code cannot be built here
// as a dependency (its pkg/controller, which the CRD generator and the
// admission webhooks import, needs kubevirt.io/virt-template-client-go
// v0.2.0, which the module proxy does not serve), so the CRDs are made by
// v1.8.0's own generator (components.New…Crd, linked into this test), and
// v1.9.0's schemas are read from v1.9.0's module and put in their place:
// one API server judges by each.
const (
	kubeVirtLinked  = "v1.8.0" // keep in step with go.mod's kubevirt.io/kubevirt
	kubeVirtOfEdge  = "v1.9.0"
	kubeVirtModule  = "kubevirt.io/kubevirt"
	validationsFile = "pkg/virt-operator/resource/generate/components/validations_generated.go"
)

// kubeVirtCRDFuncs are KubeVirt's generators of the CRDs of the kinds
// vmshelf writes (VirtualMachine by the provisioner, KubeVirt by the kit)
// and the VirtualMachineInstance that KubeVirt makes of a VirtualMachine
// (RBAC keeps the provisioner off it; TestRBAC asks the real resource).
var kubeVirtCRDFuncs = []func() (*apiextensionsv1.CustomResourceDefinition, error){
	components.NewVirtualMachineCrd,
	components.NewKubeVirtCrd,
	components.NewVirtualMachineInstanceCrd,
}

// kubeVirtCRDs are KubeVirt v1.8.0's own CRDs for those kinds, as its
// virt-operator installs them: schemas, versions, status subresources,
// printer columns.
func kubeVirtCRDs(t TB) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	crds := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(kubeVirtCRDFuncs))
	for _, newCRD := range kubeVirtCRDFuncs {
		crd, err := newCRD()
		if err != nil {
			t.Fatalf("KubeVirt %s's CRD generator: %v", kubeVirtLinked, err)
		}
		for _, v := range crd.Spec.Versions {
			if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil || len(v.Schema.OpenAPIV3Schema.Properties) == 0 {
				t.Fatalf("KubeVirt %s's CRD %s version %s has no schema", kubeVirtLinked, crd.Name, v.Name)
			}
		}
		crds = append(crds, crd)
	}
	return crds
}

// kubeVirtCRDsOfEdge are the same CRDs with every version's schema
// replaced by KubeVirt v1.9.0's, as v1.9.0's own generator does it
// (patchValidation: the CRD's singular name keys CRDsValidation).
func kubeVirtCRDsOfEdge(t TB) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	schemas := edgeSchemas(t)
	crds := kubeVirtCRDs(t)
	for _, crd := range crds {
		text, ok := schemas[crd.Spec.Names.Singular]
		if !ok {
			t.Fatalf("KubeVirt %s has no schema for %s", kubeVirtOfEdge, crd.Spec.Names.Singular)
		}
		for i := range crd.Spec.Versions {
			var v apiextensionsv1.CustomResourceValidation
			if err := k8syaml.NewYAMLToJSONDecoder(strings.NewReader(text)).Decode(&v); err != nil {
				t.Fatalf("KubeVirt %s's schema of %s: %v", kubeVirtOfEdge, crd.Name, err)
			}
			crd.Spec.Versions[i].Schema = &v
		}
	}
	return crds
}

var edgeSchemasOnce struct {
	sync.Once
	schemas map[string]string
	err     error
}

// edgeSchemas is KubeVirt v1.9.0's CRDsValidation map, read from
// validations_generated.go in its module (downloaded by the go command
// into the module cache, as any dependency is): each CRD's
// openAPIV3Schema as the YAML text its generator decodes.
func edgeSchemas(t TB) map[string]string {
	t.Helper()
	o := &edgeSchemasOnce
	o.Do(func() {
		var dir string
		if dir, o.err = moduleDir(kubeVirtModule + "@" + kubeVirtOfEdge); o.err == nil {
			o.schemas, o.err = readValidations(filepath.Join(dir, validationsFile))
		}
	})
	if o.err != nil {
		t.Fatalf("KubeVirt %s's schemas: %v", kubeVirtOfEdge, o.err)
	}
	return o.schemas
}

// moduleDir is where the go command keeps module@version, downloading it
// if it is not there yet.
func moduleDir(module string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", module)
	cmd.Dir = os.TempDir() // outside any module: only the module cache matters
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); jerr != nil || info.Error != "" || err != nil {
		return "", fmt.Errorf("go mod download %s: %v %s %s", module, err, info.Error, strings.TrimSpace(stderr.String()))
	}
	return info.Dir, nil
}

// readValidations parses the Go source of KubeVirt's generated validations
// and returns its CRDsValidation map literal: name → schema text.
func readValidations(path string) (map[string]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var lit *ast.CompositeLit
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "CRDsValidation" || len(vs.Values) != 1 {
			return lit == nil
		}
		lit, _ = vs.Values[0].(*ast.CompositeLit)
		return false
	})
	if lit == nil {
		return nil, fmt.Errorf("%s: no CRDsValidation map literal", path)
	}
	schemas := make(map[string]string, len(lit.Elts))
	for _, e := range lit.Elts {
		kv, ok := e.(*ast.KeyValueExpr)
		if !ok {
			return nil, fmt.Errorf("%s: CRDsValidation holds a %T", path, e)
		}
		k, kerr := stringLit(kv.Key)
		v, verr := stringLit(kv.Value)
		if kerr != nil || verr != nil {
			return nil, fmt.Errorf("%s: CRDsValidation entry: %v %v", path, kerr, verr)
		}
		schemas[k] = v
	}
	return schemas, nil
}

func stringLit(e ast.Expr) (string, error) {
	b, ok := e.(*ast.BasicLit)
	if !ok || b.Kind != token.STRING {
		return "", fmt.Errorf("not a string literal: %T", e)
	}
	return strconv.Unquote(b.Value)
}
