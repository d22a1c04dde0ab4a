package gateway

import (
	"errors"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
	"github.com/vmshelf/vmshelf/internal/unavailable"
)

// The answers the gateway's own logic tells apart: how a transfer is
// counted (outcomeOf), the level of its log line (logRefusal), whether a
// resumable upload ends (endsSession) and whether a 507 keeps Location
// (refuseStaying). Each is declared here once, every answer of its kind is
// a copy of it (the With* methods of apierr.Error, which leave it as it
// is), and the logic recognises it with errors.Is: a misspelt name does
// not compile, where a misspelt reason literal would have moved the answer
// to another class without a sound.
var (
	// answerBusy: every slot is taken; the client retries shortly.
	answerBusy = apierr.New(reason.Busy).WithRetryAfter(5)
	// answerShuttingDown: Shutdown stopped the request; another
	// replica, or this one restarted, takes the retry.
	answerShuttingDown = apierr.New(reason.ShuttingDown).WithRetryAfter(5)
	// answerClientGone: the client left while its fetch waited for a
	// slot; nobody reads this answer, the log and the counters do.
	answerClientGone = apierr.Wrap(errClientGone, reason.ClientGone)
	// answerIdle: no byte arrived within the idle timeout (the message
	// names it).
	answerIdle = apierr.New(reason.Idle)
	// answerIncomplete: the body ended before the length it announced.
	answerIncomplete = apierr.New(reason.IncompleteBody)
	// answerLocked: another request, or another replica, is still
	// writing the upload; the client retries.
	answerLocked = apierr.New(reason.Locked)
	// answerTakenOver: a newer request of the same upload took over.
	answerTakenOver = apierr.Wrap(errTakenOver, reason.TakenOver)
	// answerNoSpace: the disk, or the tenant's share of it, is full; the
	// client may retry once space is freed, a session resumes.
	answerNoSpace = apierr.New(reason.NoSpace)
	// answerBadContentType: tus bytes without their media type, a client
	// error that does not end the session (unlike the 415 of notQcow2).
	answerBadContentType = apierr.New(reason.BadContentType)
	// answerImageQuota: the tenant holds as many images as it may.
	answerImageQuota = apierr.New(reason.ImageQuota)
	// answerStoreUnreachable: the record store did not answer, or this
	// replica could not keep its lease on the upload in it. An upload
	// answered so keeps nothing but what a resumable one had made
	// durable (its Upload-Offset), and its ticket is given back
	// (undoUpload), so that the client's retry with it works.
	answerStoreUnreachable = unavailable.Store
)

// storeFailure is the answer to a store call that failed: the store's
// passing outage (503 storeUnreachable, Retry-After), a full disk (507),
// or else our own fault, 500 with msg.
func storeFailure(err error, msg string) *apierr.Error {
	if aerr := unavailable.Answer(err); aerr != nil {
		return aerr
	}
	if errors.Is(err, imagestore.ErrNoSpace) {
		return writeFailure(err)
	}
	return apierr.Wrap(err, reason.Internal).WithMsg(msg)
}

// isAny reports whether e is one of the declared answers.
func isAny(e *apierr.Error, answers ...*apierr.Error) bool {
	for _, a := range answers {
		if errors.Is(e, a) {
			return true
		}
	}
	return false
}
