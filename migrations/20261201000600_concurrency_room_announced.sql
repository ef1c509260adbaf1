-- A run of an action with a concurrency policy that leaves `scheduled` or `running` makes room
-- for the next request of its key: the executors are told at its commit, as for a new request
-- (on `attune_requests`, its runtime), instead of finding it at their next sweep (a second).
-- The WHEN clause is evaluated for every status change; the function runs only for executions
-- the claim marked as limited (`concurrency_limited`) when they leave flight.
CREATE FUNCTION announce_concurrency_room() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('attune_requests', jsonb_build_array(NEW.runtime)::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER execution_concurrency_room_announced
    AFTER UPDATE OF status ON execution
    FOR EACH ROW
    WHEN (OLD.concurrency_limited AND OLD.status IN ('scheduled', 'running')
          AND NEW.status NOT IN ('scheduled', 'running'))
    EXECUTE FUNCTION announce_concurrency_room();
