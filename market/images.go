package market

import (
	"context"
	"errors"
	"net/http"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
)

var errImageUnknown = apierr.New(http.StatusNotFound, "imageUnknown",
	"this box has no image with that upload_id")

type removeRequest struct {
	UploadID string `json:"upload_id"`
}

type removeAnswer struct {
	Removed string `json:"removed"`
}

// remove deletes one of the tenant's images: POST /market/vm-images/remove.
// The record goes first (revoking its fetch tokens in the same
// transaction), the file second: a crash in between leaves an orphan file,
// which start-up cleanup removes, and never a record without its file.
func (s *Server) remove(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	var req removeRequest
	if err := s.decodeBody(w, r, &req, false); err != nil {
		s.fail(w, r, err)
		return
	}
	if !t.Sharing {
		s.fail(w, r, errNotSharing)
		return
	}
	// A malformed id cannot name an image; refusing it here keeps it away
	// from file paths. Same answer as a foreign id: nothing to learn.
	if !imagestore.ValidUploadID(req.UploadID) {
		s.fail(w, r, errImageUnknown)
		return
	}
	err := s.st.RemoveImage(r.Context(), t.ID, req.UploadID)
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		s.fail(w, r, errImageUnknown)
		return
	case err != nil:
		s.fail(w, r, err)
		return
	}
	// The image is gone for the tenant now. The file is deleted even if the
	// client hangs up meanwhile; if that fails the answer is still 200
	// (a retry would only meet imageUnknown) and the log says so.
	if err := s.blobs.Delete(context.WithoutCancel(r.Context()), req.UploadID); err != nil {
		s.log.Error("image record removed but its file was not; start-up cleanup will remove it",
			"upload_id", req.UploadID, "err", err.Error())
	}
	s.writeJSON(w, r, http.StatusOK, removeAnswer{Removed: req.UploadID})
}

// catalogueAnswer is GET /market/vm-images. This stage has no catalogue
// yet; the shape is the SPEC's, with empty (never null) arrays.
type catalogueAnswer struct {
	Catalogue  []any `json:"catalogue"`
	NotOffered []any `json:"not_offered"`
}

func (s *Server) catalogue(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, r, http.StatusOK, catalogueAnswer{Catalogue: []any{}, NotOffered: []any{}})
}
