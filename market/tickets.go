package market

import (
	"context"
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
	"github.com/vmshelf/vmshelf/internal/reason"
	"github.com/vmshelf/vmshelf/internal/settle"
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
	hash := imagestore.HashSecret(secret)
	err = s.st.CreateTicket(r.Context(), tk, hash, s.cfg.ImagesPerTenant)
	switch {
	case errors.Is(err, imagestore.ErrQuota):
		s.fail(w, r, apierr.Wrap(err, reason.ImageQuota).
			WithMsg("this box's images, unused tickets and unfinished uploads already number "+
				strconv.Itoa(s.cfg.ImagesPerTenant)+", the most allowed; cancel an unused ticket (vmshelf cancel; status lists them), finish or let an upload expire, or remove an image"))
		return
	case errors.Is(err, imagestore.ErrNotFound), errors.Is(err, imagestore.ErrExists):
		s.fail(w, r, err) // refused by the records: nothing was written
		return
	case err != nil:
		// "Could not ask" is not "not done": the write may have landed,
		// or may land still.
		s.withdraw(tk, hash, "the store did not confirm it")
		s.fail(w, r, err)
		return
	}
	ans := ticketAnswer{
		Ticket:    secret,
		UploadID:  tk.UploadID,
		UploadURL: s.cfg.PublicURL + "/market/vm-images/upload/" + secret,
		ExpiresAt: tk.ExpiresAt,
	}
	if !s.deliver(w, r, http.StatusCreated, ans) {
		s.withdraw(tk, hash, "its client was gone before the answer")
		return
	}
	s.metrics.ticketsIssued.Inc()
}

// A ticket request either gets its ticket or leaves none. A ticket holds
// one of its tenant's few places for its whole TTL, and one made behind
// a client's back (the client saw an error, or no answer at all) holds it
// for nothing. The hard case is a CreateTicket whose write lands while
// its caller no longer waits: a server that stalled after the INSERT and
// resumes after the call's deadline, or a client that left while the
// write ran. Two ways were open:
//
//   - create tickets in a state that only the written answer makes
//     usable (a second write after the answer). But a place must be
//     counted from the first write on, or quotas race, and the second
//     write can fail as the first did: the client would then hold a 201
//     whose ticket does not work, the very thing the rule forbids;
//   - undo, after the answer, what the call may have done: a compensating
//     write, bounded by its own deadline and tried again until the store
//     answers.
//
// The undo is taken: it leaves every successful request as it was (one
// write, its answer), and costs only the requests that failed. Its write
// is imagestore.Store.WithdrawTicket, one upsert on the ticket's upload
// id that holds in whichever order it meets the late CreateTicket: it
// cancels the row that landed, or writes a cancelled row that makes the
// late write fail on the id's uniqueness. The client never saw the
// ticket's secret, so nothing can use it meanwhile; its place comes back
// the moment the store answers again. Only a replica that dies with an
// undo pending leaves the ticket to its TTL.

// Bounds of the withdrawals: tried again every firstWithdrawBackoff to
// maxWithdrawBackoff while the store does not answer, until the ticket
// would have expired anyway.
const (
	firstWithdrawBackoff = 500 * time.Millisecond
	maxWithdrawBackoff   = 2 * time.Second
)

func (s *Server) newWithdrawals() *settle.Queue {
	return settle.New(s.stop, s.log, func(err error) bool { return errors.Is(err, imagestore.ErrStoreUnavailable) },
		firstWithdrawBackoff, maxWithdrawBackoff)
}

// withdraw takes tk back in the background (see above); why says why its
// answer did not reach the client.
func (s *Server) withdraw(tk imagestore.Ticket, hash imagestore.Hash, why string) {
	// Until the ticket would have expired: its remaining TTL from now, on
	// the process's clock (the settle queue's).
	until := time.Now().Add(tk.ExpiresAt.Sub(s.cfg.Now()))
	s.withdrawals.Go(settle.Job{Name: "withdraw a ticket whose answer was lost", Attrs: []any{"upload_id", tk.UploadID, "why", why},
		Until: until, Done: "ticket whose answer was lost withdrawn",
		Left: "it holds its tenant's place until it expires; nobody holds its secret",
		Run: func() error {
			return s.st.WithdrawTicket(context.Background(), tk, hash, s.cfg.Now())
		}})
}

// deliver answers status with v, as writeJSON does, and reports whether
// the answer reached the connection: false when the client left before
// it (the request's context is done) or the connection refused it. The
// request counter then counts what the client got: no answer (499).
func (s *Server) deliver(w http.ResponseWriter, r *http.Request, status int, v any) bool {
	if r.Context().Err() != nil {
		clientGone(w)
		return false
	}
	s.writeJSON(w, r, status, v)
	if err := http.NewResponseController(w).Flush(); err != nil {
		clientGone(w)
		return false
	}
	return true
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

var errTicketUnknown = apierr.New(reason.TicketUnknown).
	WithMsg("this box has no upload ticket with that upload_id")

// uploadIDRequest is the body of remove and ticket/cancel.
type uploadIDRequest struct {
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
	id, ok := s.uploadIDAction(w, r, t, errTicketUnknown)
	if !ok {
		return
	}
	err := s.st.CancelTicket(r.Context(), t.ID, id, s.cfg.Now())
	switch {
	case err == nil:
		s.metrics.ticketsCancelled.Inc()
	case errors.Is(err, imagestore.ErrTicketCancelled), errors.Is(err, imagestore.ErrTicketExpired):
	case errors.Is(err, imagestore.ErrNotFound):
		s.fail(w, r, errTicketUnknown)
		return
	case errors.Is(err, imagestore.ErrTicketUsed):
		s.fail(w, r, s.ticketUsed(r, t, id))
		return
	default:
		s.fail(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, cancelTicketAnswer{Cancelled: id})
}

// uploadIDAction reads the body {"upload_id"} of a tenant's action on one
// of its uploads (remove an image, cancel a ticket) and checks that t may
// act; false when it has answered already. A malformed id names nothing
// the tenant has, and is answered unknown like another tenant's id, which
// also keeps it away from file paths.
func (s *Server) uploadIDAction(w http.ResponseWriter, r *http.Request, t imagestore.Tenant, unknown error) (string, bool) {
	var req uploadIDRequest
	if err := s.decodeBody(w, r, &req, false); err != nil {
		s.fail(w, r, err)
		return "", false
	}
	if !t.Sharing {
		s.fail(w, r, errNotSharing)
		return "", false
	}
	if !imagestore.ValidUploadID(req.UploadID) {
		s.fail(w, r, unknown)
		return "", false
	}
	return req.UploadID, true
}

// ticketUsed is the 409 of a cancel of a ticket an upload used: what holds
// the place now, and how to give it back.
func (s *Server) ticketUsed(r *http.Request, t imagestore.Tenant, uploadID string) error {
	if img, err := s.st.Image(r.Context(), uploadID); err == nil && img.TenantID == t.ID {
		return apierr.New(reason.TicketInUse).
			WithMsg("this ticket's upload has finished: it is the image " + uploadID + "; remove the image to free its place (POST /market/vm-images/remove, vmshelf rm)")
	}
	return apierr.New(reason.TicketInUse).
		WithMsg("an upload has already used this ticket; it holds a place only while it runs: a resumable upload ends with DELETE on its upload-session URL " +
			"(or 24 hours after its last byte), a plain PUT when its connection closes")
}
