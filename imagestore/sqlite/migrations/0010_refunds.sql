-- Refunds, disputes and hosts' own payout accounts.
-- An order gains three states: refunding (decided, Stripe not yet
-- done), refunded and refundFailed (Stripe refused; retried).
-- A CHECK cannot be altered in SQLite, so the orders table is
-- rebuilt: replica_states, its only child, is copied aside and
-- dropped first, so no foreign key ever points at a dropped table.
-- The move to refunding is a conditional UPDATE of the order's
-- state, like the provisioner's move to active: of the two, the
-- one whose WHERE still sees "paid" wins, the other changes
-- nothing. A refunding order holds no capacity and keeps its
-- paid_at or ended_at from the state it left (refund_from). An
-- active order may be refunded only for an import that failed for
-- good and only if no replica ever ran: ran_at is set, in the same
-- row, by the first replica state that says running.

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
