-- A run of an action with a concurrency policy that leaves `scheduled` or `running` makes room
-- for the next request of its key: the executors are told at its commit, as for a new request
-- (on `attune_requests`, its runtime), instead of finding it at their next sweep (a second).
-- The WHEN clause is evaluated for every status change; the function runs only for executions
-- that leave flight, and costs one lookup of the action by its unique ref.
CREATE FUNCTION announce_concurrency_room() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM action a WHERE a.ref = NEW.action_ref
               AND concurrency_in_force(a.concurrency, a.concurrency_set) IS NOT NULL) THEN
        PERFORM pg_notify('attune_requests', jsonb_build_array(NEW.runtime)::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER execution_concurrency_room_announced
    AFTER UPDATE OF status ON execution
    FOR EACH ROW
    WHEN (OLD.status IN ('scheduled', 'running') AND NEW.status NOT IN ('scheduled', 'running'))
    EXECUTE FUNCTION announce_concurrency_room();
