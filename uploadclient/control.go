package uploadclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/vmshelf/vmshelf/internal/reason"
)

// Control is the edge's control plane as one tenant calls it.
type Control struct {
	// URL is the control plane's, e.g. http://127.0.0.1:8481, without a
	// trailing slash.
	URL string
	// Token is the tenant's token: sent as a bearer token, never shown.
	Token string
	// TokenFile names where Token came from, for the refusal that asks
	// for the box's current token.
	TokenFile string
	// HTTPClient makes the requests; nil: one with timeouts made for
	// uploads. Redirects are never followed (one would resend a
	// capability somewhere else).
	HTTPClient *http.Client
}

// Image is a stored image as the control plane lists it.
type Image struct {
	UploadID    string    `json:"upload_id"`
	Name        string    `json:"name"`
	EFI         bool      `json:"efi"`
	Size        int64     `json:"size"`
	VirtualSize int64     `json:"virtual_size"`
	SHA256      string    `json:"sha256"`
	CreatedAt   time.Time `json:"created_at"`
	// Raw is the image's JSON as the control plane sent it, compacted:
	// with the fields a newer edge adds.
	Raw json.RawMessage `json:"-"`
}

// Ticket is an unused upload ticket as the control plane's status lists
// it: by its upload id, never the ticket itself.
type Ticket struct {
	UploadID  string    `json:"upload_id"`
	Name      string    `json:"name"`
	EFI       bool      `json:"efi"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Order is one of the tenant's orders as the control plane's status lists
// it: what the command line shows of it.
type Order struct {
	OrderID  string `json:"order_id"`
	Name     string `json:"name"`
	State    string `json:"state"`
	Reason   string `json:"reason"` // why a cancelled order was cancelled
	Host     string `json:"host"`
	Quantity int    `json:"quantity"`
	Image    string `json:"image"`
	// Total is in minor units of Currency (cents).
	Total     int64      `json:"total"`
	Currency  string     `json:"currency"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at"` // the end of the paid month; nil until paid
	Address   string     `json:"address"`
}

// Images lists the tenant's stored images, oldest first, from the control
// plane's status. It asks once: no answer, or a busy or restarting edge,
// is a *StoppedError; a refusal (the token, the route) a *RefusedError.
func (c Control) Images(ctx context.Context) ([]Image, error) {
	imgs, _, err := c.ImagesAndTickets(ctx)
	return imgs, err
}

// ImagesAndTickets is Images with the tenant's unused tickets (oldest
// first), which count against the image quota like images, from the same
// status answer.
func (c Control) ImagesAndTickets(ctx context.Context) ([]Image, []Ticket, error) {
	imgs, tickets, err := clientFor(c.HTTPClient).images(ctx, c.URL, c.Token)
	if err != nil {
		return nil, nil, c.failure(err, "asking the control plane for the image list", "the image list")
	}
	return imgs, tickets, nil
}

// Remove removes one of the tenant's images: its record and fetch URLs,
// then its file. It asks once; a refusal (an unknown image, one an order
// still uses, not sharing, the token) is a *RefusedError, no answer or a
// busy edge a *StoppedError (the image may be gone all the same: asked
// again, the edge then says it knows no such image).
func (c Control) Remove(ctx context.Context, uploadID string) error {
	if err := clientFor(c.HTTPClient).idCall(ctx, c.URL, c.Token, "/market/vm-images/remove", "upload_id", "removed", uploadID); err != nil {
		return c.failure(err, "removing image "+uploadID, "removing image "+uploadID)
	}
	return nil
}

// Cancel cancels one of the tenant's unused tickets by its upload id: it
// no longer counts against the image quota, and an upload with it is
// refused. A ticket that ended without an upload (cancelled, expired)
// cancels again without a word; one an upload used is a *RefusedError
// saying how that upload ends, as are an unknown id and the token; no
// answer or a busy edge is a *StoppedError.
func (c Control) Cancel(ctx context.Context, uploadID string) error {
	if err := clientFor(c.HTTPClient).idCall(ctx, c.URL, c.Token, "/market/vm-images/ticket/cancel", "upload_id", "cancelled", uploadID); err != nil {
		return c.failure(err, "cancelling ticket "+uploadID, "cancelling ticket "+uploadID)
	}
	return nil
}

// Orders lists the tenant's orders, newest first, from the control plane's
// status; a failure is as Images's.
func (c Control) Orders(ctx context.Context) ([]Order, error) {
	var st struct {
		Orders []Order `json:"orders"`
	}
	if err := clientFor(c.HTTPClient).status(ctx, c.URL, c.Token, &st); err != nil {
		return nil, c.failure(err, "asking the control plane for the order list", "the order list")
	}
	return st.Orders, nil
}

// CancelOrder cancels one of the tenant's orders awaiting payment: its
// replicas go back to the offer and its checkout can be paid no more. An
// order that is not awaiting payment (paid, cancelled already…) or not
// the tenant's is a *RefusedError saying so; no answer or a busy edge a
// *StoppedError (asked again, the edge then says the order is cancelled
// already, if the first call got through).
func (c Control) CancelOrder(ctx context.Context, orderID string) error {
	if err := clientFor(c.HTTPClient).idCall(ctx, c.URL, c.Token, "/market/vms/orders/cancel", "order_id", "order_id", orderID); err != nil {
		return c.failure(err, "cancelling order "+orderID, "cancelling order "+orderID)
	}
	return nil
}

// failure is a failed single call: one that may pass stops (doing names
// the call), any other is refused (what names it in the refusal).
func (c Control) failure(err error, doing, what string) error {
	if isTransient(err) {
		return &StoppedError{fmt.Sprintf("%s failed (%v); run the same command again", doing, err)}
	}
	return c.refusal(err, what)
}

// refusal explains a control plane's no to what.
func (c Control) refusal(err error, what string) error {
	var ae *apiError
	if !errors.As(err, &ae) {
		return err
	}
	switch {
	case ae.Status == http.StatusUnauthorized:
		return refusedf("the control plane did not accept the token in %s (401 unauthorized): put this box's current tenant token in it", c.TokenFile)
	case ae.Status == http.StatusNotFound && ae.Reason != "" && !ae.is(reason.NotFound):
		return refusedf("the control plane refused %s: %v", what, err)
	case ae.Status == http.StatusNotFound || ae.Status == http.StatusMethodNotAllowed:
		return refusedf("%s has no vmshelf control plane route for %s (%d): is --control the control plane's URL (port 8481 by default), not the data plane's?",
			c.URL, what, ae.Status)
	}
	return refusedf("the control plane refused %s: %v", what, err)
}

// status reads the tenant's status answer into v.
func (c *uploadClient) status(ctx context.Context, control, token string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, shortCall)
	defer cancel()
	resp, err := c.controlCall(ctx, control, "/market/vms/status", token, struct{}{})
	if err != nil {
		return err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return answerError(resp)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, answerLimit)).Decode(v); err != nil {
		return netFailure(fmt.Errorf("reading the status: %w", err), nil)
	}
	return nil
}

// images reads the images and unused tickets of the tenant's status.
func (c *uploadClient) images(ctx context.Context, control, token string) ([]Image, []Ticket, error) {
	var st struct {
		Images  []json.RawMessage `json:"images"`
		Tickets []Ticket          `json:"tickets"` // absent from an older edge's status
	}
	if err := c.status(ctx, control, token, &st); err != nil {
		return nil, nil, err
	}
	imgs := make([]Image, 0, len(st.Images))
	for _, raw := range st.Images {
		var out bytes.Buffer
		img := Image{}
		if json.Unmarshal(raw, &img) != nil || json.Compact(&out, raw) != nil {
			return nil, nil, &apiError{Status: http.StatusOK, Msg: "the control plane's status lists an image this client cannot read", Offset: -1}
		}
		img.Raw = out.Bytes()
		imgs = append(imgs, img)
	}
	return imgs, st.Tickets, nil
}

// image looks an image up in the tenant's status: nil if the status does
// not list it.
func (c *uploadClient) image(ctx context.Context, control, token, uploadID string) (*Image, error) {
	imgs, _, err := c.images(ctx, control, token)
	if err != nil {
		return nil, err
	}
	for i := range imgs {
		if imgs[i].UploadID == uploadID {
			return &imgs[i], nil
		}
	}
	return nil, nil
}

// idCall posts {key: id} to the control plane's path (remove an image,
// cancel a ticket by "upload_id", cancel an order by "order_id"), whose
// 200 answer names the id under field.
func (c *uploadClient) idCall(ctx context.Context, control, token, path, key, field, id string) error {
	ctx, cancel := context.WithTimeout(ctx, shortCall)
	defer cancel()
	resp, err := c.controlCall(ctx, control, path, token, map[string]string{key: id})
	if err != nil {
		return err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return answerError(resp)
	}
	var ans map[string]any
	if err := json.NewDecoder(io.LimitReader(resp.Body, answerLimit)).Decode(&ans); err != nil {
		return netFailure(fmt.Errorf("reading the answer: %w", err), nil)
	}
	if ans[field] != id {
		return &apiError{Status: resp.StatusCode, Msg: "the control plane's answer does not name " + id + " as " + field, Offset: -1}
	}
	return nil
}
