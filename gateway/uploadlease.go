package gateway

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
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
	mu     sync.Mutex
	lost   error // set once the term is over: every fence then fails
	stop   chan struct{}
	done   chan struct{}
	onLost func() // stops the request's read
}

var errLeaseLapsed = errors.New("this replica's lease on the upload lapsed")

// takeUploadLease starts the request's term as the upload's writer, or
// answers why not: 423 while another replica writes it (with the time its
// lease runs out as Retry-After), 500 when the store cannot be asked. With
// one replica it returns nil, nil. onLost is called (once) if the term
// ends before release: the request must stop reading.
func (g *Gateway) takeUploadLease(ctx *fasthttp.RequestCtx, uploadID string, onLost func()) (*uploadLease, *apierr.Error) {
	if g.cfg.Replica == "" {
		return nil, nil
	}
	octx, cancel := g.op()
	defer cancel()
	now := g.cfg.Now()
	l, err := g.store.AcquireLease(octx, uploadLeaseName(uploadID), g.cfg.Replica, uploadLeaseTTL, now)
	if errors.Is(err, imagestore.ErrLeaseHeld) {
		wait := max(1, int(l.ExpiresAt.Sub(now).Seconds()+0.999))
		return nil, apierr.New(fasthttp.StatusLocked, "locked", "another replica is still writing this upload; retry").WithRetryAfter(wait)
	}
	if err != nil {
		return nil, apierr.Wrap(err, fasthttp.StatusInternalServerError, "internal", "could not take the upload for this request")
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
		case errors.Is(err, imagestore.ErrLeaseLost) || !now.Add(fenceMargin).Before(l.expiresAt()):
			l.end(err)
			return
		default:
			l.g.log.Warn("renew upload lease", "lease", l.lease.Name, "err", err)
		}
	}
}

func (l *uploadLease) expiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lease.ExpiresAt
}

// end closes the term early and stops the request.
func (l *uploadLease) end(err error) {
	l.mu.Lock()
	first := l.lost == nil
	if first {
		l.lost = errors.Join(errLeaseLapsed, err)
	}
	l.mu.Unlock()
	if first {
		l.g.log.Warn("upload lease lost: this request stops writing", "lease", l.lease.Name, "err", err)
		if l.onLost != nil {
			l.onLost()
		}
	}
}

// fence is checked before every durable step: the term must be the
// upload's current one with fenceMargin to run.
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
	if err := l.g.store.CheckLease(ctx, name, token, l.g.cfg.Now().Add(fenceMargin)); err != nil {
		if errors.Is(err, imagestore.ErrLeaseLost) {
			l.end(err)
		}
		return errors.Join(errLeaseLapsed, err)
	}
	return nil
}

// fenceWriter hands the fence to a writer that others can write too.
func (l *uploadLease) fenceWriter(w imagestore.BlobWriter) {
	if f, ok := w.(imagestore.Fenceable); ok && l != nil {
		f.SetFence(l.fence)
	}
}

// release ends the term: the next PATCH, on any replica, may start at
// once.
func (l *uploadLease) release() {
	if l == nil {
		return
	}
	close(l.stop)
	<-l.done
	octx, cancel := l.g.op()
	defer cancel()
	if err := l.g.store.ReleaseLease(octx, l.lease.Name, l.lease.Holder, l.lease.Token); err != nil {
		// It lapses by itself within uploadLeaseTTL.
		l.g.log.Warn("release upload lease", "lease", l.lease.Name, "err", err)
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
