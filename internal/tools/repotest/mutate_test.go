package repotest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// toyRepo is a git repository with .ci/mutate and three planted bugs in a
// module of two packages: one and two guard a/a.go, each run by its own
// test file of package a; bee guards b/b.go. Package a's tests share
// a/helpers_test.go (no test of its own) and import package h, which a's
// code does not.
func toyRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	copyFile(t, filepath.Join(repoRoot(t), ".ci", "mutate"), filepath.Join(dir, ".ci", "mutate"))
	files := map[string]string{
		"go.mod":                  "module toy\n\ngo 1.26\n",
		"a/a.go":                  "package a\n\nfunc A() int { return 1 }\n",
		"a/helpers_test.go":       "package a\n\nimport \"toy/h\"\n\nvar want = h.H\n",
		"a/one_test.go":           "package a\n\nimport \"testing\"\n\nfunc TestOne(t *testing.T) {\n\tif A() != want {\n\t\tt.Fatal(A())\n\t}\n}\n",
		"a/two_test.go":           "package a\n\nimport \"testing\"\n\nfunc TestTwo(t *testing.T) {\n\tif A() != want {\n\t\tt.Fatal(A())\n\t}\n}\n",
		"a/testdata/x.txt":        "x\n",
		"h/h.go":                  "package h\n\nvar H = 1\n",
		"b/b.go":                  "package b\n\nfunc B() int { return 1 }\n",
		"b/b_test.go":             "package b\n\nimport \"testing\"\n\nfunc TestB(t *testing.T) {\n\tif B() != 1 {\n\t\tt.Fatal(B())\n\t}\n}\n",
		".ci/mutations/one.patch": plant("./a -run '^TestOne$'", "a/a.go", "a"),
		".ci/mutations/two.patch": plant("./a -run '^TestTwo$'", "a/a.go", "a"),
		".ci/mutations/bee.patch": plant("./b -run '^TestB$'", "b/b.go", "b"),
	}
	for name, body := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(t, dir, "init", "-q")
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-qm", "toy")
	return dir
}

// plant is a patch that makes pkg's function (A or B) answer 2.
func plant(run, file, pkg string) string {
	fn := strings.ToUpper(pkg)
	return "# why: " + fn + " answers 2\n# run: " + run + "\n" +
		"diff --git a/" + file + " b/" + file + "\n--- a/" + file + "\n+++ b/" + file + "\n" +
		"@@ -1,3 +1,3 @@\n package " + pkg + "\n \n-func " + fn + "() int { return 1 }\n+func " + fn + "() int { return 2 }\n"
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	env := append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.invalid",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.invalid", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	r := runIn(t, time.Minute, dir, env, needTool(t, "git"), args...)
	if r.code != 0 {
		t.Fatalf("git %s: %s", strings.Join(args, " "), r.out)
	}
	return strings.TrimSpace(r.out)
}

// mutate runs the toy's .ci/mutate with env added and answers what it
// printed and its exit code.
func mutate(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	full := append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	full = append(full, env...)
	return runIn(t, 3*time.Minute, dir, full, needTool(t, "bash"), append([]string{".ci/mutate"}, args...)...)
}

// chosen is the names MUTATE_LIST=1 prints, without the mutate: lines.
func chosen(t *testing.T, dir string, env ...string) []string {
	t.Helper()
	r := mutate(t, dir, append([]string{"MUTATE_LIST=1"}, env...))
	if r.code != 0 {
		t.Fatalf("MUTATE_LIST=1 .ci/mutate: exit %d:\n%s", r.code, r.out)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(r.out), "\n") {
		if l != "" && !strings.HasPrefix(l, "mutate: ") {
			names = append(names, l)
		}
	}
	slices.Sort(names)
	return names
}

// touch changes file p (a line added) and returns what restores it.
func touch(t *testing.T, p string) (restore func()) {
	t.Helper()
	old, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, append(old, "\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	return func() { _ = os.WriteFile(p, old, 0o644) }
}

// TestMutateChoice: make mutate runs the patches whose guarded files
// changed since the baseline that make mutate-all recorded, plus a slice
// of the rest within the budget, and fails on a patch it left out that
// no longer applies.
func TestMutateChoice(t *testing.T) {
	needTool(t, "go")
	dir := toyRepo(t)
	if got := chosen(t, dir, "MUTATE_BUDGET=0"); !slices.Equal(got, []string{"bee", "one", "two"}) {
		t.Fatalf("without a baseline the choice is %q; want every patch", got)
	}

	// make mutate-all kills all three on a clean tree and records them.
	r := mutate(t, dir, nil, "--all")
	if r.code != 0 || !strings.Contains(r.out, "3 killed, 0 survived, 0 broken") {
		t.Fatalf("mutate --all: exit %d:\n%s", r.code, r.out)
	}
	base, err := os.ReadFile(filepath.Join(dir, ".ci", "mutate-baseline"))
	if err != nil {
		t.Fatalf("mutate --all on a clean tree wrote no baseline: %v\n%s\n%s", err, r.out, git(t, dir, "status", "--porcelain"))
	}
	head := git(t, dir, "rev-parse", "HEAD")
	for _, w := range []string{"commit " + head + "\n", "\nbee ", "\none ", "\ntwo "} {
		if !strings.Contains(string(base), w) {
			t.Fatalf("the baseline lacks %q:\n%s", w, base)
		}
	}
	// The toy's patches take no time: give each 10 s, for the budget below.
	base = []byte("commit " + head + "\nbee 10\none 10\ntwo 10\n")
	if err := os.WriteFile(filepath.Join(dir, ".ci", "mutate-baseline"), base, 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-qm", "baseline")
	if got := chosen(t, dir, "MUTATE_BUDGET=0"); len(got) != 0 {
		t.Fatalf("nothing changed since the baseline, yet it chose %q\n%s", got, mutate(t, dir, []string{"MUTATE_LIST=1", "MUTATE_BUDGET=0"}).out)
	}

	for _, tc := range []struct {
		file string
		want []string
	}{
		{"a/two_test.go", []string{"two"}},            // only the file with its test
		{"a/helpers_test.go", []string{"one", "two"}}, // a test file without tests is shared
		{"a/testdata/x.txt", []string{"one", "two"}},
		{"h/h.go", []string{"one", "two"}}, // imported by a's tests only
		{"a/a.go", []string{"one", "two"}}, // the code under test
		{"b/b_test.go", []string{"bee"}},
		{".ci/mutations/bee.patch", []string{"bee"}}, // the patch itself
	} {
		t.Run(tc.file, func(t *testing.T) {
			defer touch(t, filepath.Join(dir, tc.file))()
			if got := chosen(t, dir, "MUTATE_BUDGET=0"); !slices.Equal(got, tc.want) {
				t.Errorf("a change to %s chose %q; want %q", tc.file, got, tc.want)
			}
		})
	}

	// The slice: within a budget of one patch's seconds, one patch per
	// worker, the same each time for the same commit; a budget for all
	// takes all.
	one := chosen(t, dir, "MUTATE_BUDGET=10", "MUTATE_JOBS=1")
	if len(one) != 1 {
		t.Errorf("a budget of one patch's 10 s chose %q", one)
	}
	if two := chosen(t, dir, "MUTATE_BUDGET=10", "MUTATE_JOBS=2"); len(two) != 2 {
		t.Errorf("a budget of 10 s on two workers chose %q; want two patches", two)
	}
	if again := chosen(t, dir, "MUTATE_BUDGET=10", "MUTATE_JOBS=1"); !slices.Equal(one, again) {
		t.Errorf("the slice for one commit changed: %q, then %q", one, again)
	}
	if all := chosen(t, dir, "MUTATE_BUDGET=100000"); !slices.Equal(all, []string{"bee", "one", "two"}) {
		t.Errorf("a budget for all chose %q", all)
	}

	// The changed patches keep the budget too: a change that selects two
	// of them, with room for one, runs one; the other is only checked to
	// apply.
	func() {
		defer touch(t, filepath.Join(dir, "a", "a.go"))()
		got := chosen(t, dir, "MUTATE_BUDGET=10", "MUTATE_JOBS=1")
		if len(got) != 1 || (got[0] != "one" && got[0] != "two") {
			t.Errorf("a change that selects one and two, with a budget for one, chose %q", got)
		}
	}()

	// A run of a changed patch kills it; the rest are only checked to
	// apply, and one that no longer does fails the run.
	if err := os.WriteFile(filepath.Join(dir, "a", "one_test.go"), []byte(strings.Replace(
		"package a\n\nimport \"testing\"\n\nfunc TestOne(t *testing.T) {\n\tif A() != want {\n\t\tt.Fatal(A())\n\t}\n}\n",
		"t.Fatal(A())", "t.Fatalf(\"A() = %d\", A())", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	r = mutate(t, dir, []string{"MUTATE_BUDGET=0"})
	if r.code != 0 || !strings.Contains(r.out, "1 killed, 0 survived, 0 broken; ran 1 of 3") {
		t.Fatalf("make mutate with a.one_test.go changed: exit %d:\n%s", r.code, r.out)
	}
	if err := os.WriteFile(filepath.Join(dir, "b", "b.go"), []byte("package b\n\nfunc B() int { return 1 + 0 }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The baseline now claims the changed b.go, so bee is not chosen:
	// only the apply check can see it broken.
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-qm", "b changes")
	rewritten := strings.Replace(string(base), "commit "+head, "commit "+git(t, dir, "rev-parse", "HEAD"), 1)
	if err := os.WriteFile(filepath.Join(dir, ".ci", "mutate-baseline"), []byte(rewritten), 0o644); err != nil {
		t.Fatal(err)
	}
	r = mutate(t, dir, []string{"MUTATE_BUDGET=0"})
	if r.code == 0 || !strings.Contains(r.out, "broken: bee (does not apply") {
		t.Fatalf("a patch that no longer applies, not chosen: exit %d:\n%s", r.code, r.out)
	}
}

// TestMutateRunSelectsNoTest: a patch whose run line selects no test (the
// test renamed, or its subtests moved one level down) would pass with any
// bug in place; mutate must call it broken, not let it pass as a mutant
// that survived, nor as one that was killed.
func TestMutateRunSelectsNoTest(t *testing.T) {
	needTool(t, "go")
	dir := toyRepo(t)
	for name, run := range map[string]string{
		"gone":   "./b -run '^TestGone$'",
		"deeper": "./b -run '^TestSubs$/^check$'", // check is TestSubs/http/check
	} {
		p := filepath.Join(dir, ".ci", "mutations", name+".patch")
		if err := os.WriteFile(p, []byte(plant(run, "b/b.go", "b")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	subs := "package b\n\nimport \"testing\"\n\nfunc TestSubs(t *testing.T) {\n\tt.Run(\"http\", func(t *testing.T) {\n\t\tt.Run(\"check\", func(t *testing.T) {\n\t\t\tif B() != 1 {\n\t\t\t\tt.Fatal(B())\n\t\t\t}\n\t\t})\n\t})\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "b", "subs_test.go"), []byte(subs), 0o644); err != nil {
		t.Fatal(err)
	}
	r := mutate(t, dir, nil, "gone", "deeper")
	if r.code == 0 || !strings.Contains(r.out, "0 killed, 0 survived, 2 broken") ||
		!strings.Contains(r.out, "broken: gone (its run line selects no test") ||
		!strings.Contains(r.out, "broken: deeper (its run line selects no test") {
		t.Fatalf("run lines that select no test: exit %d:\n%s", r.code, r.out)
	}
}
