package gateway

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/qcow2/qcow2test"
)

// failFenceOnce cannot answer the first lease check: the one a PATCH
// makes after its last byte (there is no checkpoint before it), before
// it commits.
type failFenceOnce struct {
	imagestore.Store
	mu     sync.Mutex
	failed bool
}

func (s *failFenceOnce) CheckLease(ctx context.Context, name string, token int64, until time.Time) error {
	s.mu.Lock()
	first := !s.failed
	s.failed = true
	s.mu.Unlock()
	if first {
		return errors.New("the store did not answer")
	}
	return s.Store.CheckLease(ctx, name, token, until)
}

// TestTusUnfencedLastByteKeepsOffsetBelowLength: among replicas, a PATCH
// that brought every byte but could not make sure it still held the
// upload must not record the whole length (HEAD would then tell the
// client its image is stored, and it is not): it answers, and HEAD gives,
// the last durable offset, and the client finishes from there.
func TestTusUnfencedLastByteKeepsOffsetBelowLength(t *testing.T) {
	needQemu(t)
	data := mustRead(t, makeImage(t, "64M"))
	e := startEnv(t, t.TempDir(), filepath.Join(t.TempDir(), "vmshelf.db"),
		func(c *Config) { c.Replica = "r1" },
		func(st imagestore.Store) imagestore.Store { return &failFenceOnce{Store: st} })
	sess, id := e.create(len(data))
	resp, b := patch(t, sess, 0, data)
	if resp.StatusCode != 500 || resp.Header.Get("Upload-Offset") != "0" {
		t.Fatalf("PATCH whose fence failed after the last byte: %d %s, Upload-Offset %q; want 500 and 0, the offset durable before it",
			resp.StatusCode, b, resp.Header.Get("Upload-Offset"))
	}
	if _, err := e.st.Image(context.Background(), id); !errors.Is(err, imagestore.ErrNotFound) {
		t.Fatalf("image after the failed fence: %v, want none", err)
	}
	wantOffset(t, sess, 0, "after the failed fence")
	if resp, b := patch(t, sess, 0, data); resp.StatusCode != 204 || resp.Header.Get("Upload-Offset") != strconv.Itoa(len(data)) {
		t.Fatalf("PATCH again: %d %s", resp.StatusCode, b)
	}
	img, err := e.st.Image(context.Background(), id)
	if err != nil || img.SHA256 != sha(data) {
		t.Fatalf("stored image %+v (%v), want sha %s", img, err, sha(data))
	}
	wantOffset(t, sess, len(data), "after the end")
}

// recordSaves records, in order, the offsets SaveProgress records and the
// images AddImage records.
type recordSaves struct {
	imagestore.Store
	mu     sync.Mutex
	events []string
}

func (s *recordSaves) SaveProgress(ctx context.Context, uploadID string, offset int64, hashState []byte, expiresAt time.Time) error {
	s.mu.Lock()
	s.events = append(s.events, "save "+strconv.FormatInt(offset, 10))
	s.mu.Unlock()
	return s.Store.SaveProgress(ctx, uploadID, offset, hashState, expiresAt)
}

func (s *recordSaves) AddImage(ctx context.Context, img imagestore.Image, quota int) error {
	s.mu.Lock()
	s.events = append(s.events, "image")
	s.mu.Unlock()
	return s.Store.AddImage(ctx, img, quota)
}

// TestTusNoCheckpointAtTheLastByte: the image's length is a multiple of
// CheckpointBytes (not the default), so the read that brings the last
// byte crosses a checkpoint; still, the whole length is recorded only
// once the image is: a crash between a checkpoint there and the commit
// would leave HEAD saying "all bytes arrived" of an image never stored.
func TestTusNoCheckpointAtTheLastByte(t *testing.T) {
	img := qcow2test.Base()
	const every = 4096
	if len(img)%every != 0 {
		t.Fatalf("the image's %d bytes are no multiple of %d", len(img), every)
	}
	rec := &recordSaves{}
	e := startEnv(t, t.TempDir(), filepath.Join(t.TempDir(), "vmshelf.db"),
		func(c *Config) { c.CheckpointBytes = every },
		func(st imagestore.Store) imagestore.Store { rec.Store = st; return rec })
	sess, _ := e.create(len(img))
	if resp, b := patch(t, sess, 0, img); resp.StatusCode != 204 || resp.Header.Get("Upload-Offset") != strconv.Itoa(len(img)) {
		t.Fatalf("PATCH: %d %s", resp.StatusCode, b)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	whole := "save " + strconv.Itoa(len(img))
	for i, ev := range rec.events {
		if ev == "image" {
			if i+1 >= len(rec.events) || rec.events[i+1] != whole {
				t.Errorf("calls %q: the image must be followed by its session's whole length", rec.events)
			}
			return
		}
		if ev == whole {
			t.Fatalf("calls %q: the whole length was recorded before the image", rec.events)
		}
	}
	t.Fatalf("calls %q: no image recorded", rec.events)
}
