package market

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/vmshelf/vmshelf/billing"
	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/bootdisk"
	"github.com/vmshelf/vmshelf/internal/reason"
)

// The VM market's limits (docs/api.md and docs/operations.md give them to
// clients and operators). Capacity and quantity are the market's terms;
// the price ceiling keeps a total (≤ 10 × the price) far inside Stripe's
// maximum charge. The floor is Stripe's minimum charge in the listing's currency
// (billing.MinimumAmount, the gate's own table), so one machine can always
// be paid for. The open-listing and unpaid-order bounds stop one tenant
// from filling the store or holding every listing's capacity with
// checkouts it never pays.
const (
	maxUnitPrice       = 1_000_000 // 10 000.00 a replica-month
	minCapacity        = 1
	maxCapacity        = 50
	minQuantity        = 1
	maxQuantity        = 10
	maxOpenListings    = 10 // per host
	maxUnpaidOrders    = 3  // per buyer, awaiting payment at once
	maxUserData        = 16 << 10
	maxOrderNameLength = 63 // a DNS label
)

// Defaults of the checkout's timing.
const (
	// DefaultCheckoutTTL is how long a Checkout Session stays payable:
	// Stripe's minimum of 30 minutes, plus one so that the time between
	// building the request and Stripe's own check never takes it below.
	DefaultCheckoutTTL = 31 * time.Minute
	// DefaultCheckoutGrace is how long after the session's expiry the
	// sweeper waits for Stripe's checkout.session.expired before it asks
	// Stripe itself and releases the reservation.
	DefaultCheckoutGrace = 10 * time.Minute
)

var (
	errNotOffered          = apierr.New(reason.NotOffered)
	errPaymentsUnavailable = apierr.New(reason.PaymentsUnavailable)
	errNotHosting          = apierr.New(reason.NotHosting)
	errNoPayoutAccount     = apierr.New(reason.NoPayoutAccount)
	errListingUnknown      = apierr.New(reason.ListingUnknown)
	errNoCapacity          = apierr.New(reason.NoCapacity)
	errOwnListing          = apierr.New(reason.OwnListing)
	errTooManyListings     = apierr.New(reason.TooManyListings).WithMsg(
		"this box already has " + strconv.Itoa(maxOpenListings) + " open listings; close one first")
	errTooManyUnpaid = apierr.New(reason.TooManyUnpaidOrders).WithMsg(
		"this box already has " + strconv.Itoa(maxUnpaidOrders) + " orders awaiting payment; pay, cancel or let one expire first")
	errHostGone = apierr.New(reason.NotHosting).WithMsg(
		"the listing's host no longer hosts machines or has no payout account")
	// errNeedsConsole refuses an installation ISO of the catalogue on an
	// edge without the browser console to install it with.
	errNeedsConsole = apierr.New(reason.NeedsConsole)
	// errUserDataNotForInstaller refuses user_data for an installation
	// ISO: the replica boots an installer, which runs no cloud-init, and
	// data that is silently never applied would look like a broken order.
	errUserDataNotForInstaller = apierr.New(reason.UserDataNotForInstaller)
	// errNoBootLoader and errWrongFirmware refuse an order of an image
	// that no machine could start as ordered, before anybody pays.
	errNoBootLoader  = apierr.New(reason.NoBootLoader)
	errWrongFirmware = apierr.New(reason.WrongFirmware)
)

// errStripeNoAnswer is the 503 of a Stripe call that got no answer; the
// client may retry.
var errStripeNoAnswer = apierr.New(reason.PaymentsUnavailable).WithMsg(
	"the payment provider did not answer; try again in a minute").WithRetryAfter(30)

// stripeUnavailable is errStripeNoAnswer caused by err.
func stripeUnavailable(err error) error { return errStripeNoAnswer.WithCause(err) }

// machinesUnavailable is why tenant t cannot use the VM market, or nil:
// not sharing, VMs not offered, or (payments) no Stripe keys. Status
// reports it as available:false; every machine action is refused with it
// before anything else is looked at.
func (s *Server) machinesUnavailable(t imagestore.Tenant, payments bool) *apierr.Error {
	switch {
	case !t.Sharing:
		return errNotSharing
	case !s.cfg.VMsEnabled:
		return errNotOffered
	case payments && s.cfg.Payments == nil:
		return errPaymentsUnavailable
	}
	return nil
}

// machineRoute is a tenant route of the VM market: after the tenant's
// token, its availability is decided before the body is read. payments
// says whether the action needs Stripe (closing a listing does not).
func (s *Server) machineRoute(payments bool, h func(http.ResponseWriter, *http.Request, imagestore.Tenant)) http.HandlerFunc {
	return s.tenantRoute(func(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
		if e := s.machinesUnavailable(t, payments); e != nil {
			s.fail(w, r, e)
			return
		}
		h(w, r, t)
	})
}

// listingInfo is a listing as its host sees it (and the 201 of a new one).
type listingInfo struct {
	ListingID string    `json:"listing_id"`
	UnitPrice int64     `json:"unit_price"`
	Currency  string    `json:"currency"`
	Capacity  int       `json:"capacity"`
	Reserved  int       `json:"reserved"`
	Running   int       `json:"running"`
	Free      int       `json:"free"`
	Open      bool      `json:"open"`
	CreatedAt time.Time `json:"created_at"`
}

func listingOf(l imagestore.Listing) listingInfo {
	return listingInfo{ListingID: l.ID, UnitPrice: l.UnitPrice, Currency: l.Currency, Capacity: l.Capacity,
		Reserved: l.Reserved, Running: l.Running, Free: l.Free(), Open: l.Open(), CreatedAt: l.CreatedAt.UTC()}
}

type listingRequest struct {
	UnitPrice int64 `json:"unit_price"`
	Capacity  int   `json:"capacity"`
}

// createListing is POST /market/vms/listings: a host offers capacity
// replicas at unit_price cents a replica-month.
func (s *Server) createListing(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	var req listingRequest
	if err := s.decodeBody(w, r, &req, false); err != nil {
		s.fail(w, r, err)
		return
	}
	switch {
	case req.UnitPrice < 1 || req.UnitPrice > maxUnitPrice:
		s.fail(w, r, badRequest(fmt.Sprintf("unit_price must be 1 to %d (minor units, e.g. cents, per replica-month)", maxUnitPrice)))
		return
	case req.Capacity < minCapacity || req.Capacity > maxCapacity:
		s.fail(w, r, badRequest(fmt.Sprintf("capacity must be %d to %d replicas", minCapacity, maxCapacity)))
		return
	}
	if err := checkMinimumCharge(req.UnitPrice, s.cfg.Currency); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.checkHost(r.Context(), t); err != nil {
		s.fail(w, r, err)
		return
	}
	own, err := s.st.Listings(r.Context(), t.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	open := 0
	for _, l := range own {
		if l.Open() {
			open++
		}
	}
	if open >= maxOpenListings {
		s.fail(w, r, errTooManyListings)
		return
	}
	l, err := s.st.CreateListing(r.Context(), imagestore.Listing{ID: imagestore.NewListingID(), HostID: t.ID,
		UnitPrice: req.UnitPrice, Currency: s.cfg.Currency, Capacity: req.Capacity, CreatedAt: s.cfg.Now().UTC()})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("listing created", "listing_id", l.ID, "host", t.Name, "unit_price", l.UnitPrice, "capacity", l.Capacity)
	s.writeJSON(w, r, http.StatusCreated, listingOf(l))
}

// checkMinimumCharge refuses a unit price below Stripe's minimum charge
// in currency: an order of one machine at that price could not be paid,
// and would only be found out when the buyer orders. The minimum comes
// from the payment gate's table, the one place it is written.
func checkMinimumCharge(unitPrice int64, currency string) error {
	minimum, ok := billing.MinimumAmount(currency)
	if !ok || unitPrice >= minimum {
		return nil // an unknown currency is refused at start-up
	}
	return apierr.New(reason.BelowMinimumCharge).
		WithMsg(fmt.Sprintf("%s; a unit price of %s cannot be paid for one machine",
			smallestCharge(currency, minimum), billing.Amount(unitPrice, currency)))
}

// smallestCharge says Stripe's minimum charge in currency in words.
func smallestCharge(currency string, minimum int64) string {
	return fmt.Sprintf("the smallest charge Stripe accepts in %s is %s", strings.ToUpper(currency), billing.Amount(minimum, currency))
}

// gateRefusal is the answer to an order whose checkout the payment gate
// refused. What depends on the listing is the buyer's 4xx in words: a
// total below Stripe's minimum (a listing from before listings were
// checked against it), a host whose payout account is no longer valid.
// Any other reason means the market built a wrong checkout: a 500.
func gateRefusal(o imagestore.Order, err error) error {
	switch {
	case errors.Is(err, billing.ErrBelowMinimum):
		minimum, _ := billing.MinimumAmount(o.Currency)
		return apierr.Wrap(err, reason.BelowMinimumCharge).
			WithMsg(fmt.Sprintf("%s; this order's total of %s cannot be paid; the order is cancelled",
				smallestCharge(o.Currency, minimum), billing.Amount(o.Total, o.Currency)))
	case errors.Is(err, billing.ErrDestination):
		return errHostGone.WithCause(err)
	}
	return fmt.Errorf("order %s: the payment gate refused the checkout we built: %w", o.ID, err)
}

// checkHost is nil when t may host: in the mesh, sharing, hosting with an
// appliance node, and with a Stripe account that can be paid. An account
// made by onboarding can once account.updated said charges and payouts
// are enabled; the operator's account when its transfers capability is
// active — asked from Stripe, since only Stripe knows. Stripe's "no" (no
// such account, not connected to this platform) is noPayoutAccount; no
// answer is a 503, never a "no".
func (s *Server) checkHost(ctx context.Context, t imagestore.Tenant) error {
	if !t.InMesh || !t.HostsVMs || t.Appliance == "" {
		return errNotHosting
	}
	if t.StripeAccount == "" {
		return errNoPayoutAccount
	}
	if t.StripeOnboarded { // what account.updated said (onboarding.go)
		if !payoutAccount(t) {
			return errPayoutsNotEnabled
		}
		return nil
	}
	ok, err := s.cfg.Payments.TransfersActive(ctx, t.StripeAccount)
	switch {
	case errors.Is(err, billing.ErrUnavailable):
		return stripeUnavailable(err)
	case err != nil: // not found, refused, malformed id: Stripe's answer
		return errNoPayoutAccount.WithCause(err)
	case !ok:
		return errNoPayoutAccount
	}
	return nil
}

type closeListingRequest struct {
	ListingID string `json:"listing_id"`
}

// closeListing is POST /market/vms/listings/close: the host takes no more
// orders on the listing; orders already placed go on.
func (s *Server) closeListing(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	var req closeListingRequest
	if err := s.decodeBody(w, r, &req, false); err != nil {
		s.fail(w, r, err)
		return
	}
	err := s.st.CloseListing(r.Context(), t.ID, req.ListingID, s.cfg.Now().UTC())
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		s.fail(w, r, errListingUnknown) // another host's listing looks the same
		return
	case err != nil:
		s.fail(w, r, err)
		return
	}
	l, err := s.st.Listing(r.Context(), req.ListingID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("listing closed", "listing_id", l.ID, "host", t.Name)
	s.writeJSON(w, r, http.StatusOK, listingOf(l))
}

type orderRequest struct {
	ListingID string `json:"listing_id"`
	Quantity  int    `json:"quantity"`
	Image     string `json:"image"`
	Name      string `json:"name"`
	UserData  string `json:"user_data"`
}

type orderAnswer struct {
	OrderID     string                `json:"order_id"`
	State       imagestore.OrderState `json:"state"`
	CheckoutURL string                `json:"checkout_url"`
	// ExpiresAt is when the checkout stops taking the payment.
	ExpiresAt time.Time `json:"expires_at"`
	Total     int64     `json:"total"`
	Currency  string    `json:"currency"`
}

// dnsLabel is an RFC 1123 label in lower case, as Kubernetes names want.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// checkoutBound is how long an order, once it holds its capacity, may
// take to open its checkout (or be cancelled), whether or not the buyer
// still waits: one Stripe call (billing.DefaultTimeout, 15 s, bounds it)
// and one store write (the stores bound a statement at 10 s) fit with
// room to spare. Past it something is wedged; an order left unpaid is
// released by the checkout sweeper after its reservation.
const checkoutBound = time.Minute

// createOrder is POST /market/vms/orders: the buyer reserves quantity
// replicas of a listing and gets a Stripe Checkout to pay them. The
// reservation and the order are one store transaction; the checkout comes
// after it, and an order whose checkout could not be opened is cancelled
// at once, so its capacity is back.
func (s *Server) createOrder(w http.ResponseWriter, r *http.Request, t imagestore.Tenant) {
	var req orderRequest
	if err := s.decodeBody(w, r, &req, false); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := checkOrderRequest(req); err != nil {
		s.fail(w, r, err)
		return
	}
	ctx := r.Context()
	kind, err := s.orderImage(ctx, t, req.Image, req.UserData)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	l, host, err := s.orderListing(ctx, t, req.ListingID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	now := s.cfg.Now().UTC()
	total := l.UnitPrice * int64(req.Quantity)
	fee, _ := billing.Split(total)
	expires := now.Add(s.cfg.CheckoutTTL)
	o := imagestore.Order{
		ID: imagestore.NewOrderID(), ListingID: l.ID, BuyerID: t.ID, HostID: l.HostID,
		Quantity: req.Quantity, ImageKind: kind, Image: req.Image, Name: req.Name,
		UnitPrice: l.UnitPrice, Total: total, Fee: fee, Currency: l.Currency, Destination: host.StripeAccount,
		State: imagestore.OrderAwaitingPayment, ReserveUntil: expires.Add(s.cfg.CheckoutGrace), CreatedAt: now,
	}
	if err := s.placeOrder(ctx, o, req.UserData); err != nil {
		s.fail(w, r, err)
		return
	}
	s.metrics.ordersPlaced.Inc()
	sess, err := s.openCheckout(ctx, o, host.Name, expires)
	if err != nil {
		s.fail(w, r, aboutOrder(o.ID, err))
		return
	}
	s.log.Info("order placed", "order_id", o.ID, "buyer", t.Name, "listing_id", l.ID,
		"quantity", o.Quantity, "total", o.Total, "fee", o.Fee)
	s.writeJSON(w, r, http.StatusCreated, orderAnswer{OrderID: o.ID, State: o.State, CheckoutURL: sess.URL,
		ExpiresAt: expires, Total: o.Total, Currency: o.Currency})
}

// orderListing finds the listing an order names and its host, refusing
// the buyer's own listing and a host that stopped hosting since it listed
// (a payment to it now would run no machine).
func (s *Server) orderListing(ctx context.Context, t imagestore.Tenant, id string) (imagestore.Listing, imagestore.Tenant, error) {
	l, err := s.st.Listing(ctx, id)
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		return l, imagestore.Tenant{}, errListingUnknown
	case err != nil:
		return l, imagestore.Tenant{}, err
	case l.HostID == t.ID:
		return l, imagestore.Tenant{}, errOwnListing
	}
	host, err := s.st.TenantByID(ctx, l.HostID)
	if err != nil {
		return l, host, err
	}
	if !canHost(host) {
		return l, host, errHostGone
	}
	return l, host, nil
}

// placeOrder records o with its capacity reserved, in one store
// transaction, and says in the buyer's words why it could not.
func (s *Server) placeOrder(ctx context.Context, o imagestore.Order, userData string) error {
	switch err := s.st.CreateOrder(ctx, o, userData, maxUnpaidOrders); {
	case errors.Is(err, imagestore.ErrTooManyUnpaid):
		return errTooManyUnpaid
	case errors.Is(err, imagestore.ErrNoCapacity):
		return apierr.Wrap(err, reason.NoCapacity).
			WithMsg(fmt.Sprintf("the listing has fewer than %d replicas free (or is closed)", o.Quantity))
	case errors.Is(err, imagestore.ErrOwnListing):
		return errOwnListing
	case errors.Is(err, imagestore.ErrNotFound):
		return errListingUnknown
	default:
		return err
	}
}

// openCheckout opens the Stripe Checkout of the placed order o and
// records it. The order holds its capacity now, so whatever happens to
// the request this runs to the end, within checkoutBound; an order whose
// checkout could not be opened is cancelled at once.
func (s *Server) openCheckout(ctx context.Context, o imagestore.Order, hostName string, expires time.Time) (billing.Session, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkoutBound)
	defer cancel()
	sess, err := s.cfg.Payments.CreateCheckout(cctx, s.checkoutFor(o, hostName, expires))
	if err != nil {
		s.cancel(cctx, o.ID, reason.CheckoutFailed, err)
		switch {
		case errors.Is(err, billing.ErrUnavailable):
			return sess, stripeUnavailable(err)
		case errors.Is(err, billing.ErrGate):
			return sess, gateRefusal(o, err)
		default:
			return sess, apierr.Wrap(err, reason.PaymentRefused)
		}
	}
	if err := s.st.SetCheckout(cctx, o.ID, sess.ID, sess.URL); err != nil {
		// The session exists but the order does not know it: the webhook
		// still finds the order by its metadata, and the sweeper releases
		// it if it is never paid.
		return sess, fmt.Errorf("order %s: record its checkout: %w", o.ID, err)
	}
	return sess, nil
}

// checkOrderRequest checks what an order request says by itself.
func checkOrderRequest(req orderRequest) error {
	switch {
	case req.Quantity < minQuantity || req.Quantity > maxQuantity:
		return badRequest(fmt.Sprintf("quantity must be %d to %d", minQuantity, maxQuantity))
	case len(req.Name) > maxOrderNameLength || !dnsLabel.MatchString(req.Name):
		return badRequest("name must be a DNS label: 1 to 63 lower-case letters, digits and '-', starting and ending with a letter or digit")
	case req.ListingID == "":
		return badRequest("listing_id is required")
	case req.Image == "":
		return badRequest("image is required: a catalogue id or one of this box's upload_ids")
	}
	if ud := req.UserData; ud != "" {
		switch {
		case len(ud) > maxUserData:
			return badRequest("user_data must be at most 16 KiB")
		case !utf8.ValidString(ud):
			return badRequest("user_data must be UTF-8 text")
		case !strings.HasPrefix(ud, "#cloud-config") && !strings.HasPrefix(ud, "#!"):
			return badRequest("user_data must start with #cloud-config or #! (a cloud-init config or a script)")
		}
	}
	return nil
}

// orderImage says what image names: a catalogue id, or one of t's own
// images (by upload_id). Anything else, another box's image included, is
// imageUnknown. A catalogue ISO is needsConsole where the edge has no
// console, and takes no userData.
func (s *Server) orderImage(ctx context.Context, t imagestore.Tenant, image, userData string) (imagestore.ImageKind, error) {
	if e, ok := s.cfg.Catalogue.Lookup(image); ok {
		if e.Source == catalogue.SourceISO && userData != "" {
			return "", errUserDataNotForInstaller
		}
		return imagestore.ImageCatalogue, nil
	}
	if s.cfg.Catalogue.Withheld(image) {
		return "", errNeedsConsole
	}
	if !imagestore.ValidUploadID(image) {
		return "", errImageUnknown
	}
	img, err := s.st.Image(ctx, image)
	switch {
	case errors.Is(err, imagestore.ErrNotFound) || err == nil && img.TenantID != t.ID:
		return "", errImageUnknown
	case err != nil:
		return "", err
	}
	if err := startable(img); err != nil {
		return "", err
	}
	return imagestore.ImageUpload, nil
}

// startable refuses an image whose disk, as read at its upload, no
// firmware could start (noBootLoader), or only the firmware its EFI box
// did not choose (wrongFirmware): KubeVirt would report such a machine
// running while its console says "No bootable device" or shows the UEFI
// shell. An image stored before that reading (Boot "") is not refused.
func startable(img imagestore.Image) error {
	if img.Boot == "" {
		return nil
	}
	f, err := bootdisk.Parse(img.Boot)
	if err != nil {
		return fmt.Errorf("image %s: %w", img.UploadID, err)
	}
	want := bootdisk.BIOS
	if img.EFI {
		want = bootdisk.UEFI
	}
	switch {
	case f == bootdisk.None:
		return errNoBootLoader
	case !f.Has(want):
		if img.EFI {
			return errWrongFirmware.WithMsg("the image starts only with a BIOS, and it was uploaded with the EFI box ticked: upload it again without it")
		}
		return errWrongFirmware.WithMsg("the image starts only with UEFI, and it was uploaded without the EFI box: upload it again with the box ticked")
	}
	return nil
}

// checkoutFor is the Checkout of order o: what CreateCheckout opens and
// what a session must match before the order counts as paid.
func (s *Server) checkoutFor(o imagestore.Order, host string, expires time.Time) billing.Checkout {
	return billing.Checkout{
		OrderID:     o.ID,
		Description: fmt.Sprintf("VM replica-month on %s (order %s)", host, o.ID),
		Currency:    o.Currency, UnitAmount: o.UnitPrice, Quantity: o.Quantity,
		Fee: o.Fee, Destination: o.Destination,
		SuccessURL: returnURL(s.cfg.CheckoutReturnURL, o.ID, "success"),
		CancelURL:  returnURL(s.cfg.CheckoutReturnURL, o.ID, "cancelled"),
		ExpiresAt:  expires,
	}
}

// returnURL is base with the order and the checkout's outcome in its
// query, so the page the buyer returns to can show the order.
func returnURL(base, orderID, outcome string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base // checked at start-up; the gate refuses it anyway
	}
	q := u.Query()
	q.Set("order", orderID)
	q.Set("checkout", outcome)
	u.RawQuery = q.Encode()
	return u.String()
}

// cancel ends the reservation of an unpaid order, logging why.
func (s *Server) cancel(ctx context.Context, orderID, reason string, cause error) {
	err := s.st.CancelOrder(ctx, orderID, reason, s.cfg.Now().UTC())
	attrs := []any{"order_id", orderID, "reason", reason}
	if cause != nil {
		attrs = append(attrs, "cause", logText(cause.Error()))
	}
	if err != nil {
		s.log.Error("order not cancelled; the sweeper retries", append(attrs, "err", err.Error())...)
		return
	}
	s.log.Info("order cancelled", attrs...)
}
