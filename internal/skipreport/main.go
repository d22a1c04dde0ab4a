// Command skipreport reads `go test -json` on its standard input and prints
// what go test prints without -json: build errors, each package's result
// line and the output of the tests that failed. Then it lists every test
// that skipped, with the reason the test gave. `make test-short` runs the
// tests through it: there a test whose tool is missing skips, and a run
// with skips passes, so the skips must be said, never left silent.
//
// It exits 1 when a build or a test failed, or when the input held no
// package result at all (go test did not get to run).
//
// Usage: go test -json ./... | go run ./internal/skipreport [-module PATH]
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

func main() {
	module := flag.String("module", "", "module path, shortened to ./ in the list of skips")
	flag.Parse()
	ok, err := run(os.Stdin, os.Stdout, *module)
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipreport:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json's TestEvent; the
// build events carry ImportPath instead of Package).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

type key struct{ pkg, test string }

// skip is a skipped test and the reason it logged.
type skip struct{ pkg, test, why string }

// report follows the events: it holds each running test's output until the
// test ends, prints it if the test failed, keeps it as the reason if it
// skipped, and drops it if it passed.
type report struct {
	out     io.Writer
	held    map[key][]string
	order   []key // held's keys in the order their tests started
	skips   []skip
	failed  bool
	results int // package results seen
}

// run reads the events from in, prints to out and reports whether every
// build and test passed.
func run(in io.Reader, out io.Writer, module string) (bool, error) {
	r := &report{out: out, held: map[key][]string{}}
	br := bufio.NewReader(in)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			var e event
			if json.Unmarshal([]byte(line), &e) != nil || e.Action == "" {
				// Not an event (go test writes none such to stdout, but a
				// line that is no event is shown, not lost).
				fmt.Fprint(out, line)
			} else {
				r.add(e)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return false, fmt.Errorf("reading go test -json: %w", err)
		}
	}
	r.flush(func(key) bool { return true }) // tests that never ended (a crash)
	r.summary(module)
	if r.results == 0 {
		fmt.Fprintln(out, "skipreport: no package result in the input: go test did not run")
		return false, nil
	}
	return !r.failed, nil
}

// framing is the -v bookkeeping that go test without -v does not print.
func framing(line string) bool {
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME"} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

func (r *report) add(e event) {
	switch {
	case e.Action == "build-output":
		fmt.Fprint(r.out, e.Output)
	case e.Action == "build-fail":
		r.failed = true
	case e.Test == "":
		switch e.Action {
		case "output":
			// The test binary's PASS line, which go test folds into "ok".
			if e.Output != "PASS\n" {
				fmt.Fprint(r.out, e.Output)
			}
		case "pass", "skip":
			r.results++
		case "fail":
			r.results++
			r.failed = true
			// A test still running when its package failed (a timeout,
			// a panic): its output says where.
			r.flush(func(k key) bool { return k.pkg == e.Package })
		}
	default:
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			if framing(e.Output) {
				return
			}
			if _, ok := r.held[k]; !ok {
				r.order = append(r.order, k)
			}
			r.held[k] = append(r.held[k], e.Output)
		case "fail":
			r.failed = true
			r.flush(func(o key) bool { return o == k })
		case "skip":
			r.skips = append(r.skips, skip{e.Package, e.Test, reason(r.held[k])})
			r.drop(k)
		case "pass":
			r.drop(k)
		}
	}
}

// flush prints and drops the held output of the tests that match.
func (r *report) flush(match func(key) bool) {
	for _, k := range r.order {
		if lines, ok := r.held[k]; ok && match(k) {
			fmt.Fprint(r.out, strings.Join(lines, ""))
			r.drop(k)
		}
	}
}

func (r *report) drop(k key) {
	delete(r.held, k)
	for i, o := range r.order {
		if o == k {
			r.order = append(r.order[:i], r.order[i+1:]...)
			break
		}
	}
}

// logPrefix is t.Log's "file_test.go:12: " before each message.
var logPrefix = regexp.MustCompile(`^\S+\.go:\d+: `)

// reason is a skipped test's own output without go test's SKIP line: what
// it said when it skipped.
func reason(lines []string) string {
	var parts []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		parts = append(parts, logPrefix.ReplaceAllString(l, ""))
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " ")
}

func (r *report) summary(module string) {
	if len(r.skips) == 0 {
		fmt.Fprintln(r.out, "no test skipped")
		return
	}
	noun := "tests"
	if len(r.skips) == 1 {
		noun = "test"
	}
	fmt.Fprintf(r.out, "skipped %d %s (make test installs what they need, or stops saying how):\n", len(r.skips), noun)
	for _, s := range r.skips {
		fmt.Fprintf(r.out, "  %s (%s): %s\n", s.test, shortPkg(s.pkg, module), s.why)
	}
}

func shortPkg(pkg, module string) string {
	switch {
	case module == "":
		return pkg
	case pkg == module:
		return "."
	case strings.HasPrefix(pkg, module+"/"):
		return "./" + strings.TrimPrefix(pkg, module+"/")
	}
	return pkg
}
