package uploadclient

import (
	"testing"
	"time"
)

// TestUploadRetryDelay: 0.5 s doubling up to 30 s; a longer Retry-After
// wins, up to 5 min.
func TestUploadRetryDelay(t *testing.T) {
	for _, tc := range []struct {
		attempt int
		after   time.Duration
		want    time.Duration
	}{
		{1, 0, 500 * time.Millisecond}, {2, 0, time.Second}, {3, 0, 2 * time.Second},
		{7, 0, 30 * time.Second}, {50, 0, 30 * time.Second},
		{1, 5 * time.Second, 5 * time.Second}, {3, time.Second, 2 * time.Second}, {1, time.Hour, 5 * time.Minute},
	} {
		if got := retryDelay(tc.attempt, tc.after); got != tc.want {
			t.Errorf("retryDelay(%d, %v) = %v, want %v", tc.attempt, tc.after, got, tc.want)
		}
	}
}
