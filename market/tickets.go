package market

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
)

// maxNameLen is the longest image name, in characters.
const maxNameLen = 128

type ticketRequest struct {
	Name string `json:"name"`
	EFI  bool   `json:"efi"`
}

type ticketAnswer struct {
	Ticket    string    `json:"ticket"`
	UploadID  string    `json:"upload_id"`
	UploadURL string    `json:"upload_url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// ticket issues a single-use upload right: POST /market/vm-images/ticket.
// The ticket is a fresh 256-bit secret; the store keeps only its hash, and
// the answer is the one place the ticket ever appears.
func (s *Server) ticket(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	var req ticketRequest
	if err := s.decodeBody(w, r, &req, false); err != nil {
		s.fail(w, r, err)
		return
	}
	name, err := cleanName(req.Name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !t.Sharing {
		s.fail(w, r, errNotSharing)
		return
	}
	// The limit comes before any store write or disk question, so a
	// tenant asking in a loop costs one authentication per request.
	if wait, ok := s.tickets.take(t.ID, s.cfg.Now()); !ok {
		s.fail(w, r, errRateLimited(wait))
		return
	}

	// A ticket for an upload the disk cannot take would only be refused
	// later, after the client read and maybe sent its image.
	avail, err := s.blobs.Available(r.Context())
	if err != nil {
		s.fail(w, r, fmt.Errorf("read free disk space: %w", err))
		return
	}
	if avail < s.cfg.Headroom {
		s.fail(w, r, errNoSpace(fmt.Errorf("%d bytes free, below the %d bytes of headroom", avail, s.cfg.Headroom)))
		return
	}

	secret := imagestore.NewSecret()
	now := s.cfg.Now().UTC()
	tk := imagestore.Ticket{
		UploadID:  imagestore.NewUploadID(),
		TenantID:  t.ID,
		Name:      name,
		EFI:       req.EFI,
		CreatedAt: now,
		ExpiresAt: now.Add(s.cfg.TicketTTL),
	}
	err = s.st.CreateTicket(r.Context(), tk, imagestore.HashSecret(secret), s.cfg.ImagesPerTenant)
	switch {
	case errors.Is(err, imagestore.ErrQuota):
		s.fail(w, r, apierr.Wrap(err, http.StatusConflict, "imageQuota",
			"this box's images, unused tickets and unfinished uploads already number "+
				strconv.Itoa(s.cfg.ImagesPerTenant)+", the most allowed; finish or let an upload expire, or remove an image"))
		return
	case err != nil:
		s.fail(w, r, err)
		return
	}
	s.metrics.ticketsIssued.Inc()
	s.writeJSON(w, r, http.StatusCreated, ticketAnswer{
		Ticket:    secret,
		UploadID:  tk.UploadID,
		UploadURL: s.cfg.PublicURL + "/market/vm-images/upload/" + secret,
		ExpiresAt: tk.ExpiresAt,
	})
}

// cleanName trims name and checks it is 1..128 printable characters. Names
// end up in the page, in logs and in VM labels' neighbourhood, so control
// and format characters (including bidi overrides) are refused outright.
func cleanName(name string) (string, error) {
	name = strings.TrimSpace(name)
	n := utf8.RuneCountInString(name)
	if !utf8.ValidString(name) || n < 1 || n > maxNameLen {
		return "", badRequest("name must be 1 to 128 printable characters")
	}
	for _, c := range name {
		if !unicode.IsPrint(c) {
			return "", badRequest("name must be 1 to 128 printable characters; it contains a control or format character")
		}
	}
	return name, nil
}

var errTicketUnknown = apierr.New(http.StatusNotFound, "ticketUnknown",
	"this box has no upload ticket with that upload_id")

type cancelTicketRequest struct {
	UploadID string `json:"upload_id"`
}

type cancelTicketAnswer struct {
	Cancelled string `json:"cancelled"`
}

// cancelTicket ends one of the tenant's unused tickets:
// POST /market/vm-images/ticket/cancel. From the answer on the ticket
// holds no place in the quota, and an upload with it is refused like one
// with a used ticket (410 ticketUsed). A ticket that has ended without an
// upload (cancelled already, released by a refused upload, expired) is
// answered alike, 200, so a retry after a lost answer succeeds; one an
// upload used is a 409 that says how that upload ends.
func (s *Server) cancelTicket(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	var req cancelTicketRequest
	if err := s.decodeBody(w, r, &req, false); err != nil {
		s.fail(w, r, err)
		return
	}
	if !t.Sharing {
		s.fail(w, r, errNotSharing)
		return
	}
	// As for remove: a malformed id names no ticket, and is answered
	// like another tenant's.
	if !imagestore.ValidUploadID(req.UploadID) {
		s.fail(w, r, errTicketUnknown)
		return
	}
	err := s.st.CancelTicket(r.Context(), t.ID, req.UploadID, s.cfg.Now())
	switch {
	case err == nil:
		s.metrics.ticketsCancelled.Inc()
	case errors.Is(err, imagestore.ErrTicketCancelled), errors.Is(err, imagestore.ErrTicketExpired):
	case errors.Is(err, imagestore.ErrNotFound):
		s.fail(w, r, errTicketUnknown)
		return
	case errors.Is(err, imagestore.ErrTicketUsed):
		s.fail(w, r, s.ticketUsed(r, t, req.UploadID))
		return
	default:
		s.fail(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, cancelTicketAnswer{Cancelled: req.UploadID})
}

// ticketUsed is the 409 of a cancel of a ticket an upload used: what holds
// the place now, and how to give it back.
func (s *Server) ticketUsed(r *http.Request, t imagestore.Tenant, uploadID string) error {
	if img, err := s.st.Image(r.Context(), uploadID); err == nil && img.TenantID == t.ID {
		return apierr.New(http.StatusConflict, "ticketUsed",
			"this ticket's upload has finished: it is the image "+uploadID+"; remove the image to free its place (POST /market/vm-images/remove, vmshelf rm)")
	}
	return apierr.New(http.StatusConflict, "ticketUsed",
		"an upload has already used this ticket; it holds a place only while it runs: a resumable upload ends with DELETE on its upload-session URL "+
			"(or 24 hours after its last byte), a plain PUT when its connection closes")
}
