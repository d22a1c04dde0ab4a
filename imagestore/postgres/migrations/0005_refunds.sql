-- Refunds, disputes and hosts' own payout accounts, the SQLite store's
-- step 10 (see its comment there for the rules). PostgreSQL alters the
-- CHECKs in place; the unnamed ones of 0001 are found by what they say.

DO $$
DECLARE c record;
BEGIN
	FOR c IN SELECT conname FROM pg_constraint
		WHERE conrelid = 'orders'::regclass AND contype = 'c'
		AND (pg_get_constraintdef(oid) LIKE '%awaitingPayment%'
			OR pg_get_constraintdef(oid) LIKE '%paid_at IS NOT NULL%state%'
			OR pg_get_constraintdef(oid) LIKE '%ended_at IS NOT NULL%state%')
	LOOP
		EXECUTE format('ALTER TABLE orders DROP CONSTRAINT %I', c.conname);
	END LOOP;
END $$;

ALTER TABLE orders
	ADD COLUMN payment_intent    TEXT    NOT NULL DEFAULT '',
	ADD COLUMN blocked_cause     TEXT    NOT NULL DEFAULT '',
	ADD COLUMN blocked_since     BIGINT,
	ADD COLUMN ran_at            BIGINT,
	ADD COLUMN refund_from       TEXT    NOT NULL DEFAULT '' CHECK (refund_from IN ('', 'paid', 'active', 'cancelled')),
	ADD COLUMN refund_cause      TEXT    NOT NULL DEFAULT '',
	ADD COLUMN refund_id         TEXT    NOT NULL DEFAULT '',
	ADD COLUMN refund_attempts   INTEGER NOT NULL DEFAULT 0 CHECK (refund_attempts >= 0),
	ADD COLUMN refund_generation INTEGER NOT NULL DEFAULT 0 CHECK (refund_generation >= 0),
	ADD COLUMN refund_next_at    BIGINT,
	ADD COLUMN refund_error      TEXT    NOT NULL DEFAULT '',
	ADD COLUMN refunded_at       BIGINT,
	ADD COLUMN dispute_id        TEXT    NOT NULL DEFAULT '',
	ADD COLUMN disputed_at       BIGINT,
	ADD CONSTRAINT orders_state CHECK (state IN ('awaitingPayment', 'paid', 'active', 'expired', 'cancelled',
		'refunding', 'refunded', 'refundFailed')),
	ADD CONSTRAINT orders_refund_from CHECK ((refund_from <> '') = (state IN ('refunding', 'refunded', 'refundFailed'))),
	ADD CONSTRAINT orders_paid_at CHECK (refund_from <> '' OR (paid_at IS NOT NULL) = (state IN ('paid', 'active', 'expired'))),
	ADD CONSTRAINT orders_ended_at CHECK (refund_from <> '' OR (ended_at IS NOT NULL) = (state IN ('expired', 'cancelled'))),
	ADD CONSTRAINT orders_refunded_at CHECK ((refunded_at IS NOT NULL) = (state = 'refunded')),
	ADD CONSTRAINT orders_refund_next_at CHECK ((refund_next_at IS NOT NULL) = (state IN ('refunding', 'refundFailed'))),
	ADD CONSTRAINT orders_refund_payment CHECK (refund_from = '' OR payment_intent <> ''),
	ADD CONSTRAINT orders_refund_active CHECK (refund_from <> 'active' OR (ran_at IS NULL AND refund_cause = 'importFailed'));

-- A dispute or a charge.refunded event names the PaymentIntent only.
CREATE INDEX orders_payment_intent ON orders (payment_intent) WHERE payment_intent <> '';

ALTER TABLE tenants
	ADD COLUMN stripe_charges   SMALLINT NOT NULL DEFAULT 0 CHECK (stripe_charges IN (0, 1)),
	ADD COLUMN stripe_payouts   SMALLINT NOT NULL DEFAULT 0 CHECK (stripe_payouts IN (0, 1)),
	ADD COLUMN stripe_onboarded SMALLINT NOT NULL DEFAULT 0 CHECK (stripe_onboarded IN (0, 1));
