package imagestore

import "context"

// ReconcileRecords is the part of Store that start-up's reconciliation
// (Reconcile, ReconcileShared) calls: the store identity, the intents,
// and the ids that explain the files it finds. Naming it shows that
// reconciling never reads or writes a tenant, a ticket or an order.
type ReconcileRecords interface {
	StoreID(ctx context.Context) (string, error)
	InitStoreID(ctx context.Context, id string) (string, error)
	Intents(ctx context.Context) ([]Intent, error)
	EndIntent(ctx context.Context, uploadID string, kind IntentKind) error
	ImageIDs(ctx context.Context) ([]string, error)
	SessionUploadIDs(ctx context.Context) ([]string, error)
	EndRunningUploads(ctx context.Context) (int, error)
}

// ReconcileBlobs is the part of Blobs that the reconciliation calls: it
// lists and sets aside files, removes unfinished ones, finishes removals
// and keeps the store identity beside the files.
type ReconcileBlobs interface {
	List(ctx context.Context) ([]string, error)
	Open(ctx context.Context, id string) (Blob, error)
	Quarantine(ctx context.Context, id string) error
	RemovePartials(ctx context.Context, keep func(id string) bool) (int, error)
	Delete(ctx context.Context, id string) error
	StoreIdentity
}

// RemovalRecords is the part of Store that finishing removals
// (FinishRemovals, RunRemovals) calls: the remove intents, and the image
// records that tell a restored image from a removed one.
type RemovalRecords interface {
	Intents(ctx context.Context) ([]Intent, error)
	Image(ctx context.Context, uploadID string) (Image, error)
	EndIntent(ctx context.Context, uploadID string, kind IntentKind) error
}

// RemovalBlobs is the part of Blobs that finishing removals calls.
type RemovalBlobs interface {
	Delete(ctx context.Context, id string) error
}

// intentEnder ends an intent once its file move is done (finishRemoval,
// which both the reconciliation and the removal sweep call).
type intentEnder interface {
	EndIntent(ctx context.Context, uploadID string, kind IntentKind) error
}

// The whole Store and Blobs are what start-up and the sweep pass.
var (
	_ ReconcileRecords = Store(nil)
	_ ReconcileBlobs   = Blobs(nil)
	_ RemovalRecords   = Store(nil)
	_ RemovalBlobs     = Blobs(nil)
)
