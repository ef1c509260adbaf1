-- Why an execution waits (issue 50): a waiting execution showed only `requested` everywhere. This
-- says what holds it, in the order the scheduler meets them: a retry's backoff, a pause (of its
-- action, its runtime or its workflow run), its action's concurrency limit, no worker that could
-- take it, every such worker full; else its place in the line. `NULL` when it does not wait.
--
-- A read of the record as it is now, for the views that show one execution (the API's
-- `waiting`, `attune execution get`, `run --wait`, `tail`, the dashboard); the scheduler does
-- not call it.
CREATE FUNCTION execution_waiting(p_execution BIGINT) RETURNS JSONB
LANGUAGE plpgsql STABLE SET search_path = public, pg_temp AS $$
DECLARE
    e execution;
    held pause;
    policy JSONB;
    key_value TEXT;
    holders BIGINT[];
    capable INTEGER;
    slots BIGINT;
    free BIGINT;
    unfit INTEGER;
    ahead BIGINT;
BEGIN
    SELECT * INTO e FROM execution WHERE id = p_execution;
    IF NOT FOUND OR e.status NOT IN ('requested', 'delayed', 'scheduling') THEN
        RETURN NULL;
    END IF;
    IF e.status = 'delayed' OR e.not_before > now() THEN
        RETURN jsonb_build_object('reason', 'backoff', 'until', e.not_before,
            'held_by_circuit_until', e.retry_decision->'held_until',
            'message', format('a retry waiting out its backoff until %s',
                to_char(e.not_before AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"')));
    END IF;
    IF e.status = 'scheduling' THEN
        RETURN jsonb_build_object('reason', 'scheduling', 'message', 'an executor is choosing its worker');
    END IF;
    SELECT * INTO held FROM pause
    WHERE (kind = 'action' AND name = e.action_ref) OR (kind = 'runtime' AND name = e.runtime)
       OR (kind = 'run' AND name = e.workflow_run::TEXT)
    ORDER BY CASE kind WHEN 'run' THEN 1 WHEN 'action' THEN 2 ELSE 3 END LIMIT 1;
    IF FOUND THEN
        RETURN jsonb_build_object('reason', 'paused', 'kind', held.kind, 'name', held.name,
            'paused_by', held.paused_by, 'paused_at', held.paused_at, 'why', held.reason,
            'message', format('its %s %s is paused: %s', CASE held.kind WHEN 'run' THEN 'workflow run' ELSE held.kind END,
                held.name, held.reason));
    END IF;
    SELECT concurrency_in_force(a.concurrency, a.concurrency_set) INTO policy FROM action a WHERE a.id = e.action;
    IF policy IS NOT NULL AND jsonb_typeof(policy->'limit') = 'number' THEN
        key_value := CASE WHEN policy->>'key' IS NULL THEN NULL ELSE e.parameters->>(policy->>'key') END;
        SELECT array_agg(x.id ORDER BY x.id) INTO holders FROM execution x
        WHERE x.action_ref = e.action_ref AND x.status IN ('scheduling', 'scheduled', 'running')
          AND (policy->>'key' IS NULL OR x.parameters->>(policy->>'key') IS NOT DISTINCT FROM key_value);
        IF COALESCE(cardinality(holders), 0) >= (policy->>'limit')::INTEGER THEN
            RETURN jsonb_build_object('reason', 'concurrency', 'limit', (policy->>'limit')::INTEGER,
                'key', policy->>'key', 'value', key_value, 'held_by', to_jsonb(holders[1:10]),
                'message', format('%s runs at most %s at once%s: held by %s', e.action_ref, policy->>'limit',
                    CASE WHEN policy->>'key' IS NULL THEN ''
                         ELSE format(' per %s (here %s)', policy->>'key', COALESCE(key_value, 'none')) END,
                    array_to_string(holders[1:10], ', ')));
        END IF;
    END IF;
    -- (a worker's slots are its concurrency and its look-ahead)
    SELECT count(*), COALESCE(sum(GREATEST(COALESCE((w.capabilities->>'slots')::BIGINT, (w.capabilities->>'concurrency')::BIGINT, 1), 1)), 0),
           COALESCE(sum(GREATEST(COALESCE((w.capabilities->>'slots')::BIGINT, (w.capabilities->>'concurrency')::BIGINT, 1) - h.queue_depth, 0)), 0)
      INTO capable, slots, free
    FROM healthy_workers h JOIN worker w ON w.id = h.id
    WHERE h.runtimes ? e.runtime AND w.drained_at IS NULL
      AND (w.not_receiving_until IS NULL OR w.not_receiving_until <= now());
    IF capable = 0 THEN
        SELECT count(*) INTO unfit FROM worker w
        WHERE w.capabilities->'runtimes' ? e.runtime AND w.status = 'active';
        RETURN jsonb_build_object('reason', 'no_worker', 'runtime', e.runtime, 'unhealthy_workers', unfit,
            'drained_workers', (SELECT count(*) FROM worker w WHERE w.capabilities->'runtimes' ? e.runtime
                                AND w.status = 'active' AND w.drained_at IS NOT NULL),
            'since', e.created,
            'message', format('no healthy or degraded worker offers %s (%s active one(s) unhealthy, drained or not receiving); it fails as worker_unavailable, which is retried, once none has for the executors'' ATTUNE_WORKER_WAIT_SECS (30 s by default)',
                e.runtime, unfit));
    END IF;
    IF free = 0 THEN
        RETURN jsonb_build_object('reason', 'workers_full', 'runtime', e.runtime, 'workers', capable, 'slots', slots,
            'message', format('every worker offering %s is full (%s worker(s), %s slot(s))', e.runtime, capable, slots));
    END IF;
    SELECT count(*) INTO ahead FROM execution x
    WHERE x.status = 'requested' AND x.runtime = e.runtime
      AND (COALESCE(x.not_before, x.created), x.id) < (COALESCE(e.not_before, e.created), e.id);
    RETURN jsonb_build_object('reason', 'queued', 'ahead', ahead,
        'message', format('next for a %s worker, %s ahead of it', e.runtime, ahead));
END
$$;
