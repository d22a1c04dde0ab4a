package repotest

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/vmshelf/vmshelf"

// TestImportFloors holds the layout's floors in the import graph: the
// store is the ground floor, so nothing under imagestore/ (its tests
// included) imports a package of this module that itself depends on the
// store; and the provisioner's code, which meets the market only in the
// store, imports nothing under market/ (one of its tests does, to see that
// the buyer's status shows what a pass wrote to the store).
func TestImportFloors(t *testing.T) {
	needTool(t, "go")
	pkgs := listPackages(t)
	deps := map[string][]string{} // this module's packages each depends on
	for _, p := range pkgs {
		deps[p.ImportPath] = p.Deps
	}
	dependsOnStore := func(path string) bool {
		for _, d := range deps[path] {
			if d == module+"/imagestore" {
				return true
			}
		}
		return false
	}
	for _, p := range pkgs {
		own := append(append(append([]string{}, p.Imports...), p.TestImports...), p.XTestImports...)
		for _, imp := range own {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			if under(p.ImportPath, "imagestore") && !under(imp, "imagestore") && dependsOnStore(imp) {
				t.Errorf("%s imports %s, which depends on the store: the store's floor would rest on the one above it", p.ImportPath, imp)
			}
			if under(p.ImportPath, "provisioner") && under(imp, "market") && slices.Contains(p.Imports, imp) {
				t.Errorf("%s imports %s: the provisioner meets the market only in the store", p.ImportPath, imp)
			}
		}
	}
}

// under reports whether path is folder (of this module) or below it.
func under(path, folder string) bool {
	return path == module+"/"+folder || strings.HasPrefix(path, module+"/"+folder+"/")
}

// goPackage is what go list says of a package.
type goPackage struct {
	ImportPath                         string
	Deps                               []string
	Imports, TestImports, XTestImports []string
}

// listPackages lists every package of the main module (the kubetest
// module, a module of its own, is not among them).
func listPackages(t *testing.T) []goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Deps,Imports,TestImports,XTestImports", "./...")
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p goPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 50 {
		t.Fatalf("go list found %d packages; the module has more", len(pkgs))
	}
	return pkgs
}
