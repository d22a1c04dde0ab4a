package repotest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/vmshelf/vmshelf/billing/stripetest"
	"github.com/vmshelf/vmshelf/internal/testkit/traefiktest"
)

// TestReadmeNamesDeps: README's "Tests" section names what .ci/deps
// installs (this package's tests hold .ci/deps to the same list): every
// Debian package, no other, each go install with its version and each npm
// folder. A package added to .ci/deps and not to the README fails here.
func TestReadmeNamesDeps(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, tests, ok := strings.Cut(string(b), "\n## Tests\n")
	if !ok {
		t.Fatal("README.md has no section ## Tests")
	}
	tests, _, _ = strings.Cut(tests, "\n## ")
	flat := strings.Join(strings.Fields(tests), " ")
	m := regexp.MustCompile("the Debian packages `([^`]+)`").FindStringSubmatch(flat)
	if m == nil {
		t.Fatal("README's Tests section has no list \"the Debian packages `…`\"")
	}
	listed := strings.Fields(m[1])
	var want []string
	for _, d := range debian {
		want = append(want, d.pkg)
	}
	if !slices.Equal(listed, want) {
		t.Errorf("README lists the Debian packages %q; .ci/deps installs %q (in this order)", listed, want)
	}
	for _, s := range append([]string{stripetest.MockInstall, tusdInstall, versitygwInstall, "Traefik " + traefiktest.Version}, npmDirs...) {
		if !strings.Contains(flat, strings.TrimPrefix(s, "go install ")) {
			t.Errorf("README's Tests section does not name %q", s)
		}
	}
}
