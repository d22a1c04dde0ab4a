package market

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
)

// statusAnswer is POST /market/vms/status. Listings, offers and orders come
// with later stages; they are empty arrays (never null) so clients can
// iterate without checks. Nothing here is a secret: images carry their
// public fields only, the account says whether a payout account exists but
// not its id.
type statusAnswer struct {
	Available bool               `json:"available"`
	Reason    string             `json:"reason,omitempty"`
	Images    []imagestore.Image `json:"images"`
	// Sessions are the unfinished resumable uploads: their bytes are on
	// the edge's disk and each counts against the image quota.
	Sessions []sessionInfo `json:"sessions"`
	Listings []any         `json:"listings"`
	Offers   []any         `json:"offers"`
	Orders   []any         `json:"orders"`
	Account  account       `json:"account"`
}

type account struct {
	Name          string `json:"name"`
	InMesh        bool   `json:"in_mesh"`
	Sharing       bool   `json:"sharing"`
	HostsVMs      bool   `json:"hosts_vms"`
	PayoutAccount bool   `json:"payout_account"`
}

// sessionInfo is an open upload session as status shows it: offset is
// the bytes durably received, length the size of the whole image.
type sessionInfo struct {
	UploadID  string    `json:"upload_id"`
	Name      string    `json:"name"`
	Offset    int64     `json:"offset"`
	Length    int64     `json:"length"`
	ExpiresAt time.Time `json:"expires_at"`
}

type statusRequest struct{}

func (s *Server) status(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	// An empty body is {}; anything else must still be a valid, empty
	// object (unknown fields are refused like everywhere).
	var req statusRequest
	if err := s.decodeBody(w, r, &req, true); err != nil {
		s.fail(w, r, err)
		return
	}
	images, err := s.st.Images(r.Context(), t.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if images == nil {
		images = []imagestore.Image{}
	}
	open, err := s.st.OpenSessions(r.Context(), t.ID, s.cfg.Now())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sessions := make([]sessionInfo, 0, len(open))
	for _, us := range open {
		sessions = append(sessions, sessionInfo{UploadID: us.UploadID, Name: us.Name,
			Offset: us.Offset, Length: us.Length, ExpiresAt: us.ExpiresAt.UTC()})
	}
	ans := statusAnswer{
		Available: true,
		Images:    images,
		Sessions:  sessions,
		Listings:  []any{},
		Offers:    []any{},
		Orders:    []any{},
		Account: account{
			Name:          t.Name,
			InMesh:        t.InMesh,
			Sharing:       t.Sharing,
			HostsVMs:      t.HostsVMs,
			PayoutAccount: t.StripeAccount != "",
		},
	}
	switch {
	case !t.Sharing:
		ans.Available, ans.Reason = false, "notSharing"
	case !s.cfg.VMsEnabled:
		ans.Available, ans.Reason = false, "notOffered"
	}
	s.writeJSON(w, r, http.StatusOK, ans)
}

// probeTimeout bounds each readiness check, so a hung disk or store makes
// the probe fail instead of hang.
const probeTimeout = 2 * time.Second

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, r, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz is ready when the store answers and can write, and the disk has
// room for the store's own writes. A 503 names the reason: storeCorrupt
// (a damaged page was met: restore the db), storeUnwritable (writes fail:
// I/O errors, a read-only file system), noSpace (the disk is full: remove
// images or free space), notReady (the store or the image directory does
// not answer). The cause goes to the log only.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
	defer cancel()
	storeErr := s.st.Ping(ctx)
	avail, blobErr := s.blobs.Available(ctx)
	var e *apierr.Error
	switch {
	case errors.Is(storeErr, imagestore.ErrDamaged):
		e = apierr.Wrap(storeErr, http.StatusServiceUnavailable, "storeCorrupt", "the record store is damaged; restore it from a backup")
	case errors.Is(storeErr, imagestore.ErrUnwritable):
		e = apierr.Wrap(storeErr, http.StatusServiceUnavailable, "storeUnwritable", "the record store cannot write")
	case storeErr != nil && !errors.Is(storeErr, imagestore.ErrNoSpace):
		e = apierr.Wrap(storeErr, http.StatusServiceUnavailable, "notReady", "the record store is not reachable")
	case blobErr != nil:
		e = apierr.Wrap(blobErr, http.StatusServiceUnavailable, "notReady", "the image storage is not reachable")
	case avail < s.cfg.MinFree:
		e = apierr.Wrap(storeErr, http.StatusServiceUnavailable, "noSpace", "the disk is full; remove images or free space")
	default: // a store write that failed for space before the room came back is no reason to wait
		s.writeJSON(w, r, http.StatusOK, map[string]string{"status": "ok"})
		return
	}
	s.fail(w, r, e)
}
