package sqlstore

import (
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
)

// Migrations reads an engine's schema from fsys: the files
// migrations/NNNN_name.sql, step 1 first. Both engines keep their schema
// so, and count in the database the steps it has applied, so that step i
// is the file numbered i: a gap or a repeated number (two branches that
// each added "the next" file) is refused here rather than skipping or
// reordering a step on some databases.
func Migrations(fsys fs.FS) ([]string, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	slices.Sort(names)
	steps := make([]string, len(names))
	for i, n := range names {
		base := path.Base(n)
		num, err := strconv.Atoi(base[:min(4, len(base))])
		if err != nil || len(base) < 5 || base[4] != '_' || num != i+1 {
			return nil, fmt.Errorf("migrations: %s is not step %d (want %04d_name.sql)", base, i+1, i+1)
		}
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, fmt.Errorf("migrations: %w", err)
		}
		steps[i] = string(b)
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("migrations: no migrations/*.sql")
	}
	return steps, nil
}
