package gateway

import (
	"errors"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
)

// Which refusals before the body end the ticket (docs/api.md, "A ticket
// refused before its body"). A ticket is known valid from admit's lookup
// on; a refusal from then on, before the transfer consumes the ticket,
// either ends it or leaves it for the retry:
//
//   - the request itself cannot be served, now or later (413 tooLarge:
//     the announced size is above --upload-max-gib; 415 badContentType: a
//     creation's bytes without their media type): the ticket ends with
//     the refusal, so it stops counting against its tenant's quota at
//     once instead of for the rest of its TTL, and the answer says to ask
//     for a new one;
//   - the edge's own passing state refused it (503 busy, 507 noSpace,
//     500 when the free space cannot be read): the answer asks for a
//     retry, which the same ticket makes. Burning it would turn "try
//     again" into "ask again".
//
// Refusals before admit has found the ticket valid (its shape, unknown,
// used, expired, the rate limit, a tus version or Upload-Length the
// request gets wrong) write nothing: a flood of requests that hold no
// valid ticket must never cause a store write.

// ticketEnded is appended to the message of a refusal that ended its
// ticket.
const ticketEnded = "; this upload ticket has ended with the refusal: ask for a new one"

// releaseTicket ends the valid, unused ticket tk of a request refused
// before its body for a reason the retry would meet again, and returns
// the refusal saying so. A ticket another request used or ended meanwhile
// is left to that request; if the store cannot be told, the ticket stays
// unused and counted until it expires (the log says so).
func (g *Gateway) releaseTicket(tk imagestore.Ticket, refusal *apierr.Error) *apierr.Error {
	octx, cancel := g.op()
	defer cancel()
	err := g.store.CancelTicket(octx, tk.TenantID, tk.UploadID, g.cfg.Now())
	switch {
	case err == nil:
		g.metrics.released.Inc()
	case errors.Is(err, imagestore.ErrTicketUsed), errors.Is(err, imagestore.ErrTicketCancelled),
		errors.Is(err, imagestore.ErrTicketExpired), errors.Is(err, imagestore.ErrNotFound):
		// Another request's, or ended already: nothing to release.
	default:
		g.log.Error("refused upload's ticket not released; it counts against its tenant's quota until it expires",
			"upload_id", tk.UploadID, "err", err)
		return refusal
	}
	return refusal.WithMsg(refusal.Msg + ticketEnded)
}
