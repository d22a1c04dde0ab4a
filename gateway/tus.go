package gateway

import (
	"context"
	"crypto/sha256"
	"encoding"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/crashpoint"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// Resumable uploads, tus 1.0.0 (https://tus.io/protocols/resumable-upload):
// core, creation, creation-with-upload, termination and expiration.
//
//	POST   /market/vm-images/upload/{ticket}          consumes the ticket, 201 + Location
//	HEAD   /market/vm-images/upload-sessions/{id}     Upload-Offset
//	PATCH  /market/vm-images/upload-sessions/{id}     continues at Upload-Offset
//	DELETE /market/vm-images/upload-sessions/{id}     ends the upload
//
// The session id is a capability like the ticket: 256 random bits, stored
// only as a hash, never logged. The same checks as for PUT apply as the
// bytes arrive, across PATCHes and restarts.
const (
	sessionPrefix = "/market/vm-images/upload-sessions/"
	tusVersion    = "1.0.0"
	tusExtensions = "creation,creation-with-upload,termination,expiration"
	offsetOctets  = "application/offset+octet-stream"
	// sessionTTL: an unfinished upload ends this long after its last byte.
	sessionTTL = 24 * time.Hour
	// takeoverWait bounds how long a PATCH waits for an older PATCH of the
	// same upload to stop and save its progress.
	takeoverWait = 10 * time.Second
)

// handleOptions answers tus discovery.
func (g *Gateway) handleOptions(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	h.Set("Tus-Resumable", tusVersion)
	h.Set("Tus-Version", tusVersion)
	h.Set("Tus-Extension", tusExtensions)
	h.Set("Tus-Max-Size", strconv.FormatInt(g.cfg.UploadMax, 10))
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// answerTusVersion is the 412 of a request for another tus version than
// the one served, which it names.
var answerTusVersion = apierr.New(reason.TusVersion).WithHeader("Tus-Version", tusVersion)

// tusRequest checks the protocol version a tus request names and marks the
// answer as tus.
func tusRequest(ctx *fasthttp.RequestCtx) *apierr.Error {
	ctx.Response.Header.Set("Tus-Resumable", tusVersion)
	if v := string(ctx.Request.Header.Peek("Tus-Resumable")); v != tusVersion {
		return answerTusVersion
	}
	return nil
}

func expiresHeader(ctx *fasthttp.RequestCtx, t time.Time) {
	ctx.Response.Header.Set("Upload-Expires", t.UTC().Format(http.TimeFormat))
}

// sessionURL is the Location of a session: absolute under PublicURL when
// the operator set one, else relative (tus clients resolve it against the
// creation URL).
func (g *Gateway) sessionURL(id string) string { return g.cfg.PublicURL + sessionPrefix + id }

// hasBody reports whether the request carries body bytes.
func hasBody(ctx *fasthttp.RequestCtx) bool {
	return ctx.Request.Header.ContentLength() != 0 && ctx.Request.Header.ContentLength() != -2
}

// handleCreate is POST /market/vm-images/upload/{ticket}: tus creation,
// and creation-with-upload when the request has a body.
func (g *Gateway) handleCreate(ctx *fasthttp.RequestCtx, ticket string) {
	start := g.cfg.Now()
	if aerr := tusRequest(ctx); aerr != nil {
		g.refuseUpload(ctx, aerr, start, "")
		return
	}
	length, aerr := uploadLength(ctx)
	var tk imagestore.Ticket
	if aerr == nil {
		tk, aerr = g.admit(ctx, ticket, length)
	}
	withBody := hasBody(ctx)
	if aerr == nil && withBody && string(ctx.Request.Header.ContentType()) != offsetOctets {
		aerr = g.releaseTicket(tk, answerBadContentType)
	}
	if aerr != nil {
		g.refuseUpload(ctx, aerr, start, "")
		return
	}
	if withBody && !g.slots.tryAcquire() {
		g.refuseUpload(ctx, answerBusy, start, "")
		return
	}
	if withBody {
		defer g.releaseSlot(dirUpload)
	}
	claim, aerr := g.claimCreation(ctx, tk.TenantID, length, withBody)
	if aerr != nil {
		g.refuseUpload(ctx, aerr, start, "")
		return
	}
	defer claim.release()

	now := g.cfg.Now()
	id := imagestore.NewSecret()
	sess, w, aerr := g.startSession(ticket, id, tk, length, now)
	if aerr != nil {
		g.refuseUpload(ctx, aerr, start, "")
		return
	}
	ctx.Response.Header.Set("Location", g.sessionURL(id))
	if !withBody && length > 0 {
		if err := w.Close(); err != nil {
			g.log.Error("close new upload", "upload_id", sess.UploadID, "err", err)
		}
		expiresHeader(ctx, sess.ExpiresAt)
		ctx.Response.Header.Set("Upload-Offset", "0")
		ctx.SetStatusCode(fasthttp.StatusCreated)
		g.log.Info("upload session", "upload_id", sess.UploadID, "length", length, "remote", g.clientAddr(ctx))
		return
	}
	holder, _ := g.locks.acquire(sess.UploadID, ctx.Conn(), takeoverWait) // new: nobody else knows the id yet
	defer g.locks.release(sess.UploadID, holder)
	lease, aerr := g.takeUploadLease(ctx, sess.UploadID, holder.takeOver)
	if aerr != nil {
		_ = w.Close()
		g.refuseUpload(ctx, aerr, start, "")
		// The answer names no session: it goes, and its ticket comes back.
		g.undoUpload(sess.UploadID, now, true)
		return
	}
	defer lease.release()
	lease.fenceWriter(w)
	in := g.newIntake(length, exceedsLength(length))
	in.hold(claim)
	if aerr := g.continueSession(ctx, sess, w, in, holder, lease, start, fasthttp.StatusCreated); answeredUnreachable(aerr) {
		// Its answer names no session either (refuseStaying keeps the
		// Location of a 507 only).
		g.undoUpload(sess.UploadID, now, true)
	}
}

// startSession turns ticket into the session id (its ticket consumed at
// now) and opens the session's blob. A session the store may still make
// after an unanswered call is undone; one whose blob could not be opened
// is ended.
func (g *Gateway) startSession(ticket, id string, tk imagestore.Ticket, length int64, now time.Time) (imagestore.UploadSession, imagestore.BlobWriter, *apierr.Error) {
	octx, cancel := g.op()
	defer cancel()
	sess, err := g.store.StartSession(octx, imagestore.HashSecret(ticket), imagestore.HashSecret(id), imagestore.UploadSession{
		Length: length, HashState: emptyHashState(), CreatedAt: now.UTC(), ExpiresAt: now.Add(sessionTTL).UTC(),
	}, now)
	if err != nil {
		aerr := ticketError(err)
		if answeredUnreachable(aerr) {
			g.undoUpload(tk.UploadID, now, false) // the session may land late
		}
		return imagestore.UploadSession{}, nil, aerr
	}
	g.metrics.consumed.Inc()
	bctx, bcancel := g.blobOp()
	defer bcancel()
	w, err := g.blobs.Create(bctx, sess.UploadID)
	if err != nil {
		g.endSession(sess.UploadID)
		return imagestore.UploadSession{}, nil, storageFailure(err, "could not start storing the image")
	}
	return sess, w, nil
}

// handleHead is HEAD on a session: how far the upload got.
func (g *Gateway) handleHead(ctx *fasthttp.RequestCtx, id string) {
	ctx.Response.Header.Set("Cache-Control", "no-store")
	if aerr := tusRequest(ctx); aerr != nil {
		writeError(ctx, aerr)
		return
	}
	sess, aerr := g.lookupSession(ctx, id)
	if aerr != nil {
		writeError(ctx, aerr)
		return
	}
	ctx.Response.Header.Set("Upload-Offset", strconv.FormatInt(sess.Offset, 10))
	ctx.Response.Header.Set("Upload-Length", strconv.FormatInt(sess.Length, 10))
	expiresHeader(ctx, sess.ExpiresAt)
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// admitPatch runs the checks a PATCH can pass before its body: also the
// early answer to "Expect: 100-continue".
func (g *Gateway) admitPatch(ctx *fasthttp.RequestCtx, id string) (imagestore.UploadSession, int64, *apierr.Error) {
	if aerr := tusRequest(ctx); aerr != nil {
		return imagestore.UploadSession{}, 0, aerr
	}
	sess, aerr := g.lookupSession(ctx, id)
	if aerr != nil {
		return sess, 0, aerr
	}
	if string(ctx.Request.Header.ContentType()) != offsetOctets {
		return sess, 0, answerBadContentType
	}
	off, err := strconv.ParseInt(string(ctx.Request.Header.Peek("Upload-Offset")), 10, 64)
	if err != nil || off < 0 {
		return sess, 0, apierr.New(reason.BadRequest).WithMsg("a PATCH needs Upload-Offset, a byte count")
	}
	if off != sess.Offset {
		return sess, off, offsetMismatch(sess.Offset)
	}
	if cl := int64(ctx.Request.Header.ContentLength()); cl > sess.Length-off {
		return sess, off, exceedsLength(sess.Length)
	}
	if !g.slots.free() {
		return sess, off, answerBusy
	}
	if _, aerr := g.claimSession(sess.TenantID, requestBytes(ctx, sess.Length-off), false); aerr != nil {
		return sess, off, aerr
	}
	return sess, off, nil
}

// handlePatch is PATCH on a session: the next bytes of the image.
func (g *Gateway) handlePatch(ctx *fasthttp.RequestCtx, id string) {
	start := g.cfg.Now()
	sess, off, aerr := g.admitPatch(ctx, id)
	if aerr != nil {
		g.refuseUpload(ctx, aerr, start, "")
		return
	}
	if !g.slots.tryAcquire() {
		g.refuseUpload(ctx, answerBusy, start, "")
		return
	}
	defer g.releaseSlot(dirUpload)
	holder, ok := g.locks.acquire(sess.UploadID, ctx.Conn(), takeoverWait)
	if !ok {
		g.refuseUpload(ctx, answerLocked, start, "")
		return
	}
	defer g.locks.release(sess.UploadID, holder)
	// Read the session again under the lock: an older PATCH that was just
	// taken over may have saved more.
	sess, aerr = g.lookupSession(ctx, id)
	if aerr == nil && off != sess.Offset {
		aerr = offsetMismatch(sess.Offset)
	}
	if aerr != nil {
		g.refuseUpload(ctx, aerr, start, "")
		return
	}
	if sess.Offset == sess.Length { // finished already: an answer was lost
		g.tusProgress(ctx, sess.Offset, fasthttp.StatusNoContent)
		return
	}
	lease, aerr := g.takeUploadLease(ctx, sess.UploadID, holder.takeOver)
	if aerr != nil {
		g.refuseUpload(ctx, aerr, start, "")
		return
	}
	defer lease.release()
	// Read the session once more under the lease: another replica may
	// have saved more before it let go.
	if lease != nil {
		if sess, aerr = g.lookupSession(ctx, id); aerr == nil && off != sess.Offset {
			aerr = offsetMismatch(sess.Offset)
		}
		if aerr != nil {
			g.refuseUpload(ctx, aerr, start, "")
			return
		}
	}
	// The first chunk's room, before the body: the PATCH answers 507 now
	// rather than after its bytes.
	claim, aerr := g.claimSession(sess.TenantID, requestBytes(ctx, sess.Length-sess.Offset), true)
	if aerr != nil {
		g.refuseUpload(ctx, aerr.WithHeader("Upload-Offset", strconv.FormatInt(sess.Offset, 10)), start, "")
		return
	}
	defer claim.release()
	octx, cancel := g.blobOp()
	defer cancel()
	w, err := g.blobs.Resume(octx, sess.UploadID, sess.Offset)
	if err != nil {
		g.refuseUpload(ctx, storageFailure(err, "could not reopen the upload"), start, "")
		return
	}
	in, err := g.resumeIntake(w, sess.Offset, sess.HashState, sess.Length, exceedsLength(sess.Length))
	if err != nil {
		_ = w.Close()
		g.refuseUpload(ctx, storageFailure(err, "could not resume the upload"), start, "")
		return
	}
	in.hold(claim)
	lease.fenceWriter(w)
	if aerr := g.continueSession(ctx, sess, w, in, holder, lease, start, fasthttp.StatusNoContent); committedUnrecorded(aerr) {
		g.undoUpload(sess.UploadID, sess.CreatedAt, false) // StartSession's now, the ticket's use
	}
}

// continueSession streams the body into the session's blob and then, as
// the bytes decide: finishes the image, saves the progress for a later
// PATCH, or ends the session when the image is refused. It returns the
// refusal it answered, nil after a success.
func (g *Gateway) continueSession(ctx *fasthttp.RequestCtx, sess imagestore.UploadSession, w imagestore.BlobWriter,
	in *intake, holder *patchHolder, lease *uploadLease, start time.Time, okStatus int) *apierr.Error {
	inFlight := g.metrics.inFlight.WithLabelValues(dirUpload)
	inFlight.Inc()
	defer inFlight.Dec()
	from := in.n
	p := &sessionProgress{g: g, uploadID: sess.UploadID, w: w, in: in, lease: lease, durable: sess.Offset}
	aerr := g.pump(ctx, in, w, p.save, &holder.stop)
	allIn := aerr == nil && in.n == sess.Length
	ends := false // the image failed, or failed to commit: the session ends
	if allIn {
		// The tests' hook: a shutdown begun here (fasthttp's Done says
		// it has) must not cost the client its bytes.
		crashpoint.Until(crashpoint.PatchAfterLastByte, ctx.Done())
		aerr = g.fenceCommit(lease)
	}
	if aerr == nil && allIn {
		img, ferr := g.finishSession(sess, w, in)
		if ferr == nil {
			g.metrics.transfers.WithLabelValues(dirUpload, outcomeOK).Inc()
			g.metrics.duration.WithLabelValues(dirUpload).Observe(g.cfg.Now().Sub(start).Seconds())
			g.logUpload(ctx, img.UploadID, nil, in.n-from, start, "size", img.Size, "resumable", true)
			g.tusProgress(ctx, in.n, okStatus)
			return nil
		}
		// A commit the store did not answer is no verdict on the image:
		// the session stays at its last checkpoint for the retry, unless
		// its blob was committed already (its bytes are no longer a
		// session's): then the upload is undone, and its ticket works
		// again (the caller undoes it).
		aerr, ends = ferr, !answeredUnreachable(ferr) || committedUnrecorded(ferr)
	}
	if aerr != nil && (ends || endsSession(aerr)) {
		g.endRefused(w, sess.UploadID, lease, aerr)
		g.logUpload(ctx, sess.UploadID, aerr, in.n-from, start, "resumable", true)
		g.refuseUpload(ctx, aerr, start, sess.UploadID)
		return aerr
	}
	offset := g.keepSession(p, allIn)
	if aerr != nil {
		g.logUpload(ctx, sess.UploadID, aerr, in.n-from, start, "resumable", true)
		ctx.Response.Header.Set("Upload-Offset", strconv.FormatInt(offset, 10))
		g.refuseStaying(ctx, aerr, start, sess.UploadID)
		return aerr
	}
	g.metrics.transfers.WithLabelValues(dirUpload, outcomeOK).Inc()
	g.tusProgress(ctx, offset, okStatus)
	return nil
}

// sessionProgress is what a PATCH has made durable of its session.
type sessionProgress struct {
	g        *Gateway
	uploadID string
	w        imagestore.BlobWriter
	in       *intake
	lease    *uploadLease
	durable  int64 // the offset the store holds, moved by every save
}

// save makes the bytes taken so far durable and records their offset and
// hash state for the next PATCH: the checkpoint pump takes, and the last
// step of a PATCH that stops early.
func (p *sessionProgress) save() error {
	if err := p.w.Sync(); err != nil {
		return err
	}
	octx, cancel := p.g.op()
	defer cancel()
	if err := p.lease.fence(octx); err != nil {
		return err
	}
	if err := p.g.store.SaveProgress(octx, p.uploadID, p.in.n, p.in.hashState(), p.g.cfg.Now().Add(sessionTTL).UTC()); err != nil {
		return err
	}
	p.durable = p.in.n
	return nil
}

// errNotCommitted: every byte arrived but the image was not committed, so
// the progress is not saved (see keepSession).
var errNotCommitted = errors.New("all bytes arrived but the image was not committed")

// keepSession ends a PATCH after which the session stays (the body ended
// early, was cut, stalled, was taken over or met a full disk, or, its
// last byte in, it could not make sure it still held the upload) and
// returns the offset the store holds, the one HEAD gives.
//
// After the last byte, the progress is not saved: Offset == Length is
// recorded only with the committed image (finishSession), else HEAD tells
// the client it is done and it throws away an image we do not hold. The
// session stays at its last checkpoint, below the length, and the client
// sends the rest again from there; ending it instead would cost the client
// every byte and its ticket.
func (g *Gateway) keepSession(p *sessionProgress, allIn bool) int64 {
	saveErr := errNotCommitted
	if !allIn {
		if saveErr = p.save(); saveErr != nil {
			g.log.Warn("save upload progress", "upload_id", p.uploadID, "err", saveErr)
		}
	}
	if err := p.w.Close(); err != nil {
		g.log.Error("close upload", "upload_id", p.uploadID, "err", err)
	}
	// Over shared blobs the next writer's Resume cuts back itself, and
	// this one may no longer hold the upload: only a local blob is cut.
	// Nor while the image storage does not answer: the cut would wait for
	// its deadlines before the answer, then fail, and the next Resume
	// cuts back anyway.
	if saveErr != nil && p.lease == nil && !errors.Is(saveErr, imagestore.ErrBlobsUnavailable) {
		g.cutBack(p.uploadID, p.durable)
	}
	return p.durable
}

// fenceCommit checks, once the last byte is in, that this request still
// holds the upload before it commits it. On a store call's context of its
// own: the request's (a *fasthttp.RequestCtx) is cancelled when the
// shutdown begins, and the work after the last byte must finish all the
// same, or the client's bytes are lost for nothing.
func (g *Gateway) fenceCommit(lease *uploadLease) *apierr.Error {
	octx, cancel := g.op()
	defer cancel()
	if err := lease.fence(octx); err != nil {
		return writeFailure(err)
	}
	return nil
}

// finishSession commits and records the image once its last byte is in,
// and marks the session finished; like finish, on contexts of its own.
func (g *Gateway) finishSession(sess imagestore.UploadSession, w imagestore.BlobWriter, in *intake) (imagestore.Image, *apierr.Error) {
	img, aerr := g.finish(w, in, imagestore.Image{UploadID: sess.UploadID, TenantID: sess.TenantID, Name: sess.Name, EFI: sess.EFI})
	if aerr != nil {
		return img, aerr
	}
	// The session stays, finished, until it expires: a client whose
	// last answer was lost learns from HEAD that all bytes arrived.
	octx, cancel := g.op()
	defer cancel()
	if err := g.store.SaveProgress(octx, sess.UploadID, in.n, in.hashState(), g.cfg.Now().Add(sessionTTL).UTC()); err != nil {
		g.log.Error("mark upload session finished", "upload_id", sess.UploadID, "err", err)
	}
	return img, nil
}

// endRefused ends a refused upload: its bytes and its session go. Over
// shared blobs only while this request still holds the upload: one whose
// lease lapsed must leave both to the writer that took it over. The fence
// has a context of its own: a shutdown must not turn the end into a Close
// that leaves a refused image's bytes and session behind. cause is the
// refusal (dropWrite).
func (g *Gateway) endRefused(w imagestore.BlobWriter, uploadID string, lease *uploadLease, cause *apierr.Error) {
	octx, cancel := g.op()
	err := lease.fence(octx)
	cancel()
	if err != nil {
		if cerr := w.Close(); cerr != nil {
			g.log.Error("close upload", "upload_id", uploadID, "err", cerr)
		}
		return
	}
	g.dropWrite(w, uploadID, cause)
	g.endSession(uploadID)
}

// cutBack drops what a PATCH wrote past the durable offset when it could
// not make it durable (a full disk, above all): those bytes would hold
// space for nothing, since the next PATCH starts at the durable offset.
func (g *Gateway) cutBack(uploadID string, offset int64) {
	octx, cancel := g.blobOp()
	defer cancel()
	w, err := g.blobs.Resume(octx, uploadID, offset) // Resume cuts past offset
	if err == nil {
		err = w.Close()
	}
	if err != nil {
		g.log.Error("cut upload back to its durable offset", "upload_id", uploadID, "offset", offset, "err", err)
	}
}

// endsSession: a verdict on the image itself ends the upload (imageError's
// 415 and 422, the image quota at the commit); a broken or stalled
// connection, a full disk or a client error does not.
func endsSession(e *apierr.Error) bool {
	return e.Status == fasthttp.StatusUnsupportedMediaType && !errors.Is(e, answerBadContentType) ||
		e.Status == fasthttp.StatusUnprocessableEntity || errors.Is(e, answerImageQuota)
}

// tusProgress answers a PATCH or creation with the session's offset.
func (g *Gateway) tusProgress(ctx *fasthttp.RequestCtx, offset int64, status int) {
	ctx.Response.Header.Set("Upload-Offset", strconv.FormatInt(offset, 10))
	expiresHeader(ctx, g.cfg.Now().Add(sessionTTL))
	ctx.SetStatusCode(status)
}

// logUpload writes an upload's line, PUT or tus: its outcome (aerr nil:
// ok), the image bytes this request took, then extra (a resumable
// upload's "resumable", a finished one's "size"), then the error's cause.
func (g *Gateway) logUpload(ctx *fasthttp.RequestCtx, uploadID string, aerr *apierr.Error, n int64, start time.Time, extra ...any) {
	attrs := []any{"upload_id", uploadID, "outcome", outcomeOK}
	if aerr != nil {
		attrs = []any{"upload_id", uploadID, "outcome", outcomeOf(aerr), "reason", aerr.Reason}
	}
	attrs = append(attrs, "bytes", n, "seconds", g.cfg.Now().Sub(start).Seconds(), "remote", g.clientAddr(ctx))
	attrs = append(attrs, extra...)
	if aerr != nil && aerr.Err != nil {
		attrs = append(attrs, "err", aerr.Err)
	}
	g.log.Info("upload", attrs...)
}

// handleTerminate is DELETE on a session: tus termination. A running PATCH
// is taken over first. A finished upload's image stays (images are removed
// on the control plane).
func (g *Gateway) handleTerminate(ctx *fasthttp.RequestCtx, id string) {
	if aerr := tusRequest(ctx); aerr != nil {
		writeError(ctx, aerr)
		return
	}
	sess, aerr := g.lookupSession(ctx, id)
	if aerr != nil {
		writeError(ctx, aerr)
		return
	}
	holder, ok := g.locks.acquire(sess.UploadID, ctx.Conn(), takeoverWait)
	if !ok {
		writeError(ctx, answerLocked)
		return
	}
	defer g.locks.release(sess.UploadID, holder)
	// Among replicas, only the upload's writer may end it: one that
	// writes it elsewhere keeps it until its lease ends.
	lease, aerr := g.takeUploadLease(ctx, sess.UploadID, holder.takeOver)
	if aerr != nil {
		writeError(ctx, aerr)
		return
	}
	defer lease.release()
	g.endSession(sess.UploadID)
	if sess.Offset < sess.Length {
		g.removeNowOrLater(sess.UploadID, g.removePartial(sess.UploadID))
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// lookupSession resolves a session capability, slowing down guessers.
func (g *Gateway) lookupSession(ctx *fasthttp.RequestCtx, id string) (imagestore.UploadSession, *apierr.Error) {
	now := g.cfg.Now()
	unknown := func() *apierr.Error {
		if !g.misses.miss(g.clientAddr(ctx), now) {
			return g.tooManyMisses()
		}
		return apierr.New(reason.SessionUnknown)
	}
	if !isSecretShape(id) {
		return imagestore.UploadSession{}, unknown()
	}
	octx, cancel := g.op()
	defer cancel()
	sess, err := g.store.Session(octx, imagestore.HashSecret(id))
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		return sess, unknown()
	case err == nil && !now.Before(sess.ExpiresAt): // expired, not yet swept
		return imagestore.UploadSession{}, apierr.New(reason.SessionUnknown)
	case err != nil:
		return sess, storeFailure(err, "could not look the upload session up")
	}
	return sess, nil
}

func (g *Gateway) endSession(uploadID string) {
	octx, cancel := g.op()
	defer cancel()
	if err := g.store.EndSession(octx, uploadID); err != nil {
		g.log.Error("end upload session", "upload_id", uploadID, "err", err)
	}
}

func uploadLength(ctx *fasthttp.RequestCtx) (int64, *apierr.Error) {
	if len(ctx.Request.Header.Peek("Upload-Defer-Length")) > 0 {
		return 0, apierr.New(reason.BadRequest).
			WithMsg("Upload-Defer-Length is not supported; send Upload-Length")
	}
	n, err := strconv.ParseInt(string(ctx.Request.Header.Peek("Upload-Length")), 10, 64)
	if err != nil || n < 0 {
		return 0, apierr.New(reason.BadRequest).
			WithMsg("creating a resumable upload needs Upload-Length, the image size in bytes")
	}
	return n, nil
}

func exceedsLength(length int64) *apierr.Error {
	return apierr.New(reason.TooLarge).
		WithMsg("more bytes than the Upload-Length of " + strconv.FormatInt(length, 10) + " announced")
}

// offsetMismatch is the 409 of a PATCH at another offset than the one
// stored, which its Upload-Offset tells.
func offsetMismatch(have int64) *apierr.Error {
	return apierr.New(reason.OffsetMismatch).
		WithMsg("Upload-Offset does not match the "+strconv.FormatInt(have, 10)+" bytes stored; ask with HEAD and continue from there").
		WithHeader("Upload-Offset", strconv.FormatInt(have, 10))
}

func emptyHashState() []byte {
	b, _ := sha256.New().(encoding.BinaryMarshaler).MarshalBinary()
	return b
}

// patchLocks lets one request at a time write an upload. A newer request
// takes over from an older one still reading (a client that reconnected
// while its old connection hangs): it raises the older one's stop flag,
// wakes its read, and waits until it has saved its progress.
type patchLocks struct {
	mu   sync.Mutex
	held map[string]*patchHolder // by upload id
}

type patchHolder struct {
	conn net.Conn
	stop stopFlag
	done chan struct{}
}

func newPatchLocks() *patchLocks { return &patchLocks{held: make(map[string]*patchHolder)} }

// acquire takes the upload's lock for a request on conn, taking it over
// from a holder if needed; false if the holder did not let go within wait.
func (l *patchLocks) acquire(id string, conn net.Conn, wait time.Duration) (*patchHolder, bool) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		h := l.held[id]
		if h == nil {
			me := &patchHolder{conn: conn, done: make(chan struct{})}
			l.held[id] = me
			l.mu.Unlock()
			return me, true
		}
		l.mu.Unlock()
		h.takeOver(errTakenOver)
		select {
		case <-h.done:
		case <-deadline.C:
			return nil, false
		}
	}
}

// stopAll asks every running PATCH to stop and save its progress.
func (l *patchLocks) stopAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, h := range l.held {
		h.takeOver(errTakenOver)
	}
}

// takeOver stops the holder's read for cause (errTakenOver, or the end of
// its lease): the flag first, then the deadline that wakes a read
// waiting for bytes (see idleReader.Read).
func (h *patchHolder) takeOver(cause error) {
	h.stop.raise(cause)
	_ = h.conn.SetReadDeadline(time.Now())
}

func (l *patchLocks) release(id string, h *patchHolder) {
	l.mu.Lock()
	if l.held[id] == h {
		delete(l.held, id)
	}
	l.mu.Unlock()
	close(h.done)
}

// RunSweeper ends expired upload sessions and removes their partial files
// until ctx is done.
func (g *Gateway) RunSweeper(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		g.sweepSessions()
		g.sweepLeases()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (g *Gateway) sweepSessions() {
	octx, cancel := g.op()
	defer cancel()
	ids, err := g.store.ExpireSessions(octx, g.cfg.Now())
	if err != nil {
		g.log.Error("expire upload sessions", "err", err)
		return
	}
	for _, id := range ids {
		g.removeNowOrLater(id, g.removePartial(id))
		g.log.Info("upload session expired", "upload_id", id)
	}
}

// removePartial is the removal of an ended session's partial bytes, each
// try bounded as one store call.
func (g *Gateway) removePartial(uploadID string) func() error {
	return func() error {
		octx, cancel := g.blobOp()
		defer cancel()
		return g.blobs.RemovePartial(octx, uploadID)
	}
}
