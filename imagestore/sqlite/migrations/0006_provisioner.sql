-- The provisioner. An order's note is its word on a problem with
-- the order; replica_states holds what it last saw of each
-- replica, replaced as a set per order (SetReplicaStates), so a
-- row per replica and no history. The CHECK lists
-- imagestore.ReplicaStateNames. RevokeOrderTokens finds an order's
-- fetch tokens by order_id.

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
