-- The archive keeps every column of the executions it takes (`INSERT ... SELECT *`, by
-- position): whether the claim counted it against a concurrency policy, the schedule it came
-- from, and its occurrence.
ALTER TABLE execution_archive ADD COLUMN concurrency_limited BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE execution_archive ADD COLUMN schedule BIGINT;
ALTER TABLE execution_archive ADD COLUMN scheduled_for TIMESTAMPTZ;
