package kubetest

import (
	"bytes"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/vmshelf/vmshelf/internal/imagespec"
)

// The kit as kubectl apply -k renders it: kustomize's own Go API
// (sigs.k8s.io/kustomize/api/krusty, the version kubectl 1.34 embeds) on
// each overlay, with the options kubectl uses (files only from inside a
// kustomization's own directory).

// kitOverlays are the directories below docs/deploy/overlays, each a
// cluster's whole kit: image hosting alone, with the VM market, and the
// market scaled out.
var kitOverlays = []string{"hosting", "market", "market-scale-out"}

// valuesFile is the one file an operator edits, below docs/deploy.
const valuesFile = "values/values.env"

// loadKit is the full edge, hosting and the market: the market overlay.
func loadKit(t testing.TB) []kitObject {
	t.Helper()
	return loadOverlay(t, "market")
}

// loadOverlay renders docs/deploy/overlays/<name> from the repository.
func loadOverlay(t testing.TB, name string) []kitObject {
	t.Helper()
	return renderOverlay(t, filesys.MakeFsOnDisk(), filepath.Join(kitDir, "overlays", name))
}

// renderOverlay runs kustomize's build of dir on fsys and decodes its
// output as the kit's files are decoded: strictly, every kind known.
func renderOverlay(t testing.TB, fsys filesys.FileSystem, dir string) []kitObject {
	t.Helper()
	objs, err := decodeStrict(kitScheme(t), "kustomize build "+filepath.Base(dir), bytes.NewReader(buildOverlay(t, fsys, dir)))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// buildOverlay is kustomize's build of dir, the YAML kubectl would send.
func buildOverlay(t testing.TB, fsys filesys.FileSystem, dir string) []byte {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	y, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return y
}

// kitCopy is the kit in memory, as on disk but for the files given
// (path below docs/deploy → content), at /kit.
func kitCopy(t testing.TB, replace map[string]string) filesys.FileSystem {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir(kitDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(kitDir, p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if r, ok := replace[filepath.ToSlash(rel)]; ok {
			b = []byte(r)
		}
		return mem.WriteFile(path.Join("/kit", filepath.ToSlash(rel)), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	return mem
}

// kustomizationDoc is the part of kustomize's Kustomization (and
// Component) the kit uses, read strictly: a field kustomize does not know,
// or the kit does not use, fails.
type kustomizationDoc struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Components []string `json:"components"`
	Patches    []struct {
		Path   string `json:"path"`
		Patch  string `json:"patch"`
		Target *struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"target"`
	} `json:"patches"`
	Images []struct {
		Name   string `json:"name"`
		NewTag string `json:"newTag"`
	} `json:"images"`
	ConfigMapGenerator []struct {
		Name    string   `json:"name"`
		Envs    []string `json:"envs"`
		Options struct {
			DisableNameSuffixHash bool              `json:"disableNameSuffixHash"`
			Annotations           map[string]string `json:"annotations"`
		} `json:"options"`
	} `json:"configMapGenerator"`
	Replacements []kustomizeReplacement `json:"replacements"`
}

type kustomizeReplacement struct {
	Source struct {
		Kind      string `json:"kind"`
		Name      string `json:"name"`
		FieldPath string `json:"fieldPath"`
	} `json:"source"`
	Targets []struct {
		Select struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"select"`
		FieldPaths []string `json:"fieldPaths"`
		Options    *struct {
			Delimiter string `json:"delimiter"`
			Index     int    `json:"index"`
		} `json:"options"`
	} `json:"targets"`
}

func readKustomization(t testing.TB, dir string) kustomizationDoc {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(kitDir, dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomizationDoc
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	return k
}

// TestKitFilesListed: every file below docs/deploy but the guide is read
// by a kustomization that an overlay reaches (so kubectl apply -k applies
// it and TestKitAccepted sends it to the API server), or is the operators'
// script and its pins (TestKitOperators); a new file cannot ship unchecked.
func TestKitFilesListed(t *testing.T) {
	used := map[string]bool{"README.md": true, "operators.sh": true, "releases.sha256": true}
	seen := map[string]bool{}
	var visit func(dir string)
	visit = func(dir string) {
		if seen[dir] {
			return
		}
		seen[dir] = true
		used[path.Join(dir, "kustomization.yaml")] = true
		k := readKustomization(t, dir)
		var files []string
		files = append(files, k.Resources...)
		for _, p := range k.Patches {
			if p.Path != "" {
				files = append(files, p.Path)
			}
		}
		for _, g := range k.ConfigMapGenerator {
			files = append(files, g.Envs...)
		}
		for _, f := range files {
			p := path.Join(dir, f)
			if st, err := os.Stat(filepath.Join(kitDir, p)); err == nil && st.IsDir() {
				visit(p)
			} else {
				used[p] = true
			}
		}
		for _, c := range k.Components {
			visit(path.Join(dir, c))
		}
	}
	for _, o := range kitOverlays {
		visit(path.Join("overlays", o))
	}
	var found []string
	err := filepath.WalkDir(kitDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(kitDir, p)
		found = append(found, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		if !used[f] {
			t.Errorf("docs/deploy/%s is in no overlay: kubectl apply -k never applies it, and no test checks it", f)
		}
	}
	for f := range used {
		if !slices.Contains(found, f) {
			t.Errorf("a kustomization names %s, which docs/deploy does not have", f)
		}
	}
	overlays, err := os.ReadDir(filepath.Join(kitDir, "overlays"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range overlays {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, slices.Sorted(slices.Values(kitOverlays))) {
		t.Errorf("docs/deploy/overlays has %v; the tests render %v", names, kitOverlays)
	}
}

// kitKey names an object as kubectl does: its kind, namespace and name.
type kitKey struct{ kind, namespace, name string }

func keyOf(o kitObject) kitKey {
	m := o.obj.(metav1.Object)
	return kitKey{o.gvk.Kind, m.GetNamespace(), m.GetName()}
}

// byKey indexes objs by their key; a key met twice fails.
func byKey(t *testing.T, what string, objs []kitObject) map[kitKey]kitObject {
	t.Helper()
	out := map[kitKey]kitObject{}
	for _, o := range objs {
		k := keyOf(o)
		if _, dup := out[k]; dup {
			t.Fatalf("%s holds %v twice", what, k)
		}
		out[k] = o
	}
	return out
}

// filesObjects decodes the manifests below docs/deploy, by key.
func filesObjects(t *testing.T, files ...string) map[kitKey]kitObject {
	t.Helper()
	s := kitScheme(t)
	var objs []kitObject
	for _, f := range files {
		objs = append(objs, loadKitFile(t, s, f)...)
	}
	return byKey(t, strings.Join(files, ", "), objs)
}

// The manifests of base and of the market component.
var (
	baseFiles   = []string{"base/namespace.yaml", "base/vmshelf.yaml", "base/ingress.yaml", "base/traefik-k3s.yaml", "base/traefik-rke2.yaml"}
	marketFiles = []string{"components/market/rbac.yaml", "components/market/storageclass.yaml",
		"components/market/kubevirt-cr.yaml", "components/market/cdi-cr.yaml"}
)

// TestKitOverlays: each overlay builds exactly the objects of the files it
// is made of, and those objects as the files hold them (the shipped
// values.env holds the placeholders themselves), but for vmshelf's
// Deployment, which the market and the scale-out patch: image hosting is
// base alone; the market adds its files' objects; the scale-out drops the
// single pod's volume. Every Deployment runs make image's image, by the
// tag base's images: gives it.
func TestKitOverlays(t *testing.T) {
	base := readKustomization(t, "base")
	if !slices.Equal(base.Resources, []string{"namespace.yaml", "vmshelf.yaml", "ingress.yaml", "traefik-k3s.yaml", "traefik-rke2.yaml"}) {
		t.Errorf("base resources %q", base.Resources)
	}
	if len(base.Images) != 1 || base.Images[0].Name != imagespec.Repository || base.Images[0].NewTag != imagespec.KitTag {
		t.Errorf("base images %+v, want %s with tag %s", base.Images, imagespec.Repository, imagespec.KitTag)
	}
	for name, want := range map[string][]string{
		"hosting":          {"../../values"},
		"market":           {"../../values", "../../components/market"},
		"market-scale-out": {"../../values", "../../components/market", "../../components/scale-out"},
	} {
		k := readKustomization(t, path.Join("overlays", name))
		if !slices.Equal(k.Resources, []string{"../../base"}) || !slices.Equal(k.Components, want) {
			t.Errorf("overlay %s: resources %q components %q, want ../../base and %q (the values first: the other components read them)",
				name, k.Resources, k.Components, want)
		}
	}

	deployment := kitKey{"Deployment", vmshelfNamespace, "vmshelf"}
	volume := kitKey{"PersistentVolumeClaim", vmshelfNamespace, "vmshelf-data"}
	for name, files := range map[string][]string{
		"hosting":          baseFiles,
		"market":           append(slices.Clone(baseFiles), marketFiles...),
		"market-scale-out": append(slices.Clone(baseFiles), marketFiles...),
	} {
		t.Run(name, func(t *testing.T) {
			want := filesObjects(t, files...)
			if name == "market-scale-out" {
				delete(want, volume)
			}
			got := byKey(t, name, loadOverlay(t, name))
			if !slices.Equal(sortedKitKeys(got), sortedKitKeys(want)) {
				t.Fatalf("overlay %s builds %v\nits files hold %v", name, sortedKitKeys(got), sortedKitKeys(want))
			}
			for k, w := range want {
				if k == deployment && name != "hosting" {
					continue // patched: TestKitVmshelf, TestKitScaleOut
				}
				if !apiequality.Semantic.DeepEqual(got[k].obj, w.obj) {
					t.Errorf("overlay %s: %v is not as %s holds it", name, k, w.file)
				}
			}
			dep := got[deployment].obj.(*appsv1.Deployment)
			if img := dep.Spec.Template.Spec.Containers[0].Image; img != imagespec.Repository+":"+imagespec.KitTag {
				t.Errorf("overlay %s runs %s", name, img)
			}
		})
	}
}

func sortedKitKeys(m map[kitKey]kitObject) []kitKey {
	var keys []kitKey
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b kitKey) int {
		return strings.Compare(a.kind+"/"+a.namespace+"/"+a.name, b.kind+"/"+b.namespace+"/"+b.name)
	})
	return keys
}

// sortedKeys are m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// readValues reads a values.env as kustomize's configMapGenerator does:
// KEY=VALUE lines, "#" comments and blank lines skipped; a key twice
// fails.
func readValues(t *testing.T, text string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is no KEY=VALUE", valuesFile, line)
		}
		if _, dup := out[k]; dup {
			t.Fatalf("%s sets %s twice", valuesFile, k)
		}
		out[k] = v
	}
	return out
}

// otherValues are an edge's own values, none of them the shipped ones.
var otherValues = map[string]string{
	"data_host":         "uploads.shelf.test",
	"control_host":      "machines.shelf.test",
	"vms_domain":        "run.shelf.test",
	"acme_email":        "certs@shelf.test",
	"appliance":         "box7",
	"trusted_proxies":   "10.99.0.0/16,fd00:42::/56",
	"blobs":             "s3://shelf/images",
	"blob_capacity_gib": "750",
}

// TestKitValues: values.env is the one place of the edge's names and
// choices. Its keys are exactly those the kit's replacements read; and
// each overlay rendered with other values holds none of the shipped ones
// anywhere, and the other values in every field that carries one: the
// Deployment's flags and node, the Ingresses' hosts and certificates, and
// Traefik's ACME e-mail. No other file needs an edit.
func TestKitValues(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(kitDir, valuesFile))
	if err != nil {
		t.Fatal(err)
	}
	shipped := readValues(t, string(b))
	if !slices.Equal(sortedKeys(shipped), sortedKeys(otherValues)) {
		t.Fatalf("%s sets %v; the test knows %v", valuesFile, sortedKeys(shipped), sortedKeys(otherValues))
	}
	read := map[string]bool{}
	for _, dir := range []string{"values", "components/market", "components/scale-out"} {
		for _, r := range readKustomization(t, dir).Replacements {
			key, ok := strings.CutPrefix(r.Source.FieldPath, "data.")
			if r.Source.Kind != "ConfigMap" || r.Source.Name != "vmshelf-values" || !ok {
				t.Errorf("%s: a replacement from %+v, not from values.env", dir, r.Source)
			}
			if _, known := shipped[key]; !known {
				t.Errorf("%s reads %s, which %s does not set", dir, key, valuesFile)
			}
			read[key] = true
		}
	}
	for k := range shipped {
		if !read[k] {
			t.Errorf("%s sets %s, which nothing reads", valuesFile, k)
		}
	}

	var text strings.Builder
	for _, k := range sortedKeys(otherValues) {
		text.WriteString(k + "=" + otherValues[k] + "\n")
	}
	fsys := kitCopy(t, map[string]string{valuesFile: text.String()})
	v := otherValues
	for _, name := range kitOverlays {
		t.Run(name, func(t *testing.T) {
			dir := path.Join("/kit/overlays", name)
			y := string(buildOverlay(t, fsys, dir))
			for k, old := range shipped {
				if k != "appliance" && strings.Contains(y, old) { // "edge" is a word of other fields too
					t.Errorf("the shipped %s %q is still in the build", k, old)
				}
			}
			objs := renderOverlay(t, fsys, dir)
			dep := kitFind[*appsv1.Deployment](t, objs, "vmshelf")
			args := dep.Spec.Template.Spec.Containers[0].Args
			want := map[string]string{
				"--public-url":          "https://" + v["data_host"],
				"--checkout-return-url": "https://" + v["control_host"] + "/machines",
				"--trusted-proxies":     v["trusted_proxies"],
			}
			if name != "hosting" {
				want["--vms-domain"] = v["vms_domain"]
			}
			if name == "market-scale-out" {
				want["--blobs"], want["--blob-capacity-gib"] = v["blobs"], v["blob_capacity_gib"]
			} else if got := dep.Spec.Template.Spec.NodeSelector[applianceLabel]; got != v["appliance"] {
				t.Errorf("vmshelf runs on %s=%q, want %q", applianceLabel, got, v["appliance"])
			}
			for flag, w := range want {
				if got, _ := argValue(args, flag); got != w {
					t.Errorf("%s %q, want %q", flag, got, w)
				}
			}
			for ing, host := range map[string]string{"vmshelf-data": v["data_host"], "vmshelf-control": v["control_host"]} {
				checkIngressTLS(t, kitFind[*networkingv1.Ingress](t, objs, ing), host)
			}
			for _, h := range []string{"traefik", "rke2-traefik"} {
				if got := traefikOf(t, objs, h).acmeEmail(); got != v["acme_email"] {
					t.Errorf("%s: ACME e-mail %q, want %q", h, got, v["acme_email"])
				}
			}
		})
	}
}
