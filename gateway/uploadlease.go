package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/settle"
)

// Across replicas (Config.Replica set), a resumable upload may arrive at
// any of them, PATCH after PATCH, and a client that lost its answer may
// send the next PATCH to another replica while the first still writes.
// The in-process patchLocks order writers of one replica only; the
// upload's lease in the store orders them all: a write takes it first,
// renews it while it runs, and its fencing token is checked before every
// durable step (a part, a tail, a checkpoint, the commit), so a writer
// that stalled past its lease can never overwrite the newer one's bytes.
const (
	// uploadLeaseTTL is how long a writer's right lasts without renewal:
	// after a replica dies in the middle of a PATCH, another replica takes
	// the upload within this.
	uploadLeaseTTL = 10 * time.Second
	// fenceMargin: a durable step starts only while the lease has at least
	// this long to run, longer than one step's store or S3 request (the
	// S3 request of a part has its own bound) plus the replicas' clock
	// skew.
	fenceMargin = 4 * time.Second
)

// uploadLeaseName names an upload's lease by its upload id, never by its
// session id (a capability).
func uploadLeaseName(uploadID string) string { return "upload/" + uploadID }

// uploadLease is one request's term as the writer of an upload.
type uploadLease struct {
	g      *Gateway
	lease  imagestore.Lease
	fences bool // the blob writer asks the fence (Fenceable: S3)
	mu     sync.Mutex
	lost   error // set once the term is over: every fence then fails
	stop   chan struct{}
	done   chan struct{}
	onLost func(cause error) // stops the request's read
}

// The two ways a term ends before its request does; both are an
// errLeaseEnded. A lapsed lease is one the store says is no longer this
// request's (its renewal came too late, after a long pause, and another
// replica or the leader's sweep may have acted on it). One that could not
// be checked is one whose renewals the store did not answer until too
// little of it was left to make a step durable safely: nobody else holds
// it yet, but this request cannot prove it holds it either.
var (
	errLeaseEnded     = errors.New("this replica's lease on the upload ended")
	errLeaseLapsed    = fmt.Errorf("%w: it lapsed", errLeaseEnded)
	errLeaseUnchecked = fmt.Errorf("%w: the record store did not answer in time to renew or check it", errLeaseEnded)
)

// leaseEnded is the answer of a request whose lease ended (cause): the
// record store did not confirm in time that this replica still writes the
// upload, so the request stops at once and keeps nothing it had not made
// durable; the client retries, on any replica.
func leaseEnded(cause error) *apierr.Error {
	return answerStoreUnreachable.WithMsg("the edge's record store did not confirm in time that this request still holds the upload; " +
		"it stopped and kept nothing it had not made durable (a resumable upload keeps its Upload-Offset): try again in a few seconds").
		WithCause(cause)
}

// takeUploadLease starts the request's term as the upload's writer, or
// answers why not: 423 while another replica writes it (with the time its
// lease runs out as Retry-After), 503 when the store cannot be asked.
// With one replica it returns nil, nil. onLost is called (once) if the
// term ends before release: the request must stop reading.
func (g *Gateway) takeUploadLease(ctx *fasthttp.RequestCtx, uploadID string, onLost func(cause error)) (*uploadLease, *apierr.Error) {
	if g.cfg.Replica == "" {
		return nil, nil
	}
	octx, cancel := g.op()
	defer cancel()
	now := g.cfg.Now()
	l, err := g.store.AcquireLease(octx, uploadLeaseName(uploadID), g.cfg.Replica, uploadLeaseTTL, now)
	if errors.Is(err, imagestore.ErrLeaseHeld) {
		wait := max(1, int(l.ExpiresAt.Sub(now).Seconds()+0.999))
		return nil, answerLocked.WithMsg("another replica is still writing this upload; retry").WithRetryAfter(wait)
	}
	if err != nil {
		return nil, storeFailure(err, "could not take the upload for this request")
	}
	ul := &uploadLease{g: g, lease: l, stop: make(chan struct{}), done: make(chan struct{}), onLost: onLost}
	go ul.renew()
	return ul, nil
}

// renew keeps the term alive while the request runs. A renewal refused
// (ErrLeaseLost) ends it at once; renewals that fail for another reason
// ("could not ask") end it only when its last known expiry, less the
// margin, has come: until then nobody else can hold it.
func (l *uploadLease) renew() {
	defer close(l.done)
	every := time.NewTicker(uploadLeaseTTL / 4)
	defer every.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-every.C:
		}
		now := l.g.cfg.Now()
		octx, cancel := l.g.op()
		nl, err := l.g.store.RenewLease(octx, l.lease.Name, l.lease.Holder, l.lease.Token, uploadLeaseTTL, now)
		cancel()
		switch {
		case err == nil:
			l.mu.Lock()
			l.lease = nl
			l.mu.Unlock()
		case errors.Is(err, imagestore.ErrLeaseLost):
			l.end(errLeaseLapsed, err)
			return
		case !now.Add(fenceMargin).Before(l.expiresAt()):
			l.end(errLeaseUnchecked, err)
			return
		default:
			l.g.log.Warn("upload lease not renewed yet; it still runs", "lease", l.lease.Name,
				"expires_in", l.expiresAt().Sub(now).Round(time.Millisecond).String(), "err", err)
		}
	}
}

func (l *uploadLease) expiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lease.ExpiresAt
}

// end closes the term early, for how (errLeaseLapsed, errLeaseUnchecked)
// and the store's err, and stops the request. Its one log line says
// which, and what the lease guards on this replica's blobs: over S3 every
// durable step of the write; on a local disk no write (no other replica
// writes this one's files), but the upload's place in its tenant's
// quota, which the leader's sweep ends once the lease has lapsed. Either
// way the request stops, so that its answer and the log agree.
func (l *uploadLease) end(how, err error) {
	l.mu.Lock()
	first := l.lost == nil
	if first {
		l.lost = fmt.Errorf("%w: %w", how, err)
	}
	cause, fences := l.lost, l.fences
	l.mu.Unlock()
	if !first {
		return
	}
	guards := "every durable write of the upload (S3)"
	if !fences {
		guards = "no write on a local disk, but the upload's place in its tenant's quota"
	}
	msg := "upload lease lapsed: this request stops and keeps nothing it had not made durable"
	if errors.Is(how, errLeaseUnchecked) {
		msg = "upload lease could not be renewed in time, the record store does not answer: this request stops before the lease runs out and keeps nothing it had not made durable"
	}
	l.g.log.Warn(msg, "lease", l.lease.Name, "guards", guards, "err", err)
	if l.onLost != nil {
		l.onLost(cause)
	}
}

// fence is checked before every durable step: the term must be the
// upload's current one with fenceMargin to run. A check the store could
// not answer (imagestore.ErrStoreUnavailable: "could not ask", not
// "lost", such as a connection the store's restart broke) is asked again
// every fenceRetry while ctx and the term allow; the term ends once the
// margin is reached, as renew does. Any other failure fails the step.
func (l *uploadLease) fence(ctx context.Context) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	lost, token, name := l.lost, l.lease.Token, l.lease.Name
	l.mu.Unlock()
	if lost != nil {
		return lost
	}
	for {
		now := l.g.cfg.Now()
		err := l.g.store.CheckLease(ctx, name, token, now.Add(fenceMargin))
		switch {
		case err == nil:
			return nil
		case errors.Is(err, imagestore.ErrLeaseLost):
			l.end(errLeaseLapsed, err)
			return fmt.Errorf("%w: %w", errLeaseLapsed, err)
		case !errors.Is(err, imagestore.ErrStoreUnavailable):
			return fmt.Errorf("check the upload's lease: %w", err) // a fault of ours, not the store's outage
		case !now.Add(fenceMargin).Before(l.expiresAt()):
			l.end(errLeaseUnchecked, err)
			return fmt.Errorf("%w: %w", errLeaseUnchecked, err)
		}
		t := time.NewTimer(fenceRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %w", errLeaseUnchecked, err)
		case <-t.C:
		}
	}
}

// fenceRetry is the wait before a fence asks again a store that did not
// answer.
const fenceRetry = 250 * time.Millisecond

// fenceWriter hands the fence to a writer that others can write too.
func (l *uploadLease) fenceWriter(w imagestore.BlobWriter) {
	if f, ok := w.(imagestore.Fenceable); ok && l != nil {
		f.SetFence(l.fence)
		l.mu.Lock()
		l.fences = true
		l.mu.Unlock()
	}
}

// release ends the term: the next PATCH, on any replica, may start at
// once. A release the store did not answer is tried again in the
// background (undos) until the term would have lapsed by itself: the
// retry an answer storeUnreachable asks for must not meet 423 for the
// term of the request it retries.
func (l *uploadLease) release() {
	if l == nil {
		return
	}
	close(l.stop)
	<-l.done
	release := func() error {
		octx, cancel := l.g.op()
		defer cancel()
		return l.g.store.ReleaseLease(octx, l.lease.Name, l.lease.Holder, l.lease.Token)
	}
	err := release()
	switch {
	case errors.Is(err, imagestore.ErrStoreUnavailable):
		l.g.undos.Go(settle.Job{Name: "release upload lease", Attrs: []any{"lease", l.lease.Name},
			Until: time.Now().Add(l.expiresAt().Sub(l.g.cfg.Now())), Done: "upload lease released",
			Left: "it lapses by itself", Run: release})
	case err != nil:
		l.g.log.Warn("release upload lease; it lapses by itself", "lease", l.lease.Name, "err", err)
	}
}

const (
	// leaseStartGrace is how long a plain upload may run before its
	// lease is judged: it takes it just after consuming its ticket.
	leaseStartGrace = time.Minute
	// leaseForgetAfter is how long an ended upload lease is kept before
	// its row goes; a later writer of the same upload (none: ids are
	// random and used once) would start at token 1 again.
	leaseForgetAfter = time.Hour
)

// sweepLeases, over a shared store, ends the quota reservations of plain
// uploads whose replica died mid-upload (their lease lapsed: nobody else
// ends them, the dead process never restarts as itself) and forgets
// upload leases long ended. Alone on a store, start-up's
// EndRunningUploads does the first, and no upload takes a lease.
func (g *Gateway) sweepLeases() {
	if g.cfg.Replica == "" {
		return
	}
	octx, cancel := g.op()
	defer cancel()
	now := g.cfg.Now()
	n, err := g.store.EndUnleasedUploads(octx, uploadLeaseName(""), now, now.Add(-leaseStartGrace))
	if err != nil {
		g.log.Error("end uploads whose replica died", "err", err)
	} else if n > 0 {
		g.log.Info("uploads whose replica died ended", "uploads", n)
	}
	if _, err := g.store.ForgetLeases(octx, uploadLeaseName(""), now.Add(-leaseForgetAfter)); err != nil {
		g.log.Error("forget ended upload leases", "err", err)
	}
}
