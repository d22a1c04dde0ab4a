-- The quota counts a tenant's unused, unexpired tickets on every
-- ticket request; ended tickets are kept for days, so the count
-- must not walk them.

CREATE INDEX tickets_unused ON tickets (tenant_id, expires_at) WHERE used_at IS NULL;
