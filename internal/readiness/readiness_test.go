package readiness

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
)

// TestWatchLogsChanges: one line per change of verdict, none per probe;
// a change of reasons while not ready is a change; causes are redacted.
func TestWatchLogsChanges(t *testing.T) {
	var buf bytes.Buffer
	w := NewWatch(slog.New(slog.NewTextHandler(&buf, nil)))
	down := Store(fmt.Errorf("%w: ticket 0123456789abcdef0123456789abcdef", imagestore.ErrStoreUnavailable))
	blobs := Blobs(errors.New("bucket gone"))
	at := time.Unix(1000, 0)
	for _, verdict := range [][]*apierr.Error{nil, nil, {down}, {down}, {down}, {down, blobs}, {down, blobs}, nil, nil} {
		at = at.Add(time.Second)
		w.Note(at, verdict)
	}
	// Probes that asked during the outage and end after the store came
	// back are stale: no line.
	w.Note(at.Add(-3*time.Second), []*apierr.Error{down})
	w.Note(at.Add(-2*time.Second), []*apierr.Error{down, blobs})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{`msg="not ready" reasons=storeUnreachable`, `msg="not ready" reasons=storeUnreachable,blobStoreUnreachable`, `msg="ready again"`}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, l := range lines {
		if !strings.Contains(l, want[i]) {
			t.Errorf("line %d: %s; want it to hold %s", i, l, want[i])
		}
	}
	if strings.Contains(buf.String(), "0123456789abcdef0123") {
		t.Errorf("a cause's hex run was logged: %s", buf.String())
	}
}

// TestStoreReasons: each kind of store error has its reason; a full disk
// is not the store's to report.
func TestStoreReasons(t *testing.T) {
	for err, want := range map[error]string{
		fmt.Errorf("x: %w", imagestore.ErrStoreUnavailable): "storeUnreachable",
		fmt.Errorf("x: %w", imagestore.ErrDamaged):          "storeCorrupt",
		fmt.Errorf("x: %w", imagestore.ErrUnwritable):       "storeUnwritable",
		errors.New("something else"):                        "notReady",
	} {
		if got := Store(err); got == nil || got.Reason != want || got.Status != 503 {
			t.Errorf("Store(%v) = %v, want 503 %s", err, got, want)
		}
	}
	if got := Store(fmt.Errorf("x: %w", imagestore.ErrNoSpace)); got != nil {
		t.Errorf("Store(no space) = %v, want nil", got)
	}
	if Store(nil) != nil || Blobs(nil) != nil {
		t.Error("no error is no problem")
	}
}
