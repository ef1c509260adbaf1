-- An action's own retention (issue 30: "per action where it matters"): its pack's `retention:`
-- block, as seconds per finished status (JSON null: kept for ever), over the executors'
-- ATTUNE_RETENTION_* for the statuses it names. NULL: the executors' ages alone.
ALTER TABLE action ADD COLUMN retention JSONB;
