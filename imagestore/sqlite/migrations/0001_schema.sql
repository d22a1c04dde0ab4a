-- The records of vmshelf on SQLite: tenants, upload tickets, images and
-- fetch tokens. Each file is one step of the schema, applied in one
-- transaction; a database's user_version counts the steps applied. A
-- migration file is history once released: change the schema by adding the
-- next file, never by editing one (a database already past it would stay
-- on a schema no binary describes).
--
-- Tables are STRICT so that a mistyped bind (a time.Time where nanoseconds
-- belong, a string hash) fails loudly instead of being stored as text.
-- Times are integer Unix nanoseconds in UTC, hashes are 32-byte BLOBs and
-- booleans are 0/1 integers.

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
