//go:build crashpoints

package crashpoint

import (
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// step and signal are read once: the hook is the test's, set when it
// starts the process.
var (
	step   = os.Getenv(Env)
	signal = os.Getenv(SignalEnv)
	termed atomic.Bool // SIGTERM is sent once: the first pass is the test's
)

// beginWait bounds how long Until waits for the shutdown it asked for:
// the step goes on after it all the same, and the test sees that the
// window was missed.
const beginWait = 30 * time.Second

// At kills the process with SIGKILL if step is the one VMSHELF_TEST_CRASH_AT
// names: no deferred function runs, no buffer is flushed, as in a crash.
// With VMSHELF_TEST_CRASH_SIGNAL=TERM it sends SIGTERM instead and goes on.
func At(s string) { Until(s, nil) }

// Until is At for a step that knows when the shutdown has begun: with
// VMSHELF_TEST_CRASH_SIGNAL=TERM it sends SIGTERM and returns once begun
// is closed (at most beginWait later), so that the step's next line runs
// during the shutdown, never before it.
func Until(s string, begun <-chan struct{}) {
	if step == "" || s != step {
		return
	}
	if signal != "TERM" {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	if termed.Swap(true) {
		return
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
	if begun == nil {
		return
	}
	t := time.NewTimer(beginWait)
	defer t.Stop()
	select {
	case <-begun:
	case <-t.C:
	}
}
