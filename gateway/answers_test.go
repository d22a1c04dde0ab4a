package gateway

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/qcow2"
)

// TestAnswerClasses: every answer the gateway's logic tells apart, built as
// the code that decides it builds it (a copy of the declaration with its
// own message or cause), lands in its class: the transfer outcome, the
// refusal's log level and whether a resumable upload ends. A look-alike
// that is not the declared answer does not.
func TestAnswerClasses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		e       *apierr.Error
		outcome string
		level   slog.Level
		ends    bool
	}{
		{"busy", answerBusy, outcomeRejected, slog.LevelInfo, false},
		{"fetch shuttingDown", answerShuttingDown, outcomeAborted, slog.LevelInfo, false},
		{"PATCH shuttingDown", answerShuttingDown.WithMsg("the edge is restarting; the bytes so far are kept").WithCause(errShuttingDown),
			outcomeAborted, slog.LevelInfo, false},
		{"clientGone", answerClientGone, outcomeAborted, slog.LevelInfo, false},
		{"idle", answerIdle.WithMsg("no data arrived for 1s").WithCause(io.ErrNoProgress), outcomeAborted, slog.LevelInfo, false},
		{"incompleteBody", incomplete(io.ErrUnexpectedEOF), outcomeAborted, slog.LevelInfo, false},
		{"takenOver", answerTakenOver, outcomeAborted, slog.LevelInfo, false},
		{"noSpace of a write", writeFailure(syscall.ENOSPC), outcomeRejected, slog.LevelWarn, false},
		{"noSpace of the ledger", answerNoSpace.WithMsg("no room").WithCause(errors.New("1 byte free")), outcomeRejected, slog.LevelWarn, false},
		{"blobStoreUnreachable", storageFailure(imagestore.ErrBlobsUnavailable, "x"), outcomeFailed, slog.LevelWarn, false},
		{"noSpace of the read-back", imageError(fmt.Errorf("read: %w", imagestore.ErrNoSpace)), outcomeRejected, slog.LevelWarn, false},
		{"blobStoreUnreachable of the read-back", imageError(imagestore.ErrBlobsUnavailable), outcomeFailed, slog.LevelWarn, false},
		{"internal", storageFailure(io.EOF, "x"), outcomeFailed, slog.LevelWarn, false},
		{"badContentType", answerBadContentType, outcomeRejected, slog.LevelInfo, false},
		{"notQcow2", imageError(&qcow2.Reject{Reason: qcow2.ReasonNotQcow2, Msg: "bad magic"}), outcomeRejected, slog.LevelInfo, true},
		{"backingFile", imageError(&qcow2.Reject{Reason: qcow2.ReasonBackingFile, Msg: "has one"}), outcomeRejected, slog.LevelInfo, true},
		{"imageQuota", answerImageQuota, outcomeRejected, slog.LevelInfo, true},
		{"tooLarge", exceedsLength(10), outcomeRejected, slog.LevelInfo, false},
		{"offsetMismatch", offsetMismatch(7), outcomeRejected, slog.LevelInfo, false},
		{"a busy of another status", &apierr.Error{Status: fasthttp.StatusInternalServerError, Reason: "busy", Msg: "x"}, outcomeFailed, slog.LevelWarn, false},
		{"a misspelt shuttingDown", &apierr.Error{Status: fasthttp.StatusServiceUnavailable, Reason: "shutingDown", Msg: "x"}, outcomeFailed, slog.LevelWarn, false},
	} {
		if got := outcomeOf(tc.e); got != tc.outcome {
			t.Errorf("%s: outcome %s, want %s", tc.name, got, tc.outcome)
		}
		if got := refusalLevel(tc.e); got != tc.level {
			t.Errorf("%s: logged at %s, want %s", tc.name, got, tc.level)
		}
		if got := endsSession(tc.e); got != tc.ends {
			t.Errorf("%s: ends the session %v, want %v", tc.name, got, tc.ends)
		}
	}
}

// TestWriteErrorAppliesCarriedHeaders: the headers an answer needs travel
// in the error and writeError sends them; building an error touches no
// response.
func TestWriteErrorAppliesCarriedHeaders(t *testing.T) {
	g := &Gateway{cfg: Config{MissEvery: 3 * time.Second}}
	for _, tc := range []struct {
		e            *apierr.Error
		name, value  string
		reason       string
		wantedStatus int
	}{
		{answerBusy, "Retry-After", "5", "busy", 503},
		{answerShuttingDown, "Retry-After", "5", "shuttingDown", 503},
		{g.tooManyMisses(), "Retry-After", "3", "rateLimited", 429},
		{offsetMismatch(7), "Upload-Offset", "7", "offsetMismatch", 409},
		{answerTusVersion, "Tus-Version", tusVersion, "tusVersion", 412},
		{answerNoSpace.WithHeader("Upload-Offset", "0"), "Upload-Offset", "0", "noSpace", 507},
	} {
		var ctx fasthttp.RequestCtx
		writeError(&ctx, tc.e)
		if got := string(ctx.Response.Header.Peek(tc.name)); got != tc.value || ctx.Response.StatusCode() != tc.wantedStatus {
			t.Errorf("%s: %d with %s %q, want %d with %q", tc.reason, ctx.Response.StatusCode(), tc.name, got, tc.wantedStatus, tc.value)
		}
		if b := string(ctx.Response.Body()); b != string(tc.e.JSON()) {
			t.Errorf("%s: body %s", tc.reason, b)
		}
	}
	if answerNoSpace.Header != nil || answerBusy.Header != nil {
		t.Error("a copy's header reached the declared answer")
	}
}
