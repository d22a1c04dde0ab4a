package market

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/crashpoint"
	"github.com/vmshelf/vmshelf/internal/reason"
)

var errImageUnknown = apierr.New(reason.ImageUnknown)

// errImageInUse refuses to remove an image an order still imports: a
// replica whose import fails starts it again, until the order ends.
var errImageInUse = apierr.New(reason.ImageInUse)

// blobDeleteBound is how long a removal waits for the blob store to
// delete the image's bytes before it answers all the same.
const blobDeleteBound = 10 * time.Second

type removeAnswer struct {
	Removed string `json:"removed"`
}

// remove deletes one of the tenant's images: POST /market/vm-images/remove.
// The record goes first (revoking its fetch tokens and writing the remove
// intent in the same transaction), the file second, the intent last: a
// crash or a failed delete in between leaves a file its intent explains,
// which start-up or the sweep deletes (imagestore.FinishRemovals), and
// never a record without its file.
func (s *Server) remove(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	id, ok := s.uploadIDAction(w, r, t, errImageUnknown)
	if !ok {
		return
	}
	err := s.st.RemoveImage(r.Context(), t.ID, id)
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		s.fail(w, r, errImageUnknown)
		return
	case errors.Is(err, imagestore.ErrInUse):
		s.fail(w, r, errImageInUse)
		return
	case err != nil:
		s.fail(w, r, err)
		return
	}
	// The image is gone for the tenant now. The file is deleted even if the
	// client hangs up meanwhile, but within blobDeleteBound: a blob store
	// that hangs must not hold the answer. If the delete fails or runs out
	// of time the answer is still 200 (a retry would only meet
	// imageUnknown), the log says so and the intent keeps the removal for
	// the sweep or the next start-up to finish.
	crashpoint.At(crashpoint.RemoveAfterRecord)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), blobDeleteBound)
	defer cancel()
	if err := s.blobs.Delete(dctx, id); err != nil {
		s.log.Error("image record removed but its file was not; the sweep or the next start-up will delete it",
			"upload_id", id, "err", err.Error())
	} else {
		crashpoint.At(crashpoint.RemoveAfterUnlink)
		if err := s.st.EndIntent(context.WithoutCancel(r.Context()), id, imagestore.IntentRemove); err != nil {
			s.log.Warn("image file removed, its removal not marked done; the sweep will", "upload_id", id, "err", err.Error())
		}
	}
	s.writeJSON(w, r, http.StatusOK, removeAnswer{Removed: id})
}

// catalogueCache lets browsers and proxies keep the catalogue for five
// minutes, then revalidate it with its ETag: it changes only with a restart.
const catalogueCache = "public, max-age=300"

// catalogue answers GET (and HEAD) /market/vm-images, public: the same
// bytes for everyone, built once by the catalogue package.
func (s *Server) catalogue(w http.ResponseWriter, r *http.Request) {
	c := s.cfg.Catalogue
	w.Header().Set("ETag", c.ETag())
	if etagMatch(r.Header.Values("If-None-Match"), c.ETag()) {
		// RFC 9110 15.4.5: a 304 carries the headers a 200 would have
		// had for caching, and no body.
		w.Header().Set("Cache-Control", catalogueCache)
		w.WriteHeader(http.StatusNotModified)
		return
	}
	body := c.JSON()
	// Known in advance: HEAD tells it, and the answer is not chunked.
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	writeCacheable(w, http.StatusOK, body, catalogueCache)
}

// etagMatch reports whether If-None-Match field values name etag under the
// weak comparison RFC 9110 prescribes for it (8.8.3.2, 13.1.2): "*", or any
// entity tag of the comma-separated lists, W/ or not, whose opaque part is
// etag's. A malformed tag ends the reading of its field line; a request
// nothing matches gets the whole answer, which is never wrong.
// (http.ServeContent evaluates the same header, but also serves Range
// requests with plain-text errors, which the control plane does not send.)
func etagMatch(fieldValues []string, etag string) bool {
	want := strings.TrimPrefix(etag, "W/")
	for _, v := range fieldValues {
		for {
			v = strings.TrimLeft(v, " \t,")
			if v == "" {
				break
			}
			if v[0] == '*' {
				return true
			}
			tag, rest, ok := cutETag(v)
			if !ok {
				break
			}
			if tag == want {
				return true
			}
			v = rest
		}
	}
	return false
}

// cutETag splits the entity tag s starts with (W/ dropped) from the rest.
// entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE, etagc = %x21 / %x23-7E /
// obs-text.
func cutETag(s string) (tag, rest string, ok bool) {
	s = strings.TrimPrefix(s, "W/")
	if len(s) < 2 || s[0] != '"' {
		return "", "", false
	}
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			return s[:i+1], s[i+1:], true
		case c == 0x21 || c >= 0x23 && c != 0x7f:
		default:
			return "", "", false
		}
	}
	return "", "", false
}
