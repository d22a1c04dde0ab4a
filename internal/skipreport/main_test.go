package main

import (
	"strings"
	"testing"
)

// ev is one go test -json line, for writing streams short.
func ev(action, pkg, test, output string) string {
	var b strings.Builder
	b.WriteString(`{"Action":"` + action + `"`)
	if pkg != "" {
		b.WriteString(`,"Package":"` + pkg + `"`)
	}
	if test != "" {
		b.WriteString(`,"Test":"` + test + `"`)
	}
	if output != "" {
		b.WriteString(`,"Output":` + quote(output))
	}
	return b.String() + "}\n"
}

func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\t", `\t`).Replace(s) + `"`
}

// TestRun: what go test without -json would print, the skips listed with
// their reasons, and the verdict, on streams as go test -json writes them
// (the order of events is that of go1.26's test2json).
func TestRun(t *testing.T) {
	const a, b = "example.com/m/a", "example.com/m/b"
	tests := []struct {
		name   string
		in     string
		want   string
		wantOK bool
	}{
		{
			name: "a pass and a tool skip",
			in: ev("start", a, "", "") +
				ev("run", a, "TestPass", "") + ev("output", a, "TestPass", "=== RUN   TestPass\n") +
				ev("output", a, "TestPass", "    a_test.go:3: noise\n") + ev("output", a, "TestPass", "--- PASS: TestPass (0.00s)\n") +
				ev("pass", a, "TestPass", "") +
				ev("run", a, "TestQemu", "") + ev("output", a, "TestQemu", "=== RUN   TestQemu\n") +
				ev("output", a, "TestQemu", "    e2e_test.go:87: qemu-img missing: apt-get install qemu-utils (exec: \"qemu-img\": executable file not found in $PATH)\n") +
				ev("output", a, "TestQemu", "--- SKIP: TestQemu (0.00s)\n") + ev("skip", a, "TestQemu", "") +
				ev("output", a, "", "PASS\n") + ev("output", a, "", "ok  \texample.com/m/a\t0.01s\n") + ev("pass", a, "", ""),
			want: "ok  \texample.com/m/a\t0.01s\n" +
				"skipped 1 test (make test installs what they need, or stops saying how):\n" +
				"  TestQemu (./a): qemu-img missing: apt-get install qemu-utils (exec: \"qemu-img\": executable file not found in $PATH)\n",
			wantOK: true,
		},
		{
			name: "a failing subtest is shown, a skipped one listed",
			in: ev("run", a, "TestSub", "") + ev("output", a, "TestSub", "=== RUN   TestSub\n") +
				ev("run", a, "TestSub/skip", "") + ev("output", a, "TestSub/skip", "=== RUN   TestSub/skip\n") +
				ev("output", a, "TestSub/skip", "=== PAUSE TestSub/skip\n") + ev("pause", a, "TestSub/skip", "") +
				ev("run", a, "TestSub/bad", "") + ev("output", a, "TestSub/bad", "=== RUN   TestSub/bad\n") +
				ev("output", a, "TestSub/bad", "    a_test.go:9: boom\n") + ev("output", a, "TestSub/bad", "--- FAIL: TestSub/bad (0.00s)\n") +
				ev("fail", a, "TestSub/bad", "") +
				ev("cont", a, "TestSub/skip", "") + ev("output", a, "TestSub/skip", "=== CONT  TestSub/skip\n") +
				ev("output", a, "TestSub/skip", "    a_test.go:8: nginx missing\n") + ev("output", a, "TestSub/skip", "--- SKIP: TestSub/skip (0.00s)\n") +
				ev("skip", a, "TestSub/skip", "") +
				ev("output", a, "TestSub", "--- FAIL: TestSub (0.00s)\n") + ev("fail", a, "TestSub", "") +
				ev("output", a, "", "FAIL\n") + ev("output", a, "", "FAIL\texample.com/m/a\t0.01s\n") + ev("fail", a, "", "") +
				ev("output", b, "", "ok  \texample.com/m/b\t0.01s\n") + ev("pass", b, "", ""),
			want: "    a_test.go:9: boom\n--- FAIL: TestSub/bad (0.00s)\n--- FAIL: TestSub (0.00s)\nFAIL\n" +
				"FAIL\texample.com/m/a\t0.01s\nok  \texample.com/m/b\t0.01s\n" +
				"skipped 1 test (make test installs what they need, or stops saying how):\n" +
				"  TestSub/skip (./a): nginx missing\n",
		},
		{
			name: "a build failure",
			in: `{"ImportPath":"example.com/m/a [example.com/m/a.test]","Action":"build-output","Output":"a/a_test.go:3:28: declared and not used: x\n"}` + "\n" +
				`{"ImportPath":"example.com/m/a [example.com/m/a.test]","Action":"build-fail"}` + "\n" +
				ev("output", a, "", "FAIL\texample.com/m/a [build failed]\n") + ev("fail", a, "", ""),
			want: "a/a_test.go:3:28: declared and not used: x\nFAIL\texample.com/m/a [build failed]\nno test skipped\n",
		},
		{
			name: "a test still running when its package timed out",
			in: ev("run", a, "TestHang", "") + ev("output", a, "TestHang", "=== RUN   TestHang\n") +
				ev("output", a, "TestHang", "    a_test.go:5: waiting\n") +
				ev("output", a, "", "panic: test timed out after 1s\n") + ev("fail", a, "", ""),
			want: "panic: test timed out after 1s\n    a_test.go:5: waiting\nno test skipped\n",
		},
		{
			name: "no package result: go test did not run",
			in:   "",
			want: "no test skipped\nskipreport: no package result in the input: go test did not run\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			ok, err := run(strings.NewReader(tc.in), &out, "example.com/m")
			if err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want || ok != tc.wantOK {
				t.Errorf("ok %v, printed:\n%s\nwant ok %v, printed:\n%s", ok, out.String(), tc.wantOK, tc.want)
			}
		})
	}
}
