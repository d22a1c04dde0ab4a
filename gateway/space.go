package gateway

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/internal/apierr"
)

// Reserve, then admit: an upload is admitted only if the disk has room for
// it on top of what was already promised, or four uploads that each fit
// alone would all be admitted against the same free space and all fail
// after their whole body. The headroom stays free on top.
//
// What is promised is what running requests are about to write, never
// what an idle client announced:
//   - a PUT holds its whole announced size (UploadMax when chunked) from
//     admission to its end: it cannot resume, so failing half-way for lack
//     of space would throw its bytes away;
//   - a resumable session holds nothing between requests: its Upload-Length
//     is not a promise. A running PATCH (or creation with a body) holds the
//     bytes it is writing plus at most SessionAhead more, taken chunk by
//     chunk as the bytes arrive. When the next chunk finds no room the
//     PATCH stops with 507 noSpace; the bytes it wrote stay durable and the
//     client resumes from there once space is freed.
//
// Else one tenant could hold the disk for all: a session announcing 40 GiB
// and sending nothing, renewed by one byte a day.
//
// On top of the disk, a tenant's requests together may hold at most
// TenantReserveMax of promised but not yet written bytes, so that one
// tenant's slow uploads (a byte per idle timeout keeps a PUT alive) cannot
// hold the space every other tenant's upload needs.
//
// The ledger is this process's: over a shared store, each replica counts
// the uploads it runs.

// spaceLedger holds the claims of running uploads.
type spaceLedger struct {
	mu     sync.Mutex // one admission decides at a time
	claims map[*spaceClaim]struct{}
}

// spaceClaim is one running upload's promise: size bytes, counted from
// the claim's start, of which written have reached the disk (and so show
// in the free space already).
type spaceClaim struct {
	size    int64 // under ledger.mu
	written atomic.Int64
	ledger  *spaceLedger
	tenant  int64
	// A session's claim grows as its bytes arrive, by up to ahead at a
	// time and never past most (the bytes the session still lacks); a
	// PUT's has ahead 0: all its size was promised at admission.
	ahead, most int64
}

func newSpaceLedger() *spaceLedger { return &spaceLedger{claims: map[*spaceClaim]struct{}{}} }

// outstanding is what the claims still need, all of them or one tenant's
// (tenant ≥ 0); the caller holds mu.
func (l *spaceLedger) outstanding(tenant int64) int64 {
	var n int64
	for c := range l.claims {
		if tenant < 0 || c.tenant == tenant {
			n += max(c.size-c.written.Load(), 0)
		}
	}
	return n
}

// release ends the claim; safe to call twice and on nil.
func (c *spaceClaim) release() {
	if c == nil {
		return
	}
	c.ledger.mu.Lock()
	delete(c.ledger.claims, c)
	c.ledger.mu.Unlock()
}

// wrote records n bytes of the claim on the disk.
func (c *spaceClaim) wrote(n int) {
	if c != nil {
		c.written.Add(int64(n))
	}
}

// claimSpace admits size bytes for tenant's PUT (the announced size, or
// UploadMax when the length is unknown) if the disk has room for them
// beside everything promised, and returns the claim that holds them. With
// keep false it only checks: the early answer to "Expect: 100-continue"
// claims nothing, since a client may never send the body.
func (g *Gateway) claimSpace(tenant, size int64, keep bool) (*spaceClaim, *apierr.Error) {
	if size < 0 { // chunked: the most it may become
		size = g.cfg.UploadMax
	}
	return g.grant(&spaceClaim{tenant: tenant, ledger: g.space}, size, keep)
}

// claimSession admits the first chunk of a resumable request that may
// bring up to remaining bytes; the claim grows with cover as they arrive.
func (g *Gateway) claimSession(tenant, remaining int64, keep bool) (*spaceClaim, *apierr.Error) {
	ahead := g.cfg.SessionAhead
	return g.grant(&spaceClaim{tenant: tenant, ledger: g.space, ahead: ahead, most: remaining}, min(remaining, ahead), keep)
}

// claimCreation is a tus creation's claim. A session holds no space
// between requests, only while its bytes arrive: with a body, the claim
// of that body's first chunk; without one, nothing held, only the check
// that the first chunk of Upload-Length would find room now.
func (g *Gateway) claimCreation(ctx *fasthttp.RequestCtx, tenant, length int64, withBody bool) (*spaceClaim, *apierr.Error) {
	if !withBody {
		return g.claimSession(tenant, length, false)
	}
	return g.claimSession(tenant, requestBytes(ctx, length), true)
}

// requestBytes is the most a resumable request can bring: what its
// session lacks, or its body's Content-Length when that is less (a PATCH
// of 8 MiB needs no chunk of 64).
func requestBytes(ctx *fasthttp.RequestCtx, lacks int64) int64 {
	if cl := int64(ctx.Request.Header.ContentLength()); cl >= 0 && cl < lacks {
		return cl
	}
	return lacks
}

// cover makes c hold at least upto bytes (counted from its start) before
// they are read: a session's claim takes its next chunk here, a PUT's
// holds all already. 507 noSpace if the next chunk finds no room.
func (g *Gateway) cover(c *spaceClaim, upto int64) *apierr.Error {
	if c == nil || c.ahead == 0 {
		return nil
	}
	c.ledger.mu.Lock()
	size := c.size
	c.ledger.mu.Unlock()
	want := min(max(upto, size+c.ahead), c.most)
	if upto <= size || want <= size { // past most the intake refuses the bytes
		return nil
	}
	_, aerr := g.grant(c, want, true)
	return aerr
}

// grant sets c's size to size if the disk and c's tenant have room for the
// growth beside every other promise, adding c to the ledger when keep.
func (g *Gateway) grant(c *spaceClaim, size int64, keep bool) (*spaceClaim, *apierr.Error) {
	l := g.space
	l.mu.Lock()
	defer l.mu.Unlock()
	growth := size - c.size // c's own outstanding bytes are counted already
	if mine := l.outstanding(c.tenant); mine+growth > g.cfg.TenantReserveMax {
		return nil, answerNoSpace.WithMsg("your uploads running now already hold " + strconv.FormatInt(mine, 10) + " bytes of this edge's disk, and one tenant may hold at most " +
			strconv.FormatInt(g.cfg.TenantReserveMax, 10) + "; try again when one of them has finished").
			WithCause(fmt.Errorf("tenant %d: %d bytes held by its running uploads, %d more asked, at most %d",
				c.tenant, mine, growth, g.cfg.TenantReserveMax))
	}
	octx, cancel := g.blobOp()
	defer cancel()
	avail, err := g.blobs.Available(octx)
	if err != nil {
		return nil, storageFailure(err, "could not read the free disk space")
	}
	if promised := l.outstanding(-1); avail < growth+g.cfg.Headroom+promised {
		return nil, answerNoSpace.WithMsg(spaceMessage(c.ahead > 0, growth)).
			WithCause(fmt.Errorf("%d bytes free; need %d for the image, %d of headroom and %d promised to running uploads",
				avail, growth, g.cfg.Headroom, promised))
	}
	if !keep {
		return nil, nil
	}
	c.size = size
	l.claims[c] = struct{}{}
	return c, nil
}

// spaceMessage says what found no room: a PUT's whole image, or the next
// chunk of a resumable upload (whose bytes so far are kept).
func spaceMessage(chunk bool, n int64) string {
	if chunk {
		return "the edge has not enough free disk space for the next " + strconv.FormatInt(n, 10) +
			" bytes of this image beside the uploads running now; the bytes stored so far are kept: resume later with HEAD and PATCH"
	}
	return "the edge has not enough free disk space for this image (" + strconv.FormatInt(n, 10) +
		" bytes) beside the uploads it already accepted; try again later"
}
