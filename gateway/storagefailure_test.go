package gateway

import (
	"errors"
	"fmt"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestStorageFailure: a blob call the image storage did not answer is the
// client's 503 blobStoreUnreachable with Retry-After (a passing outage it
// may retry, as /readyz says), anything else our 500.
func TestStorageFailure(t *testing.T) {
	for _, tc := range []struct {
		err        error
		status     int
		reason     string
		retryAfter int
	}{
		{fmt.Errorf("open part: %w", imagestore.ErrBlobsUnavailable), 503, "blobStoreUnreachable", 60},
		{errors.New("permission denied"), 500, "internal", 0},
	} {
		e := storageFailure(tc.err, "could not open the image")
		if e.Status != tc.status || e.Reason != tc.reason || e.RetryAfter != tc.retryAfter {
			t.Errorf("storageFailure(%v) = %d %s Retry-After %d, want %d %s %d",
				tc.err, e.Status, e.Reason, e.RetryAfter, tc.status, tc.reason, tc.retryAfter)
		}
		if !errors.Is(e, tc.err) {
			t.Errorf("storageFailure(%v) lost its cause", tc.err)
		}
	}
}
