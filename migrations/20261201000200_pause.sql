-- Pause and resume (issue 34): an operator pauses an action or a whole runtime; its requests
-- wait, `requested`, until it is resumed (nothing running is touched, no retry is spent, and the
-- wait does not fail them as `worker_unavailable`). The claim itself skips paused work, so it
-- holds whatever executor claims.
CREATE TABLE pause (
    kind TEXT NOT NULL CONSTRAINT pause_kind CHECK (kind IN ('action', 'runtime')),
    -- the action's ref (`pack.name`) or the runtime's name
    name TEXT NOT NULL,
    reason TEXT NOT NULL,
    -- the API token that paused it (`api_token.id`)
    paused_by BIGINT,
    paused_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, name)
);

-- the API pauses and resumes; the executors read
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON pause FROM attune_executor;

CREATE OR REPLACE FUNCTION execution_claim(p_runtime TEXT, p_plan BIGINT[]) RETURNS SETOF execution
LANGUAGE plpgsql AS $$
BEGIN
    -- (the two-key form: apart from the services' one-key locks)
    PERFORM pg_advisory_xact_lock(1635022965, (planned.worker % 2147483647)::int)
        FROM (SELECT DISTINCT unnest(p_plan) % 2147483647 AS worker ORDER BY 1) AS planned;
    -- a statement of a function takes its snapshot when it starts: this one sees every claim
    -- that took its turn before
    RETURN QUERY
    WITH inflight AS (
        SELECT x.worker, count(*) AS n FROM execution x
        WHERE x.status IN ('scheduled', 'running') AND x.worker = ANY (p_plan)
        GROUP BY x.worker),
    room AS (
        SELECT w.id AS worker,
               CASE WHEN jsonb_typeof(w.capabilities->'slots') = 'number'
                    THEN floor(LEAST((w.capabilities->>'slots')::numeric, 1e18))::bigint
                    ELSE 9223372036854775807 END - COALESCE(i.n, 0) AS free
        FROM worker w LEFT JOIN inflight i ON i.worker = w.id
        WHERE w.id = ANY (p_plan)),
    kept AS (
        SELECT p.worker, row_number() OVER (ORDER BY p.n) AS n
        FROM (SELECT q.worker, q.n, row_number() OVER (PARTITION BY q.worker ORDER BY q.n) AS k
              FROM unnest(p_plan) WITH ORDINALITY AS q(worker, n)) AS p
        JOIN room ON room.worker = p.worker
        WHERE p.k <= room.free),
    picked AS (
        SELECT ctid AS tid, id, COALESCE(not_before, created) AS since FROM execution w
        WHERE status = 'requested' AND runtime = p_runtime
          AND NOT EXISTS (SELECT 1 FROM action_circuit c WHERE c.action = w.action
                          AND c.state <> 'closed' AND c.trial IS DISTINCT FROM w.id)
          AND NOT EXISTS (SELECT 1 FROM pause pz
                          WHERE (pz.kind = 'runtime' AND pz.name = p_runtime)
                             OR (pz.kind = 'action' AND pz.name = w.action_ref))
        ORDER BY COALESCE(not_before, created), id
        LIMIT (SELECT count(*) FROM kept) FOR UPDATE OF w SKIP LOCKED),
    numbered AS (SELECT tid, row_number() OVER (ORDER BY since, id) AS n FROM picked),
    claimed AS (
        UPDATE execution e SET status = 'scheduled', worker = kept.worker, updated = now()
        FROM numbered JOIN kept USING (n)
        WHERE e.ctid = numbered.tid AND e.status = 'requested'
        RETURNING e.*)
    SELECT * FROM claimed;
END
$$;
