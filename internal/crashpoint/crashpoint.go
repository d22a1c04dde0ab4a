// Package crashpoint lets the process-level tests stop vmshelf dead (as
// kill -9 would) at a named step of a commit or a removal, to prove that
// a crash at that very point leaves a store start-up accepts; or begin
// its shutdown there (as SIGTERM would), to prove that the work past
// that point is neither lost nor recorded half done.
//
// It is a test hook, built only with the tag crashpoints (go build -tags
// crashpoints): in the binary built without it At does nothing and no
// setting reaches it. With the tag, the environment variable
// VMSHELF_TEST_CRASH_AT names the step, VMSHELF_TEST_CRASH_SIGNAL the
// signal; nothing a request carries does.
package crashpoint

// Env names the step a crashpoints build kills itself at.
const Env = "VMSHELF_TEST_CRASH_AT"

// SignalEnv names the signal sent at the step: KILL (the default) stops
// the process dead; TERM makes it begin its shutdown, and the step goes
// on once the shutdown has begun (see Until).
const SignalEnv = "VMSHELF_TEST_CRASH_SIGNAL"

// The steps.
const (
	// CommitAfterIntent: an upload's commit intent is written, its file
	// not yet visible.
	CommitAfterIntent = "commit-after-intent"
	// CommitAfterRename: the upload's file is visible, not yet recorded.
	CommitAfterRename = "commit-after-rename"
	// RemoveAfterRecord: the image's record is deleted (its remove intent
	// written), its file not yet.
	RemoveAfterRecord = "remove-after-record"
	// RemoveAfterUnlink: the file is deleted, the remove intent not yet
	// ended.
	RemoveAfterUnlink = "remove-after-unlink"
	// PatchAfterLastByte: a resumable upload's request has read and
	// written the image's last byte; the image is not yet committed.
	PatchAfterLastByte = "patch-after-last-byte"
)
