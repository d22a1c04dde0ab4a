// Package reason is the table of the edge's refusals: every reason code an
// error answer of either plane carries, with its HTTP status and the words
// a user reads, declared once, here (tusd's errors, declared in one block,
// are the model). The code that refuses names an entry
// (apierr.New(reason.TicketUsed)), the upload client tells answers apart
// by the entries' names, and the tests that hold the page's words and the
// API reference to the code read this table. A renamed or removed reason
// then fails to compile wherever it is answered or recognised, instead of
// silently changing what a client sees or decides.
//
// An entry is a (status, name) pair: the same name answered with two
// statuses (ticketUsed, badRequest, noSpace) is two entries. The words are
// the entry's default sentence; a place that knows more (a size, a limit,
// the header that was repeated) says it in its own words with
// apierr.Error's WithMsg, and the status and name stay the table's.
package reason

import "net/http"

// Code is one entry of the table. Its fields are unexported so that no
// code outside this package makes up a reason: a Code is one of the
// declared values below, or the zero value.
type Code struct {
	status int
	name   string
	words  string
}

// Status is the HTTP status of the answer.
func (c Code) Status() int { return c.status }

// Name is the reason code the answer's JSON carries, what programs decide
// on.
func (c Code) Name() string { return c.name }

// Words is the entry's sentence for people.
func (c Code) Words() string { return c.words }

func (c Code) String() string { return c.name }

// The table, by status. docs/api.md's "Errors" and docs/openapi.yaml
// describe each entry; the tests of cmd/vmshelf hold them to it.
var (
	// 400: a request read as no request.
	BadRequest      = Code{http.StatusBadRequest, "badRequest", "the request is malformed"}
	IncompleteBody  = Code{http.StatusBadRequest, "incompleteBody", "the connection ended before the whole image arrived"}
	RepeatedHeader  = Code{http.StatusBadRequest, "repeatedHeader", "a header that carries one value is given more than once; send it once"}
	AmbiguousLength = Code{http.StatusBadRequest, "ambiguousLength", "the request gives both Content-Length and Transfer-Encoding; send one of them"}
	BadSignature    = Code{http.StatusBadRequest, "badSignature", "the Stripe-Signature header does not verify, or its timestamp is too old"}

	Unauthorized = Code{http.StatusUnauthorized, "unauthorized", "a valid tenant token is required: send Authorization: Bearer <token>"}
	BadOrigin    = Code{http.StatusForbidden, "badOrigin", "a machine's console opens only from the Machines page of this edge"}

	// 404: nothing of that name, or nothing the asker may see.
	NotFound       = Code{http.StatusNotFound, "notFound", "there is no such route; see docs/api.md in vmshelf's repository for the routes"}
	TicketUnknown  = Code{http.StatusNotFound, "ticketUnknown", "no such upload ticket"}
	SessionUnknown = Code{http.StatusNotFound, "sessionUnknown", "no such upload session, or it ended or expired"}
	TokenUnknown   = Code{http.StatusNotFound, "tokenUnknown", "no such fetch token, or it was revoked or has expired"}
	ImageUnknown   = Code{http.StatusNotFound, "imageUnknown", "this box has no image with that upload_id"}
	ListingUnknown = Code{http.StatusNotFound, "listingUnknown", "there is no such listing"}
	OrderUnknown   = Code{http.StatusNotFound, "orderUnknown", "you have no such order: only an order's buyer cancels it"}
	ReplicaUnknown = Code{http.StatusNotFound, "replicaUnknown", "the order has no such replica"}

	MethodNotAllowed = Code{http.StatusMethodNotAllowed, "methodNotAllowed", "this route does not accept the method"}

	// 408: the client was too slow.
	RequestTimeout = Code{http.StatusRequestTimeout, "requestTimeout", "the request body did not arrive in time"}
	Idle           = Code{http.StatusRequestTimeout, "idle", "no data arrived in time; the upload was abandoned"}

	// 409: the request conflicts with what the edge holds.
	NotSharing = Code{http.StatusConflict, "notSharing", "this box does not share its disk, so it cannot use the market; turn sharing on first"}
	// TicketInUse is the control plane's ticketUsed: a ticket that an
	// upload holds cannot be cancelled. The data plane's is TicketUsed.
	TicketInUse             = Code{http.StatusConflict, "ticketUsed", "an upload has already used this ticket"}
	ImageQuota              = Code{http.StatusConflict, "imageQuota", "you already hold as many images as this edge allows; remove one first"}
	ImageInUse              = Code{http.StatusConflict, "imageInUse", "an order that is awaiting payment, paid or running uses this image; it can be removed once the order has ended"}
	OffsetMismatch          = Code{http.StatusConflict, "offsetMismatch", "Upload-Offset does not match the bytes stored; ask with HEAD and continue from there"}
	NotOffered              = Code{http.StatusConflict, "notOffered", "this edge does not offer virtual machines (it runs without --vms-enable)"}
	NotHosting              = Code{http.StatusConflict, "notHosting", "only a box in the mesh that shares its disk and hosts VMs (host-vms on, with an appliance node) can list machines"}
	NoPayoutAccount         = Code{http.StatusConflict, "noPayoutAccount", "this box has no Stripe account that can receive payouts (its transfers capability is not active)"}
	PayoutsNotEnabled       = Code{http.StatusConflict, "payoutsNotEnabled", "this box's Stripe account cannot take charges and receive payouts yet: finish setting up payouts with Stripe on the Machines page"}
	AccountManagedElsewhere = Code{http.StatusConflict, "accountManagedElsewhere", "this box's Stripe account was set by the edge's operator (vmshelf tenant set --stripe-account), not made by onboarding here; its payouts are set up with Stripe directly, or by the operator"}
	TooManyListings         = Code{http.StatusConflict, "tooManyListings", "this box already has as many open listings as it may; close one first"}
	OwnListing              = Code{http.StatusConflict, "ownListing", "a box cannot order machines from its own listing"}
	TooManyUnpaidOrders     = Code{http.StatusConflict, "tooManyUnpaidOrders", "this box already has as many orders awaiting payment as it may; pay, cancel or let one expire first"}
	NoCapacity              = Code{http.StatusConflict, "noCapacity", "the listing does not have that many replicas free"}
	OrderNotAwaitingPayment = Code{http.StatusConflict, "orderNotAwaitingPayment", "only an order awaiting payment can be cancelled"}
	NeedsConsole            = Code{http.StatusConflict, "needsConsole", "this system installs from an ISO and needs the browser console, which this edge does not offer yet"}
	ReplicaNotRunning       = Code{http.StatusConflict, "replicaNotRunning", "the machine is not running; its console opens once it runs"}
	// A power action the machine cannot take as it is.
	AlreadyRunning   = Code{http.StatusConflict, "alreadyRunning", "the machine is running already"}
	AlreadyStopped   = Code{http.StatusConflict, "alreadyStopped", "the machine is stopped already"}
	MachineStopped   = Code{http.StatusConflict, "machineStopped", "the machine does not run, so it cannot be restarted; start it instead"}
	ReplicaImporting = Code{http.StatusConflict, "replicaImporting", "the machine's disk is still being imported; the machine starts by itself when the import ends"}
	MachinesNotMade  = Code{http.StatusConflict, "machinesNotMade", "the order's machines are still being made; try again once they show as starting or running"}
	OrderEnded       = Code{http.StatusConflict, "orderEnded", "the order's paid month is over, or its payment was given back: its machines stay halted"}
	PowerInProgress  = Code{http.StatusConflict, "powerInProgress", "an action with this request_id is still running; ask again in a few seconds"}

	// 410: the data plane's spent tickets.
	TicketUsed    = Code{http.StatusGone, "ticketUsed", "this upload ticket was already used or cancelled; ask for a new one"}
	TicketExpired = Code{http.StatusGone, "ticketExpired", "this upload ticket has expired; ask for a new one"}

	TusVersion           = Code{http.StatusPreconditionFailed, "tusVersion", "resumable uploads need the header Tus-Resumable: 1.0.0"}
	TooLarge             = Code{http.StatusRequestEntityTooLarge, "tooLarge", "the request body is larger than 64 KiB"}
	UnsupportedMediaType = Code{http.StatusUnsupportedMediaType, "unsupportedMediaType", "the request body must be sent with Content-Type: application/json"}
	BadContentType       = Code{http.StatusUnsupportedMediaType, "badContentType", "upload bytes need Content-Type: application/offset+octet-stream"}
	RangeNotSatisfiable  = Code{http.StatusRequestedRangeNotSatisfiable, "rangeNotSatisfiable", "the range lies outside the image"}

	// The QCOW2 inspector's verdicts on an image (qcow2's
	// Reason constants, by the same names); the answer's words are the
	// inspector's, which say what in the bytes decided.
	NotQcow2            = Code{http.StatusUnsupportedMediaType, "notQcow2", "the first bytes are not QCOW2 version 2 or 3"}
	BackingFile         = Code{http.StatusUnprocessableEntity, "backingFile", "the image names a backing file"}
	ExternalDataFile    = Code{http.StatusUnprocessableEntity, "externalDataFile", "the image keeps its data in an external file"}
	Encrypted           = Code{http.StatusUnprocessableEntity, "encrypted", "the image is encrypted"}
	Corrupt             = Code{http.StatusUnprocessableEntity, "corrupt", "the image's structure is damaged"}
	BadHeader           = Code{http.StatusUnprocessableEntity, "badHeader", "the image's header is not one this edge accepts"}
	VirtualSizeTooLarge = Code{http.StatusUnprocessableEntity, "virtualSizeTooLarge", "the image's virtual size is larger than this edge accepts"}

	BelowMinimumCharge      = Code{http.StatusUnprocessableEntity, "belowMinimumCharge", "the amount is below the payment provider's minimum charge"}
	UserDataNotForInstaller = Code{http.StatusUnprocessableEntity, "userDataNotForInstaller", "an installation ISO runs its own installer; cloud-init user data cannot be given to it"}
	// NoBootLoader and WrongFirmware: the image's first sectors, read at
	// its upload, say that no machine could start from it as ordered.
	NoBootLoader  = Code{http.StatusUnprocessableEntity, "noBootLoader", "the image's disk has no boot loader that a BIOS or UEFI firmware could start (no boot code in its first sector, no FAT file system on it); a machine made from it would stop at its firmware's \"No bootable device\""}
	WrongFirmware = Code{http.StatusUnprocessableEntity, "wrongFirmware", "the image starts only with the other firmware than the one its EFI box chose; upload it again with the EFI box the other way"}
	// BadValue is the badRequest of a body that reads well but names
	// nothing there is (a console's kind, a power action): the place that
	// refuses says which value, with WithMsg.
	// reads well but names no console there is.
	BadValue = Code{http.StatusUnprocessableEntity, "badRequest", "a value of the request names nothing there is"}

	// 423: another request holds the upload.
	Locked    = Code{http.StatusLocked, "locked", "another request for this upload is still running; retry"}
	TakenOver = Code{http.StatusLocked, "takenOver", "a newer request for this upload took it over; this one stopped"}

	RateLimited = Code{http.StatusTooManyRequests, "rateLimited", "too many unknown tickets or tokens from this address; wait and retry"}
	ConsoleBusy = Code{http.StatusTooManyRequests, "consoleBusy", "too many consoles are open; close one and try again"}

	// Internal is a fault of the edge's own: its cause goes to the log,
	// never to the client.
	Internal       = Code{http.StatusInternalServerError, "internal", "internal error; the operator's log has the details"}
	PaymentRefused = Code{http.StatusBadGateway, "paymentRefused", "the payment provider refused to open the checkout; the order is cancelled"}

	// 503: a passing condition; the client retries.
	Busy                 = Code{http.StatusServiceUnavailable, "busy", "the edge is running as many transfers as it may; retry after a few seconds"}
	ShuttingDown         = Code{http.StatusServiceUnavailable, "shuttingDown", "the edge is restarting; retry after a few seconds"}
	ClientGone           = Code{http.StatusServiceUnavailable, "clientGone", "the client went away while waiting for a slot"}
	BlobStoreUnreachable = Code{http.StatusServiceUnavailable, "blobStoreUnreachable", "the edge's image storage does not answer; try again in a minute"}
	StoreUnreachable     = Code{http.StatusServiceUnavailable, "storeUnreachable", "the edge's record store does not answer; try again in a few seconds"}
	PaymentsUnavailable  = Code{http.StatusServiceUnavailable, "paymentsUnavailable", "this edge cannot take payments now: its Stripe keys are not configured"}
	WebhookNotConfigured = Code{http.StatusServiceUnavailable, "webhookNotConfigured", "this edge has no webhook signing secret (STRIPE_WEBHOOK_SECRET); events cannot be verified"}
	ConsoleUnavailable   = Code{http.StatusServiceUnavailable, "consoleUnavailable", "this edge reaches no cluster, so it opens no console"}
	PowerUnavailable     = Code{http.StatusServiceUnavailable, "powerUnavailable", "this edge reaches no cluster, so it cannot start or stop machines"}
	ClusterBusy          = Code{http.StatusServiceUnavailable, "clusterBusy", "the cluster did not take the action; try again in a minute"}
	// Why /readyz says the edge is not ready, besides StoreUnreachable and
	// BlobStoreUnreachable.
	StoreCorrupt    = Code{http.StatusServiceUnavailable, "storeCorrupt", "the record store is damaged; restore it from a backup"}
	StoreUnwritable = Code{http.StatusServiceUnavailable, "storeUnwritable", "the record store cannot write"}
	NotReady        = Code{http.StatusServiceUnavailable, "notReady", "the record store failed to answer"}
	// NotReadyNoSpace is /readyz's noSpace: the disk is full, so the edge
	// is not ready; a write refused for it is NoSpace.
	NotReadyNoSpace = Code{http.StatusServiceUnavailable, "noSpace", "the disk is full; remove images or free space"}

	NoSpace = Code{http.StatusInsufficientStorage, "noSpace", "the edge ran out of disk space while storing the image; try again later"}
)

// All is every entry of the table, in the order declared.
func All() []Code {
	return []Code{
		BadRequest, IncompleteBody, RepeatedHeader, AmbiguousLength, BadSignature,
		Unauthorized, BadOrigin,
		NotFound, TicketUnknown, SessionUnknown, TokenUnknown, ImageUnknown, ListingUnknown, OrderUnknown, ReplicaUnknown,
		MethodNotAllowed,
		RequestTimeout, Idle,
		NotSharing, TicketInUse, ImageQuota, ImageInUse, OffsetMismatch, NotOffered, NotHosting, NoPayoutAccount,
		PayoutsNotEnabled, AccountManagedElsewhere, TooManyListings, OwnListing, TooManyUnpaidOrders, NoCapacity,
		OrderNotAwaitingPayment, NeedsConsole, ReplicaNotRunning,
		AlreadyRunning, AlreadyStopped, MachineStopped, ReplicaImporting, MachinesNotMade, OrderEnded, PowerInProgress,
		TicketUsed, TicketExpired,
		TusVersion, TooLarge, UnsupportedMediaType, BadContentType, RangeNotSatisfiable,
		NotQcow2, BackingFile, ExternalDataFile, Encrypted, Corrupt, BadHeader, VirtualSizeTooLarge,
		BelowMinimumCharge, UserDataNotForInstaller, NoBootLoader, WrongFirmware, BadValue,
		Locked, TakenOver,
		RateLimited, ConsoleBusy,
		Internal, PaymentRefused,
		Busy, ShuttingDown, ClientGone, BlobStoreUnreachable, StoreUnreachable, PaymentsUnavailable,
		WebhookNotConfigured, ConsoleUnavailable, PowerUnavailable, ClusterBusy, StoreCorrupt, StoreUnwritable, NotReady, NotReadyNoSpace,
		NoSpace,
	}
}

// Reasons an answer carries in a field of its own, not as a refusal, and
// so without a status: why an order ended before it ran (an order's
// reason, as status and orders/cancel show it), and why the VM market
// cannot run machines although the edge is ready (/readyz's machines and
// reasons, beside PaymentsUnavailable's and WebhookNotConfigured's names).
const (
	// CheckoutFailed: the checkout could not be opened.
	CheckoutFailed = "checkoutFailed"
	// CheckoutExpired: the checkout expired unpaid.
	CheckoutExpired = "checkoutExpired"
	// PaymentFailed: the buyer's payment failed.
	PaymentFailed = "paymentFailed"
	// BuyerCancelled: the buyer cancelled the order before paying.
	BuyerCancelled = "buyerCancelled"
	// ClusterUnreachable: the provisioner cannot reach the Kubernetes
	// API, so paid orders wait.
	ClusterUnreachable = "clusterUnreachable"
)

// Fields is every reason of the constants above: what an answer's field
// may carry besides the table's names.
func Fields() []string {
	return []string{CheckoutFailed, CheckoutExpired, PaymentFailed, BuyerCancelled, ClusterUnreachable}
}
