package reason

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// moduleRoot is the module's top seen from this package's directory.
var moduleRoot = filepath.Join("..", "..")

// TestTableIsWhole: All lists every declared entry once, no two entries
// are one answer (status and name), and Fields every field reason: the
// tests that hold the docs and the page to the table read All and Fields,
// so an entry left out of them would go unchecked.
func TestTableIsWhole(t *testing.T) {
	codes, consts := declared(t)
	all := All()
	if len(all) != len(codes) {
		t.Errorf("All lists %d entries; %d are declared", len(all), len(codes))
	}
	seen := map[Code]bool{}
	camel := regexp.MustCompile(`^[a-z][A-Za-z0-9]*$`)
	for _, c := range all {
		if seen[c] {
			t.Errorf("All lists %d %s twice", c.Status(), c.Name())
		}
		seen[c] = true
		if !camel.MatchString(c.Name()) || c.Status() < 400 || c.Status() > 599 || c.Words() == "" {
			t.Errorf("entry %d %q %q: want an error status, a lowerCamel name and words", c.Status(), c.Name(), c.Words())
		}
		for d := range seen {
			if d != c && d.Status() == c.Status() && d.Name() == c.Name() {
				t.Errorf("two entries answer %d %s", c.Status(), c.Name())
			}
		}
	}
	fields := Fields()
	slices.Sort(fields)
	var want []string
	for _, v := range consts {
		want = append(want, v)
	}
	slices.Sort(want)
	if !slices.Equal(fields, want) {
		t.Errorf("Fields is %q; the constants are %q", fields, want)
	}
}

// declared reads this package's declarations: the Go names of its Code
// entries, and its string constants (Go name → reason).
func declared(t *testing.T) (codes []string, consts map[string]string) {
	t.Helper()
	consts = map[string]string{}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var decls []ast.Decl
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		decls = append(decls, f.Decls...)
	}
	for _, decl := range decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || (gd.Tok != token.VAR && gd.Tok != token.CONST) {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, v := range vs.Values {
				switch x := v.(type) {
				case *ast.CompositeLit:
					codes = append(codes, vs.Names[i].Name)
				case *ast.BasicLit:
					consts[vs.Names[i].Name], _ = strconv.Unquote(x.Value)
				}
			}
		}
	}
	if len(codes) < 40 || len(consts) == 0 {
		t.Fatalf("read %d entries and %d constants; the test no longer reads the table", len(codes), len(consts))
	}
	return codes, consts
}

// TestNoReasonOutsideTheTable walks every non-test Go file of the module
// and fails where a reason of an error answer is written as a literal
// instead of named from the table: as the reason of apierr.New or Wrap,
// as the Reason of an apierr.Error literal or an assignment to a Reason
// field, or compared with a reason field (==, !=, a switch's case). A
// reason written again is one a rename of the table's entry silently
// leaves behind. It fails too on an entry no code names: the docs would
// describe an answer nobody gives.
func TestNoReasonOutsideTheTable(t *testing.T) {
	names := map[string]bool{}
	for _, c := range All() {
		names[c.Name()] = true
	}
	codes, consts := declared(t)
	unused := map[string]bool{}
	for _, n := range codes {
		unused[n] = true
	}
	for n := range consts {
		unused[n] = true
	}
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(moduleRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != moduleRoot && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules" || isModule(p)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			return err
		}
		files++
		inTable := filepath.Dir(p) == filepath.Join(moduleRoot, "internal", "reason")
		ast.Inspect(f, func(n ast.Node) bool {
			for _, lit := range reasonLiterals(n, f.Name.Name, names) {
				t.Errorf("%s: the reason %s is written here; name the table's entry (internal/reason)", fset.Position(lit.Pos()), lit.Value)
			}
			if sel, ok := n.(*ast.SelectorExpr); ok && !inTable {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == "reason" {
					delete(unused, sel.Sel.Name)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read %d Go files under %s; the walk no longer finds the module", files, moduleRoot)
	}
	for n := range unused {
		t.Errorf("reason.%s is named by no code: remove it (and its docs) or answer it", n)
	}
}

// isModule reports whether dir is the top of a module of its own, whose
// files are not this module's.
func isModule(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

// reasonLiterals are the reason literals n writes: for an apierr.New or
// Wrap call, its reason argument if that is a literal (a string, or a Code
// made up on the spot); for an apierr.Error or Body literal (inside
// package apierr, Error or Body), a string literal given as the reason;
// for an assignment to a reason field, a comparison with one or a switch
// on one, a literal that is one of the table's names (other reason fields,
// such as an order's, hold other words).
func reasonLiterals(n ast.Node, pkg string, names map[string]bool) []*ast.BasicLit {
	var out []*ast.BasicLit
	switch x := n.(type) {
	case *ast.CallExpr:
		if recv, fn := selector(x.Fun); recv == "apierr" && (fn == "New" || fn == "Wrap") && len(x.Args) > 0 {
			switch arg := x.Args[len(x.Args)-1].(type) {
			case *ast.BasicLit:
				out = append(out, arg)
			case *ast.CompositeLit:
				out = append(out, &ast.BasicLit{ValuePos: arg.Pos(), Kind: token.STRING, Value: "Code{…}"})
			}
		}
	case *ast.CompositeLit:
		recv, typ := selector(x.Type)
		if id, ok := x.Type.(*ast.Ident); ok && pkg == "apierr" {
			recv, typ = "apierr", id.Name
		}
		if recv == "apierr" && (typ == "Error" || typ == "Body") {
			for _, e := range x.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok && isReasonField(kv.Key) {
					out = append(out, stringLit(kv.Value, nil)...)
				}
			}
		}
	case *ast.AssignStmt:
		for i, l := range x.Lhs {
			if i < len(x.Rhs) && isReasonSelector(l) {
				out = append(out, stringLit(x.Rhs[i], names)...)
			}
		}
	case *ast.BinaryExpr:
		if x.Op == token.EQL || x.Op == token.NEQ {
			if isReasonSelector(x.X) {
				out = append(out, stringLit(x.Y, names)...)
			}
			if isReasonSelector(x.Y) {
				out = append(out, stringLit(x.X, names)...)
			}
		}
	case *ast.SwitchStmt:
		if x.Tag != nil && isReasonSelector(x.Tag) {
			for _, s := range x.Body.List {
				for _, e := range s.(*ast.CaseClause).List {
					out = append(out, stringLit(e, names)...)
				}
			}
		}
	}
	return out
}

// stringLit is e if it is a non-empty string literal (and, if names is
// not nil, one of them).
func stringLit(e ast.Expr, names map[string]bool) []*ast.BasicLit {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return nil
	}
	s, err := strconv.Unquote(lit.Value)
	if err != nil || s == "" || (names != nil && !names[s]) {
		return nil
	}
	return []*ast.BasicLit{lit}
}

// isReasonSelector reports whether e reads a field named reason or
// Reason (x.Reason, x.y.reason).
func isReasonSelector(e ast.Expr) bool {
	sel, ok := e.(*ast.SelectorExpr)
	return ok && isReasonField(sel.Sel)
}

func isReasonField(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && strings.EqualFold(id.Name, "reason")
}

// selector is x and name of a selector x.name whose x is an identifier.
func selector(e ast.Expr) (x, name string) {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return "", ""
	}
	id, ok := sel.X.(*ast.Ident)
	if !ok {
		return "", ""
	}
	return id.Name, sel.Sel.Name
}
