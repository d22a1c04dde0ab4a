-- The bank's decision on a dispute (charge.dispute.closed):
-- dispute_status is Stripe's status of the closed dispute, ''
-- while it is open or there is none, and dispute_closed_at when
-- it came. A disputed order's refund is held, never refundFailed
-- (retried): the UPDATE first holds the refunds a binary before
-- this one left retrying against a dispute, so that the CHECK
-- holds for every row.

UPDATE orders SET state = 'refunding' WHERE state = 'refundFailed' AND disputed_at IS NOT NULL;
ALTER TABLE orders ADD COLUMN dispute_status TEXT NOT NULL DEFAULT ''
	CHECK (dispute_status IN ('', 'won', 'lost', 'warning_closed', 'prevented'));
ALTER TABLE orders ADD COLUMN dispute_closed_at INTEGER
	CHECK ((dispute_closed_at IS NULL) = (dispute_status = '') AND (dispute_closed_at IS NULL OR disputed_at IS NOT NULL)
		AND (state <> 'refundFailed' OR disputed_at IS NULL));
