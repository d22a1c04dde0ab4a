package s3_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
	"github.com/vmshelf/vmshelf/imagestore/s3"
	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// TestServerHangs: with the server stopped (SIGSTOP: connections are
// accepted, nothing answers) every call fails with ErrNoAnswer within its
// bound: a call that moves no image bytes within CallTimeout (all its
// tries), a transfer once IdleTimeout passed without a byte, Ping within
// PingTimeout. No caller context carries a deadline here: the store's own
// deadlines must end the calls. Once the server runs again, so does the
// store.
func TestServerHangs(t *testing.T) {
	srv := s3test.StartServer(t)
	cfg := testConfig(srv)
	const call, idle, ping = 1500 * time.Millisecond, 2 * time.Second, 700 * time.Millisecond
	cfg.CallTimeout, cfg.IdleTimeout, cfg.PingTimeout = call, idle, ping
	cfg.PingTTL = time.Nanosecond // every Ping asks
	ctx := context.Background()
	st := open(t, cfg)
	id := imagestore.NewUploadID()
	// More than the socket buffers hold: the Section's reader must wait
	// on the server.
	data := make([]byte, 4*partSize+1234)
	blobtest.Put(t, st, id, data)
	b, err := st.Open(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sec, err := b.Section(0, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(sec, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	w, err := st.Create(ctx, imagestore.NewUploadID())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	// A writer whose first part (and head) went out before the hang: its
	// next part is sent in the background, so the Write returns, and the
	// Sync that waits for the part must fail within IdleTimeout.
	inFlight, err := st.Create(ctx, imagestore.NewUploadID())
	if err != nil {
		t.Fatal(err)
	}
	defer inFlight.Abort()
	if _, err := inFlight.Write(make([]byte, partSize)); err != nil {
		t.Fatal(err)
	}
	if err := inFlight.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := st.Ping(ctx); err != nil {
		t.Fatalf("Ping before the hang: %v", err)
	}

	srv.Pause(t)
	// A bound is the deadline itself plus what a loaded machine adds to
	// the ending of a call. A call still running 5 s past its bound is
	// given up on (it ends once the server continues), so that a call
	// without a deadline fails the test instead of hanging it.
	within := func(what string, bound time.Duration, f func() error) {
		t.Helper()
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			took := time.Since(start)
			t.Logf("%s with the server stopped: %v after %v", what, err, took.Round(time.Millisecond))
			if !errors.Is(err, s3.ErrNoAnswer) || took > bound+time.Second {
				t.Errorf("%s: %v after %v; want ErrNoAnswer within %v", what, err, took, bound)
			}
		case <-time.After(bound + 5*time.Second):
			t.Errorf("%s: no answer after %v; want ErrNoAnswer within %v", what, bound+5*time.Second, bound)
		}
	}
	within("Ping", ping, func() error { return st.Ping(ctx) })
	within("Open", call, func() error { _, err := st.Open(ctx, id); return err })
	within("Delete", call, func() error { return st.Delete(ctx, imagestore.NewUploadID()) })
	within("List", call, func() error { _, err := st.List(ctx); return err })
	within("Available", call, func() error { _, err := st.Available(ctx); return err })
	within("ReadAt", idle, func() error { _, err := b.ReadAt(make([]byte, 100), 5); return err })
	within("Section's read", idle, func() error { _, err := io.ReadAll(sec); return err })
	within("Write of a part", idle, func() error { _, err := w.Write(make([]byte, partSize)); return err })
	within("Sync of a part in flight", idle, func() error {
		if _, err := inFlight.Write(make([]byte, partSize)); err != nil {
			return err
		}
		return inFlight.Sync()
	})

	srv.Continue()
	if err := st.Ping(ctx); err != nil {
		t.Fatalf("Ping after the server continued: %v", err)
	}
	got, err := io.ReadAll(io.NewSectionReader(b, 0, int64(len(data))))
	if err != nil || len(got) != len(data) {
		t.Fatalf("read after the server continued: %d bytes, %v", len(got), err)
	}
}

// TestNoAnswerIsUnavailable: the planes answer a hung S3 as the storage's
// passing outage (503 blobStoreUnreachable) by testing for
// imagestore.ErrBlobsUnavailable; ErrNoAnswer, wrapped as the calls wrap
// it, must be one.
func TestNoAnswerIsUnavailable(t *testing.T) {
	if err := fmt.Errorf("put part 3: %w", s3.ErrNoAnswer); !errors.Is(err, imagestore.ErrBlobsUnavailable) {
		t.Fatalf("%v is not an imagestore.ErrBlobsUnavailable", err)
	}
}
