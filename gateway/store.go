package gateway

import (
	"context"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Store is the part of imagestore.Store the data plane calls: tickets,
// upload sessions, images being committed, fetch tokens and the upload
// leases. Naming it here shows what an upload or a fetch can touch (never
// a tenant, a listing or an order) and lets a test fake just this. The
// methods mean what imagestore.Store documents.
type Store interface {
	// Plain uploads (PUT).
	ConsumeTicket(ctx context.Context, ticket imagestore.Hash, now time.Time) (imagestore.Ticket, error)
	EndUpload(ctx context.Context, uploadID string) error
	EndUnleasedUploads(ctx context.Context, leasePrefix string, now, startedBefore time.Time) (int, error)

	// Resumable uploads (tus), and the ticket's lookup both kinds make.
	Ticket(ctx context.Context, ticket imagestore.Hash) (imagestore.Ticket, error)
	// CancelTicket ends the ticket of an upload refused before its body
	// (release.go).
	CancelTicket(ctx context.Context, tenantID int64, uploadID string, now time.Time) error
	StartSession(ctx context.Context, ticket, session imagestore.Hash, us imagestore.UploadSession, now time.Time) (imagestore.UploadSession, error)
	Session(ctx context.Context, session imagestore.Hash) (imagestore.UploadSession, error)
	SaveProgress(ctx context.Context, uploadID string, offset int64, hashState []byte, expiresAt time.Time) error
	EndSession(ctx context.Context, uploadID string) error
	ExpireSessions(ctx context.Context, now time.Time) ([]string, error)

	// The commit of either kind, with its intent (imagestore.Journal).
	AddImage(ctx context.Context, img imagestore.Image, quota int) error
	IntendCommit(ctx context.Context, uploadID string, at time.Time) error
	EndIntent(ctx context.Context, uploadID string, kind imagestore.IntentKind) error
	// UndoUpload takes back an upload answered storeUnreachable (undo.go).
	UndoUpload(ctx context.Context, uploadID string, startedAt time.Time) (bool, error)

	// Ping answers the data plane's /readyz.
	Ping(ctx context.Context) error

	// Fetches.
	ImageForToken(ctx context.Context, token imagestore.Hash, now time.Time) (imagestore.Image, time.Time, error)

	// The upload leases, over a store several replicas share.
	imagestore.Leases
}

// Blobs is the part of imagestore.Blobs the data plane calls: writing,
// resuming and reading image bytes and the free space. Setting blobs
// aside and the store identity belong to start-up and the operators.
type Blobs interface {
	Create(ctx context.Context, id string) (imagestore.BlobWriter, error)
	Resume(ctx context.Context, id string, offset int64) (imagestore.BlobWriter, error)
	RemovePartial(ctx context.Context, id string) error
	Open(ctx context.Context, id string) (imagestore.Blob, error)
	Delete(ctx context.Context, id string) error
	Available(ctx context.Context) (int64, error)
	// Ping answers the data plane's /readyz.
	Ping(ctx context.Context) error
}

// blobOpener is what the cache of open blobs (openBlobs) needs of them.
type blobOpener interface {
	Open(ctx context.Context, id string) (imagestore.Blob, error)
}
