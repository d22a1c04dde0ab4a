-- The market. A listing's reserved and running replicas are never
-- stored: they are summed from the orders that hold capacity, so
-- they cannot drift from them. An order copies price, fee and
-- destination when it is placed (what the checkout charges never
-- changes afterwards). The CHECKs tie the times to the states, so
-- that a state change that forgets one fails instead of storing a
-- paid order without its month. user_data is a column of its own
-- that only OrderUserData reads. webhook_events remembers handled
-- Stripe events by id, so a replay changes nothing.

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
