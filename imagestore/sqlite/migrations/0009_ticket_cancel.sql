-- A tenant cancels an unused ticket (CancelTicket), and an upload
-- refused before its body releases its ticket the same way:
-- used_at is set with cancelled_at, so every rule that reads
-- used_at (single use, the quota's count, the expiry count)
-- holds for a cancelled ticket unchanged, and cancelled_at tells
-- it from a ticket an upload used. The CHECK keeps the two
-- together and a cancelled ticket out of the running uploads.

ALTER TABLE tickets ADD COLUMN cancelled_at INTEGER
	CHECK (cancelled_at IS NULL OR (cancelled_at = used_at AND put_running = 0));
