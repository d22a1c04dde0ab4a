package market

import "testing"

// TestQuarantinedFilesMetric: the gauge operators alert on counts the
// image files start-up set aside, and only those.
func TestQuarantinedFilesMetric(t *testing.T) {
	e := newEnv(t)
	alice, _ := e.tenant("alice", true)
	img := e.image(alice, "recorded")
	wantLines(t, e.scrape(), "vmshelf_quarantined_image_files 0", "# TYPE vmshelf_quarantined_image_files gauge")

	// Two files whose records are gone, set aside the way start-up does.
	for range 2 {
		id := e.image(alice, "orphan").UploadID
		if err := e.st.RemoveImage(t.Context(), alice.ID, id); err != nil {
			t.Fatal(err)
		}
		if err := e.blobs.Quarantine(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	wantLines(t, e.scrape(), "vmshelf_quarantined_image_files 2", "vmshelf_images_stored 1")
	if _, err := e.blobs.Open(t.Context(), img.UploadID); err != nil {
		t.Errorf("the recorded image: %v", err)
	}
}
