package sqlstore_test

import (
	"slices"
	"testing"
	"testing/fstest"

	"github.com/vmshelf/vmshelf/imagestore/sqlstore"
)

// TestMigrationsNumbered: the steps come in the files' order, and a gap,
// a repeated number or a file not named NNNN_name.sql is refused rather
// than applied as some other step.
func TestMigrationsNumbered(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	steps, err := sqlstore.Migrations(fstest.MapFS{
		"migrations/0002_b.sql": file("two"),
		"migrations/0001_a.sql": file("one"),
		"migrations/README.md":  file("not a step"),
	})
	if err != nil || !slices.Equal(steps, []string{"one", "two"}) {
		t.Fatalf("Migrations = %q, %v; want one, two", steps, err)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"a gap":         {"migrations/0001_a.sql": file("1"), "migrations/0003_c.sql": file("3")},
		"a repeat":      {"migrations/0001_a.sql": file("1"), "migrations/0001_b.sql": file("1b")},
		"no number":     {"migrations/schema.sql": file("1")},
		"no underscore": {"migrations/0001.sql": file("1")},
		"no file":       {},
	} {
		if steps, err := sqlstore.Migrations(fsys); err == nil {
			t.Errorf("%s: Migrations = %q, want an error", name, steps)
		}
	}
}
