-- Leases (imagestore.Leases), the SQLite store's step 7: one row per name,
-- kept after its release (expires_at 0) so that its token counts on and is
-- never handed out twice. Times are BIGINT Unix nanoseconds in UTC.

CREATE TABLE leases (
	name       TEXT   PRIMARY KEY,
	holder     TEXT   NOT NULL CHECK (holder <> ''),
	token      BIGINT NOT NULL CHECK (token > 0),
	expires_at BIGINT NOT NULL
);
