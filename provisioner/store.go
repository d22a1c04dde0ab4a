package provisioner

import (
	"context"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Store is the part of imagestore.Store the provisioner calls: the orders
// it carries out and the records it reads to build their replicas, plus
// the fetch tokens it mints and revokes. Naming it here shows that it
// never takes a payment, touches a listing or an upload, and lets a test
// fake just this. The methods mean what imagestore.Store documents.
type Store interface {
	// The orders to carry out, and what their objects are built from.
	OrdersInState(ctx context.Context, state imagestore.OrderState) ([]imagestore.Order, error)
	OrderUserData(ctx context.Context, id string) (string, error)
	TenantByID(ctx context.Context, id int64) (imagestore.Tenant, error)
	Image(ctx context.Context, uploadID string) (imagestore.Image, error)

	// The fetch tokens the replicas import their image with.
	CreateFetchToken(ctx context.Context, token imagestore.Hash, ft imagestore.FetchToken) error
	RevokeOrderTokens(ctx context.Context, orderID string, now time.Time) (int, error)

	// What the provisioner writes back on an order.
	MarkOrderActive(ctx context.Context, id string) error
	ExpireOrder(ctx context.Context, id string, now time.Time) error
	SetOrderNote(ctx context.Context, id, note string) error
	SetOrderBlocked(ctx context.Context, id, cause string, now time.Time) error
	SetReplicaStates(ctx context.Context, orderID string, states []imagestore.ReplicaState) error
	ReplicaStates(ctx context.Context, orderID string) ([]imagestore.ReplicaState, error)
}
