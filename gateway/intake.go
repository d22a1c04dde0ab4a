package gateway

import (
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/crashpoint"
	"github.com/vmshelf/vmshelf/qcow2"
)

// intake is an image arriving: the count, the checks and the hash every
// byte goes through, whether it comes in one PUT or in many PATCHes.
type intake struct {
	insp     *qcow2.Inspector
	hash     hash.Hash
	n        int64         // image bytes taken so far
	limit    int64         // image bytes allowed in all
	tooLarge *apierr.Error // the answer when limit is passed
	claim    *spaceClaim   // the disk space this request holds (hold)
	// claimFrom is in.n when the claim was taken: the claim counts this
	// request's bytes, not the ones earlier requests of a session wrote.
	claimFrom int64
}

// hold makes c the claim of the bytes from here on.
func (in *intake) hold(c *spaceClaim) {
	in.claim, in.claimFrom = c, in.n
}

func (g *Gateway) newIntake(limit int64, tooLarge *apierr.Error) *intake {
	return &intake{
		insp:     qcow2.NewInspector(qcow2.Limits{MaxVirtualSize: g.cfg.MaxVirtualSize}),
		hash:     sha256.New(),
		limit:    limit,
		tooLarge: tooLarge,
	}
}

// resumeIntake rebuilds the intake of a resumable upload at offset: the
// hash from its saved state, the inspector by reading the image's first
// bytes again (it decides within the first cluster, at most 2 MiB, so this
// costs little whatever the offset).
func (g *Gateway) resumeIntake(r io.ReaderAt, offset int64, hashState []byte, limit int64, tooLarge *apierr.Error) (*intake, error) {
	in := g.newIntake(limit, tooLarge)
	if err := in.hash.(encoding.BinaryUnmarshaler).UnmarshalBinary(hashState); err != nil {
		return nil, fmt.Errorf("restore hash state: %w", err)
	}
	in.n = offset
	buf := make([]byte, 64<<10)
	for fed := int64(0); fed < offset; {
		if _, done := in.insp.Header(); done {
			break
		}
		m := min(int64(len(buf)), offset-fed)
		if _, err := r.ReadAt(buf[:m], fed); err != nil && !(errors.Is(err, io.EOF) && m > 0) {
			return nil, fmt.Errorf("re-read image head: %w", err)
		}
		if _, err := in.insp.Write(buf[:m]); err != nil {
			// These bytes were accepted when they arrived; a different
			// verdict now means the partial file changed under us.
			return nil, fmt.Errorf("re-inspect image head: %w", err)
		}
		fed += m
	}
	return in, nil
}

// hashState is the hash's state after in.n bytes, for SaveProgress.
func (in *intake) hashState() []byte {
	b, _ := in.hash.(encoding.BinaryMarshaler).MarshalBinary() // sha256 cannot fail
	return b
}

// accept passes one chunk through the limit, the checks and the hash; the
// caller writes it once accepted.
func (in *intake) accept(chunk []byte) *apierr.Error {
	if in.n+int64(len(chunk)) > in.limit {
		return in.tooLarge
	}
	if _, err := in.insp.Write(chunk); err != nil {
		return imageError(err)
	}
	in.hash.Write(chunk)
	in.n += int64(len(chunk))
	return nil
}

// pump reads the request body into w through in until the body ends.
// checkpoint, if set, is called every Config.CheckpointBytes or
// CheckpointInterval;
// stop, if set, ends the read when another request takes the upload over.
// The bytes are written behind the read (see writeBehind); pump returns
// only once every byte it accepted is written, whatever the outcome, so in.n
// is what w holds unless a write failed (then the error says so).
func (g *Gateway) pump(ctx *fasthttp.RequestCtx, in *intake, w io.Writer, checkpoint func() error, stop *stopFlag) *apierr.Error {
	bufp := g.bufs.Get().(*[]byte)
	defer g.bufs.Put(bufp)
	wb := newWriteBehind(w, in.claim, *bufp)
	defer wb.stop()
	aerr := g.read(ctx, in, wb, checkpoint, stop)
	// A write error comes first: a read that ended after it would only
	// hide why.
	if err := wb.flush(); err != nil {
		return writeFailure(err)
	}
	return aerr
}

// read is pump's loop: it fills wb's buffers from the body.
func (g *Gateway) read(ctx *fasthttp.RequestCtx, in *intake, wb *writeBehind, checkpoint func() error, stop *stopFlag) *apierr.Error {
	var body io.Reader = ctx.RequestBodyStream()
	if body == nil { // no Content-Length and not chunked: an empty body
		body = eofReader{}
	}
	r := &idleReader{ctx: ctx, r: body, idle: g.cfg.IdleTimeout, now: g.cfg.Now, stop: stop}
	received := g.metrics.bytes.WithLabelValues(dirUpload)
	lastN, lastT := in.n, g.cfg.Now()
	for {
		buf := wb.space()
		if buf == nil {
			return nil // a write failed; pump reports it
		}
		// Room for these bytes before they are read: a session's claim
		// takes its next chunk here, or the request stops with 507.
		if aerr := g.cover(in.claim, in.n-in.claimFrom+int64(len(buf))); aerr != nil {
			return aerr
		}
		m, rerr := r.Read(buf)
		if m > 0 {
			if aerr := in.accept(buf[:m]); aerr != nil {
				return aerr
			}
			wb.filled(m)
			received.Add(float64(m))
			// Never at the last byte: "all bytes durable" must not be
			// recorded before the image is committed. At each multiple of
			// CheckpointBytes, counted from the image's first byte, not
			// from this request's: over S3 a checkpoint at a part's end
			// leaves no tail object to write.
			if checkpoint != nil && in.n < in.limit && (in.n/g.cfg.CheckpointBytes != lastN/g.cfg.CheckpointBytes || g.cfg.Now().Sub(lastT) >= g.cfg.CheckpointInterval) {
				if err := wb.flush(); err != nil {
					return nil // pump reports it
				}
				if err := checkpoint(); err != nil {
					return writeFailure(err)
				}
				lastN, lastT = in.n, g.cfg.Now()
			}
		}
		switch {
		case rerr == io.EOF:
			return nil
		case rerr != nil && stop.err() != nil:
			// Stopped from outside: the timeout is the deadline the stop
			// moved to now, never the client's idleness.
			return g.stopped(stop.err())
		case rerr != nil && isTimeout(rerr):
			return answerIdle.WithMsg("no data arrived for " + g.cfg.IdleTimeout.String() + "; the upload was abandoned").
				WithCause(rerr)
		case rerr != nil:
			return incomplete(rerr)
		}
	}
}

// stopped is the answer to a read stopped for cause (stopFlag): the end
// of the request's lease, a shutdown, or a newer request's takeover.
func (g *Gateway) stopped(cause error) *apierr.Error {
	switch {
	case errors.Is(cause, errLeaseEnded):
		return leaseEnded(cause)
	case g.closing.Load():
		return answerShuttingDown.WithMsg("the edge is restarting; the bytes so far are kept: resume with HEAD and PATCH").
			WithCause(errShuttingDown)
	}
	return answerTakenOver
}

// finish runs after the last byte: the header must have been decided, the
// whole structure is checked, the blob is committed and recorded. img
// carries the id, tenant, name and EFI flag; finish fills in the rest. On
// an error the caller aborts w (after a commit, the blob is deleted here).
func (g *Gateway) finish(w imagestore.BlobWriter, in *intake, img imagestore.Image) (imagestore.Image, *apierr.Error) {
	hdr, err := in.insp.Finish()
	if err != nil {
		return imagestore.Image{}, imageError(err)
	}
	// The work after the last byte must finish even if the server is
	// shutting down, or the client's bytes are lost for nothing.
	cctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	if err := qcow2.CheckStructure(w, in.n, hdr); err != nil {
		return imagestore.Image{}, imageError(err)
	}
	img.Boot = g.bootOf(w, in.n, hdr, img.UploadID)
	// The intent first: a crash between the commit and the record leaves
	// a file start-up must not take for a sign of lost records.
	if err := g.store.IntendCommit(cctx, img.UploadID, g.cfg.Now()); err != nil {
		return imagestore.Image{}, recordFailure(err)
	}
	crashpoint.At(crashpoint.CommitAfterIntent)
	if err := w.Commit(cctx); err != nil {
		return imagestore.Image{}, writeFailure(err)
	}
	crashpoint.At(crashpoint.CommitAfterRename)
	img.Size = in.n
	img.VirtualSize = int64(hdr.VirtualSize)
	img.SHA256 = hex.EncodeToString(in.hash.Sum(nil))
	img.CreatedAt = g.cfg.Now().UTC()
	if err := g.store.AddImage(cctx, img, g.cfg.ImagesPerTenant); err != nil {
		g.dropUnrecorded(cctx, img.UploadID, err)
		if errors.Is(err, imagestore.ErrQuota) {
			return imagestore.Image{}, answerImageQuota
		}
		return imagestore.Image{}, recordFailure(fmt.Errorf("%w: %w", errCommittedUnrecorded, err))
	}
	return img, nil
}

// errCommittedUnrecorded: the image's blob was committed, and the store
// did not confirm its record.
var errCommittedUnrecorded = errors.New("the image was stored but its record not confirmed")

// dropUnrecorded handles a committed blob whose record the store did not
// write. Only a refusal the store is sure of (the quota, a full disk: its
// transaction rolled back) proves that no record names the blob; then it
// is removed, and its intent once it is gone (if either fails, the intent
// makes start-up quarantine the file). Any other error may have come after
// the record was written (a connection lost during COMMIT, "already
// exists" from a retry of a write that did land): "could not ask" is not
// "absent", so the file and its intent stay, and start-up or the next
// look at the records settles it without deleting a recorded image.
func (g *Gateway) dropUnrecorded(ctx context.Context, id string, addErr error) {
	if errors.Is(addErr, imagestore.ErrStoreUnavailable) {
		return // answered storeUnreachable: the upload's undo settles it (undo.go)
	}
	if !errors.Is(addErr, imagestore.ErrQuota) && !errors.Is(addErr, imagestore.ErrNoSpace) {
		g.log.Error("the image's record may or may not have been written; its file is kept for start-up to settle",
			"upload_id", id, "err", addErr)
		return
	}
	if err := g.blobs.Delete(ctx, id); err != nil {
		g.log.Error("delete unrecorded image", "upload_id", id, "err", err)
	} else if err := g.store.EndIntent(ctx, id, imagestore.IntentCommit); err != nil {
		g.log.Error("end the commit intent of an unrecorded image", "upload_id", id, "err", err)
	}
}

// recordFailure is the answer to a store write of the commit that failed:
// a full disk is the client's 507, a store that did not answer 503,
// anything else ours.
func recordFailure(err error) *apierr.Error {
	return storeFailure(err, "could not record the image")
}
