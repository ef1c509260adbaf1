-- Dispatch by real capacity (docs/adr/0001-requests-wait-as-rows.md).
--
-- A request that no worker has room for waits as its `requested` row; each executor claims the
-- oldest waiting rows of a runtime, as many as the workers offering it have free slots, in one
-- statement (FOR UPDATE SKIP LOCKED). The runtime is copied onto the execution when it is
-- inserted, so that claim reads one index range per runtime, whatever else waits.

-- the action's runtime when the execution was submitted (NULL: its action no longer existed)
ALTER TABLE execution ADD COLUMN runtime TEXT;

UPDATE execution e SET runtime = a.runtime
FROM action a
WHERE a.id = e.action AND e.status IN ('requested', 'scheduling', 'scheduled', 'running', 'delayed');

-- Every insert path (the API, the RetryManager, an operator's SQL) gets the runtime. The API and
-- the RetryManager pass it; the trigger fills it for any insert that does not (it costs about
-- 20 µs per row, so the hot paths do not rely on it).
CREATE FUNCTION execution_copy_runtime() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.runtime := (SELECT runtime FROM action WHERE id = NEW.action);
    RETURN NEW;
END
$$;

CREATE TRIGGER execution_copy_runtime BEFORE INSERT ON execution
    FOR EACH ROW WHEN (NEW.runtime IS NULL AND NEW.action IS NOT NULL)
    EXECUTE FUNCTION execution_copy_runtime();

-- The wait queue: per runtime, oldest first (a retry by its not_before, anything else by when it
-- was created).
CREATE INDEX execution_waiting_idx ON execution (runtime, (COALESCE(not_before, created)), id)
    WHERE status = 'requested';

-- A worker that was asked to stop (SIGTERM) is `draining`: it gets no new work, finishes what it
-- runs, hands back what it had not started, and keeps heartbeating meanwhile.
ALTER TABLE worker DROP CONSTRAINT worker_status_check;
ALTER TABLE worker ADD CONSTRAINT worker_status_check CHECK (status IN ('active', 'draining', 'inactive'));
