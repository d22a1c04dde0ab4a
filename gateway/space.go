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
// after their whole body. Promised are the bytes admitted PUTs have yet to
// write (held here) and those open resumable sessions have yet to receive
// (the store's PendingSessionBytes, abandoned sessions included until they
// expire). The headroom stays free on top.
//
// A running PATCH's bytes since its last checkpoint are counted twice (on
// the disk and still in its session's pending bytes) until the checkpoint:
// at most --tus-checkpoint-mib per running PATCH, on the safe side.

// spaceLedger holds the claims of admitted PUTs.
type spaceLedger struct {
	mu     sync.Mutex // one admission decides at a time
	claims map[*spaceClaim]struct{}
}

// spaceClaim is one admitted upload's promise: size bytes, of which
// written have reached the disk (and so show in the free space already).
type spaceClaim struct {
	size    int64
	written atomic.Int64
	ledger  *spaceLedger
}

func newSpaceLedger() *spaceLedger { return &spaceLedger{claims: map[*spaceClaim]struct{}{}} }

// outstanding is what the claims still need; the caller holds mu.
func (l *spaceLedger) outstanding() int64 {
	var n int64
	for c := range l.claims {
		n += max(c.size-c.written.Load(), 0)
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

// claimSpace admits size bytes (the announced size, or UploadMax when the
// length is unknown) if the disk has room for them beside everything
// promised, and returns the claim that holds them. With keep false it only
// checks: the early answer to "Expect: 100-continue" claims nothing, since
// a client may never send the body.
func (g *Gateway) claimSpace(size int64, keep bool) (*spaceClaim, *apierr.Error) {
	if size < 0 { // chunked: the most it may become
		size = g.cfg.UploadMax
	}
	l := g.space
	l.mu.Lock()
	defer l.mu.Unlock()
	octx, cancel := op()
	defer cancel()
	avail, err := g.blobs.Available(octx)
	if err != nil {
		return nil, apierr.Wrap(err, fasthttp.StatusInternalServerError, "internal", "could not read the free disk space")
	}
	pending, err := g.store.PendingSessionBytes(octx)
	if err != nil {
		return nil, apierr.Wrap(err, fasthttp.StatusInternalServerError, "internal", "could not read the space promised to resumable uploads")
	}
	promised := pending + l.outstanding()
	if avail < size+g.cfg.Headroom+promised {
		return nil, apierr.Wrap(fmt.Errorf("%d bytes free; need %d for the image, %d of headroom and %d promised to running uploads",
			avail, size, g.cfg.Headroom, promised), fasthttp.StatusInsufficientStorage, "noSpace",
			"the edge has not enough free disk space for this image ("+strconv.FormatInt(size, 10)+
				" bytes) beside the uploads it already accepted; try again later")
	}
	if !keep {
		return nil, nil
	}
	c := &spaceClaim{size: size, ledger: l}
	l.claims[c] = struct{}{}
	return c, nil
}
