package main

// docs/openapi.yaml, the HTTP reference of both planes, is kept true three
// ways: it loads and validates as OpenAPI 3.1 (TestAPIDocValid); it names
// every route the code serves and every (status, reason) pair of the
// table of reasons (internal/reason), and nothing else
// (TestAPIDocCoversCode, which reads the routes with go/parser);
// and every answer the end-to-end tests receive is validated against it
// (apivalidator_test.go). kin-openapi does the OpenAPI work: a well-kept
// validator of the format, instead of one written here.

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/vmshelf/vmshelf/internal/reason"
)

// apiDocPath is docs/openapi.yaml seen from this package's directory.
var apiDocPath = filepath.Join("..", "..", "docs", "openapi.yaml")

// Planes, as the document tags every operation.
const (
	dataPlane    = "data plane"
	controlPlane = "control plane"
	// bothPlanes is a path served on both ports (the health probes),
	// whose operations carry both tags.
	bothPlanes = "both planes"
)

// loadAPIDoc loads and validates docs/openapi.yaml.
func loadAPIDoc() (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromFile(apiDocPath)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", apiDocPath, err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("validate %s: %w", apiDocPath, err)
	}
	return doc, nil
}

func TestAPIDocValid(t *testing.T) {
	doc, err := loadAPIDoc()
	if err != nil {
		t.Fatal(err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Errorf("%s declares OpenAPI %q, want 3.1", apiDocPath, doc.OpenAPI)
	}
	// Each path's operations belong to one plane, and the path's servers
	// are that plane's: a client reading the document must know where to
	// send a request. A path of both planes (the probes) has both
	// servers.
	for _, path := range doc.Paths.InMatchingOrder() {
		item := doc.Paths.Value(path)
		plane, err := planeOf(item)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		planes := []string{plane}
		if plane == bothPlanes {
			planes = []string{dataPlane, controlPlane}
		}
		if len(item.Servers) != len(planes) {
			t.Errorf("%s: want the servers of %q", path, planes)
			continue
		}
		for i, p := range planes {
			if !strings.HasPrefix(item.Servers[i].Description, p) {
				t.Errorf("%s: want server %d's description to start with %q", path, i, p)
			}
		}
	}
	if _, err := unroutedAnswers(doc); err != nil {
		t.Error(err)
	}
}

// planeOf is the plane of a path's operations (each has one plane tag).
func planeOf(item *openapi3.PathItem) (string, error) {
	plane := ""
	for method, op := range item.Operations() {
		var tags []string
		for _, tag := range op.Tags {
			if tag == dataPlane || tag == controlPlane {
				tags = append(tags, tag)
			}
		}
		this := ""
		switch len(tags) {
		case 1:
			this = tags[0]
		case 2:
			this = bothPlanes
		}
		if this == "" || (plane != "" && this != plane) {
			return "", fmt.Errorf("%s: want the tag %q or %q, or both, the same for every operation of the path; have %q",
				method, dataPlane, controlPlane, op.Tags)
		}
		plane = this
	}
	if plane == "" {
		return "", fmt.Errorf("no operation")
	}
	return plane, nil
}

// unroutedAnswers are the responses of x-unrouted-answers by status: what a
// request that matches no operation is answered.
func unroutedAnswers(doc *openapi3.T) (map[int]*openapi3.Response, error) {
	ext, ok := doc.Extensions["x-unrouted-answers"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: no x-unrouted-answers object", apiDocPath)
	}
	refs, ok := ext["responses"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: x-unrouted-answers has no responses object", apiDocPath)
	}
	out := map[int]*openapi3.Response{}
	for code, v := range refs {
		status, err := strconv.Atoi(code)
		ref, _ := v.(map[string]any)["$ref"].(string)
		name, ok := strings.CutPrefix(ref, "#/components/responses/")
		if err != nil || !ok || doc.Components.Responses[name] == nil {
			return nil, fmt.Errorf("%s: x-unrouted-answers %q: want a status and a $ref to #/components/responses/<name>", apiDocPath, code)
		}
		out[status] = doc.Components.Responses[name].Value
	}
	return out, nil
}

// reasonsOf returns the reasons a response's JSON body may carry: the enum
// on its schema's "reason" property, through $ref siblings and allOf.
// isError says whether the schema is the error shape at all.
func reasonsOf(resp *openapi3.Response) (reasons []string, isError bool) {
	mt := resp.Content.Get("application/json")
	if mt == nil || mt.Schema == nil {
		return nil, false
	}
	var walk func(*openapi3.SchemaRef)
	walk = func(s *openapi3.SchemaRef) {
		if s == nil || s.Value == nil {
			return
		}
		if s.Ref == "#/components/schemas/Error" {
			isError = true
		}
		if p := s.Value.Properties["reason"]; p != nil && p.Value != nil {
			for _, e := range p.Value.Enum {
				if r, ok := e.(string); ok {
					reasons = append(reasons, r)
				}
			}
		}
		for _, a := range s.Value.AllOf {
			walk(a)
		}
	}
	walk(mt.Schema)
	if !isError {
		return nil, false // a "reason" of another answer (status) is not an error's
	}
	return reasons, true
}

// anyParam is a path parameter of the document ("{ticket}"); the code's
// data-plane routes are a prefix and one segment, written "{}".
var anyParam = regexp.MustCompile(`\{[^}/]+\}`)

// answer is one (status, reason) pair of an error answer.
type answer struct {
	status int
	reason string
}

func (a answer) String() string { return fmt.Sprintf("%d %s", a.status, a.reason) }

// TestAPIDocCoversCode reads the routes from the code and the error answers
// from the table of reasons, and fails on any the document lacks, and on
// any route or answer the document names that they do not have.
func TestAPIDocCoversCode(t *testing.T) {
	doc, err := loadAPIDoc()
	if err != nil {
		t.Fatal(err)
	}
	code := readCode(t)
	answers := tableAnswers()

	// Routes, both ways. A GET route of the control plane also answers
	// HEAD (market's router adds it), so the document may list HEAD too.
	docOps := map[string]string{} // "METHOD path" → plane
	for _, path := range doc.Paths.InMatchingOrder() {
		item := doc.Paths.Value(path)
		plane, _ := planeOf(item)
		for method := range item.Operations() {
			docOps[method+" "+anyParam.ReplaceAllString(path, "{}")] = plane
		}
	}
	for op, plane := range code.routes {
		switch got, ok := docOps[op]; {
		case !ok:
			t.Errorf("%s: the code serves %s, which %s does not describe", code.routeAt[op], op, apiDocPath)
		case got != plane:
			t.Errorf("%s: %s is on the %s, but %s tags it %q", code.routeAt[op], op, plane, apiDocPath, got)
		}
	}
	for op := range docOps {
		if _, ok := code.routes[op]; ok {
			continue
		}
		method, path, _ := strings.Cut(op, " ")
		if _, ok := code.routes["GET "+path]; ok && method == "HEAD" && (docOps["GET "+path] == controlPlane || docOps["GET "+path] == bothPlanes) {
			continue
		}
		t.Errorf("%s describes %s, which the code does not serve", apiDocPath, op)
	}

	// Error answers, both ways: a (status, reason) pair of the table must
	// be under some operation's response of that status (or among the
	// answers to unrouted requests), and each documented pair must be one
	// of the table's.
	docPairs := map[answer][]string{}
	for _, path := range doc.Paths.InMatchingOrder() {
		for method, op := range doc.Paths.Value(path).Operations() {
			for code, ref := range op.Responses.Map() {
				status, err := strconv.Atoi(code)
				if err != nil {
					t.Errorf("%s %s: response %q: want a status code (no ranges, no default)", method, path, code)
					continue
				}
				reasons, isError := reasonsOf(ref.Value)
				if isError && len(reasons) == 0 {
					t.Errorf("%s %s: the %d error answer lists no reasons (an enum on reason)", method, path, status)
				}
				for _, r := range reasons {
					docPairs[answer{status, r}] = append(docPairs[answer{status, r}], method+" "+path)
				}
			}
		}
	}
	unrouted, err := unroutedAnswers(doc)
	if err != nil {
		t.Fatal(err)
	}
	for status, resp := range unrouted {
		reasons, _ := reasonsOf(resp)
		for _, r := range reasons {
			docPairs[answer{status, r}] = append(docPairs[answer{status, r}], "x-unrouted-answers")
		}
	}
	for _, a := range sortedAnswers(answers) {
		if docPairs[a] == nil {
			t.Errorf("the code answers %v (%q), which no operation of %s lists under %d", a, answers[a], apiDocPath, a.status)
		}
	}
	for _, a := range sortedAnswers(docPairs) {
		if _, ok := answers[a]; !ok {
			t.Errorf("%s lists %v under %s, but the table of reasons has no such entry", apiDocPath, a, strings.Join(docPairs[a], ", "))
		}
	}

	// Reasons that are not error answers: the values of enumerated fields
	// of the answers (why status says available:false, why an order was
	// cancelled, what readyz says of the market, what the webhook did).
	for _, f := range code.fields {
		s := doc.Components.Schemas[f.schema]
		if s == nil || s.Value.Properties[f.field] == nil {
			t.Errorf("%s has no schema %s with a property %q (%s)", apiDocPath, f.schema, f.field, f.from)
			continue
		}
		var documented []string
		prop := s.Value.Properties[f.field].Value
		if prop.Items != nil && prop.Items.Value != nil { // a list of reasons: its items' enum
			prop = prop.Items.Value
		}
		for _, e := range prop.Enum {
			documented = append(documented, fmt.Sprint(e))
		}
		slices.Sort(documented)
		if !slices.Equal(documented, f.values) {
			t.Errorf("%s.%s: %s lists %q; the code (%s) writes %q", f.schema, f.field, apiDocPath, documented, f.from, f.values)
		}
	}
}

// tableAnswers are the (status, reason) pairs of the table of reasons, with
// each entry's words.
func tableAnswers() map[answer]string {
	out := map[answer]string{}
	for _, r := range reason.All() {
		out[answer{r.Status(), r.Name()}] = r.Words()
	}
	return out
}

func sortedAnswers[V any](m map[answer]V) []answer {
	out := make([]answer, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].status != out[j].status {
			return out[i].status < out[j].status
		}
		return out[i].reason < out[j].reason
	})
	return out
}

// codeFacts is what TestAPIDocCoversCode reads from the code.
type codeFacts struct {
	routes  map[string]string // "METHOD path" → plane
	routeAt map[string]string // "METHOD path" → file:line where it is registered
	fields  []fieldReasons
}

// fieldReasons are the values the code writes into an enumerated field of
// an answer, which the document's components.schemas[schema].field lists.
type fieldReasons struct {
	schema, field string
	from          string // where the code writes them, in words
	values        []string
}

// The directories whose code readCode reads: the planes' routes and the
// enumerated fields of their answers, and the table of reasons, by whose
// Go names the market's answers name their entries.
var (
	marketDir  = "market"
	gatewayDir = "gateway"
	webDir     = filepath.Join("market", "web")
	reasonDir  = filepath.Join("internal", "reason")
)

// goPackage is the non-test files of one directory, parsed.
type goPackage struct {
	dir   string
	files []*ast.File
}

// readCode parses the code and extracts its routes and the reasons of its
// answers' enumerated fields. It uses go/parser and go/ast only, so it
// reads shapes, not types:
//   - control-plane routes are the rt.handle(METHOD, PATH, ...) calls of
//     market/server.go, where a PATH ranging over page.Paths() stands for the
//     paths of market/web's files table;
//   - data-plane routes are gateway's route(): its switch over the route
//     kinds and, in each, the switch over methods; classify() pairs each kind
//     with its prefix, to which the document's path adds one {parameter};
//   - a field's reasons are literals, or the reason of a package-level
//     answer built from an entry of the table (errX = apierr.New(reason.X)).
//
// The error answers themselves are the table's (tableAnswers): no code
// answers a reason the table has not.
func readCode(t *testing.T) *codeFacts {
	t.Helper()
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	pkgs := map[string]*goPackage{}
	for _, dir := range []string{marketDir, gatewayDir, webDir, reasonDir} {
		ents, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		pkgs[dir] = &goPackage{dir: dir}
		for _, e := range ents {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(root, dir, e.Name()), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			pkgs[dir].files = append(pkgs[dir].files, f)
		}
	}

	c := &codeFacts{routes: map[string]string{}, routeAt: map[string]string{}}
	at := func(n ast.Node) string {
		p := fset.Position(n.Pos())
		rel, _ := filepath.Rel(root, p.Filename)
		return fmt.Sprintf("%s:%d", rel, p.Line)
	}
	// Control plane.
	market := pkgs[marketDir]
	webPaths := stringTable(t, pkgs[webDir], "files")
	// The rt.handle calls inside a loop over page.Paths() register the
	// Machines page's files.
	inPageLoop := map[ast.Node]bool{}
	for _, f := range market.files {
		ast.Inspect(f, func(node ast.Node) bool {
			if rs, ok := node.(*ast.RangeStmt); ok {
				if call, ok := rs.X.(*ast.CallExpr); ok && selName(call.Fun) == "Paths" && recvName(call.Fun) == "page" {
					ast.Inspect(rs.Body, func(n ast.Node) bool { inPageLoop[n] = true; return true })
				}
			}
			return true
		})
	}
	n := 0
	for _, f := range market.files {
		ast.Inspect(f, func(node ast.Node) bool {
			call, ok := node.(*ast.CallExpr)
			if !ok || selName(call.Fun) != "handle" || recvName(call.Fun) != "rt" || len(call.Args) != 3 {
				return true
			}
			n++
			method := methodName(call.Args[0])
			if method == "" {
				t.Errorf("%s: rt.handle with a method this test cannot read", at(call))
				return true
			}
			var paths []string
			switch p, isLit := call.Args[1].(*ast.BasicLit); {
			case isLit:
				paths = []string{unquote(t, p)}
			case inPageLoop[call] && identName(call.Args[1]) != "":
				paths = webPaths
			default:
				t.Errorf("%s: rt.handle with a path this test cannot read", at(call))
			}
			for _, p := range paths {
				c.routes[method+" "+p] = controlPlane
				c.routeAt[method+" "+p] = at(call)
			}
			return true
		})
	}
	if n < 5 || len(webPaths) == 0 {
		t.Fatalf("found %d rt.handle calls in market and %d page files; the test no longer reads the control plane's routes", n, len(webPaths))
	}

	// Data plane.
	gw := pkgs[gatewayDir]
	consts := stringConsts(gw)
	prefixOf := map[string]string{} // route kind → path prefix, from classify
	route := funcDecl(gw, "route")
	classify := funcDecl(gw, "classify")
	if route == nil || classify == nil {
		t.Fatal("gateway has no route or classify function; the test no longer reads the data plane's routes")
	}
	ast.Inspect(classify, func(node ast.Node) bool {
		if cl, ok := node.(*ast.CompositeLit); ok && len(cl.Elts) == 2 {
			p, ok1 := cl.Elts[0].(*ast.Ident)
			k, ok2 := cl.Elts[1].(*ast.Ident)
			if ok1 && ok2 && consts[p.Name] != "" {
				prefixOf[k.Name] = consts[p.Name]
			}
		}
		return true
	})
	ast.Inspect(route.Body, func(node ast.Node) bool {
		sw, ok := node.(*ast.SwitchStmt)
		if !ok || identName(sw.Tag) != "kind" {
			return true
		}
		for _, s := range sw.Body.List {
			cc := s.(*ast.CaseClause)
			for _, k := range cc.List {
				prefix := prefixOf[identName(k)]
				if prefix == "" {
					t.Errorf("%s: route kind %s has no prefix in classify", at(k), identName(k))
					continue
				}
				ast.Inspect(&ast.BlockStmt{List: cc.Body}, func(node ast.Node) bool {
					inner, ok := node.(*ast.SwitchStmt)
					if !ok || identName(inner.Tag) != "method" {
						return true
					}
					for _, s := range inner.Body.List {
						for _, m := range s.(*ast.CaseClause).List {
							method := methodName(m)
							if method == "" {
								t.Errorf("%s: a method this test cannot read", at(m))
								continue
							}
							op := method + " " + prefix + "{}"
							c.routes[op] = dataPlane
							c.routeAt[op] = at(m)
						}
					}
					return false
				})
			}
		}
		return false
	})
	if len(prefixOf) < 3 {
		t.Fatalf("classify pairs %d route kinds with prefixes; the test no longer reads the data plane's routes", len(prefixOf))
	}
	// The data plane's probes: the control plane's paths, on its port
	// too (gateway's probePaths, its constants).
	probes := 0
	eachValue(gw, token.VAR, func(name string, v ast.Expr) {
		if name != "probePaths" {
			return
		}
		for _, e := range v.(*ast.CompositeLit).Elts {
			p := consts[identName(e)]
			if p == "" {
				t.Errorf("%s: a probe path this test cannot read", at(e))
				continue
			}
			probes++
			op := "GET " + p
			if c.routes[op] == controlPlane {
				c.routes[op] = bothPlanes
			} else {
				c.routes[op], c.routeAt[op] = dataPlane, at(e)
			}
		}
	})
	if probes == 0 {
		t.Fatal("found no gateway probePaths; the test no longer reads the data plane's probes")
	}

	// Enumerated fields of answers.
	names := tableNames(t, pkgs[reasonDir])
	vars := answerVars(t, market, names)
	c.fields = []fieldReasons{
		{schema: "Status", field: "reason", from: "market.machinesUnavailable's errors",
			values: returnedReasons(t, market, "machinesUnavailable", vars)},
		{schema: "Ready", field: "machines", from: "the reasons market.machinesProblems appends",
			values: appendedReasons(t, market, "machinesProblems", vars, names)},
		{schema: "Ready", field: "reasons", from: "the reasons market.machinesProblems appends",
			values: appendedReasons(t, market, "machinesProblems", vars, names)},
		{schema: "Order", field: "reason", from: "the reason argument of market's cancel, release and cancelByBuyer",
			values: reasonArgs(t, market, []string{"cancel", "release", "cancelByBuyer"}, names)},
		{schema: "WebhookAnswer", field: "result", from: "market's result constants but resultRefused (the 400s' metric label)",
			values: webhookResults(market)},
	}
	return c
}

// eachValue calls fn with every name = value of the package's top-level
// declarations of kind tok (token.VAR or token.CONST).
func eachValue(pkg *goPackage, tok token.Token, fn func(name string, v ast.Expr)) {
	for _, f := range pkg.files {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != tok {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, v := range vs.Values {
					if i < len(vs.Names) {
						fn(vs.Names[i].Name, v)
					}
				}
			}
		}
	}
}

// tableNames are the reasons of internal/reason by their Go names
// (BadRequest → badRequest, CheckoutFailed → checkoutFailed), read from
// its declarations: the table's entries (X = Code{status, "name", words}),
// each of which must be in reason.All, and the reasons of answers' fields
// (its string constants).
func tableNames(t *testing.T, pkg *goPackage) map[string]string {
	t.Helper()
	entries := map[string]bool{}
	for _, r := range reason.All() {
		entries[r.Name()] = true
	}
	out := stringConsts(pkg)
	for _, name := range out {
		entries[name] = true
	}
	eachValue(pkg, token.VAR, func(name string, v ast.Expr) {
		if cl, ok := v.(*ast.CompositeLit); ok && identName(cl.Type) == "Code" && len(cl.Elts) == 3 {
			if lit, ok := cl.Elts[1].(*ast.BasicLit); ok {
				out[name] = unquote(t, lit)
			}
		}
	})
	for name, code := range out {
		if !entries[code] {
			t.Errorf("reason.%s (%s) is declared but not in reason.All", name, code)
		}
	}
	if len(out) < 40 {
		t.Fatalf("read %d entries from %s; the test no longer reads the table's declarations", len(out), pkg.dir)
	}
	return out
}

// answerVars are the reason codes of a package's answers built from an
// entry of the table, by the variable's name: errX = apierr.New(reason.X),
// or apierr.Wrap(cause, reason.X), with any With* calls after.
func answerVars(t *testing.T, pkg *goPackage, names map[string]string) map[string]string {
	t.Helper()
	vars := map[string]string{}
	eachValue(pkg, token.VAR, func(name string, v ast.Expr) {
		for {
			call, ok := v.(*ast.CallExpr)
			if !ok {
				return
			}
			if recvName(call.Fun) == "apierr" && (selName(call.Fun) == "New" || selName(call.Fun) == "Wrap") {
				if r := call.Args[len(call.Args)-1]; recvName(r) == "reason" {
					vars[name] = names[selName(r)]
				}
				return
			}
			sel, ok := call.Fun.(*ast.SelectorExpr) // a With* call: its receiver
			if !ok {
				return
			}
			v = sel.X
		}
	})
	return vars
}

// resolveReason is the reason of e, or nil when it is not a literal, a
// reason of the table (reason.X) or a known answer's Reason.
func resolveReason(e ast.Expr, vars, names map[string]string) []string {
	switch x := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(x.Value); err == nil {
			return []string{s}
		}
	case *ast.SelectorExpr:
		if r, ok := names[x.Sel.Name]; ok && recvName(x) == "reason" {
			return []string{r}
		}
		if r, ok := vars[recvName(x)]; ok && x.Sel.Name == "Reason" {
			return []string{r}
		}
	}
	return nil
}

// stringConsts are a package's string constants, by name.
func stringConsts(pkg *goPackage) map[string]string {
	out := map[string]string{}
	eachValue(pkg, token.CONST, func(name string, v ast.Expr) {
		if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			out[name], _ = strconv.Unquote(lit.Value)
		}
	})
	return out
}

// stringTable is the first string of each element of the package-level
// composite literal var name (market/web's files table: path, file, type).
func stringTable(t *testing.T, pkg *goPackage, name string) []string {
	t.Helper()
	var out []string
	for _, f := range pkg.files {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if len(vs.Names) != 1 || vs.Names[0].Name != name || len(vs.Values) != 1 {
					continue
				}
				for _, e := range vs.Values[0].(*ast.CompositeLit).Elts {
					if lit, ok := e.(*ast.CompositeLit).Elts[0].(*ast.BasicLit); ok {
						out = append(out, unquote(t, lit))
					}
				}
			}
		}
	}
	return out
}

func funcDecl(pkg *goPackage, name string) *ast.FuncDecl {
	for _, f := range pkg.files {
		for _, decl := range f.Decls {
			if fd, ok := decl.(*ast.FuncDecl); ok && fd.Name.Name == name {
				return fd
			}
		}
	}
	return nil
}

// returnedReasons are the reasons of the apierr variables function name
// returns.
func returnedReasons(t *testing.T, pkg *goPackage, name string, vars map[string]string) []string {
	t.Helper()
	fd := funcDecl(pkg, name)
	if fd == nil {
		t.Fatalf("%s has no function %s", pkg.dir, name)
	}
	var out []string
	ast.Inspect(fd.Body, func(node ast.Node) bool {
		if rs, ok := node.(*ast.ReturnStmt); ok {
			for _, r := range rs.Results {
				if a, ok := vars[identName(r)]; ok {
					out = append(out, a)
				}
			}
		}
		return true
	})
	return sortedUnique(out)
}

// appendedReasons are the reasons the function name appends to a list:
// the literals, the table's reasons and known answers' Reasons among its
// append calls' values.
func appendedReasons(t *testing.T, pkg *goPackage, name string, vars, names map[string]string) []string {
	t.Helper()
	fd := funcDecl(pkg, name)
	if fd == nil {
		t.Fatalf("%s has no function %s", pkg.dir, name)
	}
	var out []string
	ast.Inspect(fd.Body, func(node ast.Node) bool {
		if call, ok := node.(*ast.CallExpr); ok && identName(call.Fun) == "append" {
			for _, a := range call.Args[1:] {
				out = append(out, resolveReason(a, vars, names)...)
			}
		}
		return true
	})
	return sortedUnique(out)
}

// reasonArgs are the string values given to the parameter "reason" of the
// functions funcs: literal arguments or the table's reasons (reason.X),
// and those assigned to a variable passed as the argument in the calling
// function. names are the table's reasons by Go name (tableNames).
func reasonArgs(t *testing.T, pkg *goPackage, funcs []string, names map[string]string) []string {
	t.Helper()
	index := map[string]int{} // function → position of its reason parameter
	for _, name := range funcs {
		fd := funcDecl(pkg, name)
		if fd == nil {
			t.Fatalf("%s has no function %s", pkg.dir, name)
		}
		i := 0
		for _, field := range fd.Type.Params.List {
			for _, n := range field.Names {
				if n.Name == "reason" {
					index[name] = i
				}
				i++
			}
		}
	}
	var out []string
	for _, f := range pkg.files {
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			ast.Inspect(fd.Body, func(node ast.Node) bool {
				call, ok := node.(*ast.CallExpr)
				if !ok {
					return true
				}
				i, ok := index[selName(call.Fun)]
				if !ok || i >= len(call.Args) {
					return true
				}
				arg := call.Args[i]
				values := resolveReason(arg, nil, names)
				if id, ok := arg.(*ast.Ident); ok { // a variable of the caller: what it is set to
					ast.Inspect(fd.Body, func(node ast.Node) bool {
						if as, ok := node.(*ast.AssignStmt); ok && len(as.Lhs) == 1 && identName(as.Lhs[0]) == id.Name {
							values = append(values, resolveReason(as.Rhs[0], nil, names)...)
						}
						return true
					})
				}
				if len(values) == 0 {
					t.Errorf("%s: a reason passed to %s that this test cannot read", fd.Name.Name, selName(call.Fun))
				}
				out = append(out, values...)
				return true
			})
		}
	}
	return sortedUnique(out)
}

// webhookResults are the values of market's result constants, but
// resultRefused: the metric label of the webhook's 400s, whose answer is the
// error shape.
func webhookResults(pkg *goPackage) []string {
	var out []string
	for name, v := range stringConsts(pkg) {
		if strings.HasPrefix(name, "result") && name != "resultRefused" {
			out = append(out, v)
		}
	}
	return sortedUnique(out)
}

func sortedUnique(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// methodName reads http.MethodGet / fasthttp.MethodPut as "GET" / "PUT".
func methodName(e ast.Expr) string {
	if r := recvName(e); r != "http" && r != "fasthttp" {
		return ""
	}
	m, ok := strings.CutPrefix(selName(e), "Method")
	if !ok {
		return ""
	}
	return strings.ToUpper(m)
}

// selName is the selected name of x.Sel, recvName the name of x.
func selName(e ast.Expr) string {
	if s, ok := e.(*ast.SelectorExpr); ok {
		return s.Sel.Name
	}
	return ""
}

func recvName(e ast.Expr) string {
	if s, ok := e.(*ast.SelectorExpr); ok {
		return identName(s.X)
	}
	return ""
}

func identName(e ast.Expr) string {
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

func unquote(t *testing.T, lit *ast.BasicLit) string {
	t.Helper()
	s, err := strconv.Unquote(lit.Value)
	if err != nil {
		t.Fatalf("%s: %v", lit.Value, err)
	}
	return s
}
