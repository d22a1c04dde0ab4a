package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/qcow2"
	"github.com/vmshelf/vmshelf/internal/apierr"
)

// bufSize is the chunk an upload reads, hashes and writes at a time: large
// enough for few syscalls, small enough that MaxTransfers of them are
// nothing next to an image.
const bufSize = 1 << 20

// commitTimeout bounds the work after the last byte (structure check reads,
// fsync, rename, record), which must not be cut short by a shutdown.
const commitTimeout = 5 * time.Minute

// admit runs SPEC's checks that come before the body, in SPEC's order. It
// takes nothing: the handler acquires the slot and consumes the ticket.
func (g *Gateway) admit(ctx *fasthttp.RequestCtx, ticket string) *apierr.Error {
	now := g.cfg.Now()
	addr := remoteAddr(ctx)
	if g.misses.blocked(addr, now) {
		return g.tooManyMisses(ctx)
	}
	tk, err := g.lookupTicket(ticket)
	if err != nil {
		if errors.Is(err, imagestore.ErrNotFound) {
			g.misses.miss(addr, now)
		}
		return ticketError(err)
	}
	switch {
	case !tk.UsedAt.IsZero():
		return ticketError(imagestore.ErrTicketUsed)
	case !now.Before(tk.ExpiresAt):
		return ticketError(imagestore.ErrTicketExpired)
	}
	if !g.slots.free() {
		return g.busy(ctx)
	}
	cl := int64(ctx.Request.Header.ContentLength()) // -1: chunked
	if cl > g.cfg.UploadMax {
		return apierr.New(fasthttp.StatusRequestEntityTooLarge, "tooLarge",
			"the image is larger than this edge accepts ("+strconv.FormatInt(g.cfg.UploadMax, 10)+" bytes)")
	}
	octx, cancel := op()
	defer cancel()
	avail, err := g.blobs.Available(octx)
	if err != nil {
		return apierr.Wrap(err, fasthttp.StatusInternalServerError, "internal", "could not read the free disk space")
	}
	if avail < max(cl, 0)+g.cfg.Headroom {
		return apierr.New(fasthttp.StatusInsufficientStorage, "noSpace", "the edge has not enough free disk space for this image; try again later")
	}
	return nil
}

func (g *Gateway) lookupTicket(ticket string) (imagestore.Ticket, error) {
	if !isSecretShape(ticket) {
		return imagestore.Ticket{}, imagestore.ErrNotFound
	}
	ctx, cancel := op()
	defer cancel()
	return g.store.Ticket(ctx, imagestore.HashSecret(ticket))
}

func (g *Gateway) busy(ctx *fasthttp.RequestCtx) *apierr.Error {
	ctx.Response.Header.Set("Retry-After", "5")
	return apierr.New(fasthttp.StatusServiceUnavailable, "busy", "the edge is running as many transfers as it may; retry after a few seconds")
}

func ticketError(err error) *apierr.Error {
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		return apierr.New(fasthttp.StatusNotFound, "ticketUnknown", "no such upload ticket")
	case errors.Is(err, imagestore.ErrTicketUsed):
		return apierr.New(fasthttp.StatusGone, "ticketUsed", "this upload ticket was already used; ask for a new one")
	case errors.Is(err, imagestore.ErrTicketExpired):
		return apierr.New(fasthttp.StatusGone, "ticketExpired", "this upload ticket has expired; ask for a new one")
	}
	return apierr.Wrap(err, fasthttp.StatusInternalServerError, "internal", "could not look the ticket up")
}

// handleUpload is PUT /market/vm-images/upload/{ticket}: the body is the
// QCOW2 file. See DESIGN "An upload, as data flowing through".
func (g *Gateway) handleUpload(ctx *fasthttp.RequestCtx, ticket string) {
	start := g.cfg.Now()
	if aerr := g.admit(ctx, ticket); aerr != nil {
		g.refuseUpload(ctx, aerr, start, "")
		return
	}
	if !g.slots.tryAcquire() {
		g.refuseUpload(ctx, g.busy(ctx), start, "")
		return
	}
	defer g.releaseSlot(dirUpload)
	inFlight := g.metrics.inFlight.WithLabelValues(dirUpload)
	inFlight.Inc()
	defer inFlight.Dec()

	octx, cancel := op()
	tk, err := g.store.ConsumeTicket(octx, imagestore.HashSecret(ticket), g.cfg.Now())
	cancel()
	if err != nil {
		g.refuseUpload(ctx, ticketError(err), start, "")
		return
	}
	g.metrics.consumed.Inc()

	img, n, aerr := g.receive(ctx, tk)
	if aerr != nil {
		g.refuseUpload(ctx, aerr, start, tk.UploadID)
		attrs := []any{"upload_id", tk.UploadID, "outcome", outcomeOf(aerr), "reason", aerr.Reason,
			"bytes", n, "seconds", g.cfg.Now().Sub(start).Seconds(), "remote", remoteAddr(ctx)}
		if aerr.Err != nil {
			attrs = append(attrs, "err", aerr.Err)
		}
		g.log.Info("upload", attrs...)
		return
	}
	g.metrics.transfers.WithLabelValues(dirUpload, outcomeOK).Inc()
	g.metrics.duration.WithLabelValues(dirUpload).Observe(g.cfg.Now().Sub(start).Seconds())
	g.log.Info("upload", "upload_id", img.UploadID, "outcome", outcomeOK, "bytes", n,
		"seconds", g.cfg.Now().Sub(start).Seconds(), "remote", remoteAddr(ctx))
	body, _ := json.Marshal(img)
	ctx.SetStatusCode(fasthttp.StatusCreated)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// refuseUpload answers an upload with its error. The body may still be
// on the wire; closing the connection stops the client sending it.
func (g *Gateway) refuseUpload(ctx *fasthttp.RequestCtx, aerr *apierr.Error, start time.Time, uploadID string) {
	outcome := outcomeOf(aerr)
	if outcome == outcomeRejected {
		g.reject(dirUpload, aerr)
	}
	g.metrics.transfers.WithLabelValues(dirUpload, outcome).Inc()
	if uploadID != "" {
		g.metrics.duration.WithLabelValues(dirUpload).Observe(g.cfg.Now().Sub(start).Seconds())
	}
	// The answer must not wait on a client that stopped reading.
	_ = ctx.SetWriteDeadline(g.cfg.Now().Add(g.cfg.IdleTimeout))
	writeError(ctx, aerr)
	// The connection ends after the answer, by lingerClose. (fasthttp
	// skips the hijack when the answer says "Connection: close", so it
	// does not; the client learns from the FIN.)
	ctx.Hijack(lingerClose)
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

// underlyingTCP finds the *net.TCPConn under fasthttp's hijacked wrapper.
func underlyingTCP(c net.Conn) (*net.TCPConn, bool) {
	for range 4 {
		if tc, ok := c.(*net.TCPConn); ok {
			return tc, true
		}
		u, ok := c.(interface{ UnsafeConn() net.Conn })
		if !ok {
			return nil, false
		}
		c = u.UnsafeConn()
	}
	return nil, false
}

// outcomeOf sorts an error into the transfers_total outcomes.
func outcomeOf(e *apierr.Error) string {
	switch {
	case e.Reason == "idle" || e.Reason == "incompleteBody":
		return outcomeAborted
	case e.Status >= 500 && e.Reason != "busy" && e.Reason != "noSpace":
		return outcomeFailed
	}
	return outcomeRejected
}

// receive streams the body through the checks into a new blob and, after
// the last byte, commits and records it. On any error nothing is left.
func (g *Gateway) receive(ctx *fasthttp.RequestCtx, tk imagestore.Ticket) (imagestore.Image, int64, *apierr.Error) {
	octx, cancel := op()
	w, err := g.blobs.Create(octx, tk.UploadID)
	cancel()
	if err != nil {
		return imagestore.Image{}, 0, apierr.Wrap(err, fasthttp.StatusInternalServerError, "internal", "could not start storing the image")
	}
	committed := false
	defer func() {
		if !committed {
			if err := w.Abort(); err != nil {
				g.log.Error("abort upload", "upload_id", tk.UploadID, "err", err)
			}
		}
	}()

	n, sum, hdr, aerr := g.stream(ctx, w)
	if aerr != nil {
		return imagestore.Image{}, n, aerr
	}

	// The work after the last byte must finish even if the server is
	// shutting down, or the client's bytes are lost for nothing.
	cctx, cancelCommit := context.WithTimeout(context.Background(), commitTimeout)
	defer cancelCommit()
	if err := qcow2.CheckStructure(w, n, hdr); err != nil {
		return imagestore.Image{}, n, imageError(err)
	}
	if err := w.Commit(cctx); err != nil {
		return imagestore.Image{}, n, writeFailure(err)
	}
	committed = true
	img := imagestore.Image{
		UploadID:    tk.UploadID,
		TenantID:    tk.TenantID,
		Name:        tk.Name,
		EFI:         tk.EFI,
		Size:        n,
		VirtualSize: int64(hdr.VirtualSize),
		SHA256:      sum,
		CreatedAt:   g.cfg.Now().UTC(),
	}
	if err := g.store.AddImage(cctx, img, g.cfg.ImagesPerTenant); err != nil {
		// The blob is committed but no record names it: remove it now (and
		// start-up cleanup would, if this fails too).
		if derr := g.blobs.Delete(cctx, img.UploadID); derr != nil {
			g.log.Error("delete unrecorded image", "upload_id", img.UploadID, "err", derr)
		}
		if errors.Is(err, imagestore.ErrQuota) {
			return imagestore.Image{}, n, apierr.New(fasthttp.StatusConflict, "imageQuota", "you already hold as many images as this edge allows; remove one first")
		}
		return imagestore.Image{}, n, apierr.Wrap(err, fasthttp.StatusInternalServerError, "internal", "could not record the image")
	}
	return img, n, nil
}

// stream copies the body into w, refusing it as soon as the bytes allow.
// It returns the byte count, the hex SHA-256 and the accepted header.
func (g *Gateway) stream(ctx *fasthttp.RequestCtx, w io.Writer) (int64, string, *qcow2.Header, *apierr.Error) {
	var body io.Reader = ctx.RequestBodyStream()
	if body == nil { // no Content-Length and not chunked: an empty body
		body = eofReader{}
	}
	r := &idleReader{ctx: ctx, r: body, idle: g.cfg.IdleTimeout, now: g.cfg.Now}
	bufp := g.bufs.Get().(*[]byte)
	defer g.bufs.Put(bufp)
	buf := *bufp
	insp := qcow2.NewInspector(qcow2.Limits{MaxVirtualSize: g.cfg.MaxVirtualSize})
	hash := sha256.New()
	received := g.metrics.bytes.WithLabelValues(dirUpload)
	var n int64
	for {
		m, rerr := r.Read(buf)
		if m > 0 {
			n += int64(m)
			if n > g.cfg.UploadMax {
				return n, "", nil, apierr.New(fasthttp.StatusRequestEntityTooLarge, "tooLarge",
					"the image is larger than this edge accepts ("+strconv.FormatInt(g.cfg.UploadMax, 10)+" bytes)")
			}
			chunk := buf[:m]
			if _, err := insp.Write(chunk); err != nil {
				return n, "", nil, imageError(err)
			}
			hash.Write(chunk)
			if _, err := w.Write(chunk); err != nil {
				return n, "", nil, writeFailure(err)
			}
			received.Add(float64(m))
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if isTimeout(rerr) {
				return n, "", nil, apierr.Wrap(rerr, fasthttp.StatusRequestTimeout, "idle",
					"no data arrived for "+g.cfg.IdleTimeout.String()+"; the upload was abandoned")
			}
			return n, "", nil, incomplete(rerr)
		}
	}
	// fasthttp ends a fixed-length body that was cut short with a clean EOF.
	if cl := int64(ctx.Request.Header.ContentLength()); cl >= 0 && n != cl {
		return n, "", nil, incomplete(io.ErrUnexpectedEOF)
	}
	hdr, err := insp.Finish()
	if err != nil {
		return n, "", nil, imageError(err)
	}
	return n, hex.EncodeToString(hash.Sum(nil)), hdr, nil
}

func incomplete(err error) *apierr.Error {
	return apierr.Wrap(err, fasthttp.StatusBadRequest, "incompleteBody", "the connection ended before the whole image arrived")
}

// imageError turns an inspection verdict into SPEC's 415/422 answers.
func imageError(err error) *apierr.Error {
	var rej *qcow2.Reject
	if !errors.As(err, &rej) {
		return apierr.Wrap(err, fasthttp.StatusInternalServerError, "internal", "could not check the image")
	}
	if rej.Reason == qcow2.ReasonNotQcow2 {
		return apierr.New(fasthttp.StatusUnsupportedMediaType, rej.Reason, rej.Msg)
	}
	return apierr.New(fasthttp.StatusUnprocessableEntity, rej.Reason, rej.Msg)
}

// writeFailure tells a full disk (507, the client may retry later) from
// other storage errors (500).
func writeFailure(err error) *apierr.Error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return apierr.Wrap(err, fasthttp.StatusInsufficientStorage, "noSpace", "the edge ran out of disk space while storing the image; try again later")
	}
	return apierr.Wrap(err, fasthttp.StatusInternalServerError, "internal", "could not store the image")
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
