-- Console tickets, the SQLite store's step 11: single use, a minute's
-- life; used_at is set by the one conditional UPDATE that uses one.

CREATE TABLE console_tickets (
	hash       BYTEA   PRIMARY KEY CHECK (length(hash) = 32),
	tenant_id  BIGINT  NOT NULL REFERENCES tenants (id),
	order_id   TEXT    NOT NULL REFERENCES orders (id),
	replica    INTEGER NOT NULL CHECK (replica >= 0),
	kind       TEXT    NOT NULL CHECK (kind IN ('vnc', 'serial')),
	created_at BIGINT  NOT NULL,
	expires_at BIGINT  NOT NULL,
	used_at    BIGINT
);
CREATE INDEX console_tickets_expiry ON console_tickets (expires_at);
