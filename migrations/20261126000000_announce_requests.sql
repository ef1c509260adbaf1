-- New waiting requests are announced by the database, at the commit that makes them visible: a
-- statement that inserts `requested` executions sends one notification on the channel
-- `attune_requests` (delivered to the executors that listen when the transaction commits, and
-- never if it rolls back). Its payload is a JSON array of the runtimes of those rows, `null` for
-- a row whose runtime is unknown (its action did not exist); `[null]` also stands for "look at
-- every runtime" when the list would not fit in a notification.
--
-- This takes the place of the broker hint that the API published after each insert: that hint
-- went through a quorum queue (one more fsync, one more hop) before any executor could look, and
-- said nothing the row does not. Rows that become `requested` by an UPDATE (a retry that is due,
-- a dispatch handed back) are announced as before, by whoever moved them.
CREATE FUNCTION announce_requests() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    runtimes text;
BEGIN
    SELECT jsonb_agg(DISTINCT runtime)::text INTO runtimes FROM inserted WHERE status = 'requested';
    IF runtimes IS NOT NULL THEN
        -- (a notification's payload must be shorter than 8000 bytes)
        IF octet_length(runtimes) > 7000 THEN
            runtimes := '[null]';
        END IF;
        PERFORM pg_notify('attune_requests', runtimes);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER execution_requests_announced
    AFTER INSERT ON execution
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION announce_requests();
