package gateway

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
	"github.com/vmshelf/vmshelf/internal/unavailable"
	"github.com/vmshelf/vmshelf/qcow2"
)

// bufSize is the chunk an upload reads, hashes and writes at a time: large
// enough for few syscalls, small enough that MaxTransfers of them are
// nothing next to an image.
const bufSize = 1 << 20

// commitTimeout bounds the work after the last byte (structure check reads,
// fsync, rename, record), which must not be cut short by a shutdown.
const commitTimeout = 5 * time.Minute

// admit runs the checks that come before the body, in the order docs/api.md
// gives for the upload (ticket, slot, size limit), up to the size limit; the free space comes next (claimSpace). It takes
// nothing: the handler acquires the slot, claims the space and consumes
// the ticket. A size over the limit ends the ticket (release.go). size is the image size the client announced (Content-Length
// of a PUT, Upload-Length of a tus creation), -1 when unknown (chunked).
// The ticket names the tenant whose space the upload will claim.
func (g *Gateway) admit(ctx *fasthttp.RequestCtx, ticket string, size int64) (imagestore.Ticket, *apierr.Error) {
	now := g.cfg.Now()
	tk, err := g.lookupTicket(ticket)
	if err != nil {
		// The limiter is asked only now: a valid ticket is always served,
		// whoever else guessed from the same address.
		if errors.Is(err, imagestore.ErrNotFound) && !g.misses.miss(g.clientAddr(ctx), now) {
			return tk, g.tooManyMisses()
		}
		return tk, ticketError(err)
	}
	switch {
	case !tk.UsedAt.IsZero():
		return tk, ticketError(imagestore.ErrTicketUsed)
	case !now.Before(tk.ExpiresAt):
		return tk, ticketError(imagestore.ErrTicketExpired)
	}
	if !g.slots.free() {
		return tk, answerBusy
	}
	if size > g.cfg.UploadMax {
		return tk, g.releaseTicket(tk, g.tooLarge())
	}
	return tk, nil
}

func (g *Gateway) lookupTicket(ticket string) (imagestore.Ticket, error) {
	if !isSecretShape(ticket) {
		return imagestore.Ticket{}, imagestore.ErrNotFound
	}
	ctx, cancel := g.op()
	defer cancel()
	return g.store.Ticket(ctx, imagestore.HashSecret(ticket))
}

// tooLarge is the 413 for an image above --upload-max-gib, before or
// while the body streams.
func (g *Gateway) tooLarge() *apierr.Error {
	return apierr.New(reason.TooLarge).
		WithMsg("the image is larger than this edge accepts (" + strconv.FormatInt(g.cfg.UploadMax, 10) + " bytes)")
}

func ticketError(err error) *apierr.Error {
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		return apierr.New(reason.TicketUnknown)
	case errors.Is(err, imagestore.ErrTicketUsed):
		return apierr.New(reason.TicketUsed)
	case errors.Is(err, imagestore.ErrTicketExpired):
		return apierr.New(reason.TicketExpired)
	}
	return storeFailure(err, "could not look the ticket up")
}

// handleUpload is PUT /market/vm-images/upload/{ticket}: the body is the
// QCOW2 file, streamed: inspected header first, written to a partial file
// as it arrives, committed after the last byte (checks and their order:
// docs/api.md, the upload's table).
func (g *Gateway) handleUpload(ctx *fasthttp.RequestCtx, ticket string) {
	start := g.cfg.Now()
	size := int64(ctx.Request.Header.ContentLength())
	tk, aerr := g.admit(ctx, ticket, size)
	if aerr != nil {
		g.refuseUpload(ctx, aerr, start, "")
		return
	}
	if !g.slots.tryAcquire() {
		g.refuseUpload(ctx, answerBusy, start, "")
		return
	}
	defer g.releaseSlot(dirUpload)
	claim, aerr := g.claimSpace(tk.TenantID, size, true)
	if aerr != nil {
		g.refuseUpload(ctx, aerr, start, "")
		return
	}
	defer claim.release()
	inFlight := g.metrics.inFlight.WithLabelValues(dirUpload)
	inFlight.Inc()
	defer inFlight.Dec()

	// started marks this start of the upload in the store (the ticket's
	// use): an undo takes back this one and no other.
	started := g.cfg.Now()
	octx, cancel := g.op()
	consumed, err := g.store.ConsumeTicket(octx, imagestore.HashSecret(ticket), started)
	cancel()
	if err != nil {
		aerr := ticketError(err)
		if answeredUnreachable(aerr) {
			g.undoUpload(tk.UploadID, started, false) // the use may land late
		}
		g.refuseUpload(ctx, aerr, start, "")
		return
	}
	tk = consumed
	g.metrics.consumed.Inc()

	img, n, aerr := g.receive(ctx, tk, claim)
	if aerr != nil {
		// Neither the store's outage nor a lease an earlier try still
		// holds is the upload's fault: its ticket works again for the
		// retry the answer asks for.
		if answeredUnreachable(aerr) || errors.Is(aerr, answerLocked) {
			g.undoUpload(tk.UploadID, started, false)
		} else {
			g.endUpload(tk.UploadID)
		}
		g.refuseUpload(ctx, aerr, start, tk.UploadID)
		g.logUpload(ctx, tk.UploadID, aerr, n, start)
		return
	}
	g.metrics.transfers.WithLabelValues(dirUpload, outcomeOK).Inc()
	g.metrics.duration.WithLabelValues(dirUpload).Observe(g.cfg.Now().Sub(start).Seconds())
	g.logUpload(ctx, img.UploadID, nil, n, start)
	body, _ := json.Marshal(img)
	ctx.SetStatusCode(fasthttp.StatusCreated)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// endUpload gives the quota place of a plain upload that did not become an
// image back to its tenant. If the store cannot be told, the place stays
// taken until the next start-up ends every upload left running (the log
// says so): a tenant refused a ticket for a while is better than one over
// its quota.
func (g *Gateway) endUpload(uploadID string) {
	octx, cancel := g.op()
	defer cancel()
	if err := g.store.EndUpload(octx, uploadID); err != nil {
		g.log.Error("ended upload still counts against its tenant's quota until restart", "upload_id", uploadID, "err", err)
	}
}

// refuseUpload answers an upload with its error. The body may still be
// on the wire; closing the connection stops the client sending it.
func (g *Gateway) refuseUpload(ctx *fasthttp.RequestCtx, aerr *apierr.Error, start time.Time, uploadID string) {
	// A refused creation names no session: the one it may have made has
	// ended with the refusal.
	ctx.Response.Header.Del("Location")
	g.answerRefusal(ctx, aerr, start, uploadID)
}

// refuseStaying is refuseUpload for a refusal after which the session
// stays. A 507 (no room for its next chunk, a full disk) asks the client
// to resume once space is freed: a creation's answer keeps its Location
// for that.
func (g *Gateway) refuseStaying(ctx *fasthttp.RequestCtx, aerr *apierr.Error, start time.Time, uploadID string) {
	if !errors.Is(aerr, answerNoSpace) {
		ctx.Response.Header.Del("Location")
	}
	g.answerRefusal(ctx, aerr, start, uploadID)
}

func (g *Gateway) answerRefusal(ctx *fasthttp.RequestCtx, aerr *apierr.Error, start time.Time, uploadID string) {
	g.refused(dirUpload, aerr)
	if uploadID != "" {
		g.metrics.duration.WithLabelValues(dirUpload).Observe(g.cfg.Now().Sub(start).Seconds())
	}
	writeError(ctx, aerr)
	g.answerAndClose(ctx)
}

// answerAndClose sends the answer in ctx with "Connection: close" and ends
// the connection with a lingering close. The request body may still be on
// the wire, so the connection cannot serve another request. fasthttp skips
// a hijack when the answer closes the connection, so the hijack writes the
// answer itself.
func (g *Gateway) answerAndClose(ctx *fasthttp.RequestCtx) {
	resp := &fasthttp.Response{}
	ctx.Response.CopyTo(resp)
	resp.SetConnectionClose()
	idle := g.cfg.IdleTimeout
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		// The answer must not wait long on a client that stopped reading.
		_ = c.SetWriteDeadline(time.Now().Add(idle))
		bw := bufio.NewWriter(c)
		if err := resp.Write(bw); err == nil && bw.Flush() == nil {
			lingerClose(c)
		}
	})
}

// Lingering close bounds (nginx's lingering_time and lingering_timeout).
const (
	lingerTotal = 30 * time.Second
	lingerIdle  = 5 * time.Second
)

// lingerClose runs after a refusal was sent on a connection whose client
// may still be sending the body. Closing at once would make the kernel
// answer the unread bytes with a reset, and the client (curl among them)
// would report a send failure instead of our answer. So: send FIN, read
// and drop what still arrives until the client closes, stalls or the
// bound passes, then close.
func lingerClose(c net.Conn) {
	if tc, ok := underlyingTCP(c); ok {
		_ = tc.CloseWrite()
	}
	end := time.Now().Add(lingerTotal)
	buf := make([]byte, 32<<10)
	for time.Now().Before(end) {
		d := time.Now().Add(lingerIdle)
		if d.After(end) {
			d = end
		}
		_ = c.SetReadDeadline(d)
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

// underlyingTCP finds the *net.TCPConn under fasthttp's hijacked wrapper
// and the connection cap's (connlimit.Conn's NetConn).
func underlyingTCP(c net.Conn) (*net.TCPConn, bool) {
	for range 4 {
		switch u := c.(type) {
		case *net.TCPConn:
			return u, true
		case interface{ UnsafeConn() net.Conn }:
			c = u.UnsafeConn()
		case interface{ NetConn() net.Conn }:
			c = u.NetConn()
		default:
			return nil, false
		}
	}
	return nil, false
}

// outcomeOf sorts an error into the transfers_total outcomes.
func outcomeOf(e *apierr.Error) string {
	switch {
	case isAny(e, answerIdle, answerIncomplete, answerTakenOver, answerShuttingDown, answerClientGone):
		return outcomeAborted
	case e.Status >= 500 && !isAny(e, answerBusy, answerNoSpace):
		return outcomeFailed
	}
	return outcomeRejected
}

// receive streams the body through the checks into a new blob and, after
// the last byte, commits and records it. On any error nothing is left.
func (g *Gateway) receive(ctx *fasthttp.RequestCtx, tk imagestore.Ticket, claim *spaceClaim) (_ imagestore.Image, _ int64, aerr *apierr.Error) {
	octx, cancel := g.blobOp()
	w, err := g.blobs.Create(octx, tk.UploadID)
	cancel()
	if err != nil {
		return imagestore.Image{}, 0, storageFailure(err, "could not start storing the image")
	}
	defer func() { g.dropWrite(w, tk.UploadID, aerr) }() // a no-op once committed
	// Over a shared store the upload's lease says this replica is alive
	// and writing it (the leader ends the running mark of one whose lease
	// lapsed: uploadSweep), and fences its S3 writes. Its end stops the
	// read at once (stop), and is answered as such, never as the
	// client's idleness.
	stop := &stopFlag{}
	lease, aerr := g.takeUploadLease(ctx, tk.UploadID, func(cause error) {
		stop.raise(cause)
		_ = ctx.Conn().SetReadDeadline(time.Now())
	})
	if aerr != nil {
		return imagestore.Image{}, 0, aerr
	}
	defer lease.release()
	lease.fenceWriter(w)
	in := g.newIntake(g.cfg.UploadMax, g.tooLarge())
	in.hold(claim)
	if aerr := g.pump(ctx, in, w, nil, stop); aerr != nil {
		return imagestore.Image{}, in.n, aerr
	}
	// fasthttp ends a fixed-length body that was cut short with a clean EOF.
	if cl := int64(ctx.Request.Header.ContentLength()); cl >= 0 && in.n != cl {
		return imagestore.Image{}, in.n, incomplete(io.ErrUnexpectedEOF)
	}
	// A lease that ended once the body was in stops the commit too: on a
	// local disk no write asks the fence, and the answer must not be a
	// 201 after the log said the request stops.
	if aerr := g.fenceCommit(lease); aerr != nil {
		return imagestore.Image{}, in.n, aerr
	}
	img, aerr := g.finish(w, in, imagestore.Image{UploadID: tk.UploadID, TenantID: tk.TenantID, Name: tk.Name, EFI: tk.EFI})
	return img, in.n, aerr
}

// dropWrite removes what an upload that did not finish wrote, the cause
// being why it did not (nil: it did, and the abort is a no-op). Where
// the image storage is unreachable, the cause or the abort's own failure
// says so, and the abort, which needs that storage, is left to the
// background (leftovers): the answer does not wait for it, and it is
// tried again until the storage answers.
func (g *Gateway) dropWrite(w imagestore.BlobWriter, uploadID string, cause *apierr.Error) {
	if cause != nil && errors.Is(cause, imagestore.ErrBlobsUnavailable) {
		g.removeLater(uploadID, w.Abort)
		return
	}
	g.removeNowOrLater(uploadID, w.Abort)
}

// removeNowOrLater runs remove (the abort or removal of an upload's
// bytes) now, and again in the background (leftovers) if it failed for an
// unreachable image storage.
func (g *Gateway) removeNowOrLater(uploadID string, remove func() error) {
	err := remove()
	switch {
	case errors.Is(err, imagestore.ErrBlobsUnavailable):
		g.removeLater(uploadID, remove)
	case err != nil:
		g.log.Error("remove upload", "upload_id", uploadID, "err", err)
	}
}

func incomplete(err error) *apierr.Error {
	return answerIncomplete.WithCause(err)
}

// imageError turns an inspection verdict into the 415/422 answers of
// docs/api.md (reasons per rule: docs/image-safety.md).
func imageError(err error) *apierr.Error {
	var rej *qcow2.Reject
	if !errors.As(err, &rej) {
		// No verdict on the bytes: reading them back from the storage
		// failed (the structure check reads the blob). A full disk or
		// an image storage that did not answer is told as for a write.
		return blobFailure(err, "could not read the image back to check it")
	}
	r, ok := imageRefusals[rej.Reason]
	if !ok {
		return apierr.Wrap(err, reason.Internal).
			WithMsg("the image check gave a verdict this edge cannot answer")
	}
	return apierr.New(r).WithMsg(rej.Msg)
}

// imageRefusals are the table's answers to the inspector's verdicts, by
// the inspector's name for each (the same name).
var imageRefusals = map[string]reason.Code{
	qcow2.ReasonNotQcow2:            reason.NotQcow2,
	qcow2.ReasonBackingFile:         reason.BackingFile,
	qcow2.ReasonExternalDataFile:    reason.ExternalDataFile,
	qcow2.ReasonEncrypted:           reason.Encrypted,
	qcow2.ReasonCorrupt:             reason.Corrupt,
	qcow2.ReasonBadHeader:           reason.BadHeader,
	qcow2.ReasonVirtualSizeTooLarge: reason.VirtualSizeTooLarge,
}

// writeFailure is the answer to a write of image bytes that failed.
func writeFailure(err error) *apierr.Error {
	return blobFailure(err, "could not store the image")
}

// blobFailure tells a full disk (507, the client may retry later) from
// other storage errors (storageFailure, with msg).
func blobFailure(err error, msg string) *apierr.Error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, imagestore.ErrNoSpace) {
		return answerNoSpace.WithCause(err)
	}
	return storageFailure(err, msg)
}

// storageFailure is the answer to a blob call that failed for another
// reason than a full disk: 503 blobStoreUnreachable, which a client may
// retry, when the image storage did not answer in time (S3 hung or down,
// the same reason /readyz gives); 503 storeUnreachable when the write's
// fence could not ask the record store (over S3, every durable step asks
// it whether this replica still holds the upload); else 500 with msg.
func storageFailure(err error, msg string) *apierr.Error {
	if errors.Is(err, errLeaseEnded) {
		return leaseEnded(err)
	}
	if aerr := unavailable.Answer(err); aerr != nil {
		return aerr
	}
	if errors.Is(err, imagestore.ErrBlobsUnavailable) {
		return apierr.Wrap(err, reason.BlobStoreUnreachable).
			WithMsg("the edge's image storage did not answer in time; try again in a minute").WithRetryAfter(60)
	}
	return apierr.Wrap(err, reason.Internal).WithMsg(msg)
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// isSecretShape reports whether s looks like a capability (64 lower-case
// hex characters), so that junk never reaches the store.
func isSecretShape(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
