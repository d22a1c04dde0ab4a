package imagestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"
)

// Errors of the market records; callers test them with errors.Is.
var (
	// ErrNoCapacity is an order for more replicas than its listing has
	// free, or for a closed listing.
	ErrNoCapacity = errors.New("not enough free capacity")
	// ErrOwnListing is an order a host places on its own listing.
	ErrOwnListing = errors.New("a host cannot order from its own listing")
	// ErrOrderState is a state change the order's current state does not
	// allow (paying a cancelled order, cancelling a paid one).
	ErrOrderState = errors.New("the order is not in a state that allows this")
	// ErrInUse is a remove of an image that an order still needs, or of a
	// tenant that still holds something (TenantInUse).
	ErrInUse = errors.New("in use by an order")
	// ErrTooManyUnpaid is an order of a buyer who has as many orders
	// awaiting payment as CreateOrder allows.
	ErrTooManyUnpaid = errors.New("too many orders awaiting payment")
	// ErrDisputed is a refund of an order whose charge the buyer's bank
	// disputes: the dispute, not vmshelf, decides where that money goes.
	ErrDisputed = errors.New("the order's charge is disputed")
)

// OrderState is where an order stands (the states and their moves:
// docs/operations.md, "The VM market").
type OrderState string

const (
	// OrderAwaitingPayment: the checkout is open, capacity reserved.
	OrderAwaitingPayment OrderState = "awaitingPayment"
	// OrderPaid: the payment is confirmed; the provisioner's turn.
	OrderPaid OrderState = "paid"
	// OrderActive: the order's objects exist in the cluster.
	OrderActive OrderState = "active"
	// OrderExpired: the month is over, the replicas are halted.
	OrderExpired OrderState = "expired"
	// OrderCancelled: the checkout expired or the payment failed; the
	// capacity is released.
	OrderCancelled OrderState = "cancelled"
	// OrderRefunding: the buyer's money is to go back (Order.RefundCause
	// says why); Stripe has not confirmed it yet. Entered only from paid
	// (never active) or from cancelled with a payment, and never left for
	// active: the move here and MarkOrderActive exclude each other.
	OrderRefunding OrderState = "refunding"
	// OrderRefunded: Stripe refunded the payment; final.
	OrderRefunded OrderState = "refunded"
	// OrderRefundFailed: Stripe refused or failed the refund; it is tried
	// again at Order.RefundNextAt, and an operator is alerted.
	OrderRefundFailed OrderState = "refundFailed"
)

// OrderStates lists every state, in their order of succession.
var OrderStates = []OrderState{OrderAwaitingPayment, OrderPaid, OrderActive, OrderExpired, OrderCancelled,
	OrderRefunding, OrderRefunded, OrderRefundFailed}

// Refunding reports whether an order in state s is on its way back to
// the buyer: a refund is decided and not yet confirmed.
func (s OrderState) Refunding() bool { return s == OrderRefunding || s == OrderRefundFailed }

// Refunded reports whether an order in state s went to refunding at some
// point: refunding, refundFailed or refunded.
func (s OrderState) Refunded() bool { return s.Refunding() || s == OrderRefunded }

// The causes of a refund (Order.RefundCause, the cause label of
// vmshelf_refunds_total, and part of the refund's idempotency key).
const (
	// RefundPaidAfterCancel: the payment arrived for an order already
	// cancelled (its checkout expired or was given up).
	RefundPaidAfterCancel = "paidAfterCancel"
	// RefundNotProvisioned: a paid order was not active within the
	// deadline for a cause that does not pass by itself
	// (Order.BlockedCause).
	RefundNotProvisioned = "notProvisioned"
	// RefundImportFailed: the import of the buyer's own image failed for
	// good.
	RefundImportFailed = "importFailed"
)

// RefundCauses lists every refund cause.
var RefundCauses = []string{RefundPaidAfterCancel, RefundNotProvisioned, RefundImportFailed}

// The causes for which the provisioner cannot make a paid order run and
// that will not pass by themselves (Order.BlockedCause). "Could not ask"
// (the cluster or the store did not answer) is never one of them.
const (
	BlockedImageGone       = "imageGone"       // the order's own image was removed
	BlockedHostGone        = "hostGone"        // the host left the mesh or stopped hosting
	BlockedClusterRefused  = "clusterRefused"  // the cluster refused the objects as invalid
	BlockedImportFailed    = "importFailed"    // CDI's import of the own image failed for good
	BlockedImageNotOffered = "imageNotOffered" // the catalogue no longer has the image
)

// BlockedCauses lists every cause the provisioner may name.
var BlockedCauses = []string{BlockedImageGone, BlockedHostGone, BlockedClusterRefused, BlockedImportFailed, BlockedImageNotOffered}

// The bank's decisions on a dispute (Order.DisputeStatus once it is
// closed, Stripe's statuses of a closed dispute): won, the money stays
// with the host and the platform; lost, the bank gave it back to the
// buyer; warning_closed, an inquiry ended without becoming a dispute;
// prevented, the dispute was stopped before it began.
const (
	DisputeWon           = "won"
	DisputeLost          = "lost"
	DisputeWarningClosed = "warning_closed"
	DisputePrevented     = "prevented"
)

// DisputeOutcomes lists every decision CloseOrderDispute records.
var DisputeOutcomes = []string{DisputeWon, DisputeLost, DisputeWarningClosed, DisputePrevented}

// RefundOutcome is what Stripe answered a refund (SettleRefund).
type RefundOutcome struct {
	// RefundID is Stripe's re_… id; empty when Stripe gave none (it did
	// not answer).
	RefundID string
	// Status is Stripe's refund status: "succeeded" moves the order to
	// refunded; "pending" (or "requires_action") keeps it refunding until
	// RetryAt; "failed" or "canceled", or an Error, move it to
	// refundFailed until RetryAt.
	Status string
	// Error says why the attempt failed, in words without secrets.
	Error string
	// NewKey is set when Stripe's refund itself failed (status failed or
	// canceled): no money moved, and the next attempt needs a new
	// idempotency key, or Stripe would only repeat the failed refund.
	NewKey bool
	// RetryAt is when the refund is looked at again (pending or failed).
	RetryAt time.Time
	// Disputed is set when Stripe refused the refund because the charge
	// is disputed (its charge_disputed): nothing was refunded, and the
	// refund is held by the dispute (see Order.RefundHeld) instead of
	// being tried again.
	Disputed bool
}

// Holds reports whether an order in state s holds capacity of its listing:
// reserved while its checkout is open, taken while it runs.
func (s OrderState) Holds() bool {
	return s == OrderAwaitingPayment || s == OrderPaid || s == OrderActive
}

// Listing is a host's offer of replicas. Reserved and Running are derived
// by the store from the orders that hold capacity (never stored), so they
// cannot drift from the orders.
type Listing struct {
	ID     string `json:"listing_id"`
	HostID int64  `json:"-"`
	// UnitPrice is the price of one replica-month in minor units of
	// Currency (cents).
	UnitPrice int64     `json:"unit_price"`
	Currency  string    `json:"currency"`
	Capacity  int       `json:"capacity"`
	CreatedAt time.Time `json:"created_at"`
	ClosedAt  time.Time `json:"-"` // zero while open

	// Reserved is the replicas of orders awaiting payment, Running those
	// of paid and active orders.
	Reserved int `json:"reserved"`
	Running  int `json:"running"`
}

// Open reports whether the listing takes orders.
func (l Listing) Open() bool { return l.ClosedAt.IsZero() }

// Free is the replicas a new order may take: none on a closed listing,
// and never negative.
func (l Listing) Free() int {
	if !l.Open() {
		return 0
	}
	return max(0, l.Capacity-l.Reserved-l.Running)
}

// ImageKind says where an order's image comes from.
type ImageKind string

const (
	// ImageCatalogue: Order.Image is a catalogue id.
	ImageCatalogue ImageKind = "catalogue"
	// ImageUpload: Order.Image is the buyer's own upload id.
	ImageUpload ImageKind = "upload"
)

// Order is a buyer's purchase of Quantity replicas of a listing. The
// prices, fee and destination are copied from the listing and the host
// when the order is placed, so a later change of either never changes
// what a checkout charges or what the webhook checks. The user data is
// deliberately not a field: it is written with CreateOrder and read only
// by OrderUserData, so that no answer, log line or metric that shows an
// Order can carry it.
type Order struct {
	ID        string
	ListingID string
	BuyerID   int64
	HostID    int64
	Quantity  int
	ImageKind ImageKind
	Image     string
	Name      string

	UnitPrice   int64
	Total       int64 // UnitPrice × Quantity
	Fee         int64 // the platform's share (billing decides it)
	Currency    string
	Destination string // the host's Stripe account

	State OrderState
	// Reason says why an order was cancelled (checkoutExpired,
	// paymentFailed, checkoutFailed, ...); empty otherwise.
	Reason string

	// CheckoutID and CheckoutURL are the Stripe Checkout Session, set
	// once Stripe created it; empty before.
	CheckoutID  string
	CheckoutURL string
	// ReserveUntil is when the capacity reservation of an unpaid order
	// ends whatever Stripe says or fails to say: the checkout's own expiry
	// plus a grace. The sweeper acts on it.
	ReserveUntil time.Time

	CreatedAt time.Time
	PaidAt    time.Time // zero until paid
	// ExpiresAt is the end of the paid month; zero until paid.
	ExpiresAt time.Time
	EndedAt   time.Time // when it became expired or cancelled

	// Note is the provisioner's word on a problem with the order (the
	// cluster cannot be reached, an object could not be created), shown
	// to the buyer; empty when there is none. It never carries a secret.
	Note string

	// PaymentIntent is the Stripe PaymentIntent that paid the order (pi_…),
	// recorded when the payment was seen; what a refund refunds and what
	// dispute and charge events name.
	PaymentIntent string
	// BlockedCause is one of BlockedCauses while the provisioner knows the
	// paid order cannot run and will not by itself; BlockedSince is when
	// it first said so.
	BlockedCause string
	BlockedSince time.Time

	// RanAt is when a replica of the order was first seen running
	// (SetReplicaStates); zero if none ever was. An order that ran is
	// never refunded.
	RanAt time.Time

	// RefundFrom is the state the order left for refunding (paid,
	// cancelled, or active for an import that failed); RefundCause one
	// of RefundCauses. Empty unless the order
	// is refunding, refunded or refundFailed.
	RefundFrom  OrderState
	RefundCause string
	// RefundID is Stripe's refund (re_…) once it answered; RefundAttempts
	// counts the calls made; RefundGeneration counts the refunds Stripe
	// itself failed (each next attempt has its own idempotency key);
	// RefundNextAt is when the refund is tried or looked at next;
	// RefundError is the last failure in words.
	RefundID         string
	RefundAttempts   int
	RefundGeneration int
	RefundNextAt     time.Time
	RefundError      string
	RefundedAt       time.Time
	// DisputedAt is set when vmshelf learnt that the buyer's bank
	// disputes the charge: from charge.dispute.created, or from Stripe's
	// refusal of a refund (charge_disputed), whichever came first.
	// DisputeID is the dispute (du_… or dp_…), from its event. Shown and
	// alerted, nothing halted; the order is never refunded automatically
	// from then on.
	DisputeID  string
	DisputedAt time.Time
	// DisputeStatus is the bank's decision once the dispute is closed
	// (one of DisputeOutcomes), and DisputeClosedAt when vmshelf heard of
	// it; "" and zero while the dispute is open.
	DisputeStatus   string
	DisputeClosedAt time.Time
}

// RefundHeld reports whether o's refund is held by a dispute: decided
// (refunding) but never to be tried again, since its charge is disputed.
// Only a person refunds it (in Stripe's Dashboard), which charge.refunded
// then records.
func (o Order) RefundHeld() bool { return o.State.Refunding() && !o.DisputedAt.IsZero() }

// The states a replica is reported in (ReplicaState.State): the machines
// page's words, from the VirtualMachine's and its DataVolume's status.
const (
	ReplicaRunning   = "running"
	ReplicaStarting  = "starting"
	ReplicaImporting = "importing" // CDI copies the disk
	ReplicaPaused    = "paused"
	ReplicaStopped   = "stopped"
	ReplicaFailed    = "failed"
)

// ReplicaStateNames lists every replica state.
var ReplicaStateNames = []string{ReplicaRunning, ReplicaStarting, ReplicaImporting, ReplicaPaused, ReplicaStopped, ReplicaFailed}

// ReplicaState is what the provisioner last saw of one replica of an
// order.
type ReplicaState struct {
	Index int    // 0 .. Quantity-1
	Name  string // the VirtualMachine: vm-<order>-<index>
	State string // one of ReplicaStateNames
	// Detail is what the state was read from: the VirtualMachine's
	// printableStatus ("Running", "ErrImagePull"...) or the DataVolume's
	// phase ("ImportInProgress", "Failed"...).
	Detail string
	// Progress is CDI's import progress ("42.50%") while importing.
	Progress   string
	ObservedAt time.Time
}

// WebhookEvent is a Stripe event the webhook handled, remembered by its id
// so that a replay changes nothing.
type WebhookEvent struct {
	ID     string
	Type   string
	Result string
	At     time.Time
}

// NewListingID returns a fresh listing id: "l" and 16 hex characters, a
// DNS label.
func NewListingID() string { return "l" + randomHex(8) }

// NewOrderID returns a fresh order id: "o" and 16 hex characters, a DNS
// label that starts with a letter, so that "vm-<order>-<i>" and
// "market-<buyer>" names built from it are valid Kubernetes names.
func NewOrderID() string { return "o" + randomHex(8) }

// ValidOrderID reports whether id has NewOrderID's form.
func ValidOrderID(id string) bool { return validID(id, 'o') }

// ValidListingID reports whether id has NewListingID's form.
func ValidListingID(id string) bool { return validID(id, 'l') }

func validID(id string, prefix byte) bool {
	if len(id) != 17 || id[0] != prefix {
		return false
	}
	for _, c := range id[1:] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// MarketStore holds the market's records: listings, orders and the
// payments, refunds and disputes behind them.
type MarketStore interface {
	Listings
	Orders
	Provisioning
	Billing
}

// Listings holds what hosts offer: the control plane creates, lists and
// closes them. A listing's reserved and running replicas are summed from
// its orders when it is read, never stored.
type Listings interface {
	// CreateListing stores l (ID, HostID, UnitPrice, Currency, Capacity,
	// CreatedAt; a zero CreatedAt means now) open, and returns it as
	// stored. ErrExists if the id is taken, ErrNotFound if the host does
	// not exist; a capacity or unit price below 1 or an empty currency is
	// an error.
	CreateListing(ctx context.Context, l Listing) (Listing, error)
	// Listing returns a listing, open or closed, with its derived counts;
	// ErrNotFound.
	Listing(ctx context.Context, id string) (Listing, error)
	// Listings returns the host's listings, open and closed, oldest first.
	Listings(ctx context.Context, hostID int64) ([]Listing, error)
	// OpenListings returns every open listing, oldest first.
	OpenListings(ctx context.Context) ([]Listing, error)
	// CloseListing closes the host's listing at now: it takes no more
	// orders; orders already placed go on. Closing a closed listing is
	// not an error. ErrNotFound if the host has no such listing.
	CloseListing(ctx context.Context, hostID int64, id string, now time.Time) error
}

// Orders is the control plane's side of an order's life: placing it,
// its checkout, its payment or cancel, and reading it back; the sweeper
// cancels the overdue ones. Capacity is reserved in the same transaction
// that creates an order, so two buyers can never both take the last
// replica.
type Orders interface {
	// CreateOrder stores o in state awaitingPayment with its user data,
	// reserving o.Quantity replicas of o.ListingID in the same
	// transaction. Errors: ErrExists (the id is taken; checked first, so
	// a retry hears it rather than that its own reservation took the
	// last replica), ErrNotFound (no such listing or buyer, or an upload
	// image the buyer does not hold: checked in the transaction, so an
	// image removed meanwhile is not ordered), ErrOwnListing (the buyer
	// is the host), ErrNoCapacity (closed, or fewer free than
	// o.Quantity). The listing's host, price and currency and the host's
	// Stripe account (o.Destination) are checked against o, as are
	// Total = UnitPrice × Quantity and 0 <= Fee <= Total: a listing is
	// immutable once created, so a mismatch is the caller's bug (an
	// error). A zero CreatedAt means now; ReserveUntil is required. The
	// fields a state change sets (State, Reason, CheckoutID, CheckoutURL,
	// PaidAt, ExpiresAt, EndedAt) and Note are ignored. ErrTooManyUnpaid
	// if the buyer already has maxUnpaid orders awaiting payment (counted
	// in the same transaction; maxUnpaid <= 0 means no limit).
	CreateOrder(ctx context.Context, o Order, userData string, maxUnpaid int) error
	// SetCheckout records the Stripe Checkout Session of an order
	// awaiting payment (again: the last call wins); ErrOrderState in any
	// other state, ErrNotFound if there is no such order.
	SetCheckout(ctx context.Context, orderID, checkoutID, checkoutURL string) error
	// Order returns an order; ErrNotFound.
	Order(ctx context.Context, id string) (Order, error)
	// Orders returns the buyer's orders, newest first.
	Orders(ctx context.Context, buyerID int64) ([]Order, error)
	// OrdersInState returns every order in state, oldest first.
	OrdersInState(ctx context.Context, state OrderState) ([]Order, error)

	// PayOrder moves an order from awaitingPayment to paid at paidAt,
	// running until expiresAt, and says whether this call moved it. An
	// order already paid, active or expired is left as it is (false, nil:
	// a replayed event); a cancelled one is ErrOrderState. Every state
	// change (this one, CancelOrder, MarkOrderActive, ExpireOrder) returns
	// ErrNotFound for an unknown id. Of concurrent calls for one order
	// exactly one moves it: the one that may report the payment (a metric,
	// a log line, the provisioner's kick).
	PayOrder(ctx context.Context, id string, paidAt, expiresAt time.Time) (moved bool, err error)
	// CancelOrder moves an order from awaitingPayment to cancelled with
	// reason at now, releasing its capacity. A cancelled order is left as
	// it is and nil returned; a paid, active or expired one is
	// ErrOrderState.
	CancelOrder(ctx context.Context, id, reason string, now time.Time) error
	// CancelOwnOrder is a buyer's cancel of one of its own orders awaiting
	// payment: CancelOrder's move, in the same conditional UPDATE, so of
	// this cancel and a payment of the order (PayOrder) exactly one
	// applies, and a payment that loses is one for a cancelled order.
	// nil only when this call cancelled the order; ErrNotFound when
	// buyerID has no order id (another buyer's order looks the same);
	// ErrOrderState in any other state, cancelled included.
	CancelOwnOrder(ctx context.Context, buyerID int64, id, reason string, now time.Time) error

	// OverdueOrders returns the orders awaiting payment whose
	// ReserveUntil is at or before now, oldest first: the sweeper asks
	// Stripe about each and cancels it.
	OverdueOrders(ctx context.Context, now time.Time) ([]Order, error)
	// OrderCounts returns the number of orders in each state (every state
	// present, zero included).
	OrderCounts(ctx context.Context) (map[OrderState]int64, error)
}

// Provisioning is what the provisioner writes back on the orders it
// carries out, and the user data only it reads.
type Provisioning interface {
	// OrderUserData returns the cloud-init user data of an order ("" if
	// none): for the provisioner only. ErrNotFound.
	OrderUserData(ctx context.Context, id string) (string, error)
	// MarkOrderActive moves a paid order to active: its objects exist in
	// the cluster. An active one is left as it is and nil returned; any
	// other state is ErrOrderState.
	MarkOrderActive(ctx context.Context, id string) error
	// ExpireOrder moves a paid or active order whose ExpiresAt is at or
	// before now to expired at now: its month is over, its replicas are
	// halted, its capacity returns to the listing. An expired order is
	// left as it is and nil returned; an order awaiting payment or
	// cancelled, or one whose month is not over at now, is ErrOrderState.
	// Its fetch tokens stay valid: the provisioner revokes them
	// (RevokeOrderTokens) once it has halted the replicas, which may
	// still be importing.
	ExpireOrder(ctx context.Context, id string, now time.Time) error
	// SetOrderNote sets the provisioner's note on an order, in any state;
	// "" clears it. ErrNotFound for an unknown order.
	SetOrderNote(ctx context.Context, id, note string) error
	// SetOrderBlocked records (cause one of BlockedCauses) or clears ("")
	// the cause that keeps a paid order from running. BlockedSince is set
	// at now when the cause first appears and kept while it stays; a
	// cleared cause clears it. ErrNotFound.
	SetOrderBlocked(ctx context.Context, id, cause string, now time.Time) error
	// SetReplicaStates replaces the replica states stored for an order
	// with states (none: forget them); the first running state of a
	// paid, active or expired order sets its RanAt. Each index must be in 0 ..
	// Quantity-1 and appear once, each state one of ReplicaStateNames;
	// anything else is an error and changes nothing. ErrNotFound for an
	// unknown order.
	SetReplicaStates(ctx context.Context, orderID string, states []ReplicaState) error
	// ReplicaStates returns the replica states stored for an order, by
	// index (none: empty). ErrNotFound for an unknown order.
	ReplicaStates(ctx context.Context, orderID string) ([]ReplicaState, error)
}

// Billing is what Stripe's webhook and the refund worker record: the
// payment behind an order, its refund and its dispute, and the events
// already handled.
type Billing interface {
	// SetOrderPaymentIntent records the PaymentIntent that paid an order,
	// in any state; setting the same one again is nil, another one is
	// ErrOrderState (one order, one payment). ErrNotFound.
	SetOrderPaymentIntent(ctx context.Context, id, paymentIntent string) error
	// OrderByPaymentIntent returns the order paid by a PaymentIntent;
	// ErrNotFound.
	OrderByPaymentIntent(ctx context.Context, paymentIntent string) (Order, error)

	// StartRefund moves an order to refunding for cause, to be tried at
	// now: from paid or from cancelled, or from active for
	// RefundImportFailed if no replica ever ran (RanAt zero), and only if
	// its PaymentIntent is recorded and its charge is not disputed. In one
	// conditional UPDATE of the order, like MarkOrderActive's and
	// MarkOrderDisputed's, so of two exactly one applies. moved reports
	// whether this call moved it; an order already refunding, refunded or
	// refundFailed is left as it is (false, nil); a disputed one is
	// ErrDisputed; any other state (active, expired, awaiting payment,
	// cancelled without a payment) is ErrOrderState.
	StartRefund(ctx context.Context, id, cause string, now time.Time) (moved bool, err error)
	// DueRefunds returns the orders refunding or refundFailed whose
	// RefundNextAt is at or before now, oldest first; never a disputed
	// one (its refund is held).
	DueRefunds(ctx context.Context, now time.Time) ([]Order, error)
	// ClaimRefund takes the next attempt of a due refund for one caller:
	// if the order is refunding or refundFailed with RefundNextAt at or
	// before now, RefundNextAt becomes until and the attempts count one
	// more, and claimed is true with the order as claimed. Of concurrent
	// claims (two replicas) exactly one gets it; the other gets false. A
	// claimant that dies leaves the refund due again at until. An order
	// whose charge is disputed is never claimed (false): the check is in
	// the claim's own UPDATE, so a dispute recorded after DueRefunds
	// listed the order still stops the attempt.
	ClaimRefund(ctx context.Context, id string, now, until time.Time) (o Order, claimed bool, err error)
	// SettleRefund records Stripe's answer to a refund (see
	// RefundOutcome) on an order refunding or refundFailed: succeeded →
	// refunded at now; Disputed → refunding, held, DisputedAt set at now
	// unless set; otherwise it stays refunding (pending) or becomes
	// refundFailed, due at RetryAt — but a disputed order stays refunding
	// (held), never refundFailed. A refunded order is left as it is (nil:
	// a late or replayed answer); any other state is ErrOrderState.
	SettleRefund(ctx context.Context, id string, out RefundOutcome, now time.Time) error
	// MarkOrderDisputed records a dispute (disputeID, not empty) of the
	// order's charge: DisputedAt at now unless a refusal already set it,
	// and the first dispute id (moved false after it). A refund of the
	// order is held from then on: refundFailed becomes refunding, in the
	// same UPDATE that ClaimRefund's excludes. ErrNotFound.
	MarkOrderDisputed(ctx context.Context, id, disputeID string, now time.Time) (moved bool, err error)
	// CloseOrderDispute records the bank's decision (one of
	// DisputeOutcomes) on the order's dispute at now; the first decision
	// is kept (moved false after it). Nothing else of the order changes.
	// ErrOrderState if no dispute of the order is recorded, ErrNotFound.
	CloseOrderDispute(ctx context.Context, id, outcome string, now time.Time) (moved bool, err error)

	// WebhookEventSeen reports whether an event with this id was recorded.
	WebhookEventSeen(ctx context.Context, id string) (bool, error)
	// RecordWebhookEvent remembers a handled event (a zero At means now);
	// recording an id again is not an error and keeps the first record.
	RecordWebhookEvent(ctx context.Context, ev WebhookEvent) error
}
