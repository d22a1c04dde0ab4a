// Package market is vmshelf's control plane (net/http): the tenants' API
// (tickets, images, status), the public catalogue, health probes and
// /metrics. It decides nothing about bytes on the wire of an upload; it
// hands out the capabilities the data plane checks.
package market

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/baseurl"
	"github.com/vmshelf/vmshelf/internal/clientaddr"
	"github.com/vmshelf/vmshelf/internal/readiness"
	"github.com/vmshelf/vmshelf/internal/reason"
	"github.com/vmshelf/vmshelf/internal/settle"
	"github.com/vmshelf/vmshelf/internal/unavailable"
	"github.com/vmshelf/vmshelf/market/web"
)

// Config is what the control plane needs of the command line.
type Config struct {
	// PublicURL is the base of the upload URLs handed out, e.g.
	// "http://127.0.0.1:8480". A trailing slash is dropped.
	PublicURL string
	// TicketTTL is how long an upload ticket stays usable.
	TicketTTL time.Duration
	// ImagesPerTenant is the image quota (--images-per-tenant, 3 by
	// default).
	ImagesPerTenant int
	// UploadMax, MaxVirtualSize and MaxTransfers are the data plane's
	// limits (--upload-max-gib, --max-virtual-gib, --max-transfers). The
	// control plane enforces none of them; status reports them so that a
	// client (the Machines page, vmshelf upload) can refuse a file before
	// it takes a ticket and run no more uploads at once than the edge
	// serves. 0 leaves a limit out of the answer.
	UploadMax      int64
	MaxVirtualSize uint64
	MaxTransfers   int
	// VMsEnabled is --vms-enable; off, status says "notOffered".
	VMsEnabled bool
	// Now is the clock; nil means time.Now. Tests control it.
	Now func() time.Time
	// Log receives at most one line per failed request; nil discards.
	Log *slog.Logger
	// Headroom is the free space below which no ticket is issued (an
	// upload must leave as much); 0 means imagestore.DefaultHeadroom.
	Headroom int64
	// MinFree is the free space below which /readyz answers 503 noSpace:
	// the disk is full for the store's and the system's own writes. 0
	// means DefaultMinFree.
	MinFree int64
	// TicketRate is how many tickets a second one tenant may take in the
	// long run, TicketBurst how many at once (token bucket, per tenant).
	// 0 means DefaultTicketRate and DefaultTicketBurst; rate.Inf turns
	// the limit off.
	TicketRate  rate.Limit
	TicketBurst int
	// BodyTimeout bounds the reading of a request body (at most 64 KiB),
	// from the handler's start: a body not in by then is answered 408
	// requestTimeout and the connection closed. 0 means
	// DefaultBodyTimeout.
	BodyTimeout time.Duration
	// TrustedProxies are the reverse proxies whose forwarding header
	// (X-Forwarded-For, or Forwarded when named) names the client in the
	// log lines (the data plane's rule, clientaddr). Default none: the
	// peer is the client.
	TrustedProxies clientaddr.Trust
	// Catalogue is what GET /market/vm-images answers (--vm-catalogue);
	// nil means catalogue.Builtin().
	Catalogue *catalogue.Catalogue
	// ConsoleAvailable: the edge serves the browser console, so the
	// catalogue's installation ISOs are offered (Catalogue.WithConsole).
	// Without it they are listed as not offered and ordering one is
	// refused needsConsole.
	ConsoleAvailable bool

	// Payments is Stripe. Nil when no STRIPE_SECRET_KEY is set: then
	// creating listings and orders answers 503 paymentsUnavailable and
	// /readyz names the reason; everything else works.
	Payments billing.Payments
	// WebhookSecret verifies the Stripe-Signature of webhook events
	// (STRIPE_WEBHOOK_SECRET); empty, the webhook answers 503.
	WebhookSecret string
	// Currency is the listings' currency (--currency), lower case.
	Currency string
	// CheckoutReturnURL is where Stripe Checkout sends the buyer back,
	// with ?order=<id>&checkout=success|cancelled added. Required with
	// Payments.
	CheckoutReturnURL string
	// DemoPayments: Payments is a Stripe stand-in on this machine (serve
	// --dev with a loopback --stripe-api-base); status says so and the
	// Machines page shows that no money moves.
	DemoPayments bool
	// CheckoutTTL is how long a checkout stays payable (Stripe: 30 min to
	// 24 h); CheckoutGrace how long after that the sweeper waits for
	// Stripe's expiry event before it settles the order itself. 0 means
	// DefaultCheckoutTTL and DefaultCheckoutGrace.
	CheckoutTTL, CheckoutGrace time.Duration
	// Replica is the size of one replica the provisioner makes
	// (--vm-cpu, --vm-memory-mib, --vm-disk-gib), which every offer
	// shows; a zero field is left out of the offers.
	Replica ReplicaSize
	// VMsDomain is --vms-domain: an order's address is
	// vm-<order>.<domain>; empty, orders have no address.
	VMsDomain string
	// OnPaid, if set, is told the id of each order the moment it is paid
	// (the provisioner's cue; it also finds paid orders on its own).
	OnPaid func(orderID string)
	// OnPower, if set, is told the id of each order a power action was
	// taken on, so that its replicas' new states are read soon.
	OnPower func(orderID string)
	// ClusterReady, if set, says whether the provisioner reaches the
	// cluster (nil) or why not; /readyz then names clusterUnreachable.
	ClusterReady func() error
	// RefundDeadline is --refund-deadline: a paid order not active this
	// long after its payment, for a cause the provisioner names, is
	// refunded. 0 means DefaultRefundDeadline.
	RefundDeadline time.Duration
	// RefundClaim is how long one replica holds a refund attempt: longer
	// than one Stripe call takes. A shorter one costs at most a second
	// request under the same key, never a second refund. 0 means a
	// minute.
	RefundClaim time.Duration

	// Consoles opens replicas' consoles (the provisioner's cluster); nil
	// refuses console tickets (503 consoleUnavailable).
	Consoles Consoles
	// Power starts, stops and restarts replicas (the provisioner's
	// cluster); nil refuses power actions (503 powerUnavailable).
	Power Power
	// ConsoleBase is the ws: or wss: origin (and path prefix) the console
	// URLs are built on: the page's own origin, whose control plane
	// serves the WebSocket. Required with Consoles.
	ConsoleBase string
	// ConsoleIdle ends a console nothing passed through for so long;
	// UnfinishedWrites, if set, reports what unfinished writes hold in the
	// image storage (over S3: multipart uploads running or left by a
	// killed process), for /metrics.
	UnfinishedWrites UnfinishedWrites
	// ConsolesPerTenant and ConsolesPerEdge cap the consoles open on
	// this replica. 0 means the Default values.
	ConsoleIdle time.Duration
	// ConsoleTimeout bounds the opening of a console by the cluster and
	// every write to either side of an open one; 0 means
	// DefaultConsoleTimeout.
	ConsoleTimeout                     time.Duration
	ConsolesPerTenant, ConsolesPerEdge int
}

// ReplicaSize is what one replica of an order gets, at least: an image
// whose catalogue entry asks for more memory or disk, or an own image
// whose disk is larger, gets that.
type ReplicaSize struct {
	VCPU      int `json:"vcpu,omitempty"`
	MemoryMiB int `json:"memory_mib,omitempty"`
	DiskGiB   int `json:"disk_gib,omitempty"`
}

// DefaultMinFree is Config.MinFree's default.
const DefaultMinFree = 32 << 20

// Server is the control plane. Build it with New; it is safe for concurrent
// use.
type Server struct {
	cfg      Config
	st       Store
	blobs    Blobs
	log      *slog.Logger
	metrics  *metrics
	handler  http.Handler
	tickets  *tenantLimiter // ticket issuance, per tenant
	refusals *refusalLog    // sampling of the refusals' log lines

	// afterSweep, when set (tests only), is called after every sweep of
	// RunSweeper, so a test can wait for a sweep without sleeping.
	afterSweep func(n int, err error)
	// afterRefunds, when set (tests only), is called after every round
	// of RunRefunds.
	afterRefunds func()
	// consoles counts the consoles open on this replica.
	consoles consoleGate
	// readiness logs the verdicts of /readyz once per change.
	readiness *readiness.Watch
	// withdrawals take back, after the answer, the tickets whose answer
	// did not reach their client (tickets.go); stop ends their retries
	// (Shutdown).
	withdrawals *settle.Queue
	stop        chan struct{}
	stopOnce    sync.Once
}

// New checks cfg and builds the control plane over st and blobs. Its
// metrics are registered on reg; /metrics serves gather (normally the same
// *prometheus.Registry, which also holds the Go and process collectors the
// caller chooses to add).
func New(cfg Config, st Store, blobs Blobs, reg prometheus.Registerer, gather prometheus.Gatherer) (*Server, error) {
	if st == nil || blobs == nil || reg == nil || gather == nil {
		return nil, errors.New("market: store, blobs, registerer and gatherer are all required")
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	var err error
	s := &Server{cfg: cfg, st: st, blobs: blobs, log: cfg.Log,
		tickets: newTenantLimiter(cfg.TicketRate, cfg.TicketBurst), refusals: newRefusalLog(cfg.Log),
		readiness: readiness.NewWatch(cfg.Log.With("probe", "readyz")), stop: make(chan struct{})}
	s.withdrawals = s.newWithdrawals()
	if s.metrics, err = newMetrics(reg, st, blobs, cfg.UnfinishedWrites, cfg.Log); err != nil {
		return nil, err
	}

	if s.handler, err = s.routes(reg, gather); err != nil {
		return nil, err
	}
	return s, nil
}

// check refuses a configuration the control plane cannot serve and fills
// the fields left zero with their defaults.
func (c *Config) check() error {
	c.PublicURL = strings.TrimRight(c.PublicURL, "/")
	if _, err := baseurl.ParseBase(c.PublicURL); err != nil {
		return fmt.Errorf("market: public URL %q is not an http(s) base URL like http://host:port", c.PublicURL)
	}
	if c.TicketTTL <= 0 {
		return fmt.Errorf("market: ticket TTL must be positive, not %v", c.TicketTTL)
	}
	if c.ImagesPerTenant < 1 {
		return fmt.Errorf("market: images per tenant must be at least 1, not %d", c.ImagesPerTenant)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Headroom <= 0 {
		c.Headroom = imagestore.DefaultHeadroom
	}
	if c.MinFree <= 0 {
		c.MinFree = DefaultMinFree
	}
	if c.Catalogue == nil {
		c.Catalogue = catalogue.Builtin()
	}
	if c.ConsoleAvailable {
		c.Catalogue = c.Catalogue.WithConsole()
	}
	if c.BodyTimeout <= 0 {
		c.BodyTimeout = DefaultBodyTimeout
	}
	if c.TicketRate == 0 {
		c.TicketRate = DefaultTicketRate
	}
	if c.TicketBurst == 0 {
		c.TicketBurst = DefaultTicketBurst
	}
	if c.CheckoutTTL == 0 {
		c.CheckoutTTL = DefaultCheckoutTTL
	}
	if c.CheckoutGrace == 0 {
		c.CheckoutGrace = DefaultCheckoutGrace
	}
	if c.CheckoutTTL < billing.MinExpiry || c.CheckoutTTL > billing.MaxExpiry || c.CheckoutGrace < 0 {
		return fmt.Errorf("market: checkout TTL %v must be %v to %v and the grace %v not negative",
			c.CheckoutTTL, billing.MinExpiry, billing.MaxExpiry, c.CheckoutGrace)
	}
	if c.Currency == "" {
		c.Currency = "eur"
	}
	if _, ok := billing.MinimumAmount(c.Currency); !ok {
		return fmt.Errorf("market: currency %q is not one the payment gate knows", c.Currency)
	}
	if c.Payments != nil {
		if _, err := baseurl.Parse(c.CheckoutReturnURL); err != nil {
			return fmt.Errorf("market: checkout return URL %q is not an http(s) URL", c.CheckoutReturnURL)
		}
	}
	if c.TicketRate < 0 || c.TicketBurst < 0 {
		return fmt.Errorf("market: ticket rate %v and burst %d must not be negative", c.TicketRate, c.TicketBurst)
	}
	return nil
}

// routes is the control plane's handler: every route and the Machines
// page's files.
func (s *Server) routes(reg prometheus.Registerer, gather prometheus.Gatherer) (http.Handler, error) {
	rt := newRouter(s.metrics.observe, s.fail)
	rt.handle(http.MethodGet, "/healthz", s.healthz)
	rt.handle(http.MethodGet, "/readyz", s.readyz)
	rt.handle(http.MethodGet, "/metrics", s.metrics.handler(reg, gather).ServeHTTP)
	rt.handle(http.MethodGet, "/market/vm-images", s.catalogue)
	rt.handle(http.MethodPost, "/market/vm-images/ticket", s.tenantRoute(s.ticket))
	rt.handle(http.MethodPost, "/market/vm-images/ticket/cancel", s.tenantRoute(s.cancelTicket))
	rt.handle(http.MethodPost, "/market/vm-images/remove", s.tenantRoute(s.remove))
	rt.handle(http.MethodPost, "/market/vms/status", s.tenantRoute(s.status))
	rt.handle(http.MethodPost, "/market/vms/listings", s.machineRoute(true, s.createListing))
	rt.handle(http.MethodPost, "/market/vms/listings/close", s.machineRoute(false, s.closeListing))
	rt.handle(http.MethodPost, "/market/vms/orders", s.machineRoute(true, s.createOrder))
	rt.handle(http.MethodPost, "/market/vms/orders/cancel", s.machineRoute(true, s.cancelOrder))
	rt.handle(http.MethodPost, "/market/vms/orders/power", s.tenantRoute(s.power))
	rt.handle(http.MethodPost, "/market/stripe/webhook", s.webhook)
	rt.handle(http.MethodPost, "/market/vms/console/ticket", s.tenantRoute(s.consoleTicket))
	rt.handle(http.MethodGet, "/market/vms/console", s.console)
	rt.handle(http.MethodPost, "/market/stripe/onboarding", s.machineRoute(true, s.onboarding))
	page, err := web.New(s.cfg.PublicURL, s.cfg.ConsoleBase) // the Machines page: GET /machines and its files
	if err != nil {
		return nil, err
	}
	for _, p := range page.Paths() {
		rt.handle(http.MethodGet, p, page.ServeHTTP)
	}
	return rt, nil
}

// Handler returns the control plane's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Shutdown stops the retries of the work that settles earlier answers
// (the withdrawals of tickets) and waits, within ctx, for the try each
// may be in. Call it once the HTTP server has stopped.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	return s.withdrawals.Wait(ctx)
}

// writeJSON answers status with v as JSON. Every answer of the control
// plane goes through here or fail, so headers are uniform.
func (s *Server) writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.fail(w, r, fmt.Errorf("encoding the answer: %w", err))
		return
	}
	writeBody(w, status, append(b, '\n'))
}

func writeBody(w http.ResponseWriter, status int, body []byte) {
	// Tenant answers carry tickets and private state: no cache may keep
	// them. Probes and errors lose nothing by it either.
	writeCacheable(w, status, body, "no-store")
}

// writeCacheable is writeBody with the Cache-Control given: only public
// answers that are the same for everyone (the catalogue) may be cached.
func writeCacheable(w http.ResponseWriter, status int, body []byte, cacheControl string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", cacheControl)
	w.WriteHeader(status)
	_, _ = w.Write(body) // a client that hung up is not our error
}

// fail writes err as the error body of docs/api.md "Errors". Errors that are not an
// *apierr.Error become a 500 whose text stays in the log. It logs one line:
// server faults at Error, refusals (4xx) at Info with the client's address,
// sampled per reason (see refusalLog). Nothing logged here carries a token:
// only method, route, status, reason, address and the internal cause, with
// every hex run of 16 characters or more redacted.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := s.logFailure(w, r, err)
	writeBody(w, e.Status, append(e.JSON(), '\n'))
}

// logFailure is fail but for the body: it logs err, sets the answer's
// headers and returns the error to answer, for a handler whose error
// body says more than error and reason (readyz's reasons).
func (s *Server) logFailure(w http.ResponseWriter, r *http.Request, err error) *apierr.Error {
	var answered *apierr.Error
	switch {
	case errors.As(err, &answered):
	case errors.Is(err, imagestore.ErrNoSpace):
		// A full disk is the client's answer, not a server fault: it can
		// retry once space is freed (a remove, above all, still works).
		err = errNoSpace(err)
	case errors.Is(err, imagestore.ErrBlobsUnavailable):
		// So is an image storage that does not answer: its outage
		// passes, and the client retries.
		err = errBlobsUnreachable(err)
	case errors.Is(err, imagestore.ErrStoreUnavailable):
		// And a record store that does not answer, on every route.
		err = unavailable.Answer(err)
	}
	e := apierr.From(err)
	e.EachHeader(w.Header().Set) // Retry-After and the like: the error's own
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", "Bearer")
	}
	if bodyUnread(w, r) {
		// Refused before its body was read (no token, no route, too
		// slow...): answer at once and close. Without Connection: close
		// net/http would first drain the body, and a client that dribbles
		// it would hold the answer and the connection; the past read
		// deadline makes the drain after the answer give up at once too.
		w.Header().Set("Connection", "close")
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	}
	attrs := []any{"method", logText(r.Method), "route", routeLabel(r), "status", e.Status, "reason", e.Reason}
	if oe, ok := errors.AsType[*orderError](err); ok {
		attrs = append(attrs, "order_id", oe.orderID)
	}
	if e.Status < 500 {
		// A refusal: the client's business, but an operator wants to see
		// who is refused and why. Sampled, so a flood cannot fill the disk.
		if s.refusals.allow(r.Context(), e.Reason, s.cfg.Now()) {
			attrs = append(attrs, "remote", s.clientAddr(r))
			if e.Err != nil {
				attrs = append(attrs, "err", logText(e.Err.Error()))
			}
			s.log.Log(r.Context(), slog.LevelInfo, "control request refused", attrs...)
		}
	} else {
		if e.Err != nil {
			attrs = append(attrs, "err", logText(e.Err.Error()))
		}
		s.log.Log(r.Context(), slog.LevelError, "control request failed", attrs...)
	}
	return e
}

// errNoSpace is the 507 of a request the full disk refused.
func errNoSpace(cause error) *apierr.Error {
	return apierr.Wrap(cause, reason.NoSpace).
		WithMsg("the edge's disk is full; uploads are refused until space is freed (removing an image works)")
}

// errBlobsUnreachable is the 503 of a request the image storage did not
// take (an S3 server down, hung or failing), as the data plane answers it.
func errBlobsUnreachable(cause error) *apierr.Error {
	return apierr.Wrap(cause, reason.BlobStoreUnreachable).WithRetryAfter(60)
}

// routeLabel is the registered pattern of r, never the raw path: the path
// of an unknown route is client-chosen text.
func routeLabel(r *http.Request) string {
	if r.Pattern == "" {
		return otherRoute
	}
	return r.Pattern
}
