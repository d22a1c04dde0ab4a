package kubetest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// KubeVirt's and CDI's operators: docs/deploy/operators.sh downloads their
// release manifests and applies them only when each is byte for byte the
// one pinned in docs/deploy/releases.sha256. The releases cannot be
// downloaded here, so curl and kubectl are stand-ins on PATH; sh and
// sha256sum are the real ones, and so is the script.

// The versions the kit installs (docs/deploy/README.md).
const (
	kubevirtRelease = "https://github.com/kubevirt/kubevirt/releases/download/v1.9.0/kubevirt-operator.yaml"
	cdiRelease      = "https://github.com/kubevirt/containerized-data-importer/releases/download/v1.66.1/cdi-operator.yaml"
)

// releasePins reads a sha256sum file: file name → 64-hex digest.
func releasePins(t *testing.T, text string) map[string]string {
	t.Helper()
	line := regexp.MustCompile(`^([0-9a-f]{64})  ([a-z0-9.-]+)$`)
	pins := map[string]string{}
	for _, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("releases.sha256: %q is not \"<sha256>  <file>\"", l)
		}
		pins[m[2]] = m[1]
	}
	return pins
}

// operatorsRun is one run of the script with the stand-ins.
type operatorsRun struct {
	err              error
	output           string
	curled, kubectls []string // one line per call: its arguments
}

// runOperators runs operators.sh from a copy of docs/deploy's script
// beside pins, with a curl that saves body(url) where --output says and a
// kubectl that only notes its arguments.
func runOperators(t *testing.T, pins string, body func(url string) string) operatorsRun {
	t.Helper()
	for _, tool := range []string{"sh", "sha256sum"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (coreutils and a POSIX sh are the script's own needs)", tool, err)
		}
	}
	dir := t.TempDir()
	kit, bin, bodies := filepath.Join(dir, "kit"), filepath.Join(dir, "bin"), filepath.Join(dir, "bodies")
	for _, d := range []string{kit, bin, bodies} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script, err := os.ReadFile(filepath.Join(kitDir, "operators.sh"))
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, text string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(name, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(kit, "operators.sh"), string(script), 0o755)
	write(filepath.Join(kit, "releases.sha256"), pins, 0o644)
	for i, u := range []string{kubevirtRelease, cdiRelease} {
		write(filepath.Join(bodies, strings.Repeat("x", i+1)), body(u), 0o644)
	}
	// curl: notes its arguments; the body of a release URL it knows goes
	// to --output, anything else is a failed download.
	write(filepath.Join(bin, "curl"), `#!/bin/sh
echo "$*" >>"$LOG_DIR/curl"
out= url=
while [ $# -gt 0 ]; do
	case "$1" in
	--output) out=$2; shift ;;
	--proto|--max-time) shift ;;
	-*) ;;
	*) url=$1 ;;
	esac
	shift
done
case "$url" in
`+kubevirtRelease+`) cp "$BODIES/x" "$out" ;;
`+cdiRelease+`) cp "$BODIES/xx" "$out" ;;
*) echo "curl: (22) 404 $url" >&2; exit 22 ;;
esac
`, 0o755)
	write(filepath.Join(bin, "kubectl"), "#!/bin/sh\necho \"$*\" >>\"$LOG_DIR/kubectl\"\n", 0o755)

	cmd := exec.Command("sh", filepath.Join(kit, "operators.sh"))
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "LOG_DIR="+dir, "BODIES="+bodies)
	out, err := cmd.CombinedOutput()
	r := operatorsRun{err: err, output: string(out)}
	for name, lines := range map[string]*[]string{"curl": &r.curled, "kubectl": &r.kubectls} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
			*lines = strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		}
	}
	return r
}

func sha256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// TestKitOperators: operators.sh fetches KubeVirt v1.9.0's and CDI
// v1.66.1's operator manifests from their releases, over https only, and
// hands them to kubectl (server-side) only when both are byte for byte
// the pinned ones; one byte off, and kubectl is never run.
func TestKitOperators(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(kitDir, "releases.sha256"))
	if err != nil {
		t.Fatal(err)
	}
	pins := releasePins(t, string(b))
	var names []string
	for name := range pins {
		names = append(names, name)
	}
	if slices.Sort(names); !slices.Equal(names, []string{"cdi-operator.yaml", "kubevirt-operator.yaml"}) {
		t.Fatalf("releases.sha256 pins %v", names)
	}

	guide, err := os.ReadFile(filepath.Join(kitDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{kubevirtRelease, cdiRelease} {
		if !strings.Contains(string(guide), u) {
			t.Errorf("docs/deploy/README.md does not name %s", u)
		}
	}

	release := func(u string) string { return "# the release manifest at " + u + "\n" }
	t.Run("a download that is not the pinned release is never applied", func(t *testing.T) {
		r := runOperators(t, string(b), release)
		if r.err == nil || len(r.kubectls) > 0 {
			t.Fatalf("err = %v, kubectl ran %q; output:\n%s", r.err, r.kubectls, r.output)
		}
		if !strings.Contains(r.output, "FAILED") {
			t.Errorf("no word of the mismatch:\n%s", r.output)
		}
		if len(r.curled) != 2 || !strings.Contains(r.curled[0], kubevirtRelease) || !strings.Contains(r.curled[1], cdiRelease) {
			t.Errorf("downloads %q, want %s and %s", r.curled, kubevirtRelease, cdiRelease)
		}
		for _, c := range r.curled {
			for _, want := range []string{"--fail", "--proto =https"} {
				if !strings.Contains(c, want) {
					t.Errorf("curl %s without %s", c, want)
				}
			}
		}
	})

	t.Run("the pinned releases are applied, operators first", func(t *testing.T) {
		local := sha256Hex(release(kubevirtRelease)) + "  kubevirt-operator.yaml\n" +
			sha256Hex(release(cdiRelease)) + "  cdi-operator.yaml\n"
		r := runOperators(t, local, release)
		if r.err != nil {
			t.Fatalf("%v; output:\n%s", r.err, r.output)
		}
		if len(r.kubectls) != 2 || !regexp.MustCompile(`^apply --server-side -f \S+/kubevirt-operator\.yaml -f \S+/cdi-operator\.yaml$`).MatchString(r.kubectls[0]) ||
			!strings.HasPrefix(r.kubectls[1], "wait --for condition=Established") {
			t.Errorf("kubectl ran %q", r.kubectls)
		}
	})

	t.Run("one byte off", func(t *testing.T) {
		local := sha256Hex(release(kubevirtRelease)) + "  kubevirt-operator.yaml\n" +
			sha256Hex(release(cdiRelease)) + "  cdi-operator.yaml\n"
		r := runOperators(t, local, func(u string) string {
			if u == cdiRelease {
				return strings.Replace(release(u), "#", "%", 1)
			}
			return release(u)
		})
		if r.err == nil || len(r.kubectls) > 0 {
			t.Fatalf("err = %v, kubectl ran %q", r.err, r.kubectls)
		}
	})
}
