package gateway

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/qcow2"
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

// TestReadBackFailure: the structure check reads the upload back from
// storage; a read that fails there is no verdict on the image. A full
// disk (an S3 server's 507 included, which the S3 store wraps as
// ErrNoSpace) is 507 noSpace, an image storage that did not answer 503,
// anything else 500 naming the read-back; only a Reject is the image's
// fault.
func TestReadBackFailure(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		reason string
	}{
		{fmt.Errorf("s3: read x at 0: %w", imagestore.ErrNoSpace), 507, "noSpace"},
		{fmt.Errorf("re-read: %w", syscall.ENOSPC), 507, "noSpace"},
		{fmt.Errorf("s3: read x at 0: %w", imagestore.ErrBlobsUnavailable), 503, "blobStoreUnreachable"},
		{errors.New("input/output error"), 500, "internal"},
		{&qcow2.Reject{Reason: qcow2.ReasonBackingFile, Msg: "has one"}, 422, qcow2.ReasonBackingFile},
	} {
		e := imageError(tc.err)
		if e.Status != tc.status || e.Reason != tc.reason {
			t.Errorf("imageError(%v) = %d %s, want %d %s", tc.err, e.Status, e.Reason, tc.status, tc.reason)
		}
		if tc.status == 500 && !strings.Contains(e.Msg, "read the image back") {
			t.Errorf("imageError(%v) says %q; want it to name the read-back", tc.err, e.Msg)
		}
	}
}

// TestImageVerdictsAnsweredByName: each verdict of the QCOW2 inspector is
// answered with the table's entry of the same name, in the inspector's
// words (notQcow2 as 415, the rest as 422); a verdict the table lacks is
// the edge's fault, never a reason the docs do not name.
func TestImageVerdictsAnsweredByName(t *testing.T) {
	verdicts := []string{qcow2.ReasonNotQcow2, qcow2.ReasonBackingFile, qcow2.ReasonExternalDataFile, qcow2.ReasonEncrypted,
		qcow2.ReasonCorrupt, qcow2.ReasonBadHeader, qcow2.ReasonVirtualSizeTooLarge}
	for _, v := range verdicts {
		e := imageError(&qcow2.Reject{Reason: v, Msg: "the bytes say so"})
		want := 422
		if v == qcow2.ReasonNotQcow2 {
			want = 415
		}
		if e.Status != want || e.Reason != v || e.Msg != "the bytes say so" {
			t.Errorf("verdict %s answered %d %s %q, want %d %s in the inspector's words", v, e.Status, e.Reason, e.Msg, want, v)
		}
	}
	if len(imageRefusals) != len(verdicts) {
		t.Errorf("imageRefusals answers %d verdicts; the inspector has %d", len(imageRefusals), len(verdicts))
	}
	if e := imageError(&qcow2.Reject{Reason: "unheardOf", Msg: "x"}); e.Status != 500 {
		t.Errorf("an unknown verdict answered %d %s, want 500 internal", e.Status, e.Reason)
	}
}
