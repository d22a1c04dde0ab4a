package imagestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"
)

// Start-up must tell "the records were lost" (a deleted, emptied or
// replaced database: refuse, or every image would look unrecorded) from
// "a few files outlived or preceded their records" (a crash between a
// file's move and its record's write: carry on). Counting image records
// cannot tell them apart: the crash of the first upload of a store, or
// of the removal of its last image, leaves files beside no record at all.
// So the store keeps evidence of its own:
//
//   - an identity, a random id kept in the records and beside the blobs:
//     blobs that carry an id the records do not (a new, emptied or
//     another store's database) were recorded by a database that is not
//     this one;
//   - intents, one row per file move in progress: "commit" is written
//     before an upload's file becomes visible and deleted with the record
//     that names it; "remove" is written with the deletion of an image's
//     record and deleted once its file is gone. A file an intent names is
//     explained, whatever the count of records.

// IntentKind is the file move an Intent announces.
type IntentKind string

const (
	// IntentCommit: an upload's file is about to become visible; AddImage
	// deletes the intent in the transaction that records the image.
	IntentCommit IntentKind = "commit"
	// IntentRemove: the image's record is deleted (RemoveImage writes the
	// intent in that transaction) and its file is to go: deletion the
	// owner asked for, which start-up and the sweep finish.
	IntentRemove IntentKind = "remove"
)

// Intent is a file move in progress, as the records know it.
type Intent struct {
	UploadID string
	Kind     IntentKind
	At       time.Time
}

// Journal is the part of the Store that start-up reads to judge the
// files it finds (see the comment above).
type Journal interface {
	// StoreID returns the records' store identity; "" if they have none
	// (a database created anew, or one whose tables were emptied).
	StoreID(ctx context.Context) (string, error)
	// InitStoreID gives the records the identity id unless they already
	// have one, and returns the identity they have afterwards: of two
	// replicas starting at once, both get the first one's.
	InitStoreID(ctx context.Context, id string) (string, error)
	// IntendCommit records that uploadID's file is about to be committed
	// (replacing any intent of that id).
	IntendCommit(ctx context.Context, uploadID string, at time.Time) error
	// Intents lists every intent, sorted by upload id.
	Intents(ctx context.Context) ([]Intent, error)
	// EndIntent deletes uploadID's intent if it is of kind; a missing one
	// is not an error.
	EndIntent(ctx context.Context, uploadID string, kind IntentKind) error
}

// StoreIdentity is what Blobs keep of the store they belong to: the same
// id as the records' (Journal.StoreID), written beside the image files.
type StoreIdentity interface {
	// StoreID returns the id written beside the blobs; "" if there is
	// none (blobs from before identities, or a new store).
	StoreID(ctx context.Context) (string, error)
	// SetStoreID writes id beside the blobs, durably, replacing any.
	SetStoreID(ctx context.Context, id string) error
}

// NewStoreID returns a fresh store identity: 128 random bits as 32 hex
// characters.
func NewStoreID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// ValidStoreID reports whether id has NewStoreID's form.
func ValidStoreID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
