-- The journal (imagestore.Journal), the SQLite store's step 8: the store's
-- identity, one row that start-up writes (the same id is kept beside the
-- image files and must match), and the intents of file moves in progress,
-- one row per upload id. Times are BIGINT Unix nanoseconds in UTC.

CREATE TABLE store_meta (
	one        INTEGER PRIMARY KEY CHECK (one = 1),
	id         TEXT    NOT NULL CHECK (length(id) = 32),
	created_at BIGINT  NOT NULL
);

CREATE TABLE blob_intents (
	upload_id TEXT   PRIMARY KEY,
	kind      TEXT   NOT NULL CHECK (kind IN ('commit', 'remove')),
	at        BIGINT NOT NULL
);
