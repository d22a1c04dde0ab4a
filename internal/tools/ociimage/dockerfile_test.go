package ociimage

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/imagespec"
)

// instruction is one Dockerfile instruction, its continuation lines joined.
type instruction struct {
	op, args string
}

// parseDockerfile reads the instructions of each stage (a stage starts at
// FROM), comments and blank lines dropped, "\" continuations joined.
func parseDockerfile(text string) [][]instruction {
	var stages [][]instruction
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		op, args, _ := strings.Cut(line, " ")
		in := instruction{strings.ToUpper(op), strings.TrimSpace(args)}
		if in.op == "FROM" || len(stages) == 0 {
			stages = append(stages, nil)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	for _, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		if cur.Len() == 0 && (t == "" || strings.HasPrefix(t, "#")) {
			continue
		}
		if strings.HasSuffix(t, "\\") {
			cur.WriteString(strings.TrimSuffix(t, "\\") + " ")
			continue
		}
		cur.WriteString(t)
		flush()
	}
	flush()
	return stages
}

// keyValues splits ENV and LABEL arguments: k=v pairs, values maybe quoted.
func keyValues(t *testing.T, args string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, f := range quotedFields(args) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("%q: not k=v", f)
		}
		m[k] = strings.ReplaceAll(v, `"`, "")
	}
	return m
}

// quotedFields splits at spaces outside double quotes.
func quotedFields(s string) []string {
	var out []string
	var cur strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			cur.WriteRune(r)
		case r == ' ' && !quoted:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

// TestDockerfile: the Dockerfile at the repository's top builds what make
// image builds: the same go build, on scratch, the same files, user,
// environment, entrypoint, command, ports and labels. (No container
// engine runs here; this reads the file.)
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	stages := parseDockerfile(text)
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a build stage and the image", len(stages))
	}
	build := "CGO_ENABLED=0 GOOS=linux go " + strings.Join(GoBuildArgs("/out"+imagespec.BinaryPath), " ")
	if !slices.Contains(stages[len(stages)-2], instruction{"RUN", build}) {
		t.Errorf("the build stage does not RUN %q", build)
	}
	for name, content := range map[string]string{"/etc/passwd": passwdFile(), "/etc/group": groupFile()} {
		if !strings.Contains(text, "printf '"+strings.ReplaceAll(content, "\n", `\n`)+"' >/out"+name) {
			t.Errorf("the build stage does not write %s as the image has it: %q", name, content)
		}
	}
	final := map[string][]string{}
	for _, in := range stages[len(stages)-1] {
		final[in.op] = append(final[in.op], in.args)
	}
	checkFinalStage(t, final)
}

func checkFinalStage(t *testing.T, final map[string][]string) {
	t.Helper()
	jsonArgs := func(op string) []string {
		var v []string
		if len(final[op]) != 1 || json.Unmarshal([]byte(final[op][0]), &v) != nil {
			t.Errorf("%s %q: want one, in JSON form", op, final[op])
		}
		return v
	}
	if !slices.Equal(final["FROM"], []string{"scratch"}) {
		t.Errorf("FROM %q, want scratch (an empty base, as make image)", final["FROM"])
	}
	if !slices.Equal(final["USER"], []string{imagespec.User()}) {
		t.Errorf("USER %q, want %q", final["USER"], imagespec.User())
	}
	if got := jsonArgs("ENTRYPOINT"); !slices.Equal(got, imagespec.Entrypoint()) {
		t.Errorf("ENTRYPOINT %q, want %q", got, imagespec.Entrypoint())
	}
	if got := jsonArgs("CMD"); !slices.Equal(got, imagespec.Cmd()) {
		t.Errorf("CMD %q, want %q", got, imagespec.Cmd())
	}
	if !slices.Equal(strings.Fields(strings.Join(final["EXPOSE"], " ")), imagespec.ExposedPorts()) {
		t.Errorf("EXPOSE %q, want %q", final["EXPOSE"], imagespec.ExposedPorts())
	}
	var env []string
	for k, v := range keyValues(t, strings.Join(final["ENV"], " ")) {
		env = append(env, k+"="+v)
	}
	if slices.Sort(env); !slices.Equal(env, slices.Sorted(slices.Values(imagespec.Env()))) {
		t.Errorf("ENV %q, want %q", env, imagespec.Env())
	}
	labels := keyValues(t, strings.Join(final["LABEL"], " "))
	want := Labels(Stamp{Revision: "r"}, time.Unix(0, 0))
	if !slices.Equal(slices.Sorted(maps.Keys(labels)), slices.Sorted(maps.Keys(want))) ||
		labels[LabelTitle] != want[LabelTitle] || labels[LabelDescription] != "QCOW2 image gateway and VM market edge" {
		t.Errorf("LABEL %v, want the names %v", labels, slices.Sorted(maps.Keys(want)))
	}
	for _, dst := range []string{imagespec.BinaryPath, imagespec.CABundlePath, "/etc/passwd", "/etc/group", "--chown=" + imagespec.User() + " /out" + imagespec.DataDir + " " + imagespec.DataDir} {
		if !slices.ContainsFunc(final["COPY"], func(c string) bool { return strings.HasSuffix(c, " "+dst) }) {
			t.Errorf("no COPY to %s in %q", dst, final["COPY"])
		}
	}
}
