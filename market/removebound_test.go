package market

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vmshelf/vmshelf/imagestore"
)

// stuckDelete is a blob store whose Delete would hang for as long as its
// context lets it, as an S3 bucket that does not answer holds it: it notes
// how long it was given and reports running out of it.
type stuckDelete struct {
	imagestore.Blobs
	gave chan time.Duration // -1: no deadline at all
}

func (b stuckDelete) Delete(ctx context.Context, id string) error {
	d, ok := ctx.Deadline()
	if !ok {
		b.gave <- -1
		return errors.New("no deadline: this delete would hang as long as the bucket does")
	}
	b.gave <- time.Until(d)
	return fmt.Errorf("s3: delete %s: %w", id, context.DeadlineExceeded)
}

// TestRemoveBoundsTheBlobDelete: a removal gives the blob delete at most
// blobDeleteBound, so that a hung blob store cannot hold the answer, and
// answers 200 all the same (the record is gone), logging the unfinished
// delete.
func TestRemoveBoundsTheBlobDelete(t *testing.T) {
	e := newEnv(t)
	alice, token := e.tenant("alice", true)
	img := e.image(alice, "alice's disk")
	blobs := stuckDelete{Blobs: e.blobs, gave: make(chan time.Duration, 1)}
	reg := prometheus.NewRegistry()
	srv, err := New(e.cfg, e.st, blobs, reg, reg)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/market/vm-images/remove", strings.NewReader(`{"upload_id":"`+img.UploadID+`"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("removal: %d %s, want 200", rec.Code, rec.Body)
	}
	if gave := <-blobs.gave; gave <= 0 || gave > blobDeleteBound {
		t.Errorf("the blob delete was given %v, want at most %v", gave, blobDeleteBound)
	}
	if _, err := e.st.Image(t.Context(), img.UploadID); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("record after the removal: %v, want ErrNotFound", err)
	}
	if !strings.Contains(e.logs.String(), "image record removed but its file was not") {
		t.Errorf("the unfinished delete is not logged:\n%s", e.logs)
	}
}
