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
	Listings  []any              `json:"listings"`
	Offers    []any              `json:"offers"`
	Orders    []any              `json:"orders"`
	Account   account            `json:"account"`
}

type account struct {
	Name          string `json:"name"`
	InMesh        bool   `json:"in_mesh"`
	Sharing       bool   `json:"sharing"`
	HostsVMs      bool   `json:"hosts_vms"`
	PayoutAccount bool   `json:"payout_account"`
}

type statusRequest struct{}

func (s *Server) status(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	// An empty body is {}; anything else must still be a valid, empty
	// object (unknown fields are refused like everywhere).
	var req statusRequest
	if err := decodeBody(w, r, &req, true); err != nil {
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
	ans := statusAnswer{
		Available: true,
		Images:    images,
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

// readyz is ready when the store answers and the image directory is
// reachable. The sentence names which failed; the cause goes to the log
// only.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
	defer cancel()
	storeErr := s.st.Ping(ctx)
	_, blobErr := s.blobs.Available(ctx)
	var msg string
	switch {
	case storeErr != nil && blobErr != nil:
		msg = "neither the record store nor the image storage is reachable"
	case storeErr != nil:
		msg = "the record store is not reachable"
	case blobErr != nil:
		msg = "the image storage is not reachable"
	default:
		s.writeJSON(w, r, http.StatusOK, map[string]string{"status": "ok"})
		return
	}
	s.fail(w, r, apierr.Wrap(errors.Join(storeErr, blobErr), http.StatusServiceUnavailable, "notReady", msg))
}
