package market

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/readiness"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// statusAnswer is POST /market/vms/status: everything a box sees of the
// edge. Arrays are empty, never null, so clients can iterate without
// checks. Nothing here is a secret: images carry their public fields,
// orders never their user data, the account says whether a payout account
// exists but not its id.
type statusAnswer struct {
	Available bool               `json:"available"`
	Reason    string             `json:"reason,omitempty"`
	Images    []imagestore.Image `json:"images"`
	// Sessions are the unfinished resumable uploads: their bytes are on
	// the edge's disk and each counts against the image quota.
	Sessions []sessionInfo `json:"sessions"`
	// Tickets are the unused, unexpired tickets: each counts against the
	// image quota until it is used, cancelled or expires. Never the
	// capability itself, which only the ticket's answer carried.
	Tickets  []ticketInfo  `json:"tickets"`
	Listings []listingInfo `json:"listings"`
	Offers   []offerInfo   `json:"offers"`
	Orders   []orderInfo   `json:"orders"`
	Account  account       `json:"account"`
	Limits   limits        `json:"limits"`
	// Currency is the edge's listing currency (--currency, lower case):
	// a host creating its first listing needs it to read its price.
	Currency string `json:"currency,omitempty"`
	// DemoPayments says the payments go to a Stripe stand-in on this
	// machine (a trial edge): no money moves. Absent otherwise.
	DemoPayments bool `json:"demo_payments,omitempty"`
}

// limits are the edge's limits a client should know before it uploads
// (the status answer first lacked them; a page that learns the quota
// only from a 409 after the user picked a file is what users complain of).
type limits struct {
	ImagesPerTenant int    `json:"images_per_tenant"`
	UploadMaxBytes  int64  `json:"upload_max_bytes,omitempty"`
	MaxVirtualBytes uint64 `json:"max_virtual_bytes,omitempty"`
	MaxTransfers    int    `json:"max_transfers,omitempty"`
}

type account struct {
	Name          string `json:"name"`
	InMesh        bool   `json:"in_mesh"`
	Sharing       bool   `json:"sharing"`
	HostsVMs      bool   `json:"hosts_vms"`
	Appliance     string `json:"appliance"`
	PayoutAccount bool   `json:"payout_account"`
	// The onboarded account's state (onboarding.go); false for an
	// account the operator set.
	StripeOnboarded      bool `json:"stripe_onboarded"`
	StripeChargesEnabled bool `json:"stripe_charges_enabled"`
	StripePayoutsEnabled bool `json:"stripe_payouts_enabled"`
}

// offerInfo is another host's open listing, as a buyer sees it: what one
// replica is (the edge's size of a replica; an image that needs more gets
// more) and what it costs a month.
type offerInfo struct {
	ListingID string `json:"listing_id"`
	Host      string `json:"host"`
	UnitPrice int64  `json:"unit_price"`
	Currency  string `json:"currency"`
	Capacity  int    `json:"capacity"`
	Free      int    `json:"free"`
	ReplicaSize
}

// orderInfo is one of the buyer's orders.
type orderInfo struct {
	OrderID   string                `json:"order_id"`
	ListingID string                `json:"listing_id"`
	Host      string                `json:"host"`
	State     imagestore.OrderState `json:"state"`
	// Reason says why a cancelled order was cancelled.
	Reason    string               `json:"reason,omitempty"`
	Quantity  int                  `json:"quantity"`
	Image     string               `json:"image"`
	ImageKind imagestore.ImageKind `json:"image_kind"`
	Name      string               `json:"name"`
	Total     int64                `json:"total"`
	Currency  string               `json:"currency"`
	CreatedAt time.Time            `json:"created_at"`
	PaidAt    *time.Time           `json:"paid_at,omitempty"`
	// ExpiresAt is the end of the paid month (null until paid).
	ExpiresAt *time.Time `json:"expires_at"`
	// CheckoutURL is where an order awaiting payment is paid.
	CheckoutURL string `json:"checkout_url,omitempty"`
	// Address is the replicas' web address (vm-<order>.<--vms-domain>),
	// empty without --vms-domain.
	Address  string        `json:"address"`
	Replicas []replicaInfo `json:"replicas"`
	// Note is the provisioner's word on a problem with the order (the
	// cluster cannot be reached, an object could not be made).
	Note string `json:"note,omitempty"`
	// Blocked is what keeps a paid order from running and will not pass
	// by itself (imagestore.BlockedCauses): refunded after the deadline.
	Blocked string `json:"blocked,omitempty"`
	// Refund is the refund of an order refunding, refundFailed or
	// refunded.
	Refund *refundInfo `json:"refund,omitempty"`
	// DisputedAt is when the buyer's bank disputed the charge (as far as
	// the edge knows: its event, or Stripe's refusal of a refund).
	DisputedAt *time.Time `json:"disputed_at,omitempty"`
	// DisputeStatus is, for a disputed order, "open" until the bank
	// decides, then its decision (imagestore.DisputeOutcomes: won, lost,
	// warning_closed, prevented) from DisputeClosedAt on.
	DisputeStatus   string     `json:"dispute_status,omitempty"`
	DisputeClosedAt *time.Time `json:"dispute_closed_at,omitempty"`
}

// disputeOpen is orderInfo.DisputeStatus while the bank has not decided.
const disputeOpen = "open"

// refundInfo is an order's refund as status shows it: its cause
// (imagestore.RefundCauses), the attempts made, when the next is due
// (while not refunded), the last failure in words, and when it was done.
type refundInfo struct {
	Cause         string     `json:"cause"`
	Attempts      int        `json:"attempts"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	Error         string     `json:"error,omitempty"`
	RefundedAt    *time.Time `json:"refunded_at,omitempty"`
	// HeldByDispute is set while the refund is held because the charge is
	// disputed: no attempt follows (no next_attempt_at); the dispute
	// decides where the money goes.
	HeldByDispute bool `json:"held_by_dispute,omitempty"`
}

// replicaInfo is a replica as the provisioner last saw it: state is one
// of imagestore.ReplicaStateNames; detail what KubeVirt or CDI said
// ("ErrImagePull"), progress CDI's import progress while importing.
type replicaInfo struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	Detail   string `json:"detail,omitempty"`
	Progress string `json:"progress,omitempty"`
}

// sessionInfo is an open upload session as status shows it: offset is
// the bytes durably received, length the size of the whole image.
type sessionInfo struct {
	UploadID  string    `json:"upload_id"`
	Name      string    `json:"name"`
	Offset    int64     `json:"offset"`
	Length    int64     `json:"length"`
	ExpiresAt time.Time `json:"expires_at"`
}

// ticketInfo is an unused ticket as status shows it.
type ticketInfo struct {
	UploadID  string    `json:"upload_id"`
	Name      string    `json:"name"`
	EFI       bool      `json:"efi"`
	ExpiresAt time.Time `json:"expires_at"`
}

type statusRequest struct{}

func (s *Server) status(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	// An empty body is {}; anything else must still be a valid, empty
	// object (unknown fields are refused like everywhere).
	var req statusRequest
	if err := s.decodeBody(w, r, &req, true); err != nil {
		s.fail(w, r, err)
		return
	}
	images, err := s.st.Images(r.Context(), t.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if images == nil {
		images = []imagestore.Image{}
	}
	open, err := s.st.OpenSessions(r.Context(), t.ID, s.cfg.Now())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sessions := make([]sessionInfo, 0, len(open))
	for _, us := range open {
		sessions = append(sessions, sessionInfo{UploadID: us.UploadID, Name: us.Name,
			Offset: us.Offset, Length: us.Length, ExpiresAt: us.ExpiresAt.UTC()})
	}
	tickets, err := s.unusedTickets(r.Context(), t)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ans := statusAnswer{
		Available: true,
		Images:    images,
		Sessions:  sessions,
		Tickets:   tickets,
		Account: account{
			Name:          t.Name,
			InMesh:        t.InMesh,
			Sharing:       t.Sharing,
			HostsVMs:      t.HostsVMs,
			Appliance:     t.Appliance,
			PayoutAccount: payoutAccount(t),

			StripeOnboarded:      t.StripeOnboarded,
			StripeChargesEnabled: t.StripeChargesEnabled,
			StripePayoutsEnabled: t.StripePayoutsEnabled,
		},
		Limits: limits{
			ImagesPerTenant: s.cfg.ImagesPerTenant,
			UploadMaxBytes:  s.cfg.UploadMax,
			MaxVirtualBytes: s.cfg.MaxVirtualSize,
			MaxTransfers:    s.cfg.MaxTransfers,
		},
		Currency:     s.cfg.Currency,
		DemoPayments: s.cfg.DemoPayments,
	}
	if e := s.machinesUnavailable(t, true); e != nil {
		ans.Available, ans.Reason = false, e.Reason
	}
	if ans.Listings, ans.Offers, ans.Orders, err = s.market(r.Context(), t); err != nil {
		s.fail(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, ans)
}

// unusedTickets is t's tickets that count against its quota, for status.
func (s *Server) unusedTickets(ctx context.Context, t imagestore.Tenant) ([]ticketInfo, error) {
	unused, err := s.st.UnusedTickets(ctx, t.ID, s.cfg.Now())
	if err != nil {
		return nil, err
	}
	tickets := make([]ticketInfo, 0, len(unused))
	for _, tk := range unused {
		tickets = append(tickets, ticketInfo{UploadID: tk.UploadID, Name: tk.Name, EFI: tk.EFI, ExpiresAt: tk.ExpiresAt.UTC()})
	}
	return tickets, nil
}

// market is t's part of the VM market for status: its own listings, the
// open listings of hosts that can still host, and its orders.
func (s *Server) market(ctx context.Context, t imagestore.Tenant) ([]listingInfo, []offerInfo, []orderInfo, error) {
	own, err := s.st.Listings(ctx, t.ID)
	if err != nil {
		return nil, nil, nil, err
	}
	listings := make([]listingInfo, 0, len(own))
	for _, l := range own {
		listings = append(listings, listingOf(l))
	}
	open, err := s.st.OpenListings(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	mine, err := s.st.Orders(ctx, t.ID)
	if err != nil {
		return nil, nil, nil, err
	}
	// The tenants are read only for an answer that names a host: an edge
	// has a tenant per box, and reading them all was a quarter of the CPU
	// of a status for a box that neither bought nor sees an offer. Read
	// after the listings and orders, they hold every host these name (a
	// tenant with an open listing or an order cannot be removed).
	var byID map[int64]imagestore.Tenant
	if len(mine) > 0 || slices.ContainsFunc(open, func(l imagestore.Listing) bool { return l.HostID != t.ID }) {
		tenants, err := s.st.Tenants(ctx)
		if err != nil {
			return nil, nil, nil, err
		}
		byID = make(map[int64]imagestore.Tenant, len(tenants))
		for _, tn := range tenants {
			byID[tn.ID] = tn
		}
	}
	offers := []offerInfo{}
	for _, l := range open {
		host, ok := byID[l.HostID]
		if l.HostID == t.ID || !ok || !canHost(host) {
			continue
		}
		offers = append(offers, offerInfo{ListingID: l.ID, Host: host.Name, UnitPrice: l.UnitPrice,
			Currency: l.Currency, Capacity: l.Capacity, Free: l.Free(), ReplicaSize: s.cfg.Replica})
	}
	orders := make([]orderInfo, 0, len(mine))
	for _, o := range mine {
		var seen []imagestore.ReplicaState
		if o.State == imagestore.OrderPaid || o.State == imagestore.OrderActive || o.State == imagestore.OrderExpired {
			if seen, err = s.st.ReplicaStates(ctx, o.ID); err != nil {
				return nil, nil, nil, err
			}
		}
		orders = append(orders, s.orderOf(o, byID[o.HostID].Name, seen))
	}
	return listings, offers, orders, nil
}

// orderOf is o as its buyer sees it, with the replica states the
// provisioner stored (seen). A replica it has not seen yet is "starting"
// while the order is paid or active, "stopped" once it expired.
func (s *Server) orderOf(o imagestore.Order, host string, seen []imagestore.ReplicaState) orderInfo {
	oi := orderInfo{OrderID: o.ID, ListingID: o.ListingID, Host: host, State: o.State, Reason: o.Reason,
		Quantity: o.Quantity, Image: o.Image, ImageKind: o.ImageKind, Name: o.Name, Total: o.Total,
		Currency: o.Currency, CreatedAt: o.CreatedAt.UTC(), Replicas: []replicaInfo{}, Note: o.Note}
	if !o.PaidAt.IsZero() {
		paid, exp := o.PaidAt.UTC(), o.ExpiresAt.UTC()
		oi.PaidAt, oi.ExpiresAt = &paid, &exp
	}
	if o.State == imagestore.OrderAwaitingPayment {
		oi.CheckoutURL = o.CheckoutURL
	}
	if o.State == imagestore.OrderPaid || o.State == imagestore.OrderActive {
		oi.Blocked = o.BlockedCause
	}
	if o.State.Refunded() {
		oi.Refund = &refundInfo{Cause: o.RefundCause, Attempts: o.RefundAttempts, Error: o.RefundError, HeldByDispute: o.RefundHeld()}
		if !o.RefundNextAt.IsZero() && !o.RefundHeld() {
			next := o.RefundNextAt.UTC()
			oi.Refund.NextAttemptAt = &next
		}
		if !o.RefundedAt.IsZero() {
			done := o.RefundedAt.UTC()
			oi.Refund.RefundedAt = &done
		}
	}
	if !o.DisputedAt.IsZero() {
		d := o.DisputedAt.UTC()
		oi.DisputedAt, oi.DisputeStatus = &d, disputeOpen
	}
	if !o.DisputeClosedAt.IsZero() {
		c := o.DisputeClosedAt.UTC()
		oi.DisputeStatus, oi.DisputeClosedAt = o.DisputeStatus, &c
	}
	if s.cfg.VMsDomain != "" {
		oi.Address = "vm-" + o.ID + "." + s.cfg.VMsDomain
	}
	unseen := ""
	switch o.State {
	case imagestore.OrderPaid, imagestore.OrderActive:
		unseen = imagestore.ReplicaStarting
	case imagestore.OrderExpired:
		unseen = imagestore.ReplicaStopped
	}
	if unseen == "" {
		return oi
	}
	byIndex := make(map[int]imagestore.ReplicaState, len(seen))
	for _, rs := range seen {
		byIndex[rs.Index] = rs
	}
	for i := range o.Quantity {
		ri := replicaInfo{Name: fmt.Sprintf("vm-%s-%d", o.ID, i), State: unseen}
		if rs, ok := byIndex[i]; ok {
			ri.State, ri.Detail, ri.Progress = rs.State, rs.Detail, rs.Progress
		}
		oi.Replicas = append(oi.Replicas, ri)
	}
	return oi
}

// canHost reports whether t can still run machines it listed: in the
// mesh, sharing, hosting with an appliance node, with a payout account.
func canHost(t imagestore.Tenant) bool {
	return t.Sharing && t.InMesh && t.HostsVMs && t.Appliance != "" && payoutAccount(t)
}

// probeTimeout bounds each readiness check, so a hung disk or store makes
// the probe fail instead of hang.
const probeTimeout = 2 * time.Second

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, r, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz is ready when the store answers and can write, the blob store
// answers, and the disk has room for the store's own writes. A 503 names
// the reason: storeCorrupt (a damaged page was met: restore the db),
// storeUnwritable (writes fail: I/O errors, a read-only file system),
// noSpace (the disk is full: remove images or free space),
// storeUnreachable (the record store does not answer in time, refuses or
// restarts), notReady (the record store failed otherwise),
// blobStoreUnreachable (the S3 bucket or the image directory does not
// answer). Every answer lists every problem in reasons, the first being
// the one reason (or machines) names: a store and a disk can fail at
// once, and an operator who fixes the first should not learn of the next
// only then. The causes go to the log, once per change of verdict
// (readiness.Watch): a probe every few seconds must not write a line
// each.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
	defer cancel()
	asked := time.Now()
	problems := s.notReady(ctx)
	s.readiness.Note(asked, problems)
	machines := s.machinesProblems()
	if len(problems) == 0 {
		ans := readyAnswer{Status: "ok", Reasons: machines}
		if len(machines) > 0 {
			ans.Machines = machines[0]
		}
		s.writeJSON(w, r, http.StatusOK, ans)
		return
	}
	reasons := make([]string, 0, len(problems)+len(machines))
	for _, p := range problems {
		reasons = append(reasons, p.Reason)
	}
	s.writeJSON(w, r, problems[0].Status, notReadyAnswer{Error: problems[0].Msg, Reason: problems[0].Reason, Reasons: append(reasons, machines...)})
}

// notReady is why the edge is not ready, the record store's problem
// first, then the image storage's (one that does not answer, or else a
// full disk); none when it is ready.
func (s *Server) notReady(ctx context.Context) []*apierr.Error {
	// The blob store's own Ping is cheap and cached (a probe flood asks
	// it once); Available is asked only of a store that answers, since
	// over S3 it lists the bucket.
	var avail int64
	storeErr, blobErr := readiness.Ask(ctx, s.st.Ping, func(ctx context.Context) (err error) {
		if err = s.blobs.Ping(ctx); err == nil {
			avail, err = s.blobs.Available(ctx)
		}
		return err
	})
	var out []*apierr.Error
	if p := readiness.Store(storeErr); p != nil {
		out = append(out, p)
	}
	switch {
	case blobErr != nil:
		out = append(out, readiness.Blobs(blobErr))
	case avail < s.cfg.MinFree:
		// A store write that failed for space before the room came back
		// is no reason to wait; one while the disk is still full is this.
		out = append(out, apierr.Wrap(storeErr, reason.NotReadyNoSpace))
	}
	return out
}

// readyAnswer is /readyz's 200. Machines says why the VM market cannot
// take payments or run machines although --vms-enable is on
// (paymentsUnavailable: no STRIPE_SECRET_KEY; webhookNotConfigured: no
// STRIPE_WEBHOOK_SECRET, so no payment is ever confirmed;
// clusterUnreachable: the provisioner cannot reach the Kubernetes API, so
// paid orders wait), and Reasons every such reason, Machines first. The
// edge is still ready: uploads, fetches and everything else work, and
// taking it out of a load balancer would stop those too.
type readyAnswer struct {
	Status   string   `json:"status"`
	Machines string   `json:"machines,omitempty"`
	Reasons  []string `json:"reasons,omitempty"`
}

// notReadyAnswer is /readyz's 503: the error answer of its first problem,
// and every problem in reasons, the machines' last.
type notReadyAnswer struct {
	Error   string   `json:"error"`
	Reason  string   `json:"reason"`
	Reasons []string `json:"reasons"`
}

// machinesProblems are the reasons of readyAnswer.Machines, in the order
// an order meets them: without Stripe no order is paid, before a cluster
// is needed.
func (s *Server) machinesProblems() []string {
	if !s.cfg.VMsEnabled {
		return nil
	}
	var out []string
	if s.cfg.Payments == nil {
		out = append(out, errPaymentsUnavailable.Reason)
	}
	if s.cfg.WebhookSecret == "" {
		out = append(out, errWebhookNotConfigured.Reason)
	}
	if s.cfg.ClusterReady != nil && s.cfg.ClusterReady() != nil {
		// Why goes to the provisioner's log and the orders' notes.
		out = append(out, reason.ClusterUnreachable)
	}
	return out
}
