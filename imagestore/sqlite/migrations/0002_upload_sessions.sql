-- Resumable (tus) uploads. upload_id is deliberately not a foreign
-- key to tickets: SweepTickets forgets used tickets after a while,
-- and a session may outlive its ticket's retention. "offset" is
-- quoted because OFFSET is an SQL keyword; SQLite would accept it
-- bare, but only by a parser fallback. The CHECKs catch a caller
-- that records progress past the end of the upload.

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
