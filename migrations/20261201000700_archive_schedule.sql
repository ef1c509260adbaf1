-- The archive keeps every column of the executions it takes (`INSERT ... SELECT *`): the schedule
-- an execution came from, and its occurrence, too.
ALTER TABLE execution_archive ADD COLUMN schedule BIGINT;
ALTER TABLE execution_archive ADD COLUMN scheduled_for TIMESTAMPTZ;
