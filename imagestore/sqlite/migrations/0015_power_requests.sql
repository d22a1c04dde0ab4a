-- Power requests (imagestore.PowerStore): a buyer's start, stop or
-- restart of an order's replica (-1: all of them), kept by the
-- client's request id so that a retry after a lost answer is given
-- the first answer instead of acting twice. done_at, status and
-- answer are set when the action has answered; a row still running
-- long after taken_at lost its process and is taken again. Swept
-- with the tickets.

CREATE TABLE power_requests (
	order_id   TEXT    NOT NULL REFERENCES orders (id),
	request_id TEXT    NOT NULL CHECK (length(request_id) BETWEEN 1 AND 64),
	tenant_id  INTEGER NOT NULL REFERENCES tenants (id),
	replica    INTEGER NOT NULL CHECK (replica >= -1),
	action     TEXT    NOT NULL CHECK (action IN ('start', 'stop', 'restart')),
	taken_at   INTEGER NOT NULL,
	done_at    INTEGER,
	status     INTEGER NOT NULL DEFAULT 0,
	answer     BLOB,
	PRIMARY KEY (order_id, request_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX power_requests_taken ON power_requests (taken_at);
