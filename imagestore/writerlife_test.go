package imagestore

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// TestWriterLife: what each step of a blob writer's life allows, as both
// Blobs use it.
func TestWriterLife(t *testing.T) {
	closed := func(t *testing.T, what string, err error) {
		t.Helper()
		if !errors.Is(err, os.ErrClosed) || !strings.HasPrefix(err.Error(), "fs: ") || !strings.Contains(err.Error(), " b1: ") {
			t.Errorf("%s: %v, want fs: … b1: wrapping os.ErrClosed", what, err)
		}
	}
	writing := func(t *testing.T) *WriterLife {
		l := NewWriterLife("fs", "b1")
		if err := l.Usable("write"); err != nil {
			t.Fatalf("a new writer refuses to write: %v", err)
		}
		return &l
	}
	t.Run("commit", func(t *testing.T) {
		l := writing(t)
		if err := l.StartCommit(); err != nil {
			t.Fatalf("StartCommit: %v", err)
		}
		if err := l.EndCommit(nil); err != nil {
			t.Fatalf("EndCommit: %v", err)
		}
		closed(t, "write after commit", l.Usable("write"))
		if err := l.StartCommit(); err == nil || !strings.Contains(err.Error(), "already committed") {
			t.Errorf("commit after commit: %v, want already committed", err)
		}
		if l.AbortNeeded() {
			t.Error("abort after commit has something to do")
		}
		if l.Close() {
			t.Error("close after commit did something")
		}
	})
	t.Run("failed commit", func(t *testing.T) {
		l := writing(t)
		cause := errors.New("fsync: EIO")
		if err := l.EndCommit(cause); !errors.Is(err, cause) || !strings.HasPrefix(err.Error(), "fs: commit b1: ") {
			t.Fatalf("EndCommit(fail): %v", err)
		}
		closed(t, "write after a failed commit", l.Usable("write"))
		closed(t, "commit after a failed commit", l.StartCommit())
		if !l.AbortNeeded() {
			t.Error("a failed commit leaves nothing to abort")
		}
	})
	t.Run("close", func(t *testing.T) {
		l := writing(t)
		if !l.Close() {
			t.Fatal("close of a writing writer did nothing")
		}
		if l.Close() {
			t.Error("a second close did something")
		}
		closed(t, "sync after close", l.Usable("sync"))
		closed(t, "commit after close", l.StartCommit())
		if !l.AbortNeeded() {
			t.Error("abort after close has nothing to do: the partial blob stays")
		}
	})
	t.Run("abort", func(t *testing.T) {
		l := writing(t)
		cause := errors.New("remove: EBUSY")
		if err := l.EndAbort(cause); !errors.Is(err, cause) || !strings.HasPrefix(err.Error(), "fs: abort b1: ") {
			t.Fatalf("EndAbort(fail): %v", err)
		}
		closed(t, "write after a failed abort", l.Usable("write"))
		if !l.AbortNeeded() {
			t.Fatal("a failed abort is not to be done again")
		}
		if err := l.EndAbort(nil); err != nil {
			t.Fatalf("EndAbort: %v", err)
		}
		if l.AbortNeeded() {
			t.Error("abort after abort has something to do")
		}
		closed(t, "commit after abort", l.StartCommit())
	})
}
