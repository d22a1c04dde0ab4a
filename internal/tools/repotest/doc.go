// Package repotest holds the repository's own tests: tests of what a
// developer meets before any Go code runs (make test on a machine that
// lacks the tools, .ci/deps installing them). It has no code, only tests;
// its helpers (repo_test.go) find the repository's top and run commands in
// it with a PATH of the tests' choosing.
package repotest
