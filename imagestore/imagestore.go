// Package imagestore is the ground floor of vmshelf: the records (tenants,
// upload tickets, images, fetch tokens, the market's listings and orders)
// behind the Store interface and the image bytes behind the Blobs
// interface. Both planes meet here and nowhere else. Store is every record
// the service keeps, so it is made of role interfaces of a few methods
// each (Health, Tenants, Tickets, Uploads, Images, FetchTokens, Listings,
// Orders, Provisioning, Billing, ConsoleStore, PowerStore, Leases,
// Journal), one per part of the service that calls them: a part depends
// on the roles it uses, and its test fakes just those. The interfaces are storage-neutral:
// imagestore/sqlite and imagestore/postgres keep the records (their SQL
// once, in imagestore/sqlstore), imagestore/blobfs and imagestore/s3 the
// bytes, and imagestore/storetest and imagestore/blobtest hold the one
// test suite every Store, and every Blobs, passes.
package imagestore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Errors a Store or Blobs returns; callers test them with errors.Is.
var (
	ErrNotFound      = errors.New("not found")
	ErrExists        = errors.New("already exists")
	ErrTicketUsed    = errors.New("ticket already used")
	ErrTicketExpired = errors.New("ticket expired")
	// ErrTicketCancelled is a ticket its tenant cancelled, or that an
	// upload refused before its body released.
	ErrTicketCancelled = errors.New("ticket cancelled")
	ErrQuota           = errors.New("image quota reached")
	// ErrDamaged is a store whose own integrity check failed, or that met
	// a damaged page while answering.
	ErrDamaged = errors.New("store damaged")
	// ErrNoSpace is a store write that failed because its disk is full.
	ErrNoSpace = errors.New("no space left for the store")
	// ErrUnwritable is a store write that failed for another storage
	// reason (I/O error, read-only file system, permissions).
	ErrUnwritable = errors.New("store not writable")
	// ErrBlobsUnavailable is a Blobs call the image storage could not
	// take: it did not answer in time, refused or reset the connection,
	// or failed on its side (an S3 server's 5xx). A passing condition,
	// which clients may retry, unlike a failure of ours.
	ErrBlobsUnavailable = errors.New("the image storage did not answer")
	// ErrStoreUnavailable is a Store call the record store could not
	// take: it did not answer within the call's deadline, refused or
	// reset the connection, or was shutting down or starting up. A
	// passing condition, which clients may retry, unlike a failure of
	// ours (a busy SQLite file, whose lock another process of ours holds,
	// is not one: only its deadline passing is). "Could not ask" is not
	// "not done": the write of such a call may still land (a stalled
	// server that resumes), so a caller that answers its client an error
	// undoes what the call may have done (WithdrawTicket, UndoUpload).
	ErrStoreUnavailable = errors.New("the record store did not answer")
)

// DefaultHeadroom is the free space an upload must leave on the disk of
// the images, and below which no ticket is issued: a full disk is the
// normal state of a small home server, and the store and the system need
// room of their own.
const DefaultHeadroom = 1 << 30

// SweepBatch bounds the tickets one write of SweepTickets changes. A sweep
// goes through the store's one writer, grouped with the tickets being
// issued: at a few hundred tickets a second thousands expire between two
// sweeps, and counting them in one transaction held every ticket request
// behind it (the ticket route's p99 at 500 req/s grew with the store). In
// batches the requests wait one batch at most.
const SweepBatch = 256

// Tenant is a box of the mesh, known to the edge by a bearer token.
type Tenant struct {
	ID            int64  `json:"-"`
	Name          string `json:"name"`
	InMesh        bool   `json:"in_mesh"`
	Sharing       bool   `json:"sharing"`
	HostsVMs      bool   `json:"hosts_vms"`
	Appliance     string `json:"appliance"`
	StripeAccount string `json:"stripe_account"`
	// StripeOnboarded says the account was made by the host's own
	// onboarding (SetOnboardedAccount), not set by the operator: its
	// capability flags below are then what decides whether it can list.
	StripeOnboarded bool `json:"stripe_onboarded"`
	// StripeChargesEnabled and StripePayoutsEnabled are what Stripe's
	// last account.updated said of an onboarded account
	// (SetAccountCapabilities); false for an operator-set one.
	StripeChargesEnabled bool      `json:"stripe_charges_enabled"`
	StripePayoutsEnabled bool      `json:"stripe_payouts_enabled"`
	CreatedAt            time.Time `json:"created_at"`
}

// TenantInUse is RemoveTenant's refusal: how many of each thing the
// tenant still holds.
type TenantInUse struct {
	Images, Tickets, Uploads, Sessions, Listings, Orders int
}

func (e *TenantInUse) Error() string {
	var held []string
	for _, h := range []struct {
		n    int
		what string
	}{{e.Images, "images"}, {e.Tickets, "unused tickets"}, {e.Uploads, "running uploads"},
		{e.Sessions, "upload sessions"}, {e.Listings, "open listings"}, {e.Orders, "orders"}} {
		if h.n > 0 {
			held = append(held, fmt.Sprintf("%s: %d", h.what, h.n))
		}
	}
	return "the tenant still holds " + strings.Join(held, ", ")
}

// Unwrap makes a TenantInUse an ErrInUse.
func (e *TenantInUse) Unwrap() error { return ErrInUse }

// Ticket is a single-use right to upload one image. The upload id is fixed
// when the ticket is issued so that the partial file has a name from the
// first byte on.
type Ticket struct {
	UploadID  string
	TenantID  int64
	Name      string
	EFI       bool
	CreatedAt time.Time
	ExpiresAt time.Time
	// UsedAt is when an upload used the ticket or it was cancelled
	// (CancelTicket); zero while unused. A cancelled ticket is refused
	// like a used one.
	UsedAt time.Time
}

// Image is a stored QCOW2 file; its JSON is the upload's 201 answer.
type Image struct {
	UploadID    string    `json:"upload_id"`
	TenantID    int64     `json:"-"`
	Name        string    `json:"name"`
	EFI         bool      `json:"efi"`
	Size        int64     `json:"size"`
	VirtualSize int64     `json:"virtual_size"`
	SHA256      string    `json:"sha256"`
	CreatedAt   time.Time `json:"created_at"`
	// Boot is the firmware that could start the image's disk, as the data
	// plane read its first sectors at upload: "bios", "uefi",
	// "bios+uefi" or "none"; "" for an image stored before that check.
	Boot string `json:"boot,omitempty"`
}

// FetchToken names one image for one order (or for an operator, with an
// empty OrderID) until ExpiresAt.
type FetchToken struct {
	UploadID  string
	OrderID   string
	ExpiresAt time.Time
}

// UploadSession is a resumable (tus) upload in progress. It is created by
// consuming a ticket, so it carries the ticket's image attributes; its id
// is a capability stored only as a hash.
type UploadSession struct {
	UploadID string
	TenantID int64
	Name     string
	EFI      bool
	Length   int64 // Upload-Length: the size of the whole image
	// Offset is how many bytes are durably written (fsynced); HashState
	// is the SHA-256 state after exactly those bytes
	// (encoding.BinaryMarshaler of crypto/sha256), so a restart resumes
	// the hash without reading the image again.
	Offset    int64
	HashState []byte
	CreatedAt time.Time
	ExpiresAt time.Time // the session ends unfinished at this time
}

// Stats is what the metrics report of the store.
type Stats struct {
	Images     int64
	ImageBytes int64
}

// Hash is the SHA-256 of a secret (tenant token, ticket, fetch token). The
// store only ever sees hashes, so a copy of the database grants nothing.
type Hash [sha256.Size]byte

// HashSecret hashes a secret for lookup.
func HashSecret(secret string) Hash { return sha256.Sum256([]byte(secret)) }

// NewSecret returns 256 random bits as 64 lower-case hex characters: the
// form of tenant tokens, tickets and fetch tokens.
func NewSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// NewUploadID returns a fresh image id: 96 random bits as 24 hex characters,
// safe as a file name. It is a name, not a capability.
func NewUploadID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ValidUploadID reports whether id has NewUploadID's form (24 lower-case hex
// characters); anything else is refused before it can reach a file path.
func ValidUploadID(id string) bool {
	if len(id) != 24 {
		return false
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Store holds the records. Every method is one transaction; single use of a
// ticket is one conditional update, never read-then-write. Its methods
// come in roles, one for each part of the service that calls them, so
// that a part can depend on the roles it uses and a test fake just those.
type Store interface {
	Health
	Tenants
	Tickets
	Uploads
	Images
	FetchTokens
	MarketStore
	ConsoleStore
	PowerStore
	Leases
	Journal
	Close() error
}

// Health is what the probes, start-up and the metrics ask of the store
// itself.
type Health interface {
	// Ping reads from the store. Besides a failed read it reports what
	// the store knows of its own health: ErrDamaged once it met a damaged
	// page, ErrNoSpace or ErrUnwritable while its last write failed so.
	Ping(ctx context.Context) error
	// Verify checks the store's own integrity (SQLite: PRAGMA
	// quick_check) and returns an error wrapping ErrDamaged if it fails.
	// It reads the whole store: start-up runs it, probes do not.
	Verify(ctx context.Context) error
	// Stats counts the stored images and their bytes, for the metrics.
	Stats(ctx context.Context) (Stats, error)
}

// Tenants holds the boxes of the mesh: the operators' commands create,
// change and remove them, the control plane finds the caller by its token
// and records the payout account of a host's own Stripe onboarding.
type Tenants interface {
	// CreateTenant stores t with the hash of its token; ErrExists if the
	// name is taken. It returns t with ID and CreatedAt set.
	CreateTenant(ctx context.Context, t Tenant, token Hash) (Tenant, error)
	// Tenant finds a tenant by its name; ErrNotFound.
	Tenant(ctx context.Context, name string) (Tenant, error)
	// TenantByToken finds the tenant whose token has this hash: the
	// caller of an API request; ErrNotFound.
	TenantByToken(ctx context.Context, token Hash) (Tenant, error)
	// TenantByID finds a tenant by its id (a listing's host, an order's
	// buyer); ErrNotFound.
	TenantByID(ctx context.Context, id int64) (Tenant, error)
	// Tenants lists every tenant, by name.
	Tenants(ctx context.Context) ([]Tenant, error)
	// UpdateTenant writes t's attributes, found by t.Name. The
	// onboarding state is not among them: a StripeAccount other than the
	// stored one (the operator's, made elsewhere) clears StripeOnboarded
	// and the capability flags, which stay as they are otherwise.
	UpdateTenant(ctx context.Context, t Tenant) error
	// SetOnboardedAccount records account, made by the tenant's own Stripe
	// onboarding, as its payout account (StripeOnboarded) and returns the
	// tenant as it is now. A tenant that already has this account is
	// returned unchanged; one with another account is refused with an
	// error wrapping ErrExists, so that onboarding never replaces an
	// account. ErrNotFound if there is no such tenant.
	SetOnboardedAccount(ctx context.Context, tenantID int64, account string) (Tenant, error)
	// SetAccountCapabilities records what Stripe says account can do
	// (account.updated) on the tenants that have it and returns one of
	// them, the onboarded one first; ErrNotFound if no tenant has it.
	SetAccountCapabilities(ctx context.Context, account string, charges, payouts bool) (Tenant, error)
	// SetTenantToken replaces the hash of the tenant's token, so the old
	// token stops working at once; ErrNotFound.
	SetTenantToken(ctx context.Context, name string, token Hash) error
	// RemoveTenant deletes the tenant called name, so its token stops
	// working at once, unless it still holds something (at now): then a
	// *TenantInUse (errors.Is ErrInUse) says what, and nothing changes.
	// What it holds: images, unused unexpired tickets, plain uploads
	// running, upload sessions (any not yet ended or swept), open
	// listings, and orders that name it as buyer or host in any state
	// (order records are the market's history). What it no longer needs
	// goes with it in the same transaction: its ended tickets and its
	// closed listings. ErrNotFound if there is no such tenant.
	RemoveTenant(ctx context.Context, name string, now time.Time) error
}

// Tickets is the control plane's side of uploads: issuing a ticket
// against the quota, listing what holds a tenant's places in it,
// cancelling or withdrawing a ticket, and sweeping the ended ones.
type Tickets interface {
	// CreateTicket stores tk under the hash of the ticket, unless the
	// tenant's stored images plus its reservations already reach quota
	// (ErrQuota), counted in the same transaction as the insert. A
	// reservation is an unused ticket unexpired at tk.CreatedAt, or an
	// upload session unexpired then and not finished (Offset < Length: a
	// finished session has become an image and is not counted twice).
	CreateTicket(ctx context.Context, tk Ticket, ticket Hash, quota int) error
	// UnusedTickets lists the tenant's tickets that are unused (neither
	// used nor cancelled) and unexpired at now, the ones CreateTicket
	// counts, oldest first (then by upload id).
	UnusedTickets(ctx context.Context, tenantID int64, now time.Time) ([]Ticket, error)
	// OpenSessions lists the tenant's sessions that are unfinished
	// (Offset < Length) and unexpired at now, the ones CreateTicket counts,
	// oldest first (then by upload id).
	OpenSessions(ctx context.Context, tenantID int64, now time.Time) ([]UploadSession, error)
	// CancelTicket ends the tenant's unused ticket uploadID at now: it
	// no longer counts against the quota, and ConsumeTicket and
	// StartSession refuse it as used (ErrTicketUsed). The decision is one
	// conditional update, so of a CancelTicket and a ConsumeTicket or
	// StartSession racing for one ticket exactly one succeeds. Errors:
	// ErrNotFound if the tenant has no ticket with that id (another
	// tenant's is not found either); ErrTicketUsed if an upload used it;
	// ErrTicketCancelled if it was cancelled already; ErrTicketExpired if
	// it expired unused. None of them changes the ticket.
	CancelTicket(ctx context.Context, tenantID int64, uploadID string, now time.Time) error
	// WithdrawTicket ends tk, issued under ticket by a CreateTicket whose
	// answer never reached its client, whether that write landed, failed
	// or is still to land (a stalled server that resumes): afterwards the
	// ticket is cancelled at now, out of every count, and a CreateTicket
	// of it fails (ErrExists). A ticket an upload used is left alone (its
	// client had the answer after all). ErrNotFound if the tenant does not
	// exist.
	WithdrawTicket(ctx context.Context, tk Ticket, ticket Hash, now time.Time) error
	// SweepTickets counts unused tickets that expired since the last sweep
	// and forgets tickets that ended more than retain before now, in
	// writes of at most SweepBatch tickets each.
	SweepTickets(ctx context.Context, now time.Time, retain time.Duration) (newlyExpired int, err error)
}

// Uploads is the data plane's side: an upload from the ticket it
// consumes, plain (PUT) or resumable (a session), to the image it records
// or to its end without one; and what start-up asks of the uploads a
// crash or a dead replica left running.
type Uploads interface {
	// Ticket looks a ticket up without using it.
	Ticket(ctx context.Context, ticket Hash) (Ticket, error)
	// ConsumeTicket marks the ticket used at now if it is unused and not
	// expired; of two concurrent calls exactly one succeeds. Errors:
	// ErrNotFound, ErrTicketUsed, ErrTicketExpired. It is the start of a
	// plain (PUT) upload, which from then on holds the ticket's place in
	// the quota (CreateTicket counts it) until AddImage records its image
	// or EndUpload ends it.
	ConsumeTicket(ctx context.Context, ticket Hash, now time.Time) (Ticket, error)
	// EndUpload ends the quota reservation of a plain upload that did not
	// become an image (refused, cut off, failed); a missing or already
	// ended one is not an error.
	EndUpload(ctx context.Context, uploadID string) error
	// UndoUpload undoes, in one transaction, what the upload uploadID
	// started at startedAt (ConsumeTicket or StartSession with that now)
	// left in the records, for an upload answered an error after which
	// nothing may be kept: the image record, if its commit landed after
	// all (ErrInUse, and nothing changes, if an order holds it already),
	// the session, if the upload made one, and the ticket's use: the
	// ticket is unused again, so that the client's retry with it works.
	// Where a blob may have been committed (the record was there, or the
	// commit intent), the intent becomes a remove intent and removeBlob
	// is true: the caller deletes the blob and ends the intent (the
	// removal sweep does it otherwise). A ticket not marked used at
	// startedAt (another start since, a sweep) is left as it is, with
	// everything else.
	UndoUpload(ctx context.Context, uploadID string, startedAt time.Time) (removeBlob bool, err error)

	// StartSession consumes a ticket exactly as ConsumeTicket does and, in
	// the same transaction, creates the upload session us (UploadID,
	// TenantID, Name and EFI are taken from the ticket) under the hash of
	// its id. Errors: those of ConsumeTicket.
	StartSession(ctx context.Context, ticket, session Hash, us UploadSession, now time.Time) (UploadSession, error)
	// Session looks a session up by the hash of its id; ErrNotFound.
	Session(ctx context.Context, session Hash) (UploadSession, error)
	// SaveProgress records a durable offset with its hash state and moves
	// the expiry; ErrNotFound if the session has ended.
	SaveProgress(ctx context.Context, uploadID string, offset int64, hashState []byte, expiresAt time.Time) error
	// EndSession forgets a session (finished, terminated); a missing one is
	// not an error.
	EndSession(ctx context.Context, uploadID string) error
	// ExpireSessions forgets the sessions whose ExpiresAt <= now and returns
	// their upload ids, so the caller can remove their partial files.
	ExpireSessions(ctx context.Context, now time.Time) ([]string, error)

	// AddImage records a committed image, re-checking in the same
	// transaction that the tenant's stored images stay under quota
	// (ErrQuota); ErrExists if the id is taken. Reservations are not
	// counted here: the upload being committed holds one itself, admitted
	// by CreateTicket, and the others were admitted alike. The running
	// upload's reservation ends in the same transaction, so it is never
	// counted twice, and so does its commit intent (Journal).
	AddImage(ctx context.Context, img Image, quota int) error

	// EndRunningUploads ends the reservations of every plain upload still
	// marked running and returns how many there were. Only start-up calls
	// it: a crash ended those uploads, and their partial files are gone.
	EndRunningUploads(ctx context.Context) (int, error)
	// EndUnleasedUploads ends, over a store several replicas share, the
	// reservations of plain uploads marked running that started before
	// startedBefore and whose lease (leasePrefix + upload id) nobody
	// holds at now: their replica died with them, and its restart (a new
	// process, perhaps on another host) will not end them. It returns how
	// many there were. The replica that runs a plain upload holds its
	// lease from just after consuming the ticket; startedBefore leaves it
	// the time to take it.
	EndUnleasedUploads(ctx context.Context, leasePrefix string, now, startedBefore time.Time) (int, error)
	// SessionUploadIDs lists the upload ids of all live sessions.
	SessionUploadIDs(ctx context.Context) ([]string, error)
}

// Images holds the stored images' records: a tenant's listing and
// removal, the provisioner's look-up, and the ids start-up matches with
// the files it finds.
type Images interface {
	// Image returns an image record by its upload id; ErrNotFound.
	Image(ctx context.Context, uploadID string) (Image, error)
	// Images lists the tenant's images, oldest first.
	Images(ctx context.Context, tenantID int64) ([]Image, error)
	// ImageIDs lists the upload ids of every image record.
	ImageIDs(ctx context.Context) ([]string, error)
	// RemoveImage deletes the tenant's image record and revokes its fetch
	// tokens in one transaction; ErrNotFound if the tenant has no such
	// image, ErrInUse if an order that holds capacity (awaiting payment,
	// paid or active) runs it: its replicas import it from the edge, and
	// an import that fails starts over. The same transaction writes the
	// image's remove intent (Journal): the caller deletes the file, then
	// ends the intent, and start-up or the sweep finish what a crash or an
	// unreachable blob store left.
	RemoveImage(ctx context.Context, tenantID int64, uploadID string) error
}

// FetchTokens holds the capabilities an order's replicas import their
// image with: the provisioner mints and revokes them, the data plane
// serves the image a valid one names.
type FetchTokens interface {
	// CreateFetchToken stores a fetch capability; ErrNotFound if the image
	// does not exist.
	CreateFetchToken(ctx context.Context, token Hash, ft FetchToken) error
	// ImageForToken returns the image a valid token names and the token's
	// expiry; ErrNotFound when the token is unknown, revoked or expired at
	// now.
	ImageForToken(ctx context.Context, token Hash, now time.Time) (Image, time.Time, error)
	// RevokeOrderTokens revokes, at now, every fetch token of the order
	// that is not revoked yet and returns how many there were (an unknown
	// order has none). An empty orderID is an error: it would name the
	// operators' tokens.
	RevokeOrderTokens(ctx context.Context, orderID string, now time.Time) (int, error)
}

// Blobs holds image bytes by upload id.
type Blobs interface {
	// Create starts writing blob id; nothing is visible to Open or List
	// until Commit.
	Create(ctx context.Context, id string) (BlobWriter, error)
	// Open returns a committed blob; ErrNotFound if there is none.
	Open(ctx context.Context, id string) (Blob, error)
	// Delete removes a committed blob; a missing one is not an error.
	Delete(ctx context.Context, id string) error
	// List returns the ids of all committed blobs.
	List(ctx context.Context) ([]string, error)
	// Resume reopens the unfinished blob id to continue writing at offset,
	// cutting off anything written past it (bytes never recorded durable).
	// ErrNotFound if there is no such unfinished blob.
	Resume(ctx context.Context, id string, offset int64) (BlobWriter, error)
	// RemovePartial removes one unfinished blob that no writer holds; a
	// missing one is not an error.
	RemovePartial(ctx context.Context, id string) error
	// RemovePartials removes unfinished writes left by a crash, except
	// those keep names (live resumable sessions). Call it at start-up,
	// before any Create.
	RemovePartials(ctx context.Context, keep func(id string) bool) (int, error)
	// Available returns the bytes free for new blobs.
	Available(ctx context.Context) (int64, error)
	// Ping says whether the blob store answers, for a readiness probe:
	// cheaply, within ctx, and at most one check at a time however many
	// probes ask (see HealthProbe).
	Ping(ctx context.Context) error

	// Quarantine takes committed blob id out of service (Open and List no
	// longer see it) without deleting a byte: a blob no record names may
	// still be somebody's only copy of a disk, so absence of a record is
	// never a reason to delete it. ErrNotFound if there is no such blob,
	// ErrExists if a quarantined blob already has that id.
	Quarantine(ctx context.Context, id string) error
	// Quarantined lists the quarantined blobs, sorted by id.
	Quarantined(ctx context.Context) ([]QuarantinedBlob, error)
	// RemoveQuarantined deletes one quarantined blob. Only an operator's
	// explicit request may call it; ErrNotFound if there is none.
	RemoveQuarantined(ctx context.Context, id string) error

	StoreIdentity
}

// QuarantinedBlob is a blob set aside because no record named it.
type QuarantinedBlob struct {
	ID            string
	Size          int64
	QuarantinedAt time.Time
}

// BlobWriter is a blob being written. Exactly one of Commit, Abort and
// Close ends it; Abort after a failed Commit removes what is left, and
// after a successful Commit does nothing, so a deferred Abort is safe. A
// failed Write is final: Sync and Commit then fail too.
type BlobWriter interface {
	io.Writer
	// ReaderAt reads back what was written, for the structure check that
	// runs after the last byte and before Commit.
	io.ReaderAt
	// Sync makes the bytes written so far durable without ending the
	// write: a resumable upload records its offset only after Sync.
	Sync() error
	// Close ends this writer but keeps the unfinished blob for Resume.
	Close() error
	// Commit makes the bytes durable and the blob visible, atomically.
	Commit(ctx context.Context) error
	Abort() error
}

// Fenceable is a BlobWriter that other processes can write too (S3): it
// asks fence before each write it makes durable or visible (a part, a
// tail, the completion, the commit), and a fence error fails that write,
// for good. A writer whose right to write has lapsed (its lease taken by
// another replica) is thus stopped before it overwrites a newer writer's
// bytes. A local file needs none: its process's own locks order writers.
type Fenceable interface {
	SetFence(fence func(ctx context.Context) error)
}

// Blob is a committed blob, open for reading.
type Blob interface {
	io.ReaderAt
	io.Closer
	Size() int64
	ModTime() time.Time
	// Section returns a reader of n bytes from off. A file-backed Blob
	// returns an *io.LimitedReader around its *os.File so that the HTTP
	// server can send it with sendfile(2).
	Section(off, n int64) (io.Reader, error)
}
