-- The journal (imagestore.Journal): the store's identity, one row
-- that start-up writes (and that the same id beside the image
-- files must match), and the intents of file moves in progress,
-- one row per upload id. The identity is not made here: a
-- database emptied later must look like a new one, not like a
-- store of its own.

CREATE TABLE store_meta (
	one        INTEGER PRIMARY KEY CHECK (one = 1),
	id         TEXT    NOT NULL CHECK (length(id) = 32),
	created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE blob_intents (
	upload_id TEXT    PRIMARY KEY,
	kind      TEXT    NOT NULL CHECK (kind IN ('commit', 'remove')),
	at        INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
