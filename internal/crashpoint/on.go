//go:build crashpoints

package crashpoint

import (
	"os"
	"syscall"
)

// step is read once: the hook is the test's, set when it starts the
// process.
var step = os.Getenv(Env)

// At kills the process with SIGKILL if step is the one VMSHELF_TEST_CRASH_AT
// names: no deferred function runs, no buffer is flushed, as in a crash.
func At(s string) {
	if step != "" && s == step {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
