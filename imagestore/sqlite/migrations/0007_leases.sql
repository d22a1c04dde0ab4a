-- Leases (imagestore.Leases): one row per name, kept after its
-- release (expires_at 0) so that its token counts on and is never
-- handed out twice.

CREATE TABLE leases (
	name       TEXT    PRIMARY KEY,
	holder     TEXT    NOT NULL CHECK (holder <> ''),
	token      INTEGER NOT NULL CHECK (token > 0),
	expires_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
