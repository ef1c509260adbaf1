-- A year of history (docs/adr/0007-history-beside-the-queue.md): what waits and runs is read
-- through indexes keyed by status, so finished rows do not slow it; statistics over long windows
-- read per-minute rollups; retention removes whole retry chains in the background.

-- Keyed by status, then id: the monitor's and the scheduler's reads of one unfinished status walk
-- only that status's entries, a list page filtered by status is one backward range walk (newest
-- first, keyset by id), and retention walks one finished status oldest first. It replaces the
-- index on status alone, which could do none of the last two.
CREATE INDEX execution_status_id_idx ON execution (status, id);
DROP INDEX execution_status_idx;

-- Retention removes the rows of long-inactive workers. The foreign key from execution.worker
-- (ON DELETE SET NULL) would read the whole table for each worker row removed, and an index on
-- execution.worker to serve it costs the hot path dearly: with no statistics yet, the planner
-- takes it for the workers' guarded updates (`WHERE id = $1 AND worker = $2 AND status = ...`)
-- and walks every execution the worker ever ran (core.noop at maximum rate: 1,130 -> 500/s).
-- So execution.worker names the worker that ran it without a foreign key: a finished
-- execution keeps the id of a worker whose row retention removed (the API shows the id alone).
ALTER TABLE execution DROP CONSTRAINT execution_worker_fkey;

-- The retry attempts alone: the quick reference's "retry success rate by reason"
-- (WHERE retry_count > 0) reads them without reading the rest of history.
CREATE INDEX execution_retries_idx ON execution (id) WHERE retry_count > 0;

-- Removing an execution removes its idempotency record (ON DELETE CASCADE): found by index.
CREATE INDEX api_idempotency_key_execution_idx ON api_idempotency_key (execution);

-- The hot table is updated several times per execution: vacuum it after 2 % of its rows changed,
-- not the default 20 % (at millions of rows that is hundreds of thousands of dead versions
-- before the first vacuum). Pages are filled to 90 %: an execution's later versions fit on its
-- own page, and a new execution goes to a page with room for it and the tenth kept free, not to
-- the few bytes a vacuum found on every old page (which scattered each new execution's writes
-- over the whole table: a page read and a full-page image in the WAL each).
ALTER TABLE execution SET (
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05
);

-- Counts of executions per minute of creation and retry reason, for statistics over windows of
-- hours to days (`/stats/retries`, the dashboard). Written by the executor's history job for
-- each minute once it is over (see `history_state`), never updated afterwards; removing
-- executions (retention) leaves their counts here. Kept 31 days (the longest stats window is 30).
CREATE TABLE execution_rollup (
    minute    TIMESTAMPTZ NOT NULL,
    -- '' for original executions (retry_count = 0); a retry's retry_reason ('unknown' if none)
    reason    TEXT NOT NULL,
    total     BIGINT NOT NULL,
    completed BIGINT NOT NULL,
    -- reached a terminal status by the time the minute was counted
    finished  BIGINT NOT NULL,
    PRIMARY KEY (minute, reason)
);

-- One row: how far the rollup reaches. Every execution created before `rolled_up_until` is
-- counted in execution_rollup; statistics read the rows created since from `execution`.
CREATE TABLE history_state (
    singleton       BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
    rolled_up_until TIMESTAMPTZ
);
INSERT INTO history_state DEFAULT VALUES;

-- Counts the executions created from where the rollup reaches (at first: the oldest execution's
-- minute) up to `until` (a minute boundary), or up to `step` further only, and returns where it
-- reaches now. The history job calls it with a bounded step; an operator who bulk-loaded
-- executions behind the service's back calls execution_rollup_rebuild().
CREATE FUNCTION execution_rollup_advance(until TIMESTAMPTZ, step INTERVAL DEFAULT NULL) RETURNS TIMESTAMPTZ
LANGUAGE plpgsql AS $$
DECLARE
    since TIMESTAMPTZ;
BEGIN
    SELECT rolled_up_until INTO since FROM history_state FOR UPDATE;
    IF since IS NULL THEN
        since := (SELECT date_trunc('minute', min(created)) FROM execution);
        IF since IS NULL OR since > until THEN
            since := until;
        END IF;
    END IF;
    IF step IS NOT NULL AND until > since + step THEN
        until := since + step;
    END IF;
    IF until <= since THEN
        RETURN since;
    END IF;
    INSERT INTO execution_rollup (minute, reason, total, completed, finished)
    SELECT date_trunc('minute', created),
           CASE WHEN retry_count > 0 THEN COALESCE(retry_reason, 'unknown') ELSE '' END,
           count(*),
           count(*) FILTER (WHERE status = 'completed'),
           count(*) FILTER (WHERE finished IS NOT NULL)
    FROM execution
    WHERE created >= since AND created < until
    GROUP BY 1, 2
    ON CONFLICT (minute, reason) DO UPDATE
        SET total = execution_rollup.total + EXCLUDED.total,
            completed = execution_rollup.completed + EXCLUDED.completed,
            finished = execution_rollup.finished + EXCLUDED.finished;
    UPDATE history_state SET rolled_up_until = until;
    RETURN until;
END
$$;

-- Forgets the rollup and counts every execution again, up to the last whole minute.
CREATE FUNCTION execution_rollup_rebuild() RETURNS TIMESTAMPTZ
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM history_state FOR UPDATE;
    DELETE FROM execution_rollup;
    UPDATE history_state SET rolled_up_until = NULL;
    RETURN execution_rollup_advance(date_trunc('minute', now()));
END
$$;

-- Where retention moves what it removes when ATTUNE_RETENTION_ARCHIVE is on: the same columns
-- as `execution` (a test holds them equal), no indexes or constraints, for an operator to COPY
-- out and TRUNCATE on their own schedule.
CREATE TABLE execution_archive (LIKE execution);
