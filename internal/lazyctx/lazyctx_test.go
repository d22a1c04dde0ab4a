package lazyctx

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDeadlineAndErrWithoutTimer(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	now := t0
	ctx, cancel := WithTimeout(30*time.Second, func() time.Time { return now })
	defer cancel()
	if d, ok := ctx.Deadline(); !ok || !d.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("Deadline = %v, %v; want %v, true", d, ok, t0.Add(30*time.Second))
	}
	if err := ctx.Err(); err != nil {
		t.Fatalf("Err before the deadline = %v", err)
	}
	if ctx.inner != nil {
		t.Fatal("a timer was started though nobody asked for Done")
	}
	now = t0.Add(30 * time.Second) // exactly at the deadline: over
	if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err at the deadline = %v, want DeadlineExceeded", err)
	}
}

func TestCancelBeforeAndAfterDone(t *testing.T) {
	ctx, cancel := WithTimeout(time.Hour, nil)
	cancel()
	if err := ctx.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err after cancel = %v", err)
	}
	select {
	case <-ctx.Done(): // canceled before Done was asked: closed at once
	default:
		t.Fatal("Done not closed for a context canceled before")
	}

	ctx, cancel = WithTimeout(time.Hour, nil)
	done := ctx.Done()
	cancel()
	<-done // bounded: cancel closes it
	if err := ctx.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err = %v", err)
	}
}

func TestDoneFiresAtTheDeadline(t *testing.T) {
	ctx, cancel := WithTimeout(time.Millisecond, nil)
	defer cancel()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done never closed after the deadline")
	}
	if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err = %v", err)
	}
	// A child sees the deadline, as with context.WithTimeout.
	child, ccancel := context.WithCancel(ctx)
	defer ccancel()
	<-child.Done()
}
