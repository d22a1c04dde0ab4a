package apierr

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"

	"github.com/vmshelf/vmshelf/internal/reason"
)

var errDeclared = New(reason.Busy).WithRetryAfter(5)

// TestIsMatchesCopies: a copy made with the With* methods, wrapped once
// more, is still the declared answer; another status or reason is not.
func TestIsMatchesCopies(t *testing.T) {
	copied := errDeclared.WithMsg("retry in a bit").WithCause(io.EOF).WithHeader("X-A", "1")
	wrapped := fmt.Errorf("fetch: %w", copied)
	if !errors.Is(wrapped, errDeclared) {
		t.Error("a wrapped copy of the declared answer is not it")
	}
	if !errors.Is(wrapped, io.EOF) {
		t.Error("the copy's cause is lost to errors.Is")
	}
	for _, other := range []*Error{
		New(reason.ShuttingDown),
		{Status: 500, Reason: "busy", Msg: "retry later"},
	} {
		if errors.Is(copied, other) || errors.Is(other, errDeclared) {
			t.Errorf("%d %s taken for %d %s", other.Status, other.Reason, errDeclared.Status, errDeclared.Reason)
		}
	}
	var nilErr *Error
	if errors.Is(copied, nilErr) {
		t.Error("a nil *Error matched")
	}
}

// TestWithLeavesDeclaredAlone: the declared value is shared by every
// request, so a copy's changes must never reach it.
func TestWithLeavesDeclaredAlone(t *testing.T) {
	base := New(reason.OffsetMismatch).WithMsg("ask again").WithHeader("Upload-Offset", "1")
	a := base.WithHeader("Upload-Offset", "2")
	b := base.WithHeader("Location", "/x")
	_ = base.WithRetryAfter(9).WithMsg("changed").WithCause(io.EOF)
	if base.RetryAfter != 0 || base.Msg != "ask again" || base.Err != nil ||
		!slices.Equal(base.Header, []Field{{"Upload-Offset", "1"}}) {
		t.Errorf("declared value changed: %+v", base)
	}
	if !slices.Equal(a.Header, []Field{{"Upload-Offset", "2"}}) {
		t.Errorf("WithHeader of a name already set: %v, want it replaced", a.Header)
	}
	if !slices.Equal(b.Header, []Field{{"Upload-Offset", "1"}, {"Location", "/x"}}) {
		t.Errorf("WithHeader of a new name: %v", b.Header)
	}
}

// TestEachHeader: Retry-After (only when positive) first, then the
// headers in the order they were added.
func TestEachHeader(t *testing.T) {
	var got []Field
	set := func(n, v string) { got = append(got, Field{n, v}) }
	New(reason.NotFound).WithRetryAfter(0).EachHeader(set)
	if len(got) != 0 {
		t.Fatalf("headers of an error without any: %v", got)
	}
	errDeclared.WithHeader("Upload-Offset", "0").WithHeader("Tus-Version", "1.0.0").EachHeader(set)
	want := []Field{{"Retry-After", "5"}, {"Upload-Offset", "0"}, {"Tus-Version", "1.0.0"}}
	if !slices.Equal(got, want) {
		t.Errorf("EachHeader = %v, want %v", got, want)
	}
}

// TestNewIsTheTablesEntry: an answer built from an entry carries the
// entry's status, name and words, and Wrap keeps its cause from the
// client; two entries of one name and other statuses are other answers.
func TestNewIsTheTablesEntry(t *testing.T) {
	e := Wrap(io.EOF, reason.TicketUsed)
	if e.Status != 410 || e.Reason != "ticketUsed" || e.Msg != reason.TicketUsed.Words() || !errors.Is(e, io.EOF) {
		t.Errorf("Wrap(EOF, TicketUsed) = %d %s %q (cause %v)", e.Status, e.Reason, e.Msg, e.Err)
	}
	if body := string(e.JSON()); body != `{"error":"`+reason.TicketUsed.Words()+`","reason":"ticketUsed"}` {
		t.Errorf("body %s; the cause must not show", body)
	}
	if errors.Is(e, New(reason.TicketInUse)) {
		t.Error("the 410 ticketUsed is taken for the 409 one")
	}
	if in := From(io.EOF); in.Status != 500 || in.Reason != reason.Internal.Name() || !errors.Is(in, io.EOF) {
		t.Errorf("From(EOF) = %d %s", in.Status, in.Reason)
	}
}
