// Package gateway is the data plane: the fasthttp server that streams QCOW2
// uploads into the image store and serves images to CDI importers. It is
// authorised only by capabilities (an upload ticket, a fetch token) and
// never holds a whole image in memory.
package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/clientaddr"
	"github.com/vmshelf/vmshelf/internal/connlimit"
	"github.com/vmshelf/vmshelf/internal/headerrule"
	"github.com/vmshelf/vmshelf/internal/lazyctx"
	"github.com/vmshelf/vmshelf/internal/logsample"
	"github.com/vmshelf/vmshelf/internal/readiness"
	"github.com/vmshelf/vmshelf/internal/reason"
	"github.com/vmshelf/vmshelf/internal/settle"
)

const (
	uploadPrefix = "/market/vm-images/upload/"
	fetchPrefix  = "/market/vm-images/fetch/"

	// DefaultHeadroom is the free space an upload must leave on the disk.
	DefaultHeadroom = imagestore.DefaultHeadroom
	// DefaultSessionAhead is the chunk of disk space a running resumable
	// request takes at a time.
	DefaultSessionAhead = 64 << 20
)

// Config is what the data plane needs to know; cmd/vmshelf fills it from
// flags.
type Config struct {
	UploadMax       int64         // largest image in bytes (413 above)
	MaxVirtualSize  uint64        // largest virtual disk size in bytes (422 above)
	IdleTimeout     time.Duration // no byte for this long ends a transfer
	MaxTransfers    int           // uploads + fetches running at once (503 above)
	ImagesPerTenant int           // quota re-checked at commit (409 above)
	Headroom        int64         // free bytes an upload must leave; DefaultHeadroom if 0
	// StoreTimeout bounds one record store call made for a request
	// (default 10 s, the record store's own call deadline): a store that
	// hangs costs a request that long, then the request is answered 503
	// storeUnreachable.
	StoreTimeout time.Duration
	// Unknown tickets and tokens an address may present: MissBurst at once,
	// then one per MissEvery. Defaults: 20 and 1s.
	MissBurst int
	MissEvery time.Duration
	// TrustedProxies are the reverse proxies whose forwarding header
	// (X-Forwarded-For, or Forwarded when named) names the client (see
	// clientAddr). Default none: the peer's address is the client's.
	TrustedProxies clientaddr.Trust
	Now            func() time.Time // clock; time.Now if nil
	Log            *slog.Logger
	// PublicURL is the base of the upload-session URLs handed out (no
	// trailing slash); empty gives relative URLs.
	PublicURL string
	// CORSOrigins let pages on these origins ("*" for any) use the data
	// plane from a browser: the Machines page's own, and any the operator
	// adds; none: no CORS headers. A browser request from any other
	// origin is logged once per origin, with the flag that would allow it.
	CORSOrigins []string
	// A running PATCH makes its progress durable every CheckpointBytes
	// (default 256 MiB) or CheckpointInterval (default 15 s): what a crash
	// can cost a resumable upload, against an fsync and a store write.
	CheckpointBytes    int64
	CheckpointInterval time.Duration
	// Replica names this process among the replicas that share the store
	// and the blobs; non-empty makes every resumable write take the
	// upload's lease first (uploadlease.go), so that of all replicas one
	// writes a session at a time. Empty: one replica, whose own locks
	// suffice.
	Replica string
	// SessionAhead is the disk space a running resumable request holds
	// beyond the bytes it wrote, taken chunk by chunk as they arrive
	// (default DefaultSessionAhead); a session holds none between
	// requests (space.go).
	SessionAhead int64
	// TenantReserveMax bounds the space one tenant's running uploads may
	// hold beyond what they wrote (default UploadMax).
	TenantReserveMax int64
	// FetchQueueWait is how long a fetch GET beyond MaxTransfers waits for
	// a slot before 503 busy (default DefaultFetchQueueWait, 30 s): CDI's
	// importer does not retry in-process, so it queues instead.
	FetchQueueWait time.Duration
	// RefusalLogPerSecond bounds the "refused" log lines per reason: that
	// many per second, as a token bucket of that size (default
	// DefaultRefusalLogPerSecond). The rest are counted and reported in a
	// "refusals suppressed" line every minute.
	RefusalLogPerSecond int
}

// Gateway is the data plane server.
type Gateway struct {
	cfg      Config
	store    Store
	blobs    Blobs
	log      *slog.Logger
	metrics  *metrics
	slots    slots
	misses   *missLimiter
	fetches  fetchHolders  // fetch tokens holding a slot
	stopping chan struct{} // closed when Shutdown begins
	stopOnce sync.Once
	refusals *logsample.Sampler // one line per refusal, sampled per reason
	// corsRefused logs each browser origin the data plane does not allow, once.
	corsRefused corsRefusals
	locks       *patchLocks
	space       *spaceLedger
	closing     atomic.Bool // Shutdown began
	bufs        sync.Pool
	open        *openBlobs // blobs kept open between small fetches
	srv         *fasthttp.Server
	// readiness logs the verdicts of /readyz once per change.
	readiness *readiness.Watch
	// leftovers aborts, after their answers, the blobs of uploads that
	// failed for an unreachable image storage; undos takes back what
	// uploads answered storeUnreachable may have left (undoUpload).
	leftovers, undos *settle.Queue

	// onSlotFreed, if set, is told the direction of every transfer that
	// gave its slot back; tests wait on it instead of sleeping.
	onSlotFreed func(direction string)
}

// defaultStoreTimeout bounds one record store call made for a request,
// unless Config.StoreTimeout says otherwise.
const defaultStoreTimeout = 10 * time.Second

// blobCallBackstop bounds one image storage call that moves no image
// bytes. The storage bounds its own calls and says when one timed out (S3:
// its CallTimeout, 10 s, then ErrBlobsUnavailable, answered 503
// blobStoreUnreachable); a caller's deadline that ended first would read
// as the caller giving up (500). So this is only a backstop, longer than
// the storage's own.
const blobCallBackstop = 30 * time.Second

// blobOp returns the context for one image storage call (see
// blobCallBackstop), lazily timed as op's.
func (g *Gateway) blobOp() (context.Context, context.CancelFunc) {
	return lazyctx.WithTimeout(blobCallBackstop, nil)
}

// op returns the context for one record store call, bounded by
// Config.StoreTimeout. A *fasthttp.RequestCtx is never used as a
// context.Context: fasthttp reuses it once the handler returns, while
// database/sql may still hold it. Its timer starts only if the call waits
// on it (lazyctx): a fetch's lookups are mostly answered from memory, and
// a timer per request was a measurable part of a small range read's CPU.
func (g *Gateway) op() (context.Context, context.CancelFunc) {
	return lazyctx.WithTimeout(g.cfg.StoreTimeout, nil)
}

// releaseSlot gives a transfer slot back.
func (g *Gateway) releaseSlot(direction string) {
	g.slots.release()
	if g.onSlotFreed != nil {
		g.onSlotFreed(direction)
	}
}

// New returns a gateway over st and blobs whose metrics are registered on reg.
func New(cfg Config, st Store, blobs Blobs, reg prometheus.Registerer) (*Gateway, error) {
	if cfg.UploadMax <= 0 || cfg.MaxVirtualSize == 0 || cfg.IdleTimeout <= 0 || cfg.MaxTransfers <= 0 {
		return nil, fmt.Errorf("gateway: upload max, max virtual size, idle timeout and max transfers must be positive")
	}
	cfg.setDefaults()
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("gateway: register metrics: %w", err)
	}
	g := &Gateway{
		cfg:      cfg,
		store:    st,
		blobs:    blobs,
		log:      cfg.Log,
		metrics:  m,
		slots:    newSlots(cfg.MaxTransfers),
		misses:   newMissLimiter(rate.Every(cfg.MissEvery), cfg.MissBurst, 100_000),
		fetches:  fetchHolders{held: make(map[string]int)},
		stopping: make(chan struct{}),
		refusals: logsample.New(rate.Limit(cfg.RefusalLogPerSecond), cfg.RefusalLogPerSecond),
		locks:    newPatchLocks(),
		space:    newSpaceLedger(),
		bufs:     sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }},
		open:     newOpenBlobs(blobs, imagestore.TokenCacheTTL),
	}
	g.leftovers, g.undos = g.newLeftovers(), g.newUndos()
	g.readiness = readiness.NewWatch(g.log.With("probe", "readyz"))
	g.srv = g.newServer()
	return g, nil
}

// setDefaults fills the fields left zero with their documented defaults.
func (c *Config) setDefaults() {
	if c.Headroom == 0 {
		c.Headroom = DefaultHeadroom
	}
	if c.MissBurst == 0 {
		c.MissBurst = 20
	}
	if c.MissEvery == 0 {
		c.MissEvery = time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.CheckpointBytes <= 0 {
		c.CheckpointBytes = 256 << 20
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = 15 * time.Second
	}
	if c.StoreTimeout <= 0 {
		c.StoreTimeout = defaultStoreTimeout
	}
	if c.SessionAhead <= 0 {
		c.SessionAhead = DefaultSessionAhead
	}
	if c.TenantReserveMax <= 0 {
		c.TenantReserveMax = c.UploadMax
	}
	if c.FetchQueueWait <= 0 {
		c.FetchQueueWait = DefaultFetchQueueWait
	}
	if c.RefusalLogPerSecond <= 0 {
		c.RefusalLogPerSecond = DefaultRefusalLogPerSecond
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

// newServer is the fasthttp server of the data plane, with the limits of
// the phase before a handler runs.
func (g *Gateway) newServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:       func(ctx *fasthttp.RequestCtx) { markBusy(ctx); g.route(ctx); g.logAnswer(ctx) },
		ExpectHandler: func(ctx *fasthttp.RequestCtx) int { markBusy(ctx); st := g.expect(ctx); g.logAnswer(ctx); return st },
		ConnState:     connState,
		Name:          "vmshelf",
		// Bodies are read by the handler as they arrive; only the first
		// 8 KiB may be read ahead by fasthttp. MaxRequestBodySize is not
		// enforced in this mode: the upload handler counts bytes itself.
		StreamRequestBody: true,
		// Deadlines for the phase before a handler runs. While a transfer
		// runs, the handler moves the read or write deadline on with every
		// chunk, so a slow transfer that moves never times out.
		ReadTimeout: g.cfg.IdleTimeout,
		IdleTimeout: g.cfg.IdleTimeout,
		// An answer's write gets one deadline, set by fasthttp as it
		// starts writing; a small range (headers and bytes in one write)
		// needs no other. A long body moves its own deadline per chunk
		// (fetchStream), and fasthttp then leaves it alone.
		WriteTimeout:      g.cfg.IdleTimeout,
		ReduceMemoryUsage: true, // idle keep-alive connections give back their buffers
		// A small range's headers and bytes leave in one write (see
		// smallRange); the buffer is held only while an answer is written.
		WriteBufferSize: smallRange + 8<<10,
		CloseOnShutdown: true,
		Logger:          redactingLogger{g.log},
		// Errors fasthttp answers itself (bad request line, header too
		// large) still get our JSON shape.
		// A head that does not arrive within ReadTimeout is a 408.
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			aerr := apierr.Wrap(err, reason.BadRequest).WithMsg("the request could not be read as HTTP/1.1")
			if isTimeout(err) {
				aerr = apierr.Wrap(err, reason.RequestTimeout).
					WithMsg("the request head did not arrive in time")
			} else if refusal := parseRefusal(err); refusal != nil {
				aerr = refusal.WithCause(err)
			}
			writeError(ctx, aerr)
			g.logRefusal(ctx, aerr)
		},
	}
}

// Serve answers connections from ln until Shutdown. ln is meant to be a
// *connlimit.Listener: it caps the connections held, makes room by
// closing one with no request in progress, and retries an Accept that
// failed for want of descriptors (fasthttp would stop serving).
func (g *Gateway) Serve(ln net.Listener) error {
	go g.reportSuppressed()
	return g.srv.Serve(ln)
}

// markBusy tells the connection limit that ctx's connection has a request
// in progress (a transfer, a lookup): it is never closed for another
// client until its answer is out.
func markBusy(ctx *fasthttp.RequestCtx) {
	if c, ok := ctx.Conn().(*connlimit.Conn); ok {
		c.Busy()
	}
}

// connState tells the connection limit when a connection waits again for
// a request (an idle keep-alive), so that it may be closed for a new
// client. Until its handler starts (markBusy) a connection is waiting:
// one silent since accept, or dribbling its head, is no better.
func connState(c net.Conn, s fasthttp.ConnState) {
	lc, ok := c.(*connlimit.Conn)
	if !ok {
		return
	}
	switch s {
	case fasthttp.StateIdle:
		lc.Waiting()
	case fasthttp.StateHijacked:
		lc.Busy()
	}
}

// Shutdown stops accepting connections and waits until the running
// transfers end or ctx is done, then closes what is left. Resumable
// uploads do not make it wait: their PATCHes stop at once, save their
// progress and answer 503, and the clients resume after the restart.
// The aborts of failed uploads (leftovers) and the undos of uploads
// answered storeUnreachable (undos) still running after their answers
// stop retrying, and the one try each may be in is waited for, within
// ctx too.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.closing.Store(true)
	g.stopOnce.Do(func() { close(g.stopping) })
	g.locks.stopAll()
	err := g.srv.ShutdownWithContext(ctx)
	g.open.closeAll()
	return errors.Join(err, g.leftovers.Wait(ctx), g.undos.Wait(ctx))
}

// route dispatches on exact path shapes: a capability (or, for the fetch
// route's header form, the upload id its token must name) is the last path
// segment and nothing else is accepted.
func (g *Gateway) route(ctx *fasthttp.RequestCtx) {
	if aerr := headRefusal(ctx); aerr != nil {
		writeError(ctx, aerr)
		return
	}
	if g.cors(ctx) { // a preflight, answered
		return
	}
	switch path := string(ctx.Path()); path {
	case healthzPath, readyzPath:
		g.handleProbe(ctx, path)
		return
	}
	kind, capability := classify(string(ctx.Path()))
	method := string(ctx.Method())
	switch kind {
	case routeUpload:
		switch method {
		case fasthttp.MethodPut:
			g.handleUpload(ctx, capability)
		case fasthttp.MethodPost:
			g.handleCreate(ctx, capability)
		case fasthttp.MethodOptions:
			g.handleOptions(ctx)
		default:
			methodNotAllowed(ctx, "PUT, POST, OPTIONS")
		}
	case routeSession:
		switch method {
		case fasthttp.MethodHead:
			g.handleHead(ctx, capability)
		case fasthttp.MethodPatch:
			g.handlePatch(ctx, capability)
		case fasthttp.MethodDelete:
			g.handleTerminate(ctx, capability)
		case fasthttp.MethodOptions:
			g.handleOptions(ctx)
		default:
			methodNotAllowed(ctx, "HEAD, PATCH, DELETE, OPTIONS")
		}
	case routeFetch:
		switch method {
		case fasthttp.MethodGet, fasthttp.MethodHead:
			g.handleFetch(ctx, capability)
		default:
			methodNotAllowed(ctx, "GET, HEAD")
		}
	default:
		writeError(ctx, apierr.New(reason.NotFound).WithMsg("no such route on the data plane"))
	}
}

type routeKind int

const (
	routeNone routeKind = iota
	routeUpload
	routeSession
	routeFetch
)

// classify splits a data-plane path into its route and capability.
func classify(path string) (routeKind, string) {
	for _, r := range []struct {
		prefix string
		kind   routeKind
	}{{uploadPrefix, routeUpload}, {sessionPrefix, routeSession}, {fetchPrefix, routeFetch}} {
		if rest, ok := strings.CutPrefix(path, r.prefix); ok && !strings.Contains(rest, "/") {
			return r.kind, rest
		}
	}
	return routeNone, ""
}

// expect answers "Expect: 100-continue" with the early refusals, so that a
// client that asked first sends no body byte to be refused.
func (g *Gateway) expect(ctx *fasthttp.RequestCtx) int {
	if aerr := headRefusal(ctx); aerr != nil {
		writeError(ctx, aerr)
		return aerr.Status
	}
	g.cors(ctx) // a refusal here must be readable by a browser too
	kind, capability := classify(string(ctx.Path()))
	var aerr *apierr.Error
	switch {
	case kind == routeUpload && ctx.IsPut():
		size := int64(ctx.Request.Header.ContentLength())
		var tk imagestore.Ticket
		if tk, aerr = g.admit(ctx, capability, size); aerr == nil {
			_, aerr = g.claimSpace(tk.TenantID, size, false)
		}
	case kind == routeUpload && ctx.IsPost():
		if aerr = tusRequest(ctx); aerr == nil {
			var length int64
			if length, aerr = uploadLength(ctx); aerr == nil {
				var tk imagestore.Ticket
				if tk, aerr = g.admit(ctx, capability, length); aerr == nil {
					_, aerr = g.claimSession(tk.TenantID, requestBytes(ctx, length), false)
				}
			}
		}
	case kind == routeSession && ctx.IsPatch():
		_, _, aerr = g.admitPatch(ctx, capability)
	case kind == routeNone && !slices.Contains(probePaths, string(ctx.Path())):
		aerr = apierr.New(reason.NotFound).WithMsg("no such route on the data plane")
	}
	if aerr == nil {
		return fasthttp.StatusContinue // the route answers the rest without reading
	}
	if kind != routeNone {
		g.refused(dirUpload, aerr)
	}
	writeError(ctx, aerr)
	return aerr.Status
}

// headRefusal refuses a head that reads two ways (headerrule: a header of
// one value given twice, a body framed both by Content-Length and by
// Transfer-Encoding; fasthttp keeps the first line of a repeated header
// but the last Content-Type, and reads a body with both lengths as
// chunked) and a Transfer-Encoding other than chunked (RFC 9112 6.1):
// fasthttp refuses most itself but takes "identity" as no body at all, so
// whatever follows the head would run as a second request, a smuggling
// channel past a proxy that framed it otherwise. It reads the head's
// lines as they came, once, and allocates nothing for a head it lets
// pass. The connection closes after a refusal: the bytes before a head a
// proxy framed otherwise are not what it sent either.
func headRefusal(ctx *fasthttp.RequestCtx) *apierr.Error {
	var head headerrule.Head
	otherCoding := false
	raw := ctx.Request.Header.RawHeaders()
	for len(raw) > 0 {
		var line []byte
		line, raw, _ = bytes.Cut(raw, []byte("\n"))
		if len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
			continue // more of the line before (obs-fold), no header of its own
		}
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		k = bytes.TrimSpace(k)
		head.Line(k)
		if len(k) == len("Transfer-Encoding") && bytes.EqualFold(k, []byte("Transfer-Encoding")) &&
			!bytes.EqualFold(bytes.TrimSpace(v), []byte("chunked")) {
			otherCoding = true
		}
	}
	aerr := head.Refusal(ctx.Request.Header.IsHTTP11())
	if aerr == nil && otherCoding {
		aerr = apierr.New(reason.BadRequest).WithMsg("Transfer-Encoding other than chunked is not accepted")
	}
	if aerr != nil {
		ctx.SetConnectionClose()
	}
	return aerr
}

// parseRefusal is the answer to a head fasthttp refused while parsing it
// for a reason of headerrule's, or nil. fasthttp tells a repeated
// Content-Length by a sentinel, a Transfer-Encoding on a request older
// than HTTP/1.1 by ErrUnsupportedTransferEncoding (its only use in a
// request head while SecureErrorLogMessage is off, as here), and a
// repeated Transfer-Encoding or Host only by the text of the error it
// wraps.
func parseRefusal(err error) *apierr.Error {
	switch {
	case errors.Is(err, fasthttp.ErrDuplicateContentLength):
		return headerrule.Repeated("Content-Length")
	case errors.Is(err, fasthttp.ErrUnsupportedTransferEncoding):
		return headerrule.TransferEncodingBeforeHTTP11
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		switch e.Error() {
		case "too many transfer-encoding headers":
			return headerrule.Repeated("Transfer-Encoding")
		case "too many host headers":
			return headerrule.Repeated("Host")
		}
	}
	return nil
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Response.Header.Set("Allow", allow)
	writeError(ctx, apierr.New(reason.MethodNotAllowed).WithMsg("method not allowed here; allowed: "+allow))
}

// writeError answers with the JSON error shape of docs/api.md "Errors" and
// the headers the error carries (Retry-After, Upload-Offset...).
// The handler's wrapper logs it once the handler returns (logAnswer).
func writeError(ctx *fasthttp.RequestCtx, e *apierr.Error) {
	ctx.SetUserValue(refusalKey, e)
	ctx.Response.SetStatusCode(e.Status)
	e.EachHeader(ctx.Response.Header.Set)
	ctx.Response.Header.SetContentType("application/json")
	ctx.Response.SetBody(e.JSON())
}

// refused counts a transfer that ended with e: by outcome, and by reason
// when the outcome is a refusal. Every refusal path goes through here, so
// the two counters always agree.
func (g *Gateway) refused(dir string, e *apierr.Error) {
	outcome := outcomeOf(e)
	if outcome == outcomeRejected {
		g.metrics.rejections.WithLabelValues(dir, e.Reason).Inc()
	}
	g.metrics.transfers.WithLabelValues(dir, outcome).Inc()
}

// tooManyMisses is the 429 for an address that guessed too often.
func (g *Gateway) tooManyMisses() *apierr.Error {
	return apierr.New(reason.RateLimited).
		WithRetryAfter(int(max(g.cfg.MissEvery/time.Second, 1)))
}

// redactingLogger keeps capabilities out of fasthttp's own log lines (they
// can quote a request head: URIs carry tickets and tokens, Authorization
// headers fetch tokens).
type redactingLogger struct{ log *slog.Logger }

func (l redactingLogger) Printf(format string, args ...any) {
	l.log.Warn(redactHead(fmt.Sprintf(format, args...)), "component", "fasthttp")
}

// isTimeout reports whether err is a deadline that passed: the idle timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
