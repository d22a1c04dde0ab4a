package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// schema returns the migration steps in order; step i brings the database
// to user_version i+1. Steps are only ever appended: a released step is
// history, and editing it would leave existing databases on a schema no
// binary describes.
//
// Tables are STRICT so that a mistyped bind (a time.Time where nanoseconds
// belong, a string hash) fails loudly instead of being stored as text.
// Times are integer Unix nanoseconds in UTC, hashes are 32-byte BLOBs and
// booleans are 0/1 integers.
func schema() []string {
	return []string{
		`
CREATE TABLE tenants (
	id             INTEGER PRIMARY KEY,
	name           TEXT    NOT NULL UNIQUE,
	token_hash     BLOB    NOT NULL UNIQUE,
	in_mesh        INTEGER NOT NULL CHECK (in_mesh IN (0, 1)),
	sharing        INTEGER NOT NULL CHECK (sharing IN (0, 1)),
	hosts_vms      INTEGER NOT NULL CHECK (hosts_vms IN (0, 1)),
	appliance      TEXT    NOT NULL,
	stripe_account TEXT    NOT NULL,
	created_at     INTEGER NOT NULL
) STRICT;

CREATE TABLE tickets (
	hash           BLOB    PRIMARY KEY,
	upload_id      TEXT    NOT NULL UNIQUE,
	tenant_id      INTEGER NOT NULL REFERENCES tenants (id),
	name           TEXT    NOT NULL,
	efi            INTEGER NOT NULL CHECK (efi IN (0, 1)),
	created_at     INTEGER NOT NULL,
	expires_at     INTEGER NOT NULL,
	used_at        INTEGER,
	expiry_counted INTEGER NOT NULL DEFAULT 0 CHECK (expiry_counted IN (0, 1))
) STRICT;

-- SweepTickets scans by expiry on every run.
CREATE INDEX tickets_expires_at ON tickets (expires_at);
CREATE INDEX tickets_tenant_id ON tickets (tenant_id);

CREATE TABLE images (
	upload_id    TEXT    PRIMARY KEY,
	tenant_id    INTEGER NOT NULL REFERENCES tenants (id),
	name         TEXT    NOT NULL,
	efi          INTEGER NOT NULL CHECK (efi IN (0, 1)),
	size         INTEGER NOT NULL,
	virtual_size INTEGER NOT NULL,
	sha256       TEXT    NOT NULL,
	created_at   INTEGER NOT NULL
) STRICT;

-- Serves both the per-tenant quota count and the ordered listing.
CREATE INDEX images_tenant ON images (tenant_id, created_at, upload_id);

-- upload_id is deliberately not a foreign key: revoked tokens outlive the
-- image they named, so that a later image under the same id is not reachable
-- through them.
CREATE TABLE fetch_tokens (
	hash       BLOB    PRIMARY KEY,
	upload_id  TEXT    NOT NULL,
	order_id   TEXT    NOT NULL,
	expires_at INTEGER NOT NULL,
	revoked_at INTEGER
) STRICT;

CREATE INDEX fetch_tokens_upload_id ON fetch_tokens (upload_id);
`,
		// Resumable (tus) uploads. upload_id is deliberately not a foreign
		// key to tickets: SweepTickets forgets used tickets after a while,
		// and a session may outlive its ticket's retention. "offset" is
		// quoted because OFFSET is an SQL keyword; SQLite would accept it
		// bare, but only by a parser fallback. The CHECKs catch a caller
		// that records progress past the end of the upload.
		`
CREATE TABLE upload_sessions (
	hash       BLOB    PRIMARY KEY,
	upload_id  TEXT    NOT NULL UNIQUE,
	tenant_id  INTEGER NOT NULL REFERENCES tenants (id),
	name       TEXT    NOT NULL,
	efi        INTEGER NOT NULL CHECK (efi IN (0, 1)),
	length     INTEGER NOT NULL CHECK (length >= 0),
	"offset"   INTEGER NOT NULL CHECK ("offset" >= 0 AND "offset" <= length),
	hash_state BLOB    NOT NULL,
	created_at INTEGER NOT NULL,
	expires_at INTEGER NOT NULL
) STRICT;

-- ExpireSessions scans by expiry on every run.
CREATE INDEX upload_sessions_expires_at ON upload_sessions (expires_at);
CREATE INDEX upload_sessions_tenant_id ON upload_sessions (tenant_id);
`,
		// The quota counts a tenant's unused, unexpired tickets on every
		// ticket request; ended tickets are kept for days, so the count
		// must not walk them.
		`
CREATE INDEX tickets_unused ON tickets (tenant_id, expires_at) WHERE used_at IS NULL;
`,
		// A plain (PUT) upload has consumed its ticket and has no session,
		// so without a mark of its own it would hold no place in the quota
		// while its body arrives. ConsumeTicket sets put_running, AddImage
		// (in the transaction that records the image), EndUpload and
		// start-up's EndRunningUploads clear it. The partial index keeps
		// the quota's count off the many ended tickets.
		`
ALTER TABLE tickets ADD COLUMN put_running INTEGER NOT NULL DEFAULT 0 CHECK (put_running IN (0, 1));
CREATE INDEX tickets_put_running ON tickets (tenant_id) WHERE put_running = 1;
`,
		// The market. A listing's reserved and running replicas are never
		// stored: they are summed from the orders that hold capacity, so
		// they cannot drift from them. An order copies price, fee and
		// destination when it is placed (what the checkout charges never
		// changes afterwards). The CHECKs tie the times to the states, so
		// that a state change that forgets one fails instead of storing a
		// paid order without its month. user_data is a column of its own
		// that only OrderUserData reads. webhook_events remembers handled
		// Stripe events by id, so a replay changes nothing.
		`
CREATE TABLE listings (
	id         TEXT    PRIMARY KEY,
	host_id    INTEGER NOT NULL REFERENCES tenants (id),
	unit_price INTEGER NOT NULL CHECK (unit_price > 0),
	currency   TEXT    NOT NULL CHECK (currency <> ''),
	capacity   INTEGER NOT NULL CHECK (capacity > 0),
	created_at INTEGER NOT NULL,
	closed_at  INTEGER
) STRICT;

CREATE INDEX listings_host ON listings (host_id, created_at, id);
CREATE INDEX listings_open ON listings (created_at, id) WHERE closed_at IS NULL;

CREATE TABLE orders (
	id            TEXT    PRIMARY KEY,
	listing_id    TEXT    NOT NULL REFERENCES listings (id),
	buyer_id      INTEGER NOT NULL REFERENCES tenants (id),
	host_id       INTEGER NOT NULL REFERENCES tenants (id),
	quantity      INTEGER NOT NULL CHECK (quantity > 0),
	image_kind    TEXT    NOT NULL CHECK (image_kind IN ('catalogue', 'upload')),
	image         TEXT    NOT NULL,
	name          TEXT    NOT NULL,
	unit_price    INTEGER NOT NULL CHECK (unit_price > 0),
	total         INTEGER NOT NULL,
	fee           INTEGER NOT NULL,
	currency      TEXT    NOT NULL,
	destination   TEXT    NOT NULL CHECK (destination <> ''),
	state         TEXT    NOT NULL CHECK (state IN ('awaitingPayment', 'paid', 'active', 'expired', 'cancelled')),
	reason        TEXT    NOT NULL DEFAULT '',
	checkout_id   TEXT    NOT NULL DEFAULT '',
	checkout_url  TEXT    NOT NULL DEFAULT '',
	reserve_until INTEGER NOT NULL,
	created_at    INTEGER NOT NULL,
	paid_at       INTEGER,
	expires_at    INTEGER,
	ended_at      INTEGER,
	user_data     TEXT    NOT NULL,
	CHECK (total = unit_price * quantity),
	CHECK (fee >= 0 AND fee <= total),
	CHECK ((paid_at IS NOT NULL) = (state IN ('paid', 'active', 'expired'))),
	CHECK ((expires_at IS NOT NULL) = (paid_at IS NOT NULL)),
	CHECK ((ended_at IS NOT NULL) = (state IN ('expired', 'cancelled')))
) STRICT;

-- A listing's counts, summed on every read of it and in every
-- CreateOrder: the index covers them.
CREATE INDEX orders_listing ON orders (listing_id, state, quantity);
CREATE INDEX orders_buyer ON orders (buyer_id, created_at, id);
-- Also the sweeper's periodic question (orders awaiting payment past
-- their reserve_until, oldest first): orders await payment for an hour or
-- so, so walking those in creation order is cheap and needs no sort.
CREATE INDEX orders_state ON orders (state, created_at, id);
-- RemoveImage asks whether an order still needs the upload.
CREATE INDEX orders_upload ON orders (image) WHERE image_kind = 'upload';

CREATE TABLE webhook_events (
	id     TEXT    PRIMARY KEY,
	type   TEXT    NOT NULL,
	result TEXT    NOT NULL,
	at     INTEGER NOT NULL
) STRICT;
`,
		// The provisioner. An order's note is its word on a problem with
		// the order; replica_states holds what it last saw of each
		// replica, replaced as a set per order (SetReplicaStates), so a
		// row per replica and no history. The CHECK lists
		// imagestore.ReplicaStateNames. RevokeOrderTokens finds an order's
		// fetch tokens by order_id.
		`
ALTER TABLE orders ADD COLUMN note TEXT NOT NULL DEFAULT '';

CREATE TABLE replica_states (
	order_id    TEXT    NOT NULL REFERENCES orders (id),
	replica     INTEGER NOT NULL CHECK (replica >= 0),
	name        TEXT    NOT NULL,
	state       TEXT    NOT NULL CHECK (state IN ('running', 'starting', 'importing', 'paused', 'stopped', 'failed')),
	detail      TEXT    NOT NULL,
	progress    TEXT    NOT NULL,
	observed_at INTEGER NOT NULL,
	PRIMARY KEY (order_id, replica)
) STRICT, WITHOUT ROWID;

CREATE INDEX fetch_tokens_order_id ON fetch_tokens (order_id) WHERE revoked_at IS NULL;
`,
		// Leases (imagestore.Leases): one row per name, kept after its
		// release (expires_at 0) so that its token counts on and is never
		// handed out twice.
		`
CREATE TABLE leases (
	name       TEXT    PRIMARY KEY,
	holder     TEXT    NOT NULL CHECK (holder <> ''),
	token      INTEGER NOT NULL CHECK (token > 0),
	expires_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
`,
		// The journal (imagestore.Journal): the store's identity, one row
		// that start-up writes (and that the same id beside the image
		// files must match), and the intents of file moves in progress,
		// one row per upload id. The identity is not made here: a
		// database emptied later must look like a new one, not like a
		// store of its own.
		`
CREATE TABLE store_meta (
	one        INTEGER PRIMARY KEY CHECK (one = 1),
	id         TEXT    NOT NULL CHECK (length(id) = 32),
	created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE blob_intents (
	upload_id TEXT    PRIMARY KEY,
	kind      TEXT    NOT NULL CHECK (kind IN ('commit', 'remove')),
	at        INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
`,
		// A tenant cancels an unused ticket (CancelTicket), and an upload
		// refused before its body releases its ticket the same way:
		// used_at is set with cancelled_at, so every rule that reads
		// used_at (single use, the quota's count, the expiry count)
		// holds for a cancelled ticket unchanged, and cancelled_at tells
		// it from a ticket an upload used. The CHECK keeps the two
		// together and a cancelled ticket out of the running uploads.
		`
ALTER TABLE tickets ADD COLUMN cancelled_at INTEGER
	CHECK (cancelled_at IS NULL OR (cancelled_at = used_at AND put_running = 0));
`,
		// Refunds, disputes and hosts' own payout accounts.
		// An order gains three states: refunding (decided, Stripe not yet
		// done), refunded and refundFailed (Stripe refused; retried).
		// A CHECK cannot be altered in SQLite, so the orders table is
		// rebuilt: replica_states, its only child, is copied aside and
		// dropped first, so no foreign key ever points at a dropped table.
		// The move to refunding is a conditional UPDATE of the order's
		// state, like the provisioner's move to active: of the two, the
		// one whose WHERE still sees "paid" wins, the other changes
		// nothing. A refunding order holds no capacity and keeps its
		// paid_at or ended_at from the state it left (refund_from). An
		// active order may be refunded only for an import that failed for
		// good and only if no replica ever ran: ran_at is set, in the same
		// row, by the first replica state that says running.
		`
CREATE TABLE replica_states_copy AS SELECT * FROM replica_states;
DROP TABLE replica_states;

CREATE TABLE orders_new (
	id            TEXT    PRIMARY KEY,
	listing_id    TEXT    NOT NULL REFERENCES listings (id),
	buyer_id      INTEGER NOT NULL REFERENCES tenants (id),
	host_id       INTEGER NOT NULL REFERENCES tenants (id),
	quantity      INTEGER NOT NULL CHECK (quantity > 0),
	image_kind    TEXT    NOT NULL CHECK (image_kind IN ('catalogue', 'upload')),
	image         TEXT    NOT NULL,
	name          TEXT    NOT NULL,
	unit_price    INTEGER NOT NULL CHECK (unit_price > 0),
	total         INTEGER NOT NULL,
	fee           INTEGER NOT NULL,
	currency      TEXT    NOT NULL,
	destination   TEXT    NOT NULL CHECK (destination <> ''),
	state         TEXT    NOT NULL CHECK (state IN ('awaitingPayment', 'paid', 'active', 'expired', 'cancelled',
		'refunding', 'refunded', 'refundFailed')),
	reason        TEXT    NOT NULL DEFAULT '',
	checkout_id   TEXT    NOT NULL DEFAULT '',
	checkout_url  TEXT    NOT NULL DEFAULT '',
	reserve_until INTEGER NOT NULL,
	created_at    INTEGER NOT NULL,
	paid_at       INTEGER,
	expires_at    INTEGER,
	ended_at      INTEGER,
	user_data     TEXT    NOT NULL,
	note          TEXT    NOT NULL DEFAULT '',
	payment_intent    TEXT    NOT NULL DEFAULT '',
	blocked_cause     TEXT    NOT NULL DEFAULT '',
	blocked_since     INTEGER,
	ran_at            INTEGER,
	refund_from       TEXT    NOT NULL DEFAULT '' CHECK (refund_from IN ('', 'paid', 'active', 'cancelled')),
	refund_cause      TEXT    NOT NULL DEFAULT '',
	refund_id         TEXT    NOT NULL DEFAULT '',
	refund_attempts   INTEGER NOT NULL DEFAULT 0 CHECK (refund_attempts >= 0),
	refund_generation INTEGER NOT NULL DEFAULT 0 CHECK (refund_generation >= 0),
	refund_next_at    INTEGER,
	refund_error      TEXT    NOT NULL DEFAULT '',
	refunded_at       INTEGER,
	dispute_id        TEXT    NOT NULL DEFAULT '',
	disputed_at       INTEGER,
	CHECK (total = unit_price * quantity),
	CHECK (fee >= 0 AND fee <= total),
	CHECK ((refund_from <> '') = (state IN ('refunding', 'refunded', 'refundFailed'))),
	CHECK (refund_from <> '' OR (paid_at IS NOT NULL) = (state IN ('paid', 'active', 'expired'))),
	CHECK ((expires_at IS NOT NULL) = (paid_at IS NOT NULL)),
	CHECK (refund_from <> '' OR (ended_at IS NOT NULL) = (state IN ('expired', 'cancelled'))),
	CHECK ((refunded_at IS NOT NULL) = (state = 'refunded')),
	CHECK ((refund_next_at IS NOT NULL) = (state IN ('refunding', 'refundFailed'))),
	CHECK (refund_from = '' OR payment_intent <> ''),
	CHECK (refund_from <> 'active' OR (ran_at IS NULL AND refund_cause = 'importFailed'))
) STRICT;

INSERT INTO orders_new (id, listing_id, buyer_id, host_id, quantity, image_kind, image, name,
	unit_price, total, fee, currency, destination, state, reason, checkout_id, checkout_url,
	reserve_until, created_at, paid_at, expires_at, ended_at, user_data, note)
SELECT id, listing_id, buyer_id, host_id, quantity, image_kind, image, name,
	unit_price, total, fee, currency, destination, state, reason, checkout_id, checkout_url,
	reserve_until, created_at, paid_at, expires_at, ended_at, user_data, note FROM orders;
DROP TABLE orders;
ALTER TABLE orders_new RENAME TO orders;

CREATE INDEX orders_listing ON orders (listing_id, state, quantity);
CREATE INDEX orders_buyer ON orders (buyer_id, created_at, id);
CREATE INDEX orders_state ON orders (state, created_at, id);
CREATE INDEX orders_upload ON orders (image) WHERE image_kind = 'upload';
-- A dispute or a charge.refunded event names the PaymentIntent only.
CREATE INDEX orders_payment_intent ON orders (payment_intent) WHERE payment_intent <> '';

CREATE TABLE replica_states (
	order_id    TEXT    NOT NULL REFERENCES orders (id),
	replica     INTEGER NOT NULL CHECK (replica >= 0),
	name        TEXT    NOT NULL,
	state       TEXT    NOT NULL CHECK (state IN ('running', 'starting', 'importing', 'paused', 'stopped', 'failed')),
	detail      TEXT    NOT NULL,
	progress    TEXT    NOT NULL,
	observed_at INTEGER NOT NULL,
	PRIMARY KEY (order_id, replica)
) STRICT, WITHOUT ROWID;
INSERT INTO replica_states SELECT * FROM replica_states_copy;
DROP TABLE replica_states_copy;

ALTER TABLE tenants ADD COLUMN stripe_charges INTEGER NOT NULL DEFAULT 0 CHECK (stripe_charges IN (0, 1));
ALTER TABLE tenants ADD COLUMN stripe_payouts INTEGER NOT NULL DEFAULT 0 CHECK (stripe_payouts IN (0, 1));
ALTER TABLE tenants ADD COLUMN stripe_onboarded INTEGER NOT NULL DEFAULT 0 CHECK (stripe_onboarded IN (0, 1));
`,
		// Console tickets (imagestore.ConsoleStore): single use, a
		// minute's life; used_at is set by the one conditional UPDATE
		// that uses one. Kept after use, like upload tickets, and swept
		// with them.
		`
CREATE TABLE console_tickets (
	hash       BLOB    PRIMARY KEY CHECK (length(hash) = 32),
	tenant_id  INTEGER NOT NULL REFERENCES tenants (id),
	order_id   TEXT    NOT NULL REFERENCES orders (id),
	replica    INTEGER NOT NULL CHECK (replica >= 0),
	kind       TEXT    NOT NULL CHECK (kind IN ('vnc', 'serial')),
	created_at INTEGER NOT NULL,
	expires_at INTEGER NOT NULL,
	used_at    INTEGER
) STRICT, WITHOUT ROWID;
CREATE INDEX console_tickets_expiry ON console_tickets (expires_at);
`,
		// SweepTickets counts the tickets that expired unused, each once;
		// the partial index keeps its scan to those not counted yet (the
		// plain expires_at index made every sweep walk every expired
		// ticket of the last seven days).
		`
CREATE INDEX tickets_expiry_uncounted ON tickets (expires_at) WHERE used_at IS NULL AND expiry_counted = 0;
`,
		// The bank's decision on a dispute (charge.dispute.closed):
		// dispute_status is Stripe's status of the closed dispute, ''
		// while it is open or there is none, and dispute_closed_at when
		// it came. A disputed order's refund is held, never refundFailed
		// (retried): the UPDATE first holds the refunds a binary before
		// this one left retrying against a dispute, so that the CHECK
		// holds for every row.
		`
UPDATE orders SET state = 'refunding' WHERE state = 'refundFailed' AND disputed_at IS NOT NULL;
ALTER TABLE orders ADD COLUMN dispute_status TEXT NOT NULL DEFAULT ''
	CHECK (dispute_status IN ('', 'won', 'lost', 'warning_closed', 'prevented'));
ALTER TABLE orders ADD COLUMN dispute_closed_at INTEGER
	CHECK ((dispute_closed_at IS NULL) = (dispute_status = '') AND (dispute_closed_at IS NULL OR disputed_at IS NOT NULL)
		AND (state <> 'refundFailed' OR disputed_at IS NULL));
`,
	}
}

// migrate applies the steps the database has not seen yet, one transaction
// each. The version is re-read inside each write transaction, so two
// processes opening a new database at once apply every step exactly once.
func migrate(ctx context.Context, db *sql.DB, steps []string) error {
	var v int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > len(steps) {
		return fmt.Errorf("database schema version %d is newer than this binary supports (%d)", v, len(steps))
	}
	for i := v; i < len(steps); i++ {
		if err := migrateStep(ctx, db, steps, i); err != nil {
			return err
		}
	}
	return nil
}

func migrateStep(ctx context.Context, db *sql.DB, steps []string, i int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migration %d: %w", i+1, err)
	}
	defer func() { _ = tx.Rollback() }()

	var v int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("migration %d: read schema version: %w", i+1, err)
	}
	switch {
	case v > len(steps):
		return fmt.Errorf("database schema version %d is newer than this binary supports (%d)", v, len(steps))
	case v > i:
		return nil // another process got here first
	}
	if _, err := tx.ExecContext(ctx, steps[i]); err != nil {
		return fmt.Errorf("migration %d: %w", i+1, err)
	}
	// PRAGMA takes no bound parameters; i+1 is an int, not input.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", i+1)); err != nil {
		return fmt.Errorf("migration %d: set schema version: %w", i+1, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migration %d: commit: %w", i+1, err)
	}
	return nil
}
