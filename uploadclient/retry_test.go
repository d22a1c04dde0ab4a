package uploadclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestRetryCountsAndWaits: --retries N is exactly N attempts after the
// first failure that may pass, each after its backoff (0.5 s doubling) or
// the longer wait the edge's Retry-After asks; a refusal is not retried.
// The count is not the default (10), and the waits are recorded instead
// of slept.
func TestRetryCountsAndWaits(t *testing.T) {
	flaky := &transientError{"no answer"}
	busy := &apiError{Status: http.StatusServiceUnavailable, Reason: "busy", RetryAfter: 7 * time.Second, Offset: -1}
	refused := &apiError{Status: http.StatusUnprocessableEntity, Reason: "corrupt", Offset: -1}
	for _, tc := range []struct {
		name    string
		retries int
		fails   []error // the answers before success; past its end, success
		always  error   // if set, every call fails with it
		calls   int
		waits   []time.Duration
		stopped bool
		want    error
	}{
		{name: "gives up after exactly 3 retries", retries: 3, always: flaky, calls: 4,
			waits: []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}, stopped: true},
		{name: "the last retry succeeds", retries: 3, fails: []error{flaky, flaky, flaky}, calls: 4,
			waits: []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}},
		{name: "no retries", retries: 0, always: flaky, calls: 1, stopped: true},
		{name: "Retry-After is waited", retries: 3, fails: []error{busy}, calls: 2, waits: []time.Duration{7 * time.Second}},
		{name: "a refusal is final", retries: 3, always: refused, calls: 1, want: refused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var waits []time.Duration
			u := &uploader{
				cfg:    Config{Retries: tc.retries},
				path:   "disk.qcow2",
				stderr: io.Discard,
				prog:   newProgress(io.Discard, 0),
				sleep: func(_ context.Context, d time.Duration) error {
					waits = append(waits, d)
					return nil
				},
			}
			calls := 0
			err := u.retry(t.Context(), "asking", func() error {
				calls++
				if tc.always != nil {
					return tc.always
				}
				if calls <= len(tc.fails) {
					return tc.fails[calls-1]
				}
				return nil
			})
			var se *StoppedError
			switch {
			case tc.stopped && !errors.As(err, &se):
				t.Errorf("error %v, want a *StoppedError", err)
			case tc.stopped && !strings.Contains(err.Error(), "run the same command again"):
				t.Errorf("error %q does not say how to go on", err)
			case !tc.stopped && !errors.Is(err, tc.want):
				t.Errorf("error %v, want %v", err, tc.want)
			}
			if calls != tc.calls || !reflect.DeepEqual(waits, tc.waits) {
				t.Errorf("%d calls after waits %v, want %d after %v", calls, waits, tc.calls, tc.waits)
			}
		})
	}
}

// TestAnswerErrorRetryAfter: Retry-After is read in seconds (the edge's
// "busy, come back in 5 s"), or as an HTTP date; the offset and reason
// of the answer come with it; a malformed or negative value asks for no
// wait of its own.
func TestAnswerErrorRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		retryAfter string
		min, max   time.Duration
	}{
		{"5", 5 * time.Second, 5 * time.Second},
		{"0", 0, 0},
		{"-1", 0, 0},
		{"soon", 0, 0},
		{time.Now().Add(time.Hour).UTC().Format(http.TimeFormat), 59 * time.Minute, time.Hour},
		{time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat), 0, 0},
	} {
		resp := &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{},
			Body: io.NopCloser(strings.NewReader(`{"error":"the edge is busy","reason":"busy"}`))}
		resp.Header.Set("Retry-After", tc.retryAfter)
		resp.Header.Set("Upload-Offset", "4096")
		e := answerError(resp)
		if e.RetryAfter < tc.min || e.RetryAfter > tc.max || e.Offset != 4096 || e.Reason != "busy" || e.Status != 503 {
			t.Errorf("Retry-After %q: %+v, want a wait in [%v, %v], offset 4096, reason busy", tc.retryAfter, e, tc.min, tc.max)
		}
	}
}
