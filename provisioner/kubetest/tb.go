package kubetest

// TB is what the cluster's and the edge's helpers need of their caller: a
// test's *testing.T, or the demo's run (demo.go), which has no test
// around it but keeps the same rules: Fatal ends the start, Cleanup's
// functions run, last first, when the run ends.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
	Failed() bool
	Name() string
}
