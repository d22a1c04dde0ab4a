package s3_test

import (
	"context"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// TestUnfinished: the unfinished writes a prefix holds are counted from
// the bucket itself: a write whose process was killed (here: a writer
// never closed) shows as one multipart upload with its part and partial
// objects, until it is aborted; a committed blob is not unfinished.
func TestUnfinished(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	cfg.UsageTTL = 1 // every call lists
	ctx := context.Background()
	st := open(t, cfg)
	blobtest.Put(t, st, imagestore.NewUploadID(), blobtest.Pattern(1, partSize+10))
	if n, b, err := st.Unfinished(ctx); err != nil || n != 0 || b != 0 {
		t.Fatalf("Unfinished with one committed blob: %d uploads, %d bytes, %v; want none", n, b, err)
	}
	w, err := st.Create(ctx, imagestore.NewUploadID())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(blobtest.Pattern(2, partSize+100)); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	// A part, its tail (100 bytes), the head and the durable offset.
	n, b, err := st.Unfinished(ctx)
	if err != nil || n != 1 || b < partSize+100 {
		t.Errorf("Unfinished with a write under way: %d uploads, %d bytes, %v; want 1 upload of at least %d bytes", n, b, err, partSize+100)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if n, b, err := st.Unfinished(ctx); err != nil || n != 0 || b != 0 {
		t.Errorf("Unfinished after the abort: %d uploads, %d bytes, %v; want none", n, b, err)
	}
}
