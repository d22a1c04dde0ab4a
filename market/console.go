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
	"github.com/vmshelf/vmshelf/internal/reason"
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
	// DefaultConsoleTimeout is Config.ConsoleTimeout's default: long
	// enough for the API server, virt-api and virt-handler to open a
	// console on a busy cluster, short enough that a wedged one gives
	// the slot back soon.
	DefaultConsoleTimeout = 15 * time.Second
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
	closeStalled    websocket.StatusCode = 4504 // a side stopped taking bytes
	closeNoStore    websocket.StatusCode = 4503 // the record store did not answer
)

var (
	errConsoleOrder = apierr.New(reason.OrderUnknown).WithMsg(
		"you have no such order: only its buyer opens a machine's console")
	errConsoleReplica      = apierr.New(reason.ReplicaUnknown)
	errConsoleKind         = apierr.New(reason.BadValue).WithMsg(`kind is "vnc" or "serial"`)
	errNotRunning          = apierr.New(reason.ReplicaNotRunning)
	errConsolesUnavailable = apierr.New(reason.ConsoleUnavailable)
)

func errConsoleBusy(what string) *apierr.Error {
	return apierr.New(reason.ConsoleBusy).
		WithMsg("too many consoles are open " + what + "; close one and try again")
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

// console is GET /market/vms/console?ticket=…: the WebSocket. Its Origin
// is checked first, so that a page of another origin neither opens a
// console nor uses up the ticket. It is accepted next, so that every other
// refusal reaches the browser as a close code with its reason in words;
// the ticket is used at once, before any byte of the console passes.
func (s *Server) console(w http.ResponseWriter, r *http.Request) {
	if err := s.checkConsoleOrigin(r); err != nil {
		s.fail(w, r, err)
		return
	}
	secret := r.URL.Query().Get("ticket")
	// The origin was checked above, exactly (scheme, host and port);
	// the library's own check compares the host only.
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return // Accept answered the request itself (a bad handshake)
	}
	ctx := context.WithoutCancel(r.Context())
	ct, err := s.st.ConsumeConsoleTicket(ctx, imagestore.HashSecret(secret), s.cfg.Now().UTC())
	if errors.Is(err, imagestore.ErrStoreUnavailable) {
		// "Could not ask" is no unknown ticket: the page may open the
		// console again once the store answers.
		s.metrics.consoleRefused("unknown", "store")
		_ = c.Close(closeNoStore, "the edge's record store does not answer; open the console again in a few seconds")
		return
	}
	if err != nil {
		s.metrics.consoleRefused("unknown", "ticket")
		_ = c.Close(closeTicket, "this console's address is unknown, used or expired; open the console again")
		return
	}
	kind := string(ct.Kind)
	o, err := s.consoleOrder(ctx, ct.TenantID, ct.OrderID, ct.Replica)
	if errors.Is(err, imagestore.ErrStoreUnavailable) {
		s.metrics.consoleRefused(kind, "store")
		_ = c.Close(closeNoStore, "the edge's record store does not answer; open the console again in a few seconds")
		return
	}
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
	sess := &consoleSession{s: s, c: c, o: o, ct: ct, start: time.Now()}
	sess.last.Store(sess.start.UnixNano())
	// The slot is the session's from here: counted as open at once, and
	// given back with one log line however the session ends.
	s.metrics.consoleOpened(kind)
	defer func() {
		release()
		s.metrics.consoleClosed(kind)
	}()
	sess.run(ctx)
}

// consoleSession is one console holding a slot: the browser's WebSocket,
// the order and ticket it was opened with, and what passed.
type consoleSession struct {
	s     *Server
	c     *websocket.Conn
	o     imagestore.Order
	ct    imagestore.ConsoleTicket
	start time.Time
	// in and out are the bytes to the machine and to the browser; last is
	// when a byte last passed either way (Unix nanoseconds).
	in, out, last atomic.Int64
	// opened is set once the machine's console is open.
	opened atomic.Bool
	// toMachineBy and toBrowserBy are the deadlines of the write to each
	// side under way (Unix nanoseconds; 0 for none). A deadline that
	// passes closes that side, so its reader fails too, maybe first: the
	// end is told by the deadline, not by which part saw it.
	toMachineBy, toBrowserBy atomic.Int64
}

// The ways a console session ends: the end label of
// vmshelf_console_sessions_total and the end of its log line.
const (
	endBrowserLeft   = "browser_left"   // the browser left while the cluster opened the console
	endCluster       = "cluster"        // the cluster did not open the console, or not within the timeout
	endBrowserClosed = "browser_closed" // the browser closed an open console
	endConsoleClosed = "console_closed" // the machine's side closed
	endIdle          = "idle"           // nothing passed for the idle time
	endOrderEnded    = "order_ended"    // the replica stopped running or the order ended
	endStalled       = "stalled"        // a write to either side did not complete within the timeout
)

// run opens the machine's console and passes bytes both ways until
// either side ends, a write stalls, nothing passes for the idle time, or
// the order stops running; then it closes the browser's WebSocket with the
// end's code and words and logs one line. From the first moment it reads
// the browser, so a browser that leaves while the cluster is still
// opening the console ends the session at once, whatever the cluster does.
func (sess *consoleSession) run(ctx context.Context) {
	s, kind := sess.s, string(sess.ct.Kind)
	// The browser's side lives until finish has closed it with the end's
	// code and words; ending its context first would drop the
	// connection without them.
	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	browser := websocket.NetConn(bctx, sess.c, websocket.MessageBinary)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// end keeps the first reason a part of the session stops for; the
	// other parts then see ctx end and stop too.
	end := make(chan string, 1)
	stop := func(why string) {
		select {
		case end <- why:
		default:
		}
		cancel()
	}
	pending := newConsoleBuffer(consolePending)
	go sess.readBrowser(ctx, browser, pending, stop)
	// dialed gets the machine's console, or nil, once the dial ends: the
	// dial is bounded by ctx, which ends with the session.
	dialed := make(chan net.Conn, 1)
	go func() {
		dctx, dcancel := context.WithTimeout(ctx, s.consoleTimeout())
		defer dcancel()
		vm, err := s.cfg.Consoles.OpenConsole(dctx, sess.o, sess.ct.Replica, sess.ct.Kind)
		dialed <- vm
		switch {
		case err != nil && ctx.Err() != nil:
			return // the browser left first: its reason is in end
		case err != nil:
			s.log.Warn("console not opened: the cluster gave none", "order_id", sess.o.ID, "replica", sess.ct.Replica,
				"kind", kind, "seconds", seconds(time.Since(sess.start)), "err", err.Error())
			s.metrics.consoleRefused(kind, "cluster")
			stop(endCluster)
			return
		}
		sess.opened.Store(true)
		go sess.writeMachine(ctx, vm, pending, stop)
		go sess.copyToBrowser(vm, browser, stop)
		go sess.watch(ctx, stop)
	}()
	why := <-end
	cancel()
	vm := <-dialed
	sess.finish(why, vm)
}

// consoleRead is the most read of either side at once; consolePending
// the most of the browser's bytes held for the machine's side (at least
// consoleRead).
const (
	consoleRead    = 32 << 10
	consolePending = 64 << 10
)

// readBrowser reads the browser's bytes into pending for writeMachine. It
// reads while the console is still being opened and while the machine's
// side is slow, up to consolePending bytes ahead, so that a browser that
// leaves is seen at once.
func (sess *consoleSession) readBrowser(ctx context.Context, browser net.Conn, pending *consoleBuffer, stop func(string)) {
	buf := make([]byte, consoleRead)
	for {
		k, err := browser.Read(buf)
		if k > 0 {
			sess.last.Store(time.Now().UnixNano())
			if !pending.put(ctx, buf[:k]) {
				return
			}
		}
		if err != nil {
			stop(sess.stalledOr(sess.browserEnd()))
			return
		}
	}
}

// browserEnd is how a browser that closed ended the session: while the
// console was still opening, or once it was open.
func (sess *consoleSession) browserEnd() string {
	if sess.opened.Load() {
		return endBrowserClosed
	}
	return endBrowserLeft
}

// writeMachine writes what readBrowser read to the machine's console,
// each write bounded by the console timeout.
func (sess *consoleSession) writeMachine(ctx context.Context, vm net.Conn, pending *consoleBuffer, stop func(string)) {
	var spare []byte
	for {
		b := pending.take(ctx, spare)
		if b == nil {
			return
		}
		if err := sess.write(vm, b, &sess.toMachineBy); err != nil {
			stop(sess.stalledOr(endConsoleClosed))
			return
		}
		sess.in.Add(int64(len(b)))
		spare = b
	}
}

// copyToBrowser passes the machine's bytes to the browser, each write
// bounded by the console timeout; a read of the machine's side has the
// idle time as its bound (watch).
func (sess *consoleSession) copyToBrowser(vm, browser net.Conn, stop func(string)) {
	buf := make([]byte, consoleRead)
	for {
		k, err := vm.Read(buf)
		if k > 0 {
			sess.last.Store(time.Now().UnixNano())
			if werr := sess.write(browser, buf[:k], &sess.toBrowserBy); werr != nil {
				stop(sess.stalledOr(endBrowserClosed))
				return
			}
			sess.out.Add(int64(k))
		}
		if err != nil {
			stop(sess.stalledOr(endConsoleClosed))
			return
		}
	}
}

// write writes b to c within the console timeout, its deadline kept in
// by while it runs, and after it if it failed.
func (sess *consoleSession) write(c net.Conn, b []byte, by *atomic.Int64) error {
	deadline := time.Now().Add(sess.s.consoleTimeout())
	by.Store(deadline.UnixNano())
	if err := c.SetWriteDeadline(deadline); err != nil {
		return err
	}
	if _, err := c.Write(b); err != nil {
		return err // the deadline stays for stalledOr: the session ends
	}
	by.Store(0)
	return nil
}

// stalledOr is endStalled when a write to either side is past its
// deadline, else end.
func (sess *consoleSession) stalledOr(end string) string {
	now := time.Now().UnixNano()
	for _, by := range []*atomic.Int64{&sess.toMachineBy, &sess.toBrowserBy} {
		if d := by.Load(); d != 0 && now >= d {
			return endStalled
		}
	}
	return end
}

// watch ends an open session when nothing passed for the idle time or its
// order no longer runs: a console outlives no order.
func (sess *consoleSession) watch(ctx context.Context, stop func(string)) {
	idle := sess.s.consoleIdle()
	t := time.NewTicker(min(consoleRecheck, idle/4))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if time.Since(time.Unix(0, sess.last.Load())) >= idle {
			stop(endIdle)
			return
		}
		if _, err := sess.s.consoleOrder(ctx, sess.ct.TenantID, sess.ct.OrderID, sess.ct.Replica); errors.Is(err, errNotRunning) || errors.Is(err, errConsoleOrder) {
			stop(endOrderEnded)
			return
		}
	}
}

// finish closes both sides with the end's code and words, counts the
// session and logs its one line.
func (sess *consoleSession) finish(why string, vm net.Conn) {
	s, kind := sess.s, string(sess.ct.Kind)
	switch why {
	case endIdle:
		_ = sess.c.Close(closeIdle, "nothing passed for "+s.consoleIdle().String()+"; open the console again")
	case endOrderEnded:
		_ = sess.c.Close(closeEnded, "the machine stopped running or its order ended")
	case endConsoleClosed:
		_ = sess.c.Close(websocket.StatusNormalClosure, "the machine's console closed")
	case endCluster:
		_ = sess.c.Close(closeNoConsole, "the cluster did not open the machine's console; try again")
	case endStalled:
		_ = sess.c.Close(closeStalled, "the console stopped taking bytes for "+s.consoleTimeout().String()+"; open the console again")
	default:
		_ = sess.c.CloseNow()
	}
	if vm != nil {
		_ = vm.Close()
	}
	s.metrics.consoleBytes(sess.in.Load(), sess.out.Load())
	s.metrics.consoleEnded(kind, why)
	s.log.Info("console session", "tenant_id", sess.ct.TenantID, "order_id", sess.o.ID, "replica", sess.ct.Replica, "kind", kind,
		"seconds", seconds(time.Since(sess.start)), "bytes_in", sess.in.Load(), "bytes_out", sess.out.Load(), "end", why)
}

func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) }

// checkConsoleOrigin refuses a console WebSocket whose Origin is not the
// page's own, compared exactly: scheme, host and port. A client that
// sends no Origin (not a browser, so no page of another site can make it
// send the request) passes; the ticket is its capability.
func (s *Server) checkConsoleOrigin(r *http.Request) error {
	origins := r.Header.Values("Origin")
	if len(origins) == 0 {
		return nil
	}
	if len(origins) == 1 && origins[0] == s.pageOrigin() {
		return nil
	}
	return errConsoleOrigin
}

var errConsoleOrigin = apierr.New(reason.BadOrigin)

// pageOrigin is the Machines page's origin, the one a console's
// WebSocket may come from: Config.ConsoleBase's scheme (http for ws:,
// https for wss:) and host, with no path.
func (s *Server) pageOrigin() string {
	base := s.cfg.ConsoleBase
	scheme, rest, ok := strings.Cut(base, "://")
	if !ok {
		return ""
	}
	switch scheme {
	case "wss":
		scheme = "https"
	case "ws":
		scheme = "http"
	default:
		return ""
	}
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		rest = rest[:i]
	}
	return scheme + "://" + rest
}

func (s *Server) consoleTimeout() time.Duration {
	if s.cfg.ConsoleTimeout > 0 {
		return s.cfg.ConsoleTimeout
	}
	return DefaultConsoleTimeout
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
