package repotest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// toolPackage is the Debian package that installs a tool these tests
// need themselves (.ci/deps installs the tools of the other tests).
var toolPackage = map[string]string{"make": "make", "bash": "bash", "git": "git", "cp": "coreutils", "mkdir": "coreutils"}

// needTool is the path of a tool the test cannot do without: missing, it
// fails the test under CI=true and skips it elsewhere, naming the install.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	pkg := toolPackage[name]
	if pkg == "" {
		pkg = name
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is required (CI=true): apt-get install %s (%v)", name, pkg, err)
	}
	t.Skipf("%s missing: apt-get install %s (%v)", name, pkg, err)
	return ""
}

// repoRoot is the repository's top: the nearest directory above the test's
// own that holds go.mod (the main module's, not provisioner/kubetest's).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = up
	}
}

// pathDir is a fresh directory for PATH holding a symlink to each named
// tool and nothing else, so that a command run with it finds only those.
func pathDir(t *testing.T, tools ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range tools {
		if err := os.Symlink(needTool(t, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// copyFile copies a file with its permission bits, making the folders
// it goes in.
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, fi.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
}

// writeScript writes an executable bash script at path; body follows the
// #! line.
func writeScript(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!"+needTool(t, "bash")+"\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
}

// childEnv is the environment of a command run with PATH set to path:
// the test's own without what would change the command's course (PATH,
// CI, the VMSHELF_* settings, Go's GOPATH, GOBIN and GOFLAGS, and an
// enclosing make's flags, as when make test runs these tests), plus extra.
func childEnv(path string, extra ...string) []string {
	drop := map[string]bool{"PATH": true, "CI": true, "GOPATH": true, "GOBIN": true, "GOFLAGS": true,
		"MAKEFLAGS": true, "MAKELEVEL": true, "MFLAGS": true, "MAKEOVERRIDES": true, "GO": true}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if drop[k] || strings.HasPrefix(k, "VMSHELF_") {
			continue
		}
		env = append(env, kv)
	}
	// .ci/deps also finds PostgreSQL off PATH, where Debian puts it; the
	// fake machines have only what PATH gives them.
	// The files .ci/deps looks for (the boot tests' firmware and GRUB) are
	// looked for below root in path, where a fake machine's packages put them.
	return append(append(env, "PATH="+path, "VMSHELF_PG_BINDIRS=/nonexistent", "VMSHELF_FILES_ROOT="+filepath.Join(path, "root")), extra...)
}

// result is what a command did.
type result struct {
	out     string // stdout and stderr, interleaved as written
	code    int
	elapsed time.Duration
}

// runIn runs name with args in dir with env, within d: past it the command
// and all its children (its process group) are killed and the test fails.
func runIn(t *testing.T, d time.Duration, dir string, env []string, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	r := result{out: out.String(), elapsed: time.Since(start)}
	if ctx.Err() != nil {
		t.Fatalf("%s %s did not end within %v; it printed:\n%s", name, strings.Join(args, " "), d, r.out)
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", name, err)
	}
	return r
}
