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
			if !named(layout, top, filepath.ToSlash(rel)) {
				t.Errorf("README's layout table does not name %s/%s", top, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// named reports whether layout names package rel of folder top: as rel in
// backquotes, or, in the row of a folder below top that holds it (a row
// that begins "| `internal/testkit/`"), as its path below that folder.
func named(layout, top, rel string) bool {
	if strings.Contains(layout, "`"+rel+"`") || strings.Contains(layout, "`"+rel+"/`") {
		return true
	}
	for _, line := range strings.Split(layout, "\n") {
		folder, ok := strings.CutPrefix(line, "| `"+top+"/")
		if !ok {
			continue
		}
		folder, _, ok = strings.Cut(folder, "`")
		below, inside := strings.CutPrefix(rel, folder)
		if ok && folder != "" && inside && (strings.Contains(line, "`"+below+"`") || strings.Contains(line, "`"+below+"/`")) {
			return true
		}
	}
	return false
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
