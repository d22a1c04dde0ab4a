package imagestore

import (
	"context"
	"errors"
	"time"
)

// Errors of the leases; callers test them with errors.Is.
var (
	// ErrLeaseHeld is an AcquireLease refused because another holder has
	// the lease, unexpired; the Lease returned with it says who and until
	// when.
	ErrLeaseHeld = errors.New("lease held by another holder")
	// ErrLeaseLost is a token that is no longer the lease's current,
	// unexpired one: the lease expired, was released, or was taken by
	// another holder since (or was never held with it).
	ErrLeaseLost = errors.New("lease lost")
)

// Lease is one holder's time-limited right to a name: the leader of the
// replicas ("provisioner"), the one writer of a resumable upload (its
// upload id). Names and holders are names, never secrets: they appear in
// errors and logs (an upload's lease is named by its upload id, never by
// its session id, which is a capability).
type Lease struct {
	Name   string
	Holder string
	// Token is the fencing token of the holder's term: strictly
	// increasing per name, never reused (a released lease keeps its row,
	// so the next term counts on from it). A writer checks it with
	// CheckLease before it commits, so that a stalled old writer, whose
	// term ended while it was stalled, can never overwrite a newer one.
	Token     int64
	ExpiresAt time.Time
}

// Leases is the one lease primitive of the replicas: leader election and
// the single writer of an upload session both use it. Every method is one
// transaction, and the decision one conditional statement, so of any
// number of callers on the same name, in any number of processes, exactly
// one holds it at a time.
//
// A lease is held at now while now < ExpiresAt; at ExpiresAt it is free.
// The clock is the caller's: now comes in with every call (tests control
// it) and is compared with ExpiresAt written by another replica, so the
// replicas' clocks must agree within a skew that is small against the
// TTL (NTP keeps them within milliseconds; leases are seconds). A skew of
// s lets two holders overlap by up to s: a holder that stops at its
// ExpiresAt by its own clock may still be working when a replica whose
// clock is s ahead takes over, which is what the fencing token is for.
type Leases interface {
	// AcquireLease takes name for holder until now+ttl if it is free
	// (never held, released, or expired at now) or holder's own unexpired
	// lease (then it is renewed, same token). Every new term, a change of
	// holder or the same holder after its lease had ended, gets the
	// previous token + 1 (1 for a name never held). ErrLeaseHeld if
	// another holder has it unexpired at now; the returned Lease is then
	// that holder's. name and holder must not be empty, ttl must be
	// positive.
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (Lease, error)
	// RenewLease moves holder's lease to now+ttl if holder still holds
	// it with token, unexpired at now; ErrLeaseLost otherwise (released,
	// taken, never held, or expired: a holder whose lease expired has
	// stopped at ExpiresAt and starts a new term with AcquireLease).
	RenewLease(ctx context.Context, name, holder string, token int64, ttl time.Duration, now time.Time) (Lease, error)
	// ReleaseLease ends holder's term with token at once (a clean shutdown
	// hands leadership on without waiting for the expiry); a lease not
	// held with that token is not an error, and changes nothing.
	ReleaseLease(ctx context.Context, name, holder string, token int64) error
	// CheckLease returns nil if token is name's current token, unexpired
	// at now, and ErrLeaseLost otherwise: the fence a writer checks before
	// it commits. The answer holds at now; a writer commits only while
	// its ExpiresAt leaves room for the commit.
	CheckLease(ctx context.Context, name string, token int64, now time.Time) error
	// ForgetLeases deletes the leases named prefix+… that ended (expired
	// or released) before endedBefore and returns how many. Only for names
	// never used again (an upload's: its id is random): a forgotten name
	// would start over at token 1. An empty prefix is an error.
	ForgetLeases(ctx context.Context, prefix string, endedBefore time.Time) (int, error)
}
