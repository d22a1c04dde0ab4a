// Command testprogress runs `go test -json` and prints what a person
// waiting on a long run wants to see while it runs: a line for each
// package as it finishes (go test's own output holds a finished package
// back until every package listed before it is done), a line for each
// skipped test as it is skipped, a line after each minute without one
// (what is still running, or that the test binaries are still being
// compiled: a cold race build is minutes of go test's silence), and at the
// end the slowest tests (where a run's time budget goes), the output of
// every failure and the counts. It exits as go test did.
//
//	go run ./internal/tools/testprogress go test -json -race ./...
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testprogress go test -json [flags] [packages]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
	events, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testprogress:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testprogress:", err)
		os.Exit(2)
	}
	start := time.Now()
	r := newReport(os.Stdout, func() time.Duration { return time.Since(start) })
	tick := time.NewTicker(heartbeatEvery / 4)
	r.read(events, tick.C)
	tick.Stop()
	err = cmd.Wait()
	r.summary()
	switch {
	case err != nil:
		// go test's own code: 1 for a failed test or build, 2 for its usage.
		if exit, ok := err.(*exec.ExitError); ok {
			os.Exit(exit.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "testprogress:", err)
		os.Exit(2)
	case r.failed():
		// A failure go test did not report in its exit code (a package
		// that printed FAIL output after a pass, say) still fails.
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json's TestEvent, with
// Go 1.24's build-output lines).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	Elapsed     float64
	ImportPath  string
	FailedBuild string
}

// timedTest is a finished top-level test and how long it ran.
type timedTest struct {
	name    string // "package Test"
	elapsed float64
}

// slowest is how many of the slowest tests the summary names.
const slowest = 10

// heartbeatEvery is the longest the report stays silent while go test runs.
const heartbeatEvery = time.Minute

type pkgState struct {
	started        time.Duration // when its test binary began, by the report's clock
	running        bool
	tests, skipped int
	output         map[string]*strings.Builder // by test; "" the package's own
}

type report struct {
	out      io.Writer
	elapsed  func() time.Duration
	pkgs     map[string]*pkgState
	builds   map[string]*strings.Builder // build output by import path
	failures []string                    // what to print again at the end
	skips    []string
	timed    []timedTest // top-level tests that passed or failed
	nTests   int
	nFailed  int // top-level tests
	nPkgFail int
	nPkgDone int
	said     time.Duration // when the report last printed a line
}

func newReport(out io.Writer, elapsed func() time.Duration) *report {
	return &report{out: out, elapsed: elapsed, pkgs: map[string]*pkgState{}, builds: map[string]*strings.Builder{}}
}

func (r *report) pkg(name string) *pkgState {
	p := r.pkgs[name]
	if p == nil {
		p = &pkgState{output: map[string]*strings.Builder{}}
		r.pkgs[name] = p
	}
	return p
}

// read handles events until in ends. A line that is not an event (a
// tool's own message) is printed as it is. On each tick it checks whether
// the report has been silent for heartbeatEvery and, if so, says what is
// going on; a nil ticks never ticks.
func (r *report) read(in io.Reader, ticks <-chan time.Time) {
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return
			}
			r.line(l)
		case <-ticks:
			r.tick()
		}
	}
}

// tick prints a heartbeat if the report has been silent for heartbeatEvery.
func (r *report) tick() {
	if r.elapsed()-r.said >= heartbeatEvery {
		r.heartbeat()
	}
}

// line handles one line of go test's output.
func (r *report) line(l []byte) {
	var e event
	if err := json.Unmarshal(l, &e); err != nil || e.Action == "" {
		r.printf("%s\n", l)
		return
	}
	r.handle(e)
}

// printf prints one or more lines of the report and notes when.
func (r *report) printf(format string, args ...any) {
	fmt.Fprintf(r.out, format, args...)
	r.said = r.elapsed()
}

// heartbeat says what go test is doing while it prints nothing: which
// packages' tests are running and for how long, or, before any has
// started, that the test binaries are still being compiled.
func (r *report) heartbeat() {
	now := r.elapsed()
	var running []string
	for name, p := range r.pkgs {
		if p.running {
			running = append(running, fmt.Sprintf("%s (%s)", name, (now-p.started).Round(time.Second)))
		}
	}
	sort.Strings(running)
	switch {
	case len(running) > 0:
		r.printf("%s ... running: %s; %d packages done\n", r.stamp(), strings.Join(running, ", "), r.nPkgDone)
	case r.nPkgDone == 0:
		r.printf("%s ... compiling the test binaries (no package's tests have started yet; a cold build takes minutes)\n", r.stamp())
	default:
		r.printf("%s ... compiling the next test binaries; %d packages done\n", r.stamp(), r.nPkgDone)
	}
}

func (r *report) stamp() string {
	d := r.elapsed().Round(time.Second)
	return fmt.Sprintf("[%dm%02ds]", int(d.Minutes()), int(d.Seconds())%60)
}

func (r *report) handle(e event) {
	if e.Action == "build-output" || e.Action == "build-fail" {
		b := r.builds[e.ImportPath]
		if b == nil {
			b = &strings.Builder{}
			r.builds[e.ImportPath] = b
		}
		b.WriteString(e.Output)
		if e.Action == "build-fail" {
			r.failures = append(r.failures, fmt.Sprintf("build of %s failed:\n%s", e.ImportPath, b.String()))
		}
		return
	}
	p := r.pkg(e.Package)
	switch e.Action {
	case "start":
		p.started, p.running = r.elapsed(), true
	case "output":
		b := p.output[e.Test]
		if b == nil {
			b = &strings.Builder{}
			p.output[e.Test] = b
		}
		b.WriteString(e.Output)
	case "pass", "fail", "skip":
		if e.Test != "" {
			r.testDone(e, p)
			return
		}
		r.packageDone(e, p)
	}
}

func (r *report) testDone(e event, p *pkgState) {
	top := !strings.Contains(e.Test, "/")
	if top {
		p.tests++
		r.nTests++
		if e.Action != "skip" {
			r.timed = append(r.timed, timedTest{e.Package + " " + e.Test, e.Elapsed})
		}
	}
	switch e.Action {
	case "skip":
		if !top {
			return
		}
		p.skipped++
		why := reason(p.output[e.Test])
		r.skips = append(r.skips, fmt.Sprintf("%s %s: %s", e.Package, e.Test, why))
		r.printf("%s SKIP %s %s: %s\n", r.stamp(), e.Package, e.Test, why)
	case "fail":
		if top {
			r.nFailed++
		}
		// A parent's own output is mostly its subtests' verdicts: print
		// a failure's block only where it says more than "--- FAIL".
		if out := telling(p.output[e.Test]); out != "" {
			r.failures = append(r.failures, fmt.Sprintf("--- FAIL: %s %s\n%s", e.Package, e.Test, out))
		}
	}
	delete(p.output, e.Test)
}

func (r *report) packageDone(e event, p *pkgState) {
	word := "ok  "
	switch e.Action {
	case "fail":
		word = "FAIL"
		r.nPkgFail++
		// A timeout's panic or a crash is the package's own output.
		if out := telling(p.output[""]); out != "" {
			r.failures = append(r.failures, fmt.Sprintf("--- FAIL: %s\n%s", e.Package, out))
		}
	case "skip":
		word = "----"
	}
	counts := ""
	if p.tests > 0 {
		counts = fmt.Sprintf("  %d tests", p.tests)
		if p.skipped > 0 {
			counts += fmt.Sprintf(", %d skipped", p.skipped)
		}
	} else if e.Action == "skip" {
		counts = "  no test files"
	}
	r.printf("%s %s %s %.1fs%s\n", r.stamp(), word, e.Package, e.Elapsed, counts)
	r.nPkgDone++
	delete(r.pkgs, e.Package)
}

// telling is output without the lines that only frame it: go test's
// === markers, verdict lines and its PASS/FAIL/ok summary of a package.
func telling(b *strings.Builder) string {
	if b == nil {
		return ""
	}
	var keep []string
	for _, l := range strings.Split(b.String(), "\n") {
		t := strings.TrimSpace(l)
		switch {
		case t == "", t == "FAIL", t == "PASS", strings.HasPrefix(t, "=== "),
			strings.HasPrefix(t, "--- FAIL:"), strings.HasPrefix(t, "--- PASS:"), strings.HasPrefix(t, "--- SKIP:"),
			strings.HasPrefix(t, "FAIL\t"), strings.HasPrefix(t, "ok  \t"):
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}

// reason is the last line a skipped test printed (t.Skip's message),
// without the file:line prefix.
func reason(b *strings.Builder) string {
	if b == nil {
		return "(no reason given)"
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "--- SKIP") || strings.HasPrefix(l, "=== ") {
			continue
		}
		if _, after, ok := strings.Cut(l, ".go:"); ok {
			if _, msg, ok := strings.Cut(after, ": "); ok {
				return msg
			}
		}
		return l
	}
	return "(no reason given)"
}

func (r *report) failed() bool { return len(r.failures) > 0 || r.nPkgFail > 0 || r.nFailed > 0 }

func (r *report) summary() {
	if len(r.timed) > 0 {
		sort.SliceStable(r.timed, func(i, j int) bool { return r.timed[i].elapsed > r.timed[j].elapsed })
		n := min(slowest, len(r.timed))
		fmt.Fprintf(r.out, "\n=== Slowest %d of %d tests (a test's own time; parallel tests overlap)\n", n, len(r.timed))
		for _, tt := range r.timed[:n] {
			fmt.Fprintf(r.out, "%7.1fs %s\n", tt.elapsed, tt.name)
		}
	}
	if len(r.skips) > 0 {
		sort.Strings(r.skips)
		fmt.Fprintf(r.out, "\n=== Skipped (%d)\n", len(r.skips))
		for _, s := range r.skips {
			fmt.Fprintln(r.out, s)
		}
	}
	if len(r.failures) > 0 {
		fmt.Fprintf(r.out, "\n=== Failed\n")
		for _, f := range r.failures {
			fmt.Fprintln(r.out, strings.TrimRight(f, "\n"))
		}
	}
	fmt.Fprintf(r.out, "\n%s DONE %d tests, %d skipped, %d failed; %d packages failed\n", r.stamp(), r.nTests, len(r.skips), r.nFailed, r.nPkgFail)
}
