-- attune's own events (issue 49, ADR 0014): what happens inside attune is an event a rule can
-- answer, as a webhook's delivery is, so that a failure can notify someone.
--
-- * An execution that ends raises `attune.execution.finished`; one that ends without success
--   (failed, timeout, abandoned) `attune.execution.failed`, and, when no retry follows it (its
--   retries used up, or its failure not one that is retried), `attune.execution.exhausted`; one
--   that ran out of time `attune.execution.timed_out`.
-- * A schedule's occurrence raises `schedule.NAME`.
-- * A worker that turns unhealthy (by what it reports, or by falling silent until the monitor
--   marks it inactive) raises `attune.worker.unhealthy`; an action's circuit that opens,
--   `attune.circuit.opened`.
--
-- An event is raised in the transaction of the change it tells of, so it is committed exactly
-- when the change is, and only when an enabled rule has its trigger (no rule: no cost but the
-- look). It waits in `event_pending` until an API answers it: the API claims it (SKIP LOCKED),
-- records every rule's answer and the executions they made, and deletes the claim, all in one
-- transaction; an API that dies mid-way leaves the claim for the next. What a rule of attune's
-- own events made raises no event itself: a notification that fails does not notify of its
-- own failure, round and round.

-- Rules an operator makes through the API (`made_by`: the token's id) live in the pack `local`
-- and no pack's registration touches them. An operator who enables or disables a pack's rule
-- (`enabled_by`) is heard over the file's `enabled:` at the pack's next registration.
ALTER TABLE rule ADD COLUMN made_by BIGINT, ADD COLUMN enabled_by BIGINT, ADD COLUMN enabled_at TIMESTAMPTZ;

CREATE TABLE event_pending (
    event BIGINT PRIMARY KEY REFERENCES event (id) ON DELETE CASCADE
);

-- the channel the API listens on for events raised (the payload is the event's id)
CREATE FUNCTION raise_event(p_trigger TEXT, p_payload JSONB) RETURNS BIGINT
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
DECLARE
    made BIGINT;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM rule WHERE trigger = p_trigger AND enabled) THEN
        RETURN NULL;
    END IF;
    INSERT INTO event (trigger, payload) VALUES (p_trigger, p_payload) RETURNING id INTO made;
    INSERT INTO event_pending (event) VALUES (made);
    PERFORM pg_notify('attune_events', made::text);
    RETURN made;
END
$$;
REVOKE ALL ON FUNCTION raise_event(TEXT, JSONB) FROM PUBLIC;

CREATE FUNCTION execution_raises_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    retried BOOLEAN := COALESCE((NEW.retry_decision->>'retried')::BOOLEAN, false);
    payload JSONB;
BEGIN
    IF (NEW.config->>'trigger') LIKE 'attune.%'
       OR NOT EXISTS (SELECT 1 FROM rule WHERE enabled AND trigger LIKE 'attune.execution.%') THEN
        RETURN NULL;
    END IF;
    payload := jsonb_build_object('execution', jsonb_build_object(
        'id', NEW.id, 'action', NEW.action_ref, 'status', NEW.status, 'failure_kind', NEW.failure_kind,
        'error', left(NEW.error, 4096), 'exit_code', NEW.exit_code, 'http_status', NEW.http_status,
        'retry_count', NEW.retry_count, 'max_retries', NEW.max_retries, 'retried', retried,
        'decision', NEW.retry_decision->>'reason', 'original_execution', NEW.original_execution,
        'worker', NEW.worker, 'submitted_by', NEW.submitted_by, 'workflow_run', NEW.workflow_run,
        'created', NEW.created, 'started', NEW.started, 'finished', NEW.finished));
    PERFORM raise_event('attune.execution.finished', payload);
    IF NEW.status IN ('failed', 'timeout', 'abandoned') THEN
        PERFORM raise_event('attune.execution.failed', payload);
        IF NOT retried THEN
            PERFORM raise_event('attune.execution.exhausted', payload);
        END IF;
    END IF;
    IF NEW.status = 'timeout' THEN
        PERFORM raise_event('attune.execution.timed_out', payload);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER execution_raises_events
    AFTER UPDATE OF status ON execution
    FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status
          AND NEW.status IN ('completed', 'failed', 'timeout', 'canceled', 'abandoned'))
    EXECUTE FUNCTION execution_raises_events();

CREATE FUNCTION worker_raises_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    max_age DOUBLE PRECISION;
    depth BIGINT;
    class_now TEXT;
    class_before TEXT;
    why TEXT;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM rule WHERE enabled AND trigger = 'attune.worker.unhealthy') THEN
        RETURN NULL;
    END IF;
    IF OLD.status <> 'inactive' AND NEW.status = 'inactive' THEN
        -- the monitor's verdict on a silent worker; a worker that stops says goodbye fresh
        SELECT heartbeat_max_age_secs INTO max_age FROM health_probe_config;
        IF NEW.last_heartbeat IS NULL OR NEW.last_heartbeat < now() - make_interval(secs => max_age) THEN
            why := 'its heartbeat stopped';
            class_now := 'unhealthy';
        END IF;
    ELSIF NEW.status = 'active' THEN
        depth := get_worker_queue_depth(NEW.id);
        class_now := worker_health_class(NEW.capabilities, NEW.last_heartbeat, depth, now());
        class_before := CASE WHEN OLD.status = 'active'
            THEN worker_health_class(OLD.capabilities, OLD.last_heartbeat, depth, COALESCE(OLD.last_heartbeat, now()))
        END;
        IF class_now = 'unhealthy' AND class_before IS DISTINCT FROM 'unhealthy' THEN
            why := 'what it reports makes it unhealthy';
        END IF;
    END IF;
    IF why IS NOT NULL THEN
        PERFORM raise_event('attune.worker.unhealthy', jsonb_build_object('worker', jsonb_build_object(
            'id', NEW.id, 'name', NEW.name, 'status', NEW.status, 'health', class_now, 'reason', why,
            'last_heartbeat', NEW.last_heartbeat,
            'consecutive_failures', COALESCE((NEW.capabilities->'health'->>'consecutive_failures')::INTEGER, 0))));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER worker_raises_events
    AFTER UPDATE ON worker
    FOR EACH ROW
    EXECUTE FUNCTION worker_raises_events();

CREATE FUNCTION circuit_raises_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.state = 'open' THEN
        RETURN NULL;
    END IF;
    PERFORM raise_event('attune.circuit.opened', jsonb_build_object('circuit', jsonb_build_object(
        'action', a.ref, 'open_until', NEW.open_until, 'failed', NEW.window_failed,
        'finished', NEW.window_finished, 'opened_count', NEW.opened_count)))
    FROM action a WHERE a.id = NEW.action;
    RETURN NULL;
END
$$;

CREATE TRIGGER action_circuit_raises_events
    AFTER INSERT OR UPDATE OF state ON action_circuit
    FOR EACH ROW WHEN (NEW.state = 'open')
    EXECUTE FUNCTION circuit_raises_events();

-- A schedule's occurrence is an event of `schedule.NAME` too, with what it ran: a rule can do
-- more at the same time (a timer, in StackStorm's words).
CREATE FUNCTION schedule_raises_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM raise_event('schedule.' || NEW.name, jsonb_build_object('schedule', jsonb_build_object(
        'name', NEW.name, 'action', NEW.action_ref, 'occurrence', NEW.last_run,
        'execution', NEW.last_execution, 'next_run', NEW.next_run)));
    RETURN NULL;
END
$$;

CREATE TRIGGER schedule_raises_events
    AFTER UPDATE OF last_execution ON schedule
    FOR EACH ROW WHEN (NEW.last_execution IS DISTINCT FROM OLD.last_execution AND NEW.last_execution IS NOT NULL)
    EXECUTE FUNCTION schedule_raises_events();

-- the API answers what was raised: it locks, reads and deletes the claims (a lock FOR UPDATE
-- takes the right to update; there is nothing else in the row to change)
REVOKE ALL ON event_pending FROM attune_executor;
REVOKE INSERT, TRUNCATE ON event_pending FROM attune_api;
