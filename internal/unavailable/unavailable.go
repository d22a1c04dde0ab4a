// Package unavailable is the one answer both planes give a request that
// the record store could not take: it did not answer within its
// deadline, refused or reset the connection, or was restarting
// (imagestore.ErrStoreUnavailable). That is the store's passing outage,
// which a client may retry, never a fault of vmshelf's (500 internal):
// a 503 with Retry-After, as an image storage that does not answer gets
// (blobStoreUnreachable).
package unavailable

import (
	"errors"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// RetryAfter is the wait the answer suggests, in seconds: a PostgreSQL
// restart or failover takes seconds, and a client that retries sooner
// only meets the outage again.
const RetryAfter = 10

// Store is the declared answer; every answer of its kind is a copy
// (apierr.Error's With* methods) and matches it with errors.Is.
var Store = apierr.New(reason.StoreUnreachable).
	WithRetryAfter(RetryAfter)

// Answer is Store with err as its cause, if err is the store's outage;
// nil otherwise.
func Answer(err error) *apierr.Error {
	if !errors.Is(err, imagestore.ErrStoreUnavailable) {
		return nil
	}
	return Store.WithCause(err)
}
