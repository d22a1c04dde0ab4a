package web

import (
	"os"
	"path/filepath"
	"testing"
)

// pageModule is the absolute path of the page's module name (static/name)
// for node to import: a copy, beside the page's other modules, in a folder
// whose package.json says they are ES modules. node of any version takes
// a .js file for CommonJS without one, and static/ holds none, since only
// the page's own files and the vendored ones may be there.
func pageModule(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	scripts, err := filepath.Glob(filepath.Join("static", "*.js"))
	if err != nil || len(scripts) == 0 {
		t.Fatalf("the page's modules: %v (%d)", err, len(scripts))
	}
	for _, s := range scripts {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(s)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"type": "module"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatalf("static/%s: %v", name, err)
	}
	return abs
}
