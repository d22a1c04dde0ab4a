package main

// The numbers and flags the documents quote, checked against their one
// source: the flag sets of the binary (what -h prints), the constants of
// the code, and the benchmark's own record (docs/bench.json). A document
// that names a flag the binary lacks, a default it does not have, or a
// memory figure nothing measured fails here, not in a reader's hands.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/market"
)

// docFiles are the documents checked, by their path from the repository's
// root: README.md and docs/ (the generated benchmark report aside: it
// quotes its own measurements).
func docFiles(t *testing.T) map[string]string {
	t.Helper()
	root := filepath.Join("..", "..")
	var names []string
	for _, glob := range []string{"README.md", "docs/*.md", "docs/*.yaml", "docs/deploy/*.md", "docs/deploy/*.yaml",
		"docs/deploy/*/*.yaml", "docs/deploy/*/*/*.yaml", "docs/deploy/*/*.env"} {
		m, err := filepath.Glob(filepath.Join(root, glob))
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, m...)
	}
	docs := map[string]string{}
	for _, n := range names {
		rel, _ := filepath.Rel(root, n)
		if rel == filepath.Join("docs", "bench.md") {
			continue
		}
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		docs[filepath.ToSlash(rel)] = string(b)
	}
	if len(docs) < 8 {
		t.Fatalf("found only %d documents: the globs are stale", len(docs))
	}
	return docs
}

// prose is a document's text as sentences run: a YAML file's comments
// joined, every run of white space one space.
func prose(name, text string) string {
	if strings.HasSuffix(name, ".yaml") {
		text = regexp.MustCompile(`\n\s*#\s?`).ReplaceAllString(text, " ")
	}
	return strings.Join(strings.Fields(text), " ")
}

// commandFlags are the flag sets of every command, by its words ("serve",
// "tenant add"), as -h shows them.
func commandFlags(t *testing.T) map[string]*flag.FlagSet {
	t.Helper()
	out := map[string]*flag.FlagSet{}
	for _, path := range helpPaths() {
		err := cli.Dispatch(context.Background(), "vmshelf", topHelp, commands, append(path, "-h"), io.Discard, io.Discard)
		var h cli.HelpShown
		if !errors.As(err, &h) {
			t.Fatalf("vmshelf %v -h: %v", path, err)
		}
		if h.Flags != nil {
			out[strings.Join(path, " ")] = h.Flags
		}
	}
	if out["serve"] == nil {
		t.Fatal("no flag set for serve")
	}
	return out
}

// docFlag is the flag a document's default is about: serve's when serve
// has it (the documents' defaults are serve's), else the one command's
// that has it; nil when none has it, or several with other defaults.
func docFlag(sets map[string]*flag.FlagSet, name string) *flag.Flag {
	if f := sets["serve"].Lookup(name); f != nil {
		return f
	}
	var found *flag.Flag
	for _, fs := range sets {
		if f := fs.Lookup(name); f != nil {
			if found != nil && found.DefValue != f.DefValue {
				return nil
			}
			found = f
		}
	}
	return found
}

// foreignFlags are the flags the documents quote of other programs, with
// the program: any other flag a document names must be vmshelf's.
var foreignFlags = map[string]string{
	"data-binary": "curl", "fail-with-body": "curl", "fail": "curl", "max-time": "curl",
	"debug": "local-path-provisioner", "config": "local-path-provisioner",
	"provisioner-name": "local-path-provisioner", "configmap-name": "local-path-provisioner",
	"service-account-name": "local-path-provisioner",
	"entrypoints":          "Traefik", "entry": "Traefik (--entryPoints.…)", "certificatesresolvers": "Traefik", "providers": "Traefik", "accesslog": "Traefik",
	"timeout": "kubectl", "cluster-cidr": "k3s and rke2",
}

// flagMention finds the flags a document names as vmshelf's: a code span
// that begins with one ("`--max-transfers 8`"), every flag after a
// "vmshelf COMMAND" on a line, and a flag in a YAML list ("- --data-dir=…").
var (
	docCodeSpan   = regexp.MustCompile("`([^`\n]+)`")
	flagWord      = regexp.MustCompile(`(?:^|[\s"'(=\[])--([a-z][a-z0-9-]*[a-z0-9])`)
	vmshelfLine   = regexp.MustCompile(`\bvmshelf (?:[a-z-]+)(?:[^|;&\n` + "`" + `]*)`)
	yamlFlagEntry = regexp.MustCompile(`(?m)^\s*-\s+["']?--([a-z][a-z0-9-]*[a-z0-9])`)
)

// TestDocFlagsExist: every flag a document names as vmshelf's is a flag
// of one of its commands, and every VMSHELF_ variable one that a command
// reads (or a knob of the repository's own scripts and tests, named here).
func TestDocFlagsExist(t *testing.T) {
	sets := commandFlags(t)
	exists := func(name string) bool {
		for _, fs := range sets {
			if fs.Lookup(name) != nil {
				return true
			}
		}
		return false
	}
	for name, text := range docFiles(t) {
		var mentioned []string
		for _, m := range docCodeSpan.FindAllStringSubmatch(text, -1) {
			if strings.HasPrefix(m[1], "--") {
				mentioned = append(mentioned, flagWord.FindStringSubmatch(m[1])[1])
			}
		}
		for _, l := range vmshelfLine.FindAllString(text, -1) {
			for _, m := range flagWord.FindAllStringSubmatch(l, -1) {
				mentioned = append(mentioned, m[1])
			}
		}
		for _, m := range yamlFlagEntry.FindAllStringSubmatch(text, -1) {
			mentioned = append(mentioned, m[1])
		}
		slices.Sort(mentioned)
		for _, f := range slices.Compact(mentioned) {
			if !exists(f) && foreignFlags[f] == "" {
				t.Errorf("%s names --%s, which no vmshelf command has (another program's? add it to foreignFlags with the program)", name, f)
			}
		}
	}

	known := knownEnv(t)
	scriptVars := map[string]string{"VMSHELF_INSTALL": ".ci/deps (make deps, make test)", "VMSHELF_SCREENSHOTS": "the browser tests"}
	for name, text := range docFiles(t) {
		var named []string
		for _, v := range regexp.MustCompile(`\bVMSHELF_[A-Z0-9_]*[A-Z0-9]\b`).FindAllString(text, -1) {
			if scriptVars[v] == "" {
				named = append(named, v)
			}
		}
		for _, w := range cli.UnknownEnv("VMSHELF_", known, named) {
			t.Errorf("%s: %s", name, w)
		}
	}
}

// knownEnv is every VMSHELF_ variable the binary reads (cli.KnownEnv, from
// inside a command run by cli.Run as the binary runs them).
func knownEnv(t *testing.T) []string {
	t.Helper()
	var known []string
	probe := cli.Command{Name: "probe", Run: func(ctx context.Context, args []string, _, _ io.Writer) error {
		if err := cli.ParseFlags(newFlagSet("probe", cli.Doc{}), args); err != nil {
			return err
		}
		known, _ = cli.KnownEnv(ctx)
		return nil
	}}
	if err := cli.Run(context.Background(), "vmshelf", topHelp, append(slices.Clip(commands), probe), []string{"probe"}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(known, "VMSHELF_CONTROL") || !slices.Contains(known, storeURLEnv) {
		t.Fatalf("known variables %q lack VMSHELF_CONTROL or %s", known, storeURLEnv)
	}
	return known
}

// A default a document quotes beside its flag, in the forms the documents
// use: a table whose second column is "default"; "`--flag` (X by
// default)" or "`--a` … `--b` … (X and Y by default)"; "--flag, X by
// default"; "the default `--flag X`".
var (
	defaultsTable = regexp.MustCompile(`(?m)^\| *flag *\| *default *\|.*\n\|[-| ]+\|\n((?:\|.*\n)+)`)
	byDefault     = regexp.MustCompile(`\(([^()]*?) by default\)`)
	commaDefault  = regexp.MustCompile(`--([a-z][a-z0-9-]*[a-z0-9])` + "`?" + `, ([^,()]+?) by default`)
	theDefault    = regexp.MustCompile("default `--([a-z][a-z0-9-]*[a-z0-9])[ =]([^`]+)`")
	flagInText    = regexp.MustCompile(`--([a-z][a-z0-9-]*[a-z0-9])`)
)

// docDefault is one default a document quotes.
type docDefault struct{ where, flag, value string }

// quotedDefaults finds the defaults a document quotes beside a flag.
func quotedDefaults(name, text string) []docDefault {
	var out []docDefault
	for _, tbl := range defaultsTable.FindAllStringSubmatch(text, -1) {
		for _, row := range strings.Split(strings.TrimSpace(tbl[1]), "\n") {
			cells := strings.Split(row, "|")
			if len(cells) < 4 {
				continue
			}
			flags := flagInText.FindAllStringSubmatch(cells[1], -1)
			var values []string
			for _, v := range docCodeSpan.FindAllStringSubmatch(cells[2], -1) {
				values = append(values, v[1])
			}
			if len(values) == len(flags) {
				for i := range flags {
					out = append(out, docDefault{name + " (flag table)", flags[i][1], values[i]})
				}
			}
		}
	}
	flat := prose(name, text)
	for _, m := range byDefault.FindAllStringSubmatchIndex(flat, -1) {
		inner := flat[m[2]:m[3]]
		if strings.Contains(inner, "--") {
			continue // "--flag, X by default" inside the parentheses: commaDefault's
		}
		values := regexp.MustCompile(`,\s*|\s+and\s+`).Split(inner, -1)
		// The flags are those of the sentence before the parentheses.
		before := flat[max(0, strings.LastIndex(flat[:m[0]], ". ")):m[0]]
		flags := flagInText.FindAllStringSubmatch(before, -1)
		switch {
		case len(flags) == 0:
			continue // a default of something else than a flag
		case len(flags) < len(values):
			out = append(out, docDefault{name, "", flat[m[0]:m[1]]})
			continue
		}
		flags = flags[len(flags)-len(values):]
		for i, v := range values {
			out = append(out, docDefault{name, flags[i][1], v})
		}
	}
	for _, re := range []*regexp.Regexp{commaDefault, theDefault} {
		for _, m := range re.FindAllStringSubmatch(flat, -1) {
			out = append(out, docDefault{name, m[1], m[2]})
		}
	}
	return out
}

// sameDefault says whether a document's value v is f's default; checked
// is false when v describes a default rather than giving one
// ("`--upload-max-gib`", "http://<data-addr>", "derived from …").
func sameDefault(f *flag.Flag, v string) (same, checked bool) {
	v = strings.Trim(strings.TrimSpace(v), "`\"'")
	g, ok := f.Value.(flag.Getter)
	if !ok || strings.HasPrefix(v, "--") {
		return false, false
	}
	switch d := g.Get().(type) {
	case bool:
		switch v {
		case "off", "false":
			return !d, true
		case "on", "true":
			return d, true
		}
	case time.Duration:
		if doc, err := time.ParseDuration(strings.ReplaceAll(v, " ", "")); err == nil {
			return doc == d, true
		}
	case int, int64, uint, uint64, float64:
		def, _ := strconv.ParseFloat(f.DefValue, 64)
		if doc, err := strconv.ParseFloat(strings.ReplaceAll(v, " ", ""), 64); err == nil {
			return doc == def, true
		}
	case string:
		if d != "" && !strings.ContainsAny(v, "<…") {
			return v == d, true
		}
	}
	return false, false
}

// TestDocDefaults: every default a document quotes beside a flag is the
// flag's default in the binary (what its -h prints).
func TestDocDefaults(t *testing.T) {
	sets := commandFlags(t)
	checked := 0
	for name, text := range docFiles(t) {
		for _, d := range quotedDefaults(name, text) {
			if d.flag == "" {
				t.Errorf("%s: %q: cannot tell which flag each default is of", d.where, d.value)
				continue
			}
			f := docFlag(sets, d.flag)
			if f == nil {
				t.Errorf("%s quotes a default of --%s, which no command has (or several, with other defaults)", d.where, d.flag)
				continue
			}
			same, ok := sameDefault(f, d.value)
			if ok {
				checked++
				t.Logf("%s: --%s %q (the binary's %q)", d.where, d.flag, d.value, f.DefValue)
			}
			if ok && !same {
				t.Errorf("%s says --%s defaults to %q; the binary's default is %q", d.where, d.flag, d.value, f.DefValue)
			}
		}
	}
	if checked < 25 {
		t.Errorf("checked only %d defaults: the patterns no longer find the documents' (operations.md's table alone has more)", checked)
	}
}

// figure is a number the documents quote whose source is the code or a
// measurement: every match of pattern in the documents (and in the help
// texts named) must give, group by group, want's numbers (within tol,
// a fraction; 0: exactly), and there must be at least min matches.
type figure struct {
	name    string
	pattern *regexp.Regexp
	want    []float64
	tol     float64
	min     int
	help    []string // the commands whose -h text is searched too
}

// docFigures are the documents' numbers and their sources.
func docFigures(t *testing.T) []figure {
	bench := benchPeak(t)
	mib := func(n int64) float64 { return float64(n >> 20) }
	return []figure{
		{name: "serve's soft memory limit (defaultMemoryLimit)", pattern: regexp.MustCompile(`(\d+) MiB soft (?:memory )?limit|sets (\d+) MiB\.`),
			want: []float64{mib(defaultMemoryLimit)}, min: 3, help: []string{"serve"}},
		{name: "peak memory at 4 uploads, 4 fetches and 1 000 idle connections (docs/bench.json's peak RSS target, measured)",
			pattern: regexp.MustCompile(`(\d+) MiB[^.;]{0,40}? (?:at|with) 4 uploads, 4 fetches and 1 000 idle connections`),
			want:    []float64{bench.measured}, tol: 0.05, min: 2},
		{name: "the memory vmshelf is sized for (docs/bench.json's peak RSS target)",
			pattern: regexp.MustCompile(`(\d+) MiB vmshelf is (?:built|sized) (?:to|for)`), want: []float64{bench.threshold}, min: 1},
		{name: "/readyz's free space floor (market.DefaultMinFree)",
			pattern: regexp.MustCompile(`at least (\d+) MiB are free|less than (\d+) MiB (?:are )?free|the store needs \((\d+) MiB\)`),
			want:    []float64{mib(market.DefaultMinFree)}, min: 3},
		{name: "the store's emergency reserve (storeReserve)",
			pattern: regexp.MustCompile(`(\d+) MiB of emergency space|vmshelf\.db-reserve` + "`?" + ` \((\d+) MiB\)`),
			want:    []float64{mib(storeReserve)}, min: 2},
		{name: "the control plane's fixed limits (controlReadTimeout, controlWriteTimeout, controlMaxHeaderBytes)",
			pattern: regexp.MustCompile(`a whole request within (\d+) s, an answer within (\d+) s, headers ≤ (\d+) KiB`),
			want:    []float64{controlReadTimeout.Seconds(), controlWriteTimeout.Seconds(), controlMaxHeaderBytes >> 10}, min: 1},
		{name: "--control-header-timeout's bound (controlReadTimeout)",
			pattern: regexp.MustCompile(`--control-header-timeout` + "`" + ` \| ` + "`[^`]+`" + ` \| [^|]*\(≤ (\d+) s\)|within this \(at most (\d+)s\)`),
			want:    []float64{controlReadTimeout.Seconds()}, min: 2, help: []string{"serve"}},
		{name: "--data-max-conns' default (descriptorReserve, minDefaultDataConns, maxDefaultDataConns)",
			pattern: regexp.MustCompile(`half of the descriptors beyond (\d+) \(` + "`" + `\(RLIMIT_NOFILE − (\d+)\) / 2` + "`" + `\), at least (\d+) and at most (\d+)`),
			want:    []float64{descriptorReserve, descriptorReserve, minDefaultDataConns, maxDefaultDataConns}, min: 1},
		{name: "--data-max-conns' default, in prose (descriptorReserve, minDefaultDataConns, maxDefaultDataConns)",
			pattern: regexp.MustCompile(`half of the descriptors left after (\d+) kept for [^.]*?, at least (\d+), at most (\d+)`),
			want:    []float64{descriptorReserve, minDefaultDataConns, maxDefaultDataConns}, min: 1},
		{name: "--data-max-conns' default in serve -h (descriptorReserve, maxDefaultDataConns)",
			pattern: regexp.MustCompile(`half the descriptors beyond (\d+), at most (\d+)`),
			want:    []float64{descriptorReserve, maxDefaultDataConns}, min: 1, help: []string{"serve"}},
		{name: "fetch-url's longest --ttl (maxFetchURLTTL)",
			pattern: regexp.MustCompile(`--ttl` + "`?" + ` is at most ` + "`?" + `(\d+)h|--ttl, at most (\d+)h|at most (\d+)h\b|longer than (\d+)h`),
			want:    []float64{maxFetchURLTTL.Hours()}, min: 2, help: []string{"fetch-url"}},
	}
}

// TestDocFigures: every figure of docFigures is its source's, wherever a
// document or a help text quotes it.
func TestDocFigures(t *testing.T) {
	docs := docFiles(t)
	for _, fig := range docFigures(t) {
		texts := map[string]string{}
		for name, text := range docs {
			texts[name] = prose(name, text)
		}
		for _, cmd := range fig.help {
			r := vmshelf(t, append(strings.Fields(cmd), "-h")...)
			texts["vmshelf "+cmd+" -h"] = strings.Join(strings.Fields(r.stdout), " ")
		}
		found := 0
		for name, text := range texts {
			for _, m := range fig.pattern.FindAllStringSubmatch(text, -1) {
				found++
				var got []string
				for _, g := range m[1:] {
					if g != "" {
						got = append(got, g)
					}
				}
				want := fig.want
				if len(got) == 1 && len(want) > 1 {
					want = want[:1]
				}
				for i, g := range got {
					n, _ := strconv.ParseFloat(g, 64)
					if i >= len(want) || math.Abs(n-want[i]) > fig.tol*want[i] {
						t.Errorf("%s: %q: %s is %v", name, m[0], fig.name, fmtFigures(want, fig.tol))
						break
					}
				}
			}
		}
		if found < fig.min {
			t.Errorf("%s: found %d quotes, want at least %d: a document was reworded past %s", fig.name, found, fig.min, fig.pattern)
		}
	}
}

func fmtFigures(want []float64, tol float64) string {
	var s []string
	for _, w := range want {
		s = append(s, strconv.FormatFloat(w, 'f', -1, 64))
	}
	if tol > 0 {
		return fmt.Sprintf("%s (±%.0f%%)", strings.Join(s, ", "), tol*100)
	}
	return strings.Join(s, ", ")
}

// benchTarget is docs/bench.json's peak RSS target: what the last `make
// bench` measured (the worst repetition) and the bound it is held to.
type benchTarget struct{ measured, threshold float64 }

func benchPeak(t *testing.T) benchTarget {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "bench.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Targets []struct {
			Name      string  `json:"name"`
			Measured  float64 `json:"measured"`
			Threshold float64 `json:"threshold"`
			Unit      string  `json:"unit"`
		} `json:"targets"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, tg := range doc.Targets {
		if strings.HasPrefix(tg.Name, "peak RSS, 4 concurrent") && strings.Contains(tg.Name, "1 000 idle connections") && tg.Unit == "MiB" {
			return benchTarget{measured: tg.Measured, threshold: tg.Threshold}
		}
	}
	t.Fatal("docs/bench.json has no peak RSS target of 4 concurrent uploads, 4 fetches and 1 000 idle connections")
	return benchTarget{}
}

// TestDocDeployMemory: the kit's memory settings agree with serve and the
// benchmark: GOMEMLIMIT (when a Deployment sets it; serve's own limit
// when not) and the measured peak fit under the container's memory limit,
// and docs/deploy/README.md quotes the single pod's request and limit.
func TestDocDeployMemory(t *testing.T) {
	docs := docFiles(t)
	peak := benchPeak(t).measured
	resources := regexp.MustCompile(`requests:\s*\n(?:\s+cpu: .*\n)?\s+memory: (\d+)Mi\s*\n\s+limits:\s*\n\s+memory: (\d+)Mi`)
	gomemlimit := regexp.MustCompile(`name: GOMEMLIMIT\s*\n\s+value: "?(\d+)MiB"?`)
	for _, name := range []string{"docs/deploy/base/vmshelf.yaml", "docs/deploy/components/scale-out/vmshelf-scale-out.yaml"} {
		m := resources.FindStringSubmatch(docs[name])
		if m == nil {
			t.Errorf("%s: no memory request and limit found", name)
			continue
		}
		request, _ := strconv.Atoi(m[1])
		limit, _ := strconv.Atoi(m[2])
		soft := int(defaultMemoryLimit >> 20)
		if g := gomemlimit.FindStringSubmatch(docs[name]); g != nil {
			soft, _ = strconv.Atoi(g[1])
		}
		if soft >= limit || peak >= float64(limit) || request > limit {
			t.Errorf("%s: soft limit %d MiB, measured peak %.0f MiB, request %d MiB: want the first two under the limit %d MiB, and the request at most it",
				name, soft, peak, request, limit)
		}
		if name == "docs/deploy/base/vmshelf.yaml" {
			quoted := regexp.MustCompile(`(\d+) MiB requested, (\d+) MiB limit`).FindStringSubmatch(prose("", docs["docs/deploy/README.md"]))
			if quoted == nil || quoted[1] != m[1] || quoted[2] != m[2] {
				t.Errorf("docs/deploy/README.md quotes %q; %s requests %s Mi with a limit of %s Mi", quoted, name, m[1], m[2])
			}
		}
	}
}
