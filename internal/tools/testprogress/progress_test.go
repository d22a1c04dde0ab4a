package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A stream as go test -json writes it for three packages run side by side:
// b finishes (with a skip) while a still runs, c fails in a subtest, d
// does not build.
const stream = `{"Action":"start","Package":"x/a"}
{"Action":"run","Package":"x/a","Test":"TestSlow"}
{"Action":"start","Package":"x/b"}
{"Action":"run","Package":"x/b","Test":"TestTool"}
{"Action":"output","Package":"x/b","Test":"TestTool","Output":"=== RUN   TestTool\n"}
{"Action":"output","Package":"x/b","Test":"TestTool","Output":"    b_test.go:9: qemu-img missing: apt-get install qemu-utils\n"}
{"Action":"output","Package":"x/b","Test":"TestTool","Output":"--- SKIP: TestTool (0.00s)\n"}
{"Action":"skip","Package":"x/b","Test":"TestTool","Elapsed":0}
{"Action":"pass","Package":"x/b","Test":"TestOther","Elapsed":0}
{"Action":"pass","Package":"x/b","Elapsed":0.02}
not an event: a tool's own line
{"Action":"output","Package":"x/c","Test":"TestBad/sub","Output":"    c_test.go:3: wrong answer 42\n"}
{"Action":"output","Package":"x/c","Test":"TestBad/sub","Output":"--- FAIL: TestBad/sub (0.00s)\n"}
{"Action":"fail","Package":"x/c","Test":"TestBad/sub","Elapsed":0}
{"Action":"output","Package":"x/c","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"x/c","Test":"TestBad","Elapsed":0}
{"Action":"output","Package":"x/c","Output":"FAIL\n"}
{"Action":"fail","Package":"x/c","Elapsed":0.01}
{"ImportPath":"x/d [x/d.test]","Action":"build-output","Output":"d_test.go:3:31: declared and not used: x\n"}
{"ImportPath":"x/d [x/d.test]","Action":"build-fail"}
{"Action":"fail","Package":"x/d","Elapsed":0,"FailedBuild":"x/d [x/d.test]"}
{"Action":"pass","Package":"x/a","Test":"TestSlow","Elapsed":6}
{"Action":"pass","Package":"x/a","Elapsed":6.01}
`

func TestReport(t *testing.T) {
	var out strings.Builder
	r := newReport(&out, func() time.Duration { return 75 * time.Second })
	r.read(strings.NewReader(stream), nil)
	r.summary()
	got := out.String()
	lines := strings.Split(got, "\n")
	// Progress in the order things happened, the skip before its package.
	want := []string{
		"[1m15s] SKIP x/b TestTool: qemu-img missing: apt-get install qemu-utils",
		"[1m15s] ok   x/b 0.0s  2 tests, 1 skipped",
		"not an event: a tool's own line",
		"[1m15s] FAIL x/c 0.0s  1 tests",
		"[1m15s] FAIL x/d 0.0s",
		"[1m15s] ok   x/a 6.0s  1 tests",
	}
	for i, w := range want {
		if i >= len(lines) || lines[i] != w {
			t.Fatalf("line %d: want %q; the report:\n%s", i, w, got)
		}
	}
	for _, w := range []string{
		"=== Skipped (1)\nx/b TestTool: qemu-img missing",
		"--- FAIL: x/c TestBad/sub\n    c_test.go:3: wrong answer 42",
		"build of x/d [x/d.test] failed:\nd_test.go:3:31: declared and not used: x",
		"DONE 4 tests, 1 skipped, 1 failed; 2 packages failed",
		// The slowest first; a skipped test took no time worth naming.
		"=== Slowest 3 of 3 tests (a test's own time; parallel tests overlap)\n    6.0s x/a TestSlow\n    0.0s x/b TestOther\n    0.0s x/c TestBad\n",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("the report lacks %q:\n%s", w, got)
		}
	}
	// The parent's verdict says nothing its subtest did not.
	if strings.Contains(got, "--- FAIL: x/c TestBad\n") {
		t.Errorf("the parent's empty failure is printed:\n%s", got)
	}
	if !r.failed() {
		t.Error("a run with failures is not failed")
	}
}

func TestReportPassing(t *testing.T) {
	var out strings.Builder
	r := newReport(&out, func() time.Duration { return time.Second })
	r.read(strings.NewReader(`{"Action":"pass","Package":"x/a","Test":"TestA","Elapsed":0}
{"Action":"pass","Package":"x/a","Elapsed":0.1}
{"Action":"skip","Package":"x/e","Elapsed":0}
`), nil)
	r.summary()
	if r.failed() {
		t.Errorf("a passing run is failed:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "---- x/e 0.0s  no test files") {
		t.Errorf("a package without tests is not named as such:\n%s", out.String())
	}
}

// TestExitsAsGoTest: make test's verdict is testprogress's exit code, so
// it must be go test's: 1 for a failed test, 0 for a pass.
func TestExitsAsGoTest(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "testprogress")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		pkg  string
		code int
		says string
	}{
		{"./testdata/fails", 1, "the answer is 41"},
		{"./testdata/passes", 0, "DONE 1 tests, 0 skipped, 0 failed"},
	} {
		cmd := exec.Command(bin, "go", "test", "-json", "-count=1", tc.pkg)
		out, err := cmd.CombinedOutput()
		code := 0
		if exit, ok := err.(*exec.ExitError); ok {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatalf("%s: %v", tc.pkg, err)
		}
		if code != tc.code || !strings.Contains(string(out), tc.says) {
			t.Errorf("testprogress go test %s: exit %d, want %d, saying %q:\n%s", tc.pkg, code, tc.code, tc.says, out)
		}
	}
}

// TestHeartbeat: a minute without a line gets one that says what runs, or
// that the test binaries are still compiling; a line printed since holds
// the next one back.
func TestHeartbeat(t *testing.T) {
	var out strings.Builder
	now := 10 * time.Second
	r := newReport(&out, func() time.Duration { return now })
	at := func(d time.Duration) { now = d }

	at(59 * time.Second)
	r.tick() // not yet a minute
	at(70 * time.Second)
	r.tick()
	r.line([]byte(`{"Action":"start","Package":"x/slow"}`))
	at(80 * time.Second)
	r.tick() // silent only 10 s since the last heartbeat
	at(2*time.Minute + 10*time.Second)
	r.tick()
	r.line([]byte(`{"Action":"pass","Package":"x/fast","Elapsed":1}`))
	at(3 * time.Minute)
	r.tick() // 50 s after the ok line
	at(3*time.Minute + 10*time.Second)
	r.tick()

	want := "[1m10s] ... compiling the test binaries (no package's tests have started yet; a cold build takes minutes)\n" +
		"[2m10s] ... running: x/slow (1m0s); 0 packages done\n" +
		"[2m10s] ok   x/fast 1.0s\n" +
		"[3m10s] ... running: x/slow (2m0s); 1 packages done\n"
	if out.String() != want {
		t.Errorf("the report:\n%s\nwant:\n%s", out.String(), want)
	}
}
