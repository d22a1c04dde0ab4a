package sqlstore_test

import (
	"database/sql"
	"maps"
	"path/filepath"
	"slices"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver

	"github.com/vmshelf/vmshelf/imagestore/postgres"
	"github.com/vmshelf/vmshelf/imagestore/postgres/pgtest"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
)

// column is what the engines' schemas must agree on for one column: its
// type, as the kind of value sqlstore binds and scans (the engines spell
// it differently), and whether it may be NULL.
type column struct {
	Kind     string
	Nullable bool
}

// sqliteKinds and postgresKinds map each engine's declared types to the
// kind sqlstore treats them as: integers (times in nanoseconds, flags,
// counts), text and bytes. A type in neither map is reported, so a new
// one must be mapped here before the engines can be said to agree.
var (
	sqliteKinds   = map[string]string{"INTEGER": "integer", "TEXT": "text", "BLOB": "bytes"}
	postgresKinds = map[string]string{"bigint": "integer", "integer": "integer", "smallint": "integer",
		"text": "text", "bytea": "bytes"}
)

// engineOnly are each engine's own bookkeeping tables, outside the
// records sqlstore reads and writes.
var engineOnly = map[string]bool{"vmshelf_schema": true}

// TestEnginesHaveOneSchema: a fresh SQLite store and a fresh PostgreSQL
// store have the same tables with the same columns, of the same kinds and
// nullability. sqlstore's statements are written once for both, so a
// column one engine's migrations lack (or type otherwise) is a statement
// that fails, or a value that round-trips differently, on that engine
// only.
func TestEnginesHaveOneSchema(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "vmshelf.db")
	ls, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("open SQLite: %v", err)
	}
	if err := ls.Close(); err != nil {
		t.Fatal(err)
	}
	cluster := pgtest.Start(t)
	url := cluster.NewDatabase(t)
	ps, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatalf("open PostgreSQL: %v", err)
	}
	if err := ps.Close(); err != nil {
		t.Fatal(err)
	}

	lite := sqliteColumns(t, path)
	pg := postgresColumns(t, url)
	for _, table := range slices.Sorted(maps.Keys(lite)) {
		if _, ok := pg[table]; !ok {
			t.Errorf("table %s is in SQLite's schema, not in PostgreSQL's", table)
		}
	}
	for _, table := range slices.Sorted(maps.Keys(pg)) {
		lcols, ok := lite[table]
		if !ok {
			t.Errorf("table %s is in PostgreSQL's schema, not in SQLite's", table)
			continue
		}
		pcols := pg[table]
		for _, name := range slices.Sorted(maps.Keys(pcols)) {
			l, ok := lcols[name]
			switch {
			case !ok:
				t.Errorf("column %s.%s is in PostgreSQL's schema, not in SQLite's", table, name)
			case l != pcols[name]:
				t.Errorf("column %s.%s is %+v in SQLite, %+v in PostgreSQL", table, name, l, pcols[name])
			}
		}
		for _, name := range slices.Sorted(maps.Keys(lcols)) {
			if _, ok := pcols[name]; !ok {
				t.Errorf("column %s.%s is in SQLite's schema, not in PostgreSQL's", table, name)
			}
		}
	}
	if len(lite) == 0 || len(pg) == 0 {
		t.Fatalf("found %d tables in SQLite, %d in PostgreSQL", len(lite), len(pg))
	}
}

// sqliteColumns reads the columns of the closed SQLite store at path,
// through a plain connection of the driver the store registered.
func sqliteColumns(t *testing.T, path string) map[string]map[string]column {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	return columns(t, db, "SQLite", sqliteKinds, `
SELECT m.name, p.name, upper(p.type), p."notnull" = 0 AND p.pk = 0
FROM sqlite_schema AS m, pragma_table_info(m.name) AS p
WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite\_%' ESCAPE '\'`)
}

// postgresColumns reads the columns of the PostgreSQL database at url.
func postgresColumns(t *testing.T, url string) map[string]map[string]column {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	return columns(t, db, "PostgreSQL", postgresKinds, `
SELECT table_name, column_name, data_type, is_nullable = 'YES'
FROM information_schema.columns WHERE table_schema = 'public'`)
}

// columns runs query, whose rows are (table, column, declared type,
// nullable), and maps each column to its kind.
func columns(t *testing.T, db *sql.DB, engine string, kinds map[string]string, query string) map[string]map[string]column {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	tables := map[string]map[string]column{}
	for rows.Next() {
		var table, name, typ string
		var nullable bool
		if err := rows.Scan(&table, &name, &typ, &nullable); err != nil {
			t.Fatal(err)
		}
		add(t, tables, engine, table, name, kinds, typ, nullable)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return tables
}

// add records a column under its kind, unless its table is an engine's
// own or its type is one sqlstore does not know.
func add(t *testing.T, tables map[string]map[string]column, engine, table, name string, kinds map[string]string, typ string, nullable bool) {
	t.Helper()
	if engineOnly[table] {
		return
	}
	kind, ok := kinds[typ]
	if !ok {
		t.Errorf("%s column %s.%s has type %s, which neither engine's mapping knows", engine, table, name, typ)
		kind = typ
	}
	if tables[table] == nil {
		tables[table] = map[string]column{}
	}
	tables[table][name] = column{Kind: kind, Nullable: nullable}
}
