-- A plain (PUT) upload has consumed its ticket and has no session,
-- so without a mark of its own it would hold no place in the quota
-- while its body arrives. ConsumeTicket sets put_running, AddImage
-- (in the transaction that records the image), EndUpload and
-- start-up's EndRunningUploads clear it. The partial index keeps
-- the quota's count off the many ended tickets.

ALTER TABLE tickets ADD COLUMN put_running INTEGER NOT NULL DEFAULT 0 CHECK (put_running IN (0, 1));
CREATE INDEX tickets_put_running ON tickets (tenant_id) WHERE put_running = 1;
