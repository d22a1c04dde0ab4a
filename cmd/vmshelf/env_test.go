package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/internal/cli"
)

// TestE2EEnvTypoWarned: serve warns once per VMSHELF_* variable it does
// not read, in its start-up log, naming the closest one it does, and
// never the value (a misspelt VMSHELF_STORE_URL carries a password). A
// variable of another command (VMSHELF_TOKEN_FILE, VMSHELF_CONTROL) is
// no typo.
func TestE2EEnvTypoWarned(t *testing.T) {
	const (
		urlValue   = "https://typo-value.example"
		storeValue = "postgres://vmshelf:pw-in-a-typo@db/vmshelf"
	)
	s := startServe(t, filepath.Join(t.TempDir(), "data"), nil,
		"VMSHELF_PUBLIC_ULR="+urlValue, "VMSHELF_STORE_ULR="+storeValue,
		"VMSHELF_TOKEN_FILE=/nonexistent/token", "VMSHELF_CONTROL=http://127.0.0.1:1", "VMSHELF_LOG_LEVEL=info")
	s.stop()
	logs := s.logs()
	for _, want := range []string{
		"VMSHELF_PUBLIC_ULR is not a vmshelf variable; did you mean VMSHELF_PUBLIC_URL?",
		"VMSHELF_STORE_ULR is not a vmshelf variable; did you mean VMSHELF_STORE_URL?",
	} {
		var lines []string
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, want) {
				lines = append(lines, l)
			}
		}
		if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") {
			t.Errorf("serve's log has %d lines saying %q, want one warning:\n%s", len(lines), want, logs)
		}
	}
	if n := strings.Count(logs, "is not a vmshelf variable"); n != 2 {
		t.Errorf("serve warned of %d variables, want 2 (VMSHELF_TOKEN_FILE and VMSHELF_CONTROL are read by other commands):\n%s", n, logs)
	}
	for _, v := range []string{urlValue, storeValue, "pw-in-a-typo"} {
		if strings.Contains(logs, v) {
			t.Errorf("serve's log tells the value %q:\n%s", v, logs)
		}
	}
}

// TestCommandsWarnUnknownEnv: every command warns on stderr of a
// misspelt VMSHELF_* variable before it runs, as serve does in its log:
// also when it only shows its help or fails (a misspelt VMSHELF_NAME is
// often why upload then lacks --name). serve warns in its start-up
// log instead (TestE2EEnvTypoWarned), so its help stays silent.
func TestCommandsWarnUnknownEnv(t *testing.T) {
	for _, kv := range os.Environ() { // the developer's own settings are not under test
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "VMSHELF_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	t.Setenv("VMSHELF_TOKN_FILE", "/box/token-in-a-typo")
	const want = `level=WARN msg="VMSHELF_TOKN_FILE is not a vmshelf variable; did you mean VMSHELF_TOKEN_FILE?"` + "\n"
	var walk func(path []string, cmds []cli.Command)
	walk = func(path []string, cmds []cli.Command) {
		for _, c := range cmds {
			p := append(path[:len(path):len(path)], c.Name)
			if c.Sub != nil {
				walk(p, c.Sub)
				continue
			}
			var stderr bytes.Buffer
			if err := run(context.Background(), append(p, "-h"), io.Discard, &stderr); err != nil {
				t.Errorf("vmshelf %s -h: %v", strings.Join(p, " "), err)
			}
			switch {
			case len(p) == 1 && p[0] == "serve":
				if stderr.Len() != 0 {
					t.Errorf("vmshelf serve -h wrote %q on stderr; serve warns in its start-up log", stderr.String())
				}
			case stderr.String() != want:
				t.Errorf("vmshelf %s -h: stderr %q, want only %q", strings.Join(p, " "), stderr.String(), want)
			}
		}
	}
	walk(nil, commands)
}

// TestE2ECommandsWarnUnknownEnv: through the binary, a command that fails
// for want of a setting whose variable is misspelt says so first, and one
// that succeeds warns without a change to what it prints; no warning
// tells a value.
func TestE2ECommandsWarnUnknownEnv(t *testing.T) {
	skipShort(t, "it runs the vmshelf binary")
	data := filepath.Join(t.TempDir(), "data")
	const name = "a name in a typo"
	r := runCmd(t, []string{"VMSHELF_NAEM=" + name}, binPath, "upload", "--token-file", "/nonexistent", "disk.qcow2")
	if r.code != 2 || !strings.HasPrefix(r.stderr, `level=WARN msg="VMSHELF_NAEM is not a vmshelf variable; did you mean VMSHELF_NAME?"`+"\n") ||
		!strings.Contains(r.stderr, "upload needs --name") || strings.Contains(r.stderr, name) {
		t.Errorf("upload with VMSHELF_NAEM: exit %d, stderr:\n%s\nwant 2, the warning, then the usage error, no value", r.code, r.stderr)
	}
	r = runCmd(t, []string{"VMSHELF_DATA_DIR=" + data}, binPath, "tenant", "add", "box1")
	if r.code != 0 || r.stderr != "tenant box1 added; its token follows, shown only this once:\n" {
		t.Fatalf("tenant add: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	r = runCmd(t, []string{"VMSHELF_DATA_DIR=" + data, "VMSHELF_SHARNG=true"}, binPath, "tenant", "list")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "NAME") || !strings.Contains(r.stdout, "box1") ||
		r.stderr != `level=WARN msg="VMSHELF_SHARNG is not a vmshelf variable; did you mean VMSHELF_SHARING?"`+"\n" {
		t.Errorf("tenant list with VMSHELF_SHARNG: exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}
