-- A claim for a plan of workers without the secrets key (a fleet without the key, as the quick
-- start and the benchmark run) looked for them twice, once to learn whether any was planned and
-- once to list them, and then ran a second claim for the other workers of the plan even when
-- there were none: 0.75 ms of a one-row claim where one claim alone takes 0.44 (issue 48, a
-- workflow step's path). One look lists them; the second claim runs only for workers left.
-- Everything else is `20261205000300_secrets_key_where_needed.sql`'s, unchanged.

CREATE OR REPLACE FUNCTION execution_claim(p_runtime TEXT, p_plan BIGINT[]) RETURNS SETOF execution
LANGUAGE plpgsql
SET enable_bitmapscan = off
AS $$
DECLARE
    -- the plan's slots of workers without the key
    keyless BIGINT[];
    -- and of the others
    others BIGINT[];
    -- the runtime's actions with a concurrency policy, and which of their waiting requests fit
    limited TEXT[];
    fitting BIGINT[];
BEGIN
    -- (the two-key form: apart from the services' one-key locks)
    PERFORM pg_advisory_xact_lock(1635022965, (planned.worker % 2147483647)::int)
        FROM (SELECT DISTINCT unnest(p_plan) % 2147483647 AS worker ORDER BY 1) AS planned;
    -- (the actions of the waiting rows, not of the runtime: a pack may have moved an action to
    -- another runtime while requests of it wait)
    -- The actions with a policy first (a handful at most), then whether any of their requests
    -- wait here: in one statement the planner read every waiting request of the runtime to
    -- find out, under a backlog the most of a claim's cost.
    -- (an action with neither block has no policy: the function is not called for it)
    SELECT array_agg(a.ref ORDER BY a.ref) INTO limited FROM action a
        WHERE (a.concurrency IS NOT NULL OR a.concurrency_set IS NOT NULL)
          AND concurrency_in_force(a.concurrency, a.concurrency_set) IS NOT NULL;
    IF limited IS NOT NULL THEN
        SELECT array_agg(r ORDER BY r) INTO limited FROM unnest(limited) AS r
            WHERE EXISTS (SELECT 1 FROM execution w WHERE w.status = 'requested' AND w.action_ref = r
                          AND w.runtime = p_runtime);
    END IF;
    IF limited IS NOT NULL THEN
        -- the claims of a limited action take turns (after the workers' locks, in one order:
        -- no deadlock); each statement below sees every claim that took its turn before
        PERFORM pg_advisory_xact_lock(1635022966, k)
            FROM (SELECT DISTINCT hashtext(r) AS k FROM unnest(limited) AS r ORDER BY 1) AS keyed;
        WITH policy AS (
            SELECT a.ref, (p->>'limit')::bigint AS most, p->>'key' AS key
            FROM action a, concurrency_in_force(a.concurrency, a.concurrency_set) AS p
            WHERE a.ref = ANY (limited)),
        busy AS (
            SELECT x.action_ref, CASE WHEN policy.key IS NULL THEN NULL ELSE x.parameters->>policy.key END AS k,
                   count(*) AS n
            FROM (SELECT i.action_ref, i.parameters FROM worker wk
                  JOIN LATERAL (SELECT i.action_ref, i.parameters FROM execution i
                                WHERE i.worker = wk.id AND i.status IN ('scheduled', 'running')) AS i ON true
                  UNION ALL
                  -- ended by hand, its processes not known to be gone yet
                  SELECT l.action_ref, l.parameters FROM execution l WHERE l.lingering) AS x
            JOIN policy ON policy.ref = x.action_ref
            GROUP BY 1, 2),
        -- each limited action's oldest 10,000 waiting requests (a key whose first request lies
        -- deeper waits until the ones before it are claimed)
        waiting AS (
            SELECT w.id, w.action_ref, policy.most,
                   CASE WHEN policy.key IS NULL THEN NULL ELSE w.parameters->>policy.key END AS k,
                   w.since
            FROM policy, LATERAL (
                SELECT x.id, x.action_ref, x.parameters, COALESCE(x.not_before, x.created) AS since
                FROM execution x
                WHERE x.status = 'requested' AND x.action_ref = policy.ref AND x.runtime = p_runtime
                  AND NOT EXISTS (SELECT 1 FROM action_circuit c WHERE c.action = x.action
                                  AND c.state <> 'closed' AND c.trial IS DISTINCT FROM x.id)
                  AND NOT EXISTS (SELECT 1 FROM pause pz
                                  WHERE (pz.kind = 'runtime' AND pz.name = p_runtime)
                                     OR (pz.kind = 'action' AND pz.name = x.action_ref))
                ORDER BY COALESCE(x.not_before, x.created), x.id
                LIMIT 10000) AS w),
        ranked AS (
            SELECT waiting.id, waiting.most - COALESCE(busy.n, 0) AS room,
                   row_number() OVER (PARTITION BY waiting.action_ref, waiting.k ORDER BY waiting.since, waiting.id) AS place
            FROM waiting LEFT JOIN busy
              ON busy.action_ref = waiting.action_ref AND busy.k IS NOT DISTINCT FROM waiting.k)
        SELECT array_agg(ranked.id) INTO fitting FROM ranked WHERE ranked.place <= ranked.room;
    END IF;
    -- workers without the key in the plan (most plans have none): their slots first, with what
    -- needs no key, then the others', with what is left (each statement sees the claims of the
    -- one before)
    SELECT array_agg(q.worker ORDER BY q.n) INTO keyless
        FROM unnest(p_plan) WITH ORDINALITY AS q(worker, n) JOIN worker w ON w.id = q.worker
        WHERE NOT worker_opens_secrets(w.capabilities);
    IF keyless IS NOT NULL THEN
        RETURN QUERY SELECT * FROM execution_claim_slots(p_runtime, keyless, limited, fitting, true);
        others := ARRAY(SELECT q.worker FROM unnest(p_plan) WITH ORDINALITY AS q(worker, n)
                        WHERE q.worker <> ALL (keyless) ORDER BY q.n);
        -- (a fleet without the key, the quick start's: every slot was the first claim's)
        IF cardinality(others) > 0 THEN
            RETURN QUERY SELECT * FROM execution_claim_slots(p_runtime, others, limited, fitting, false);
        END IF;
        RETURN;
    END IF;
    -- a statement of a function takes its snapshot when it starts: this one sees every claim
    -- that took its turn before
    RETURN QUERY
    -- (each planned worker's room counted once: inlined, the count ran again for every entry
    -- of the plan, a walk of the worker's in-flight rows each time)
    WITH inflight AS MATERIALIZED (
        SELECT x.worker, count(*) AS n FROM execution x
        WHERE x.status IN ('scheduled', 'running') AND x.worker = ANY (p_plan)
        GROUP BY x.worker),
    room AS MATERIALIZED (
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
          AND (limited IS NULL OR w.action_ref <> ALL (limited) OR w.id = ANY (fitting))
          AND NOT EXISTS (SELECT 1 FROM action_circuit c WHERE c.action = w.action
                          AND c.state <> 'closed' AND c.trial IS DISTINCT FROM w.id)
          AND NOT EXISTS (SELECT 1 FROM pause pz
                          WHERE (pz.kind = 'runtime' AND pz.name = p_runtime)
                             OR (pz.kind = 'action' AND pz.name = w.action_ref))
        ORDER BY COALESCE(not_before, created), id
        LIMIT (SELECT count(*) FROM kept) FOR UPDATE OF w SKIP LOCKED),
    numbered AS (SELECT tid, row_number() OVER (ORDER BY since, id) AS n FROM picked),
    claimed AS (
        UPDATE execution e SET status = 'scheduled', worker = kept.worker, updated = now(),
            concurrency_limited = COALESCE(e.action_ref = ANY (limited), false)
        FROM numbered JOIN kept USING (n)
        WHERE e.ctid = numbered.tid AND e.status = 'requested'
        RETURNING e.*)
    SELECT * FROM claimed;
END
$$;
