-- Workflows (issue 48, ADR 0012): several actions as one run, each step an ordinary execution.
--
-- * A workflow is registered as an action of runtime 'workflow' whose `workflow` column is the
--   hash of its definition; `workflow_definition` keeps every definition ever registered, by
--   hash, and is never rewritten.
-- * A run is an execution of that action. Its `workflow_run` row, made by the insert itself
--   (`execution_workflow_pinned`), pins the definition the action had then (a retry of a run
--   pins its parent's and takes over the steps the parent finished, `resumes`): registering
--   the pack again never changes a run that exists.
-- * Each step item is an execution with `workflow_run`, `workflow_step` and `workflow_item`
--   (its retries copy them). The unique index below lets each item start once, whatever the
--   executors do; the executors make steps only through `workflow_step_start`, which takes the
--   action, its limits and retries from the pinned definition and the run's owner from the run.
-- * Every step that ends, and every run that ends, is announced on `attune_workflows` (the
--   run's id) at its commit: the executors advance the run at once, and their sweep finds what
--   an announcement missed.

ALTER TABLE action ADD COLUMN workflow TEXT;

CREATE TABLE workflow_definition (
    hash TEXT PRIMARY KEY,
    ref TEXT NOT NULL,
    definition JSONB NOT NULL,
    created TIMESTAMPTZ NOT NULL DEFAULT now()
);

ALTER TABLE execution ADD COLUMN workflow_run BIGINT, ADD COLUMN workflow_step TEXT, ADD COLUMN workflow_item INTEGER;
ALTER TABLE execution_archive ADD COLUMN workflow_run BIGINT, ADD COLUMN workflow_step TEXT,
    ADD COLUMN workflow_item INTEGER;
CREATE UNIQUE INDEX execution_workflow_item_once ON execution (workflow_run, workflow_step, workflow_item)
    WHERE workflow_run IS NOT NULL AND original_execution IS NULL;
CREATE INDEX execution_by_workflow_run ON execution (workflow_run, workflow_step, workflow_item, id)
    WHERE workflow_run IS NOT NULL;

CREATE TABLE workflow_run (
    execution BIGINT PRIMARY KEY REFERENCES execution (id) ON DELETE CASCADE,
    definition TEXT NOT NULL REFERENCES workflow_definition (hash),
    -- the run this one retries: the steps it finished are not run again
    resumes BIGINT,
    created TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- when an executor last advanced it (its row is locked for each advance)
    advanced TIMESTAMPTZ
);

CREATE FUNCTION workflow_run_pinned() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    parent workflow_run;
BEGIN
    SELECT * INTO parent FROM workflow_run WHERE execution = NEW.original_execution;
    IF FOUND THEN
        INSERT INTO workflow_run (execution, definition, resumes) VALUES (NEW.id, parent.definition, parent.execution);
    ELSE
        INSERT INTO workflow_run (execution, definition)
        SELECT NEW.id, a.workflow FROM action a WHERE a.id = NEW.action AND a.workflow IS NOT NULL;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER execution_workflow_pinned
    AFTER INSERT ON execution
    FOR EACH ROW WHEN (NEW.runtime = 'workflow')
    EXECUTE FUNCTION workflow_run_pinned();

CREATE FUNCTION announce_workflow_progress() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('attune_workflows', COALESCE(NEW.workflow_run, NEW.id)::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER execution_workflow_progress
    AFTER UPDATE OF status ON execution
    FOR EACH ROW
    WHEN ((NEW.workflow_run IS NOT NULL OR NEW.runtime = 'workflow') AND NEW.status IS DISTINCT FROM OLD.status
          AND NEW.status IN ('completed', 'failed', 'timeout', 'canceled', 'abandoned'))
    EXECUTE FUNCTION announce_workflow_progress();

-- Item `p_item` of step `p_step` of run `p_run`, as the run's pinned definition says: its
-- action, timeout and retries from there, its owner and trace from the run; the executors give
-- only its parameters, rendered from the run's input and earlier results (`p_failure`: they
-- did not fit the action's declared parameters, and the item is recorded failed with that
-- reason, never run). `NULL` when the item was started already. What the executors cannot
-- choose through it: the action, another step's, a sealed value, a stored secret the run's
-- input or definition does not name, an item past the most a step may have.
CREATE FUNCTION workflow_step_start(p_run BIGINT, p_step TEXT, p_item INTEGER, p_parameters JSONB,
    p_failure TEXT, p_default_timeout INTEGER) RETURNS BIGINT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    run execution;
    step JSONB;
    act action;
    retries INTEGER;
    made BIGINT;
BEGIN
    SELECT * INTO run FROM execution WHERE id = p_run AND runtime = 'workflow';
    IF NOT FOUND OR run.status <> 'running' THEN
        RAISE EXCEPTION 'execution % is not a running workflow run', p_run USING ERRCODE = '22023';
    END IF;
    SELECT s INTO step
    FROM workflow_run r JOIN workflow_definition d ON d.hash = r.definition,
        jsonb_array_elements(COALESCE(d.definition->'steps', '[]') || COALESCE(d.definition->'on-failure', '[]')) s
    WHERE r.execution = p_run AND s->>'name' = p_step;
    IF step IS NULL THEN
        RAISE EXCEPTION 'workflow run % has no step %', p_run, p_step USING ERRCODE = '22023';
    END IF;
    IF p_item < 0 OR p_item >= 10000 OR (step->'with-items' IS NULL AND p_item <> 0) THEN
        RAISE EXCEPTION 'step % of workflow run % has no item %', p_step, p_run, p_item USING ERRCODE = '22023';
    END IF;
    -- a value only the API seals never comes from the executors; a stored secret's reference
    -- only as the run's input or the definition hold it (what a step printed chooses none)
    IF jsonb_path_exists(p_parameters, 'strict $.**."$sealed"') THEN
        RAISE EXCEPTION 'a step is given no sealed value' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_path_query(p_parameters, 'strict $.**."$secret"') AS given(name)
               WHERE NOT jsonb_path_exists(run.parameters, 'strict $.**."$secret" ? (@ == $n)', jsonb_build_object('n', given.name))
                 AND NOT jsonb_path_exists(step->'parameters', 'strict $.**."$secret" ? (@ == $n)', jsonb_build_object('n', given.name))) THEN
        RAISE EXCEPTION 'a step of workflow run % is given a secret neither its input nor its definition names', p_run
            USING ERRCODE = '22023';
    END IF;
    SELECT * INTO act FROM action WHERE ref = step->>'action';
    IF act.runtime = 'workflow' THEN
        RAISE EXCEPTION 'step % of workflow run % names workflow %: a step runs one action', p_step, p_run, act.ref
            USING ERRCODE = '22023';
    END IF;
    retries := CASE
        WHEN (step->'retry'->>'retryable')::boolean IS FALSE THEN 0
        WHEN step ? 'max_retries' THEN (step->>'max_retries')::integer
        WHEN step->'retry' ? 'max_attempts' THEN GREATEST((step->'retry'->>'max_attempts')::integer - 1, 0)
        ELSE COALESCE(act.max_retries, 0) END;
    INSERT INTO execution (action, action_ref, runtime, parameters, config, status, max_retries, timeout_seconds,
        retry_count, idempotency_key, submitted_by, trace_parent, workflow_run, workflow_step, workflow_item,
        failure_kind, error, finished)
    VALUES (act.id, step->>'action', act.runtime, p_parameters,
        jsonb_strip_nulls(jsonb_build_object('max_retries', retries, 'retry_count', 0, 'workflow_run', p_run,
            'workflow_step', p_step, 'workflow_item', p_item, 'step_retry', step->'retry')),
        CASE WHEN p_failure IS NULL THEN 'requested' ELSE 'failed' END::execution_status, retries,
        COALESCE((step->>'timeout_seconds')::integer, act.timeout_seconds, p_default_timeout), 0,
        gen_random_uuid()::text, run.submitted_by, run.trace_parent, p_run, p_step, p_item,
        CASE WHEN p_failure IS NULL THEN NULL ELSE 'invalid_parameters' END, p_failure,
        CASE WHEN p_failure IS NULL THEN NULL ELSE now() END)
    ON CONFLICT (workflow_run, workflow_step, workflow_item) WHERE workflow_run IS NOT NULL AND original_execution IS NULL
    DO NOTHING
    RETURNING id INTO made;
    RETURN made;
END
$$;
REVOKE ALL ON FUNCTION workflow_step_start(BIGINT, TEXT, INTEGER, JSONB, TEXT, INTEGER) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION workflow_step_start(BIGINT, TEXT, INTEGER, JSONB, TEXT, INTEGER) TO attune_executor;

-- A retry copies its parent's place in its workflow run.
CREATE OR REPLACE FUNCTION execution_insert_retry(p_parent BIGINT, p_status execution_status, p_reason TEXT,
    p_not_before TIMESTAMPTZ, p_config JSONB) RETURNS SETOF execution
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF p_status NOT IN ('requested', 'delayed') THEN
        RAISE EXCEPTION 'a retry starts requested or delayed, not %', p_status USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    INSERT INTO execution (action, action_ref, parameters, config, status, max_retries, timeout_seconds,
        retry_count, retry_reason, original_execution, not_before, runtime, idempotency_key, submitted_by,
        trace_parent, schedule, scheduled_for, workflow_run, workflow_step, workflow_item)
    SELECT p.action, p.action_ref, p.parameters,
        COALESCE(p_config, '{}'::jsonb) || jsonb_build_object('retry_of', p.id, 'original_execution', p.id,
            'retry_reason', p_reason, 'max_retries', COALESCE(p.max_retries, 0), 'retry_count', p.retry_count + 1),
        p_status, COALESCE(p.max_retries, 0), COALESCE(p.timeout_seconds, 300), p.retry_count + 1, p_reason,
        p.id, p_not_before, p.runtime, p.idempotency_key, p.submitted_by, p.trace_parent, p.schedule, p.scheduled_for,
        p.workflow_run, p.workflow_step, p.workflow_item
    FROM execution p
    WHERE p.id = p_parent AND p.status IN ('failed', 'timeout', 'abandoned')
    RETURNING *;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'execution % has not ended without success: it is not retried', p_parent
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- a workflow run may be paused alone (`pause` of kind `run`, named by its id): it starts no new
-- step until it is resumed
ALTER TABLE pause DROP CONSTRAINT pause_kind;
ALTER TABLE pause ADD CONSTRAINT pause_kind CHECK (kind IN ('action', 'runtime', 'run'));

-- what the executors read and may not write
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON workflow_definition, workflow_run FROM attune_executor;
GRANT SELECT ON workflow_definition, workflow_run TO attune_executor;
-- (a lock of the row, FOR UPDATE, takes the right to update a column of it)
GRANT UPDATE (advanced) ON workflow_run TO attune_executor;
-- the API registers definitions; runs are pinned only by the insert's trigger
REVOKE UPDATE, DELETE, TRUNCATE ON workflow_definition FROM attune_api;
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON workflow_run FROM attune_api;
GRANT SELECT ON workflow_definition, workflow_run TO attune_api;
