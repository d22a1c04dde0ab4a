package market

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

func TestRemove(t *testing.T) {
	e := newEnv(t)
	alice, token := e.tenant("alice", true)
	_, bobToken := e.tenant("bob", true)
	bob2, shyToken := e.tenant("shy", false)
	img := e.image(alice, "alice's disk")
	keep := e.image(alice, "alice's other disk")
	shyImg := e.image(bob2, "shy's disk")

	// A fetch token for the image resolves before the removal...
	fetch := imagestore.NewSecret()
	e.remember(fetch)
	ctx := t.Context()
	if err := e.st.CreateFetchToken(ctx, imagestore.HashSecret(fetch),
		imagestore.FetchToken{UploadID: img.UploadID, OrderID: "o1", ExpiresAt: t0.Add(time.Hour)}); err != nil {
		t.Fatalf("CreateFetchToken: %v", err)
	}
	if _, err := e.st.ImageForToken(ctx, imagestore.HashSecret(fetch), t0); err != nil {
		t.Fatalf("fetch token does not resolve before removal: %v", err)
	}
	file := filepath.Join(e.blobDir, img.UploadID+".qcow2")
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("image file missing before removal: %v", err)
	}

	body := `{"upload_id":"` + img.UploadID + `"}`
	// Another tenant's id is unknown to bob, and stays in place.
	wantError(t, e.post("/market/vm-images/remove", bobToken, body), http.StatusNotFound, "imageUnknown")
	// A tenant that does not share cannot act, not even on its own image.
	wantError(t, e.post("/market/vm-images/remove", shyToken, `{"upload_id":"`+shyImg.UploadID+`"}`),
		http.StatusConflict, "notSharing")
	if _, err := e.st.Image(ctx, shyImg.UploadID); err != nil {
		t.Errorf("refused removal removed the record: %v", err)
	}

	r := e.post("/market/vm-images/remove", token, body)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var ans map[string]string
	decode(t, r, &ans)
	if len(ans) != 1 || ans["removed"] != img.UploadID {
		t.Errorf("answer %v, want {removed: %s}", ans, img.UploadID)
	}

	// ...and afterwards record, file and token are gone; the other image
	// is untouched.
	if _, err := e.st.Image(ctx, img.UploadID); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("record after removal: %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("file after removal: %v, want it gone", err)
	}
	if _, err := e.blobs.Open(ctx, img.UploadID); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("blobs.Open after removal: %v, want ErrNotFound", err)
	}
	if _, err := e.st.ImageForToken(ctx, imagestore.HashSecret(fetch), t0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("fetch token after removal: %v, want ErrNotFound (revoked)", err)
	}
	if _, err := e.st.Image(ctx, keep.UploadID); err != nil {
		t.Errorf("the other image went too: %v", err)
	}

	// Removing again, or ids that cannot be ids, is imageUnknown; a
	// malformed body is still a 400.
	for _, c := range []struct {
		name, body string
		status     int
		reason     string
	}{
		{"again", body, 404, "imageUnknown"},
		{"path", `{"upload_id":"../../etc/passwd"}`, 404, "imageUnknown"},
		{"upper case", `{"upload_id":"` + "ABCDEF0123456789ABCDEF01" + `"}`, 404, "imageUnknown"},
		{"empty", `{"upload_id":""}`, 404, "imageUnknown"},
		{"missing", `{}`, 404, "imageUnknown"},
		{"unknown field", `{"upload_id":"` + keep.UploadID + `","force":true}`, 400, "badRequest"},
		{"wrong type", `{"upload_id":1}`, 400, "badRequest"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantError(t, e.post("/market/vm-images/remove", token, c.body), c.status, c.reason)
		})
	}
	if _, err := e.st.Image(ctx, keep.UploadID); err != nil {
		t.Errorf("a refused request removed an image: %v", err)
	}
}

// The catalogue is public and, for this stage, empty but well-formed.
func TestCatalogue(t *testing.T) {
	e := newEnv(t)
	r := e.do(http.MethodGet, "/market/vm-images", "", nil)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var got map[string]any
	decode(t, r, &got)
	for _, k := range []string{"catalogue", "not_offered"} {
		if a, ok := got[k].([]any); !ok || a == nil {
			t.Errorf("%s is %v, want an array", k, got[k])
		}
	}
}
