package repotest

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeLayoutNamesEveryPackage: README's layout table names every
// package under internal/ and imagestore/, each in backquotes as its path
// below that folder, so that a package added without a word on what it is
// for fails here.
func TestReadmeLayoutNamesEveryPackage(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	start := strings.Index(readme, "\n## Layout\n")
	if start < 0 {
		t.Fatal(`README has no "## Layout" section`)
	}
	layout := readme[start:]
	if end := strings.Index(layout[1:], "\n## "); end >= 0 {
		layout = layout[:end+1]
	}
	for _, top := range []string{"internal", "imagestore"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			if d.Name() == "testdata" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			rel, _ := filepath.Rel(filepath.Join(root, top), p)
			if rel == "." || !hasGoFiles(t, p) {
				return nil
			}
			if !strings.Contains(layout, "`"+filepath.ToSlash(rel)+"`") && !strings.Contains(layout, "`"+filepath.ToSlash(rel)+"/`") {
				t.Errorf("README's layout table does not name %s/%s", top, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// hasGoFiles reports whether dir holds a .go file of its own.
func hasGoFiles(t *testing.T, dir string) bool {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".go") {
			return true
		}
	}
	return false
}
