// Package gobin finds a Go tool the tests and the bench run as a peer
// (stripe-mock, versitygw, tusd): on PATH, or where `go install` put it
// (GOBIN, else each GOPATH's bin), which a fresh shell's PATH often lacks.
package gobin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Find returns the path of the executable name, and the directories it
// looked in besides PATH (for the message when it is missing).
func Find(name string) (string, []string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil, nil
	}
	var dirs []string
	if out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output(); err == nil {
		// One line each; an unset GOBIN is an empty first line.
		lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
		if len(lines) == 2 {
			if gobin := strings.TrimSpace(lines[0]); gobin != "" {
				dirs = append(dirs, gobin)
			}
			for _, gp := range filepath.SplitList(strings.TrimSpace(lines[1])) {
				dirs = append(dirs, filepath.Join(gp, "bin"))
			}
		}
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, dirs, nil
		}
	}
	return "", dirs, fmt.Errorf("%s is not on PATH nor in %q", name, dirs)
}

// Need is Find for a test: a missing tool fails the test under CI=true
// and skips it loudly elsewhere, naming what it is for and install, the
// command that gets it.
func Need(t testing.TB, name, what, install string) string {
	t.Helper()
	p, _, err := Find(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (%s) is required in CI: %v; install it with: %s", name, what, err, install)
	}
	t.Skipf("SKIPPED: %s (%s) is missing: %v; install it with: %s", name, what, err, install)
	return ""
}
