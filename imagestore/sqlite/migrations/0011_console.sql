-- Console tickets (imagestore.ConsoleStore): single use, a
-- minute's life; used_at is set by the one conditional UPDATE
-- that uses one. Kept after use, like upload tickets, and swept
-- with them.

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
