package market

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/catalogue"
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
	if _, _, err := e.st.ImageForToken(ctx, imagestore.HashSecret(fetch), t0); err != nil {
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
	if _, _, err := e.st.ImageForToken(ctx, imagestore.HashSecret(fetch), t0); !errors.Is(err, imagestore.ErrNotFound) {
		t.Errorf("fetch token after removal: %v, want ErrNotFound (revoked)", err)
	}
	if _, err := e.st.Image(ctx, keep.UploadID); err != nil {
		t.Errorf("the other image went too: %v", err)
	}
	// The file is gone, so is the removal's intent: nothing is left for
	// start-up or the sweep to finish.
	if in, err := e.st.Intents(ctx); err != nil || len(in) != 0 {
		t.Errorf("intents after the removal = %+v, %v; want none", in, err)
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

// TestCatalogueImages: GET /market/vm-images answers the catalogue's
// public JSON to anyone, cacheable for five minutes with a strong ETag;
// HEAD answers the headers alone.
func TestCatalogueImages(t *testing.T) {
	e := newEnv(t)
	want := catalogue.Builtin()
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		t.Run(method, func(t *testing.T) {
			r := e.do(method, "/market/vm-images", "", nil)
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			wantCacheable(t, r, want.ETag())
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			if cl := r.header.Get("Content-Length"); cl != strconv.Itoa(len(want.JSON())) {
				t.Errorf("Content-Length %q, want %d", cl, len(want.JSON()))
			}
			if method == http.MethodHead {
				if len(r.body) != 0 {
					t.Errorf("HEAD answered a body of %d bytes", len(r.body))
				}
				return
			}
			if !bytes.Equal(r.body, want.JSON()) {
				t.Errorf("body is not the built-in catalogue:\n%s", r.body)
			}
			var got struct {
				Catalogue  []catalogue.Entry      `json:"catalogue"`
				NotOffered []catalogue.NotOffered `json:"not_offered"`
			}
			decode(t, r, &got)
			if len(got.Catalogue) != len(want.Entries()) || len(got.NotOffered) != len(want.NotOffered()) {
				t.Errorf("answer has %d entries and %d not offered, want %d and %d",
					len(got.Catalogue), len(got.NotOffered), len(want.Entries()), len(want.NotOffered()))
			}
		})
	}
}

// wantCacheable checks the caching headers of a catalogue answer.
func wantCacheable(t *testing.T, r response, etag string) {
	t.Helper()
	if got := r.header.Get("ETag"); got != etag {
		t.Errorf("ETag %q, want %q", got, etag)
	}
	if got := r.header.Get("Cache-Control"); got != "public, max-age=300" {
		t.Errorf("Cache-Control %q, want public, max-age=300", got)
	}
}

// TestCatalogueImagesNotModified: If-None-Match with the current ETag,
// alone, weak, in a list or on several lines, or "*", is a 304 without a
// body; any other tag gets the whole answer.
func TestCatalogueImagesNotModified(t *testing.T) {
	e := newEnv(t)
	etag := catalogue.Builtin().ETag()
	opaque := strings.Trim(etag, `"`)
	for _, c := range []struct {
		name   string
		inm    []string // header lines
		method string
		status int
	}{
		{"exact", []string{etag}, http.MethodGet, http.StatusNotModified},
		{"weak", []string{"W/" + etag}, http.MethodGet, http.StatusNotModified},
		{"in a list", []string{`"old", W/"older", ` + etag}, http.MethodGet, http.StatusNotModified},
		{"list without spaces", []string{`"old",` + etag + `,"other"`}, http.MethodGet, http.StatusNotModified},
		{"on a second line", []string{`"old"`, etag}, http.MethodGet, http.StatusNotModified},
		{"a comma inside a tag", []string{`"a,b", ` + etag}, http.MethodGet, http.StatusNotModified},
		{"star", []string{"*"}, http.MethodGet, http.StatusNotModified},
		{"HEAD", []string{etag}, http.MethodHead, http.StatusNotModified},
		{"another tag", []string{`"` + opaque[:len(opaque)-1] + `x"`}, http.MethodGet, http.StatusOK},
		{"unquoted", []string{opaque}, http.MethodGet, http.StatusOK},
		{"prefix of the tag", []string{`"` + opaque[:8] + `"`}, http.MethodGet, http.StatusOK},
		{"after a malformed tag", []string{`"old, ` + etag}, http.MethodGet, http.StatusOK},
		{"empty", []string{""}, http.MethodGet, http.StatusOK},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), c.method, e.ts.URL+"/market/vm-images", nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range c.inm {
				req.Header.Add("If-None-Match", v)
			}
			r := e.send(req)
			if r.status != c.status {
				t.Fatalf("status %d, want %d", r.status, c.status)
			}
			wantCacheable(t, r, etag)
			if c.status == http.StatusNotModified && len(r.body) != 0 {
				t.Errorf("304 with a body of %d bytes", len(r.body))
			}
			if c.status == http.StatusOK && c.method == http.MethodGet && len(r.body) == 0 {
				t.Errorf("200 without the catalogue")
			}
		})
	}
}

// TestCatalogueImagesFromConfig: the catalogue of Config (serve's
// --vm-catalogue) is the one answered, with its own ETag.
func TestCatalogueImagesFromConfig(t *testing.T) {
	own, err := catalogue.Load(filepath.Join("..", "catalogue", "testdata", "small.json"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.Catalogue = own })
	r := e.do(http.MethodGet, "/market/vm-images", "", nil)
	if r.status != http.StatusOK || !bytes.Equal(r.body, own.JSON()) {
		t.Fatalf("status %d, body %s; want the configured catalogue", r.status, r.body)
	}
	wantCacheable(t, r, own.ETag())
	if own.ETag() == catalogue.Builtin().ETag() {
		t.Fatalf("the test catalogue has the built-in one's ETag")
	}
	// The built-in catalogue's ETag does not revalidate another one.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, e.ts.URL+"/market/vm-images", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("If-None-Match", catalogue.Builtin().ETag())
	if r := e.send(req); r.status != http.StatusOK {
		t.Errorf("another catalogue's ETag: status %d, want 200", r.status)
	}
}
