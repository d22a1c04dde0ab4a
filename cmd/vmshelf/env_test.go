package main

import (
	"path/filepath"
	"strings"
	"testing"
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
