// Command buildprogress runs a go command that may build for minutes (a
// first `go build` on a cold cache fetches modules and compiles hundreds of
// packages, printing nothing but "go: downloading" lines) and says what it
// is doing: a line when it starts, a line every ten seconds while modules
// are fetched or packages compiled, with the counts so far, and a line at
// the end. It passes every other line of the command's output (errors) on
// as it is, and exits as the command did.
//
//	go run ./internal/tools/buildprogress go build -v -o bin/vmshelf ./cmd/vmshelf
//
// The command should be given -v where it takes it (go build): -v names
// each package as it is compiled, which is what is counted.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// every is how often a running build reports its counts.
const every = 10 * time.Second

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: buildprogress go build -v [flags] [packages]")
		os.Exit(2)
	}
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, out io.Writer) int {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout = os.Stdin, os.Stdout
	lines, err := cmd.StderrPipe()
	if err != nil {
		fmt.Fprintln(out, "buildprogress:", err)
		return 2
	}
	start := time.Now()
	p := &progress{out: out, what: strings.Join(args[:min(2, len(args))], " "),
		elapsed: func() time.Duration { return time.Since(start) }}
	p.begin()
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(out, "buildprogress:", err)
		return 2
	}
	tick := time.NewTicker(every)
	p.read(lines, tick.C)
	tick.Stop()
	err = cmd.Wait()
	p.end(err)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	default:
		fmt.Fprintln(out, "buildprogress:", err)
		return 2
	}
}

// progress counts what a go command reports on stderr.
type progress struct {
	out      io.Writer
	what     string // "go build"
	elapsed  func() time.Duration
	fetched  int // "go: downloading" lines
	compiled int // package names (go build -v)
	last     string
}

var (
	downloading = regexp.MustCompile(`^go: downloading \S+ \S+$`)
	// A package path as -v prints it: no space, no colon (an error's
	// "file.go:1:2: …" or "# pkg" has one).
	packageLine = regexp.MustCompile(`^[A-Za-z0-9_.~/-]+$`)
)

func (p *progress) stamp() string {
	d := p.elapsed().Round(time.Second)
	return fmt.Sprintf("[%dm%02ds]", int(d.Minutes()), int(d.Seconds())%60)
}

func (p *progress) begin() {
	p.last = p.counts() // nothing to report until something moves
	fmt.Fprintf(p.out, "%s %s: started (a first build fetches modules and compiles for minutes; a line every %v)\n", p.stamp(), p.what, every)
}

// read handles the command's stderr until it ends, reporting on each tick.
func (p *progress) read(in io.Reader, ticks <-chan time.Time) {
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return
			}
			p.line(l)
		case <-ticks:
			p.report()
		}
	}
}

func (p *progress) line(l string) {
	switch {
	case downloading.MatchString(l):
		p.fetched++
	case packageLine.MatchString(l):
		p.compiled++
	default:
		fmt.Fprintln(p.out, l)
	}
}

// counts is what has happened so far, in words.
func (p *progress) counts() string {
	return fmt.Sprintf("%d modules fetched, %d packages compiled", p.fetched, p.compiled)
}

// report prints the counts if they moved since the last report.
func (p *progress) report() {
	c := p.counts()
	if c == p.last {
		return
	}
	p.last = c
	fmt.Fprintf(p.out, "%s %s: %s so far\n", p.stamp(), p.what, c)
}

func (p *progress) end(err error) {
	word := "done"
	if err != nil {
		word = "failed"
	}
	fmt.Fprintf(p.out, "%s %s: %s (%s)\n", p.stamp(), p.what, word, p.counts())
}
