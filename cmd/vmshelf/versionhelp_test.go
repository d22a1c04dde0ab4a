package main

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// TestHelpVersionPromise: version's help says what version prints. A
// build of a checkout (make build stamps VCS information) prints its
// commit's version, a pseudo-version like the help's example with +dirty
// when modified; "(devel)" only without VCS information. (The help once
// promised "(devel)" for every build from a work tree.)
func TestHelpVersionPromise(t *testing.T) {
	about := strings.Join(strings.Fields(versionHelp.About), " ")
	example := regexp.MustCompile(`v0\.0\.0-\d{14}-[0-9a-f]{12}`).FindString(about)
	if example == "" {
		t.Fatalf("version's help shows no pseudo-version:\n%s", about)
	}
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: example + "+dirty"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: strings.Repeat("0123456789", 4)}, {Key: "vcs.modified", Value: "true"}}}
	got := versionText(bi, true)
	if !strings.HasPrefix(got, "vmshelf "+example+"+dirty\n") || !strings.Contains(got, "(modified)") ||
		!strings.Contains(about, `"+dirty"`) || !strings.Contains(about, `"(modified)"`) {
		t.Errorf("a modified checkout prints %q; the help says %q", got, about)
	}
	for _, sentence := range strings.SplitAfter(about, ". ") {
		if strings.Contains(sentence, "(devel)") && !strings.Contains(sentence, "without VCS information") {
			t.Errorf("the help promises (devel) beyond builds without VCS information: %q", sentence)
		}
	}
	if got := versionText(nil, false); !strings.HasPrefix(got, "vmshelf (devel)\ncommit unknown\n") {
		t.Errorf("without build information: %q", got)
	}
	mk, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?mi)^build:\n\t.*go\)? build (-\S+ )*-buildvcs=(auto|true) `).Match(mk) {
		t.Errorf("the Makefile's build target no longer stamps VCS information (-buildvcs), which the help promises of make build")
	}
}
