-- The firmware that could start an image's disk, read from its first
-- sectors when its upload ends: 'bios', 'uefi', 'bios+uefi' or 'none'.
-- '' is an image stored before that check: nothing is known, and
-- nothing is refused for it.

ALTER TABLE images ADD COLUMN boot TEXT NOT NULL DEFAULT ''
	CHECK (boot IN ('', 'none', 'bios', 'uefi', 'bios+uefi'));
