package market

import (
	"context"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Store is the part of imagestore.Store the control plane calls: the
// tenants' tickets and images, the marketplace's listings and orders, the
// webhook's events, and what the status and metrics report. Naming it here
// shows what the API can reach (of upload sessions only a tenant's open
// ones, no lease, and of an order's life only placing, paying,
// cancelling and refunding: the provisioner carries out the rest), and lets a test fake
// just this. The methods mean what imagestore.Store documents.
type Store interface {
	// Health and figures, for the probes, the status and the metrics.
	Ping(ctx context.Context) error
	Stats(ctx context.Context) (imagestore.Stats, error)
	OrderCounts(ctx context.Context) (map[imagestore.OrderState]int64, error)

	// Tenants.
	TenantByToken(ctx context.Context, token imagestore.Hash) (imagestore.Tenant, error)
	TenantByID(ctx context.Context, id int64) (imagestore.Tenant, error)
	Tenants(ctx context.Context) ([]imagestore.Tenant, error)
	SetOnboardedAccount(ctx context.Context, tenantID int64, account string) (imagestore.Tenant, error)
	SetAccountCapabilities(ctx context.Context, account string, charges, payouts bool) (imagestore.Tenant, error)

	// Tickets, and the uploads they admit.
	CreateTicket(ctx context.Context, tk imagestore.Ticket, ticket imagestore.Hash, quota int) error
	// WithdrawTicket takes back a ticket whose answer did not reach its
	// client (tickets.go).
	WithdrawTicket(ctx context.Context, tk imagestore.Ticket, ticket imagestore.Hash, now time.Time) error
	SweepTickets(ctx context.Context, now time.Time, retain time.Duration) (newlyExpired int, err error)
	OpenSessions(ctx context.Context, tenantID int64, now time.Time) ([]imagestore.UploadSession, error)
	UnusedTickets(ctx context.Context, tenantID int64, now time.Time) ([]imagestore.Ticket, error)
	CancelTicket(ctx context.Context, tenantID int64, uploadID string, now time.Time) error

	// Images, and the end of a removal's intent (imagestore.Journal).
	Image(ctx context.Context, uploadID string) (imagestore.Image, error)
	Images(ctx context.Context, tenantID int64) ([]imagestore.Image, error)
	RemoveImage(ctx context.Context, tenantID int64, uploadID string) error
	EndIntent(ctx context.Context, uploadID string, kind imagestore.IntentKind) error

	// Listings.
	CreateListing(ctx context.Context, l imagestore.Listing) (imagestore.Listing, error)
	Listing(ctx context.Context, id string) (imagestore.Listing, error)
	Listings(ctx context.Context, hostID int64) ([]imagestore.Listing, error)
	OpenListings(ctx context.Context) ([]imagestore.Listing, error)
	CloseListing(ctx context.Context, hostID int64, id string, now time.Time) error

	// Orders: placed, paid or cancelled here, and read back.
	CreateOrder(ctx context.Context, o imagestore.Order, userData string, maxUnpaid int) error
	SetCheckout(ctx context.Context, orderID, checkoutID, checkoutURL string) error
	PayOrder(ctx context.Context, id string, paidAt, expiresAt time.Time) (moved bool, err error)
	CancelOrder(ctx context.Context, id, reason string, now time.Time) error
	CancelOwnOrder(ctx context.Context, buyerID int64, id, reason string, now time.Time) error
	OverdueOrders(ctx context.Context, now time.Time) ([]imagestore.Order, error)
	Order(ctx context.Context, id string) (imagestore.Order, error)
	Orders(ctx context.Context, buyerID int64) ([]imagestore.Order, error)
	ReplicaStates(ctx context.Context, orderID string) ([]imagestore.ReplicaState, error)

	// Refunds and disputes: decided, claimed and settled here; the
	// provisioner only names what keeps an order from running.
	OrdersInState(ctx context.Context, state imagestore.OrderState) ([]imagestore.Order, error)
	OrderByPaymentIntent(ctx context.Context, paymentIntent string) (imagestore.Order, error)
	SetOrderPaymentIntent(ctx context.Context, id, paymentIntent string) error
	StartRefund(ctx context.Context, id, cause string, now time.Time) (moved bool, err error)
	DueRefunds(ctx context.Context, now time.Time) ([]imagestore.Order, error)
	ClaimRefund(ctx context.Context, id string, now, until time.Time) (o imagestore.Order, claimed bool, err error)
	SettleRefund(ctx context.Context, id string, out imagestore.RefundOutcome, now time.Time) error
	MarkOrderDisputed(ctx context.Context, id, disputeID string, now time.Time) (moved bool, err error)
	CloseOrderDispute(ctx context.Context, id, outcome string, now time.Time) (moved bool, err error)

	// Console tickets.
	CreateConsoleTicket(ctx context.Context, ticket imagestore.Hash, ct imagestore.ConsoleTicket) error
	ConsumeConsoleTicket(ctx context.Context, ticket imagestore.Hash, now time.Time) (imagestore.ConsoleTicket, error)

	// Power requests, by the buyer's request id.
	imagestore.PowerStore

	// The Stripe webhook's replay guard.
	WebhookEventSeen(ctx context.Context, id string) (bool, error)
	RecordWebhookEvent(ctx context.Context, ev imagestore.WebhookEvent) error
}

// Blobs is the part of imagestore.Blobs the control plane calls: deleting a
// removed image's file, and the health and space figures it reports.
type Blobs interface {
	Delete(ctx context.Context, id string) error
	Ping(ctx context.Context) error
	Available(ctx context.Context) (int64, error)
	Quarantined(ctx context.Context) ([]imagestore.QuarantinedBlob, error)
}
