-- SweepTickets counts the tickets that expired unused, each once;
-- the partial index keeps its scan to those not counted yet (the
-- plain expires_at index made every sweep walk every expired
-- ticket of the last seven days).

CREATE INDEX tickets_expiry_uncounted ON tickets (expires_at) WHERE used_at IS NULL AND expiry_counted = 0;
