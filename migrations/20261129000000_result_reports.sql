-- A worker keeps its report of a finished run in the running row as well as publishing it (issue
-- 31): a result delayed on its way (the executors' broker connection partitioned, say) is then
-- recorded from the row by the monitor, which needs only the database, instead of being pre-empted
-- as `timeout` or `worker_heartbeat_stale`. The report is the `ExecutionResult` message as JSON;
-- it is only for the run it names, and goes when the execution leaves `running`.
ALTER TABLE execution ADD COLUMN report JSONB, ADD COLUMN reported_at TIMESTAMPTZ;
-- (the archive keeps the table's columns, in its order)
ALTER TABLE execution_archive ADD COLUMN report JSONB, ADD COLUMN reported_at TIMESTAMPTZ;

CREATE INDEX execution_reported_idx ON execution (reported_at) WHERE report IS NOT NULL;

CREATE FUNCTION execution_report_clear() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.report := NULL;
    NEW.reported_at := NULL;
    RETURN NEW;
END
$$;

-- (evaluated without calling the function for every other update of the table)
CREATE TRIGGER execution_report_clear BEFORE UPDATE ON execution FOR EACH ROW
    WHEN (OLD.report IS NOT NULL AND NEW.status IS DISTINCT FROM 'running'::execution_status)
    EXECUTE FUNCTION execution_report_clear();
