package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProgress: downloads and compiled packages are counted and reported
// on a tick only when they moved; every other line (an error) is passed on.
func TestProgress(t *testing.T) {
	var out strings.Builder
	now := time.Duration(0)
	p := &progress{out: &out, what: "go build", elapsed: func() time.Duration { return now }}
	p.begin()
	now = 5 * time.Second
	p.report() // nothing yet: no line
	for _, l := range []string{
		"go: downloading github.com/valyala/fasthttp v1.78.0",
		"go: downloading golang.org/x/time v0.14.0",
		"internal/goarch",
		"github.com/valyala/fasthttp",
	} {
		p.line(l)
	}
	now = 10 * time.Second
	p.report()
	now = 20 * time.Second
	p.report() // nothing moved: no line
	p.line("# github.com/vmshelf/vmshelf/gateway")
	p.line("gateway/x.go:3:2: undefined: y")
	now = 25 * time.Second
	p.end(os.ErrClosed)
	want := "[0m00s] go build: started (a first build fetches modules and compiles for minutes; a line every 10s)\n" +
		"[0m10s] go build: 2 modules fetched, 2 packages compiled so far\n" +
		"# github.com/vmshelf/vmshelf/gateway\n" +
		"gateway/x.go:3:2: undefined: y\n" +
		"[0m25s] go build: failed (2 modules fetched, 2 packages compiled)\n"
	if out.String() != want {
		t.Errorf("printed:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestRunExitCode: make's verdict is the command's exit code.
func TestRunExitCode(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "fails.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho 'go: downloading m v1' >&2\necho 'it broke' >&2\nexit 3\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if code := run([]string{script}, &out); code != 3 {
		t.Errorf("exit %d, want 3:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "it broke\n") || !strings.Contains(out.String(), "failed (1 modules fetched") {
		t.Errorf("printed:\n%s", out.String())
	}
}
