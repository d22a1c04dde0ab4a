package imagestore_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobfs"
	"github.com/vmshelf/vmshelf/imagestore/blobtest"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
)

// TestReconcile runs Reconcile over the real stores after a simulated
// crash: a live resumable upload's partial survives, a partial without a
// session is removed, a committed blob without a record is
// quarantined (never deleted), a recorded image is kept, a record
// without its blob is only reported, and a plain upload the crash cut off
// no longer holds its quota place.
func TestReconcile(t *testing.T) {
	ctx := t.Context()
	dir, st, blobs, tn := openStores(t)
	now := time.Now()

	// A live session with its synced partial.
	live := imagestore.NewUploadID()
	tk := imagestore.Ticket{UploadID: live, TenantID: tn.ID, Name: "live", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := st.CreateTicket(ctx, tk, imagestore.HashSecret("ticket"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.StartSession(ctx, imagestore.HashSecret("ticket"), imagestore.HashSecret("session"),
		imagestore.UploadSession{Length: 100, ExpiresAt: now.Add(time.Hour)}, now); err != nil {
		t.Fatal(err)
	}
	liveBytes := []byte("first half of an image")
	blobtest.Partial(t, blobs, live, liveBytes)

	// A partial no session owns: an upload whose session ended (or a
	// one-shot upload) when the process died.
	stray := imagestore.NewUploadID()
	blobtest.Partial(t, blobs, stray, []byte("abandoned"))

	// A recorded image, a committed blob without a record, and a record
	// without a blob.
	kept, orphan, lost := imagestore.NewUploadID(), imagestore.NewUploadID(), imagestore.NewUploadID()
	blobtest.Put(t, blobs, kept, []byte("kept image"))
	blobtest.Put(t, blobs, orphan, []byte("orphan"))
	for _, id := range []string{kept, lost} {
		if err := st.AddImage(ctx, imagestore.Image{UploadID: id, TenantID: tn.ID, Name: id, CreatedAt: now}, 0); err != nil {
			t.Fatal(err)
		}
	}

	// A plain upload that was running when the process died: its ticket
	// consumed, its partial (the stray one, say) about to be removed.
	put := imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: tn.ID, Name: "put", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := st.CreateTicket(ctx, put, imagestore.HashSecret("put"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ConsumeTicket(ctx, imagestore.HashSecret("put"), now); err != nil {
		t.Fatal(err)
	}
	// Two images, one session and the running upload: a quota of 4 is full.
	quotaTicket := func(secret string) error {
		return st.CreateTicket(ctx, imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: tn.ID, Name: secret,
			CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, imagestore.HashSecret(secret), 4)
	}
	if err := quotaTicket("before"); !errors.Is(err, imagestore.ErrQuota) {
		t.Fatalf("ticket at quota 4 before Reconcile: %v, want ErrQuota (the running upload counted)", err)
	}

	var logBuf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logBuf, nil))
	if err := imagestore.Reconcile(ctx, st, blobs, log); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	// The cut-off upload's place is free again.
	if err := quotaTicket("after"); err != nil {
		t.Errorf("ticket at quota 4 after Reconcile: %v, want the running upload ended", err)
	}

	// The live partial is intact and resumes where the session left it.
	w, err := blobs.Resume(ctx, live, int64(len(liveBytes)))
	if err != nil {
		t.Fatalf("Resume of the live session's partial: %v", err)
	}
	got := make([]byte, len(liveBytes))
	if _, err := w.ReadAt(got, 0); err != nil || !bytes.Equal(got, liveBytes) {
		t.Errorf("live partial after Reconcile = %q, %v; want %q", got, err, liveBytes)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := blobs.Resume(ctx, stray, 0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("Resume of the stray partial: %v, want ErrNotFound (removed)", err)
	}
	files, err := blobs.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(files, []string{kept}) {
		t.Errorf("blobs after Reconcile = %v, want only the recorded %s", files, kept)
	}
	// Records are never deleted; the missing blob is reported.
	ids, err := st.ImageIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{kept, lost}; !slices.Equal(ids, slices.Sorted(slices.Values(want))) {
		t.Errorf("image records after Reconcile = %v, want %v", ids, want)
	}
	if sessions, err := st.SessionUploadIDs(ctx); err != nil || !slices.Equal(sessions, []string{live}) {
		t.Errorf("sessions after Reconcile = %v, %v; want [%s]", sessions, err, live)
	}
	out := logBuf.String()
	if !strings.Contains(out, "upload_id="+lost) {
		t.Errorf("log does not report the record without a file:\n%s", out)
	}
	if !strings.Contains(out, "partial_uploads_removed=1") || !strings.Contains(out, "files_quarantined=1") ||
		!strings.Contains(out, "running_uploads_ended=1") {
		t.Errorf("log does not count one partial removed, one orphan quarantined and one running upload ended:\n%s", out)
	}
	// The orphan is set aside with every byte, not deleted.
	q, err := blobs.Quarantined(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(q) != 1 || q[0].ID != orphan || q[0].Size != int64(len("orphan")) {
		t.Fatalf("quarantine after Reconcile = %+v, want only %s (6 bytes)", q, orphan)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "vm-images", ".quarantine", orphan+".qcow2")); err != nil || string(got) != "orphan" {
		t.Errorf("quarantined file = %q, %v; want the orphan's bytes", got, err)
	}

	// A second run finds nothing more to do.
	logBuf.Reset()
	if err := imagestore.Reconcile(ctx, st, blobs, log); err != nil {
		t.Fatalf("second Reconcile: %v", err)
	}
	if strings.Contains(logBuf.String(), "start-up cleanup") {
		t.Errorf("second Reconcile removed or quarantined something:\n%s", logBuf.String())
	}
	w, err = blobs.Resume(ctx, live, int64(len(liveBytes)))
	if err != nil {
		t.Fatalf("live partial after the second Reconcile: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReconcileRefusesLostStore: a store with no image record beside
// committed image files (vmshelf.db deleted, emptied or replaced) is a
// refusal, and Reconcile touches nothing: not the images, not the
// partials of uploads whose sessions the lost store knew.
func TestReconcileRefusesLostStore(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	blobs, err := blobfs.Open(filepath.Join(dir, "vm-images"))
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{imagestore.NewUploadID(), imagestore.NewUploadID(), imagestore.NewUploadID()}
	for _, id := range ids {
		blobtest.Put(t, blobs, id, []byte("disk "+id))
	}
	partial := imagestore.NewUploadID()
	blobtest.Partial(t, blobs, partial, []byte("half"))

	// A store created anew: it has tenants (the dev tenant, say) but no image.
	st, err := sqlite.Open(ctx, filepath.Join(dir, "vmshelf.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.CreateTenant(ctx, imagestore.Tenant{Name: "dev"}, imagestore.HashSecret("tok")); err != nil {
		t.Fatal(err)
	}
	err = imagestore.Reconcile(ctx, st, blobs, slog.New(slog.DiscardHandler))
	var lost *imagestore.StoreLostError
	if !errors.As(err, &lost) || lost.Files != 3 {
		t.Fatalf("Reconcile on a lost store: %v, want StoreLostError{Files: 3}", err)
	}
	files, err := blobs.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(files, slices.Sorted(slices.Values(ids))) {
		t.Errorf("image files after the refusal = %v, want all of %v", files, ids)
	}
	for _, id := range ids {
		if got, err := os.ReadFile(filepath.Join(dir, "vm-images", id+".qcow2")); err != nil || string(got) != "disk "+id {
			t.Errorf("image %s after the refusal = %q, %v", id, got, err)
		}
	}
	if q, err := blobs.Quarantined(ctx); err != nil || len(q) != 0 {
		t.Errorf("quarantine after the refusal = %v, %v; want empty", q, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "vm-images", ".partial", partial)); err != nil {
		t.Errorf("partial of an upload the lost store knew: %v, want kept", err)
	}

	// An empty store beside an empty image directory is a new edge: fine.
	empty := t.TempDir()
	st2, err := sqlite.Open(ctx, filepath.Join(empty, "vmshelf.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	blobs2, err := blobfs.Open(filepath.Join(empty, "vm-images"))
	if err != nil {
		t.Fatal(err)
	}
	if err := imagestore.Reconcile(ctx, st2, blobs2, slog.New(slog.DiscardHandler)); err != nil {
		t.Errorf("Reconcile of a new edge: %v", err)
	}
}

// TestReconcileShared: beside other replicas, a committed blob without a
// record is left alone while it is younger than the grace (another
// replica may be about to record it) and quarantined once older; a plain
// upload marked running keeps its mark (it may run elsewhere).
func TestReconcileShared(t *testing.T) {
	ctx := t.Context()
	dir, st, blobs, tn := openStores(t)
	now := time.Now()
	kept, young, old := imagestore.NewUploadID(), imagestore.NewUploadID(), imagestore.NewUploadID()
	for _, id := range []string{kept, young, old} {
		blobtest.Put(t, blobs, id, []byte(id))
	}
	if err := st.AddImage(ctx, imagestore.Image{UploadID: kept, TenantID: tn.ID, Name: "kept", CreatedAt: now}, 0); err != nil {
		t.Fatal(err)
	}
	// old was committed an hour ago.
	hourAgo := now.Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(dir, "vm-images", old+".qcow2"), hourAgo, hourAgo); err != nil {
		t.Fatal(err)
	}
	put := imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: tn.ID, Name: "put", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := st.CreateTicket(ctx, put, imagestore.HashSecret("put"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ConsumeTicket(ctx, imagestore.HashSecret("put"), now); err != nil {
		t.Fatal(err)
	}

	sh := imagestore.SharedReconcile{Now: now, Grace: 10 * time.Minute}
	if err := imagestore.ReconcileShared(ctx, st, blobs, slog.New(slog.DiscardHandler), sh); err != nil {
		t.Fatalf("ReconcileShared: %v", err)
	}
	files, err := blobs.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.Sorted(slices.Values([]string{kept, young})); !slices.Equal(files, want) {
		t.Errorf("blobs after ReconcileShared = %v, want the recorded and the young one %v", files, want)
	}
	q, err := blobs.Quarantined(ctx)
	if err != nil || len(q) != 1 || q[0].ID != old {
		t.Errorf("quarantine = %+v, %v; want only the hour-old orphan %s", q, err, old)
	}
	// The running upload still holds its place: a quota of 2 (one image,
	// one running upload) is full.
	err = st.CreateTicket(ctx, imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: tn.ID, Name: "more",
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, imagestore.HashSecret("more"), 2)
	if !errors.Is(err, imagestore.ErrQuota) {
		t.Errorf("ticket at quota 2 after ReconcileShared: %v, want ErrQuota (the running upload kept)", err)
	}
}

// openStores opens a SQLite store and a blob directory in a fresh dir
// and adds the tenant alpha.
func openStores(t *testing.T) (string, *sqlite.Store, *blobfs.FS, imagestore.Tenant) {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "vmshelf.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	blobs, err := blobfs.Open(filepath.Join(dir, "vm-images"))
	if err != nil {
		t.Fatal(err)
	}
	tn, err := st.CreateTenant(t.Context(), imagestore.Tenant{Name: "alpha"}, imagestore.HashSecret("tok"))
	if err != nil {
		t.Fatal(err)
	}
	return dir, st, blobs, tn
}
