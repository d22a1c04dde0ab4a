package market

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
)

// Consoles opens a replica's console in the cluster: the provisioner's
// access to KubeVirt's vnc and console subresources. The market knows
// orders and replicas, never namespaces or VM names.
type Consoles interface {
	// OpenConsole connects to the console kind of replica (its index)
	// of order o; the bytes are the console's own (RFB for VNC, the
	// serial line's for serial). An error means no console now.
	OpenConsole(ctx context.Context, o imagestore.Order, replica int, kind imagestore.ConsoleKind) (net.Conn, error)
}

// The console's defaults (Config.ConsoleIdle, ConsolesPerTenant,
// ConsolesPerEdge) and its ticket's life.
const (
	DefaultConsoleIdle       = 15 * time.Minute
	DefaultConsolesPerTenant = 2
	DefaultConsolesPerEdge   = 32
	consoleTicketTTL         = time.Minute
	// consoleRecheck is how often an open console asks whether its order
	// still runs: a console outlives no order.
	consoleRecheck = 10 * time.Second
)

// The WebSocket close codes a console ends with, each with its reason in
// words as the close reason: a browser reads both, never an HTTP status.
const (
	closeTicket     websocket.StatusCode = 4404 // unknown, used or expired ticket
	closeNotRunning websocket.StatusCode = 4409 // the replica does not run (any more)
	closeBusy       websocket.StatusCode = 4429 // too many consoles open
	closeIdle       websocket.StatusCode = 4408 // nothing passed for the idle time
	closeEnded      websocket.StatusCode = 4410 // the order ended
	closeNoConsole  websocket.StatusCode = 4502 // the cluster gave no console
)

var (
	errConsoleOrder = apierr.New(http.StatusNotFound, "orderUnknown",
		"you have no such order: only its buyer opens a machine's console")
	errConsoleReplica = apierr.New(http.StatusNotFound, "replicaUnknown", "the order has no such replica")
	errConsoleKind    = apierr.New(http.StatusUnprocessableEntity, "badRequest", `kind is "vnc" or "serial"`)
	errNotRunning     = apierr.New(http.StatusConflict, "replicaNotRunning",
		"the machine is not running; its console opens once it runs")
	errConsolesUnavailable = apierr.New(http.StatusServiceUnavailable, "consoleUnavailable",
		"this edge reaches no cluster, so it opens no console")
)

func errConsoleBusy(what string) *apierr.Error {
	return apierr.New(http.StatusTooManyRequests, "consoleBusy",
		"too many consoles are open "+what+"; close one and try again")
}

type consoleRequest struct {
	OrderID string `json:"order_id"`
	Replica int    `json:"replica"`
	Kind    string `json:"kind"`
}

type consoleAnswer struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// consoleGate counts the consoles open on this replica of the edge, by
// tenant and in all; a ticket is refused when either cap is reached, and a
// WebSocket closed if it is reached meanwhile.
type consoleGate struct {
	mu       sync.Mutex
	byTenant map[int64]int
	all      int
}

func (g *consoleGate) full(tenant int64, perTenant, perEdge int) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fullLocked(tenant, perTenant, perEdge)
}

// fullLocked says which cap is reached ("" for none); g.mu is held.
func (g *consoleGate) fullLocked(tenant int64, perTenant, perEdge int) string {
	switch {
	case g.byTenant[tenant] >= perTenant:
		return "for this box"
	case g.all >= perEdge:
		return "on this edge"
	}
	return ""
}

func (g *consoleGate) take(tenant int64, perTenant, perEdge int) (release func(), why string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if why := g.fullLocked(tenant, perTenant, perEdge); why != "" {
		return nil, why
	}
	if g.byTenant == nil {
		g.byTenant = map[int64]int{}
	}
	g.byTenant[tenant]++
	g.all++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.byTenant[tenant]--; g.byTenant[tenant] == 0 {
				delete(g.byTenant, tenant)
			}
			g.all--
		})
	}, ""
}

// consoleTicket is POST /market/vms/console/ticket: the buyer of an active order
// asks for a console of one of its running replicas; the answer is a
// single-use WebSocket URL for a minute. The host of the order, and every
// other tenant, is told the order is unknown.
func (s *Server) consoleTicket(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	var req consoleRequest
	if err := s.decodeBody(w, r, &req, false); err != nil {
		s.fail(w, r, err)
		return
	}
	kind := imagestore.ConsoleKind(req.Kind)
	if kind != imagestore.ConsoleVNC && kind != imagestore.ConsoleSerial {
		s.fail(w, r, errConsoleKind)
		return
	}
	if s.cfg.Consoles == nil {
		s.fail(w, r, errConsolesUnavailable)
		return
	}
	if _, err := s.consoleOrder(r.Context(), t.ID, req.OrderID, req.Replica); err != nil {
		s.fail(w, r, err)
		return
	}
	if why := s.consoles.full(t.ID, s.consolesPerTenant(), s.consolesPerEdge()); why != "" {
		s.metrics.consoleRefused(string(kind), "busy")
		s.fail(w, r, errConsoleBusy(why))
		return
	}
	now := s.cfg.Now().UTC()
	secret := imagestore.NewSecret()
	ct := imagestore.ConsoleTicket{TenantID: t.ID, OrderID: req.OrderID, Replica: req.Replica, Kind: kind,
		CreatedAt: now, ExpiresAt: now.Add(consoleTicketTTL)}
	if err := s.st.CreateConsoleTicket(r.Context(), imagestore.HashSecret(secret), ct); err != nil {
		if errors.Is(err, imagestore.ErrNotFound) {
			err = errConsoleOrder
		}
		s.fail(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusCreated, consoleAnswer{URL: s.consoleURL(secret), ExpiresAt: ct.ExpiresAt})
}

// consoleOrder is the tenant's order id if it is active and its replica
// runs now (the provisioner's last word on it).
func (s *Server) consoleOrder(ctx context.Context, tenant int64, id string, replica int) (imagestore.Order, error) {
	if !imagestore.ValidOrderID(id) {
		return imagestore.Order{}, errConsoleOrder
	}
	o, err := s.st.Order(ctx, id)
	switch {
	case errors.Is(err, imagestore.ErrNotFound) || (err == nil && o.BuyerID != tenant):
		return o, errConsoleOrder
	case err != nil:
		return o, err
	case replica < 0 || replica >= o.Quantity:
		return o, errConsoleReplica
	case o.State != imagestore.OrderActive:
		return o, errNotRunning
	}
	states, err := s.st.ReplicaStates(ctx, id)
	if err != nil {
		return o, err
	}
	for _, rs := range states {
		if rs.Index == replica && rs.State == imagestore.ReplicaRunning {
			return o, nil
		}
	}
	return o, errNotRunning
}

// consoleURL is the WebSocket URL of a console ticket: the page's origin
// (Config.ConsoleBase, ws: or wss:) and the route.
func (s *Server) consoleURL(secret string) string {
	return strings.TrimRight(s.cfg.ConsoleBase, "/") + consolePath + "?ticket=" + secret
}

// consolePath is the WebSocket's route; the ticket is its query (the
// router matches exact paths, and no log line of the control plane
// carries a query).
const consolePath = "/market/vms/console"

// console is GET /market/vms/console?ticket=…: the WebSocket. It is
// accepted first, so that every refusal reaches the browser as a close
// code with its reason in words; the ticket is used at once, before any
// byte of the console passes.
func (s *Server) console(w http.ResponseWriter, r *http.Request) {
	secret := r.URL.Query().Get("ticket")
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: s.consoleOrigins()})
	if err != nil {
		return // Accept answered the request itself (a bad handshake or origin)
	}
	ctx := context.WithoutCancel(r.Context())
	ct, err := s.st.ConsumeConsoleTicket(ctx, imagestore.HashSecret(secret), s.cfg.Now().UTC())
	if err != nil {
		s.metrics.consoleRefused("unknown", "ticket")
		_ = c.Close(closeTicket, "this console's address is unknown, used or expired; open the console again")
		return
	}
	kind := string(ct.Kind)
	o, err := s.consoleOrder(ctx, ct.TenantID, ct.OrderID, ct.Replica)
	if err != nil {
		s.metrics.consoleRefused(kind, "notRunning")
		_ = c.Close(closeNotRunning, "the machine is not running; its console opens once it runs")
		return
	}
	release, why := s.consoles.take(ct.TenantID, s.consolesPerTenant(), s.consolesPerEdge())
	if why != "" {
		s.metrics.consoleRefused(kind, "busy")
		_ = c.Close(closeBusy, "too many consoles are open "+why+"; close one and try again")
		return
	}
	defer release()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	vm, err := s.cfg.Consoles.OpenConsole(cctx, o, ct.Replica, ct.Kind)
	if err != nil {
		s.log.Warn("console not opened: the cluster gave none", "order_id", o.ID, "replica", ct.Replica, "kind", kind, "err", err.Error())
		s.metrics.consoleRefused(kind, "cluster")
		_ = c.Close(closeNoConsole, "the cluster did not open the machine's console; try again")
		return
	}
	s.bridge(cctx, cancel, c, vm, o, ct)
}

// bridge passes bytes both ways between the browser's WebSocket and the
// machine's console until either side ends, nothing passes for the idle
// time, or the order stops running; then it logs one line.
func (s *Server) bridge(ctx context.Context, cancel context.CancelFunc, c *websocket.Conn, vm net.Conn, o imagestore.Order, ct imagestore.ConsoleTicket) {
	kind := string(ct.Kind)
	start := time.Now()
	s.metrics.consoleOpened(kind)
	defer s.metrics.consoleClosed(kind)
	browser := websocket.NetConn(ctx, c, websocket.MessageBinary)
	var in, out atomic.Int64 // bytes to the machine, bytes to the browser
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	end := make(chan string, 3)
	pipe := func(dst, src net.Conn, n *atomic.Int64, why string) {
		buf := make([]byte, 32<<10)
		for {
			k, err := src.Read(buf)
			if k > 0 {
				last.Store(time.Now().UnixNano())
				n.Add(int64(k))
				if _, werr := dst.Write(buf[:k]); werr != nil {
					end <- why
					return
				}
			}
			if err != nil {
				end <- why
				return
			}
		}
	}
	go pipe(vm, browser, &in, "browser closed")
	go pipe(browser, vm, &out, "console closed")
	go func() {
		idle := s.consoleIdle()
		t := time.NewTicker(min(consoleRecheck, idle/4))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if time.Since(time.Unix(0, last.Load())) >= idle {
				end <- "idle"
				return
			}
			if _, err := s.consoleOrder(ctx, ct.TenantID, ct.OrderID, ct.Replica); errors.Is(err, errNotRunning) || errors.Is(err, errConsoleOrder) {
				end <- "order ended"
				return
			}
		}
	}()
	why := <-end
	switch why {
	case "idle":
		_ = c.Close(closeIdle, "nothing passed for "+s.consoleIdle().String()+"; open the console again")
	case "order ended":
		_ = c.Close(closeEnded, "the machine stopped running or its order ended")
	case "console closed":
		_ = c.Close(websocket.StatusNormalClosure, "the machine's console closed")
	default:
		_ = c.CloseNow()
	}
	_ = vm.Close()
	cancel()
	s.metrics.consoleBytes(in.Load(), out.Load())
	s.metrics.consoleEnded(kind, strings.ReplaceAll(why, " ", "_"))
	s.log.Info("console session", "tenant_id", ct.TenantID, "order_id", o.ID, "replica", ct.Replica, "kind", kind,
		"seconds", strconv.FormatFloat(time.Since(start).Seconds(), 'f', 1, 64), "bytes_in", in.Load(), "bytes_out", out.Load(), "end", why)
}

// consoleOrigins are the origins a console's WebSocket may come from: the
// page's (Config.ConsoleBase's host).
func (s *Server) consoleOrigins() []string {
	base := s.cfg.ConsoleBase
	for _, p := range []string{"wss://", "ws://"} {
		base = strings.TrimPrefix(base, p)
	}
	if i := strings.IndexByte(base, '/'); i >= 0 {
		base = base[:i]
	}
	return []string{base}
}

func (s *Server) consoleIdle() time.Duration {
	if s.cfg.ConsoleIdle > 0 {
		return s.cfg.ConsoleIdle
	}
	return DefaultConsoleIdle
}

func (s *Server) consolesPerTenant() int {
	if s.cfg.ConsolesPerTenant > 0 {
		return s.cfg.ConsolesPerTenant
	}
	return DefaultConsolesPerTenant
}

func (s *Server) consolesPerEdge() int {
	if s.cfg.ConsolesPerEdge > 0 {
		return s.cfg.ConsolesPerEdge
	}
	return DefaultConsolesPerEdge
}
