-- The recent restores each endpoint's rates are fitted to (src/restore/calibrate.rs): a JSON
-- array of their shapes and measured seconds, the newest 32. Rows written before it hold '[]'
-- and keep their rates until the next drill there.
ALTER TABLE restore_rates ADD COLUMN recent TEXT NOT NULL DEFAULT '[]';
