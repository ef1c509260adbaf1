-- Schedules (issue 34): an action with its parameters, run at the occurrences of a cron expression
-- in a time zone, or once at an instant. The executors create each due run in the transaction
-- that moves the schedule's `next_run` on, under the schedule row's lock: a run is created once
-- however many executors look, and an executor killed at the due moment leaves the schedule due
-- for the next look (its transaction never committed).
CREATE TABLE schedule (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    action_ref TEXT NOT NULL,
    -- checked against the action's declarations when the schedule was made (secret ones sealed)
    parameters JSONB NOT NULL DEFAULT '{}',
    -- a cron expression (5 fields, or 6 with seconds first) read in `timezone`, or one instant
    cron TEXT,
    timezone TEXT NOT NULL DEFAULT 'UTC',
    at TIMESTAMPTZ,
    -- what a look after an outage does with occurrences older than the grace (60 s): `skip`
    -- them, or run `once` for them all
    catch_up TEXT NOT NULL DEFAULT 'skip' CONSTRAINT schedule_catch_up CHECK (catch_up IN ('skip', 'once')),
    paused BOOLEAN NOT NULL DEFAULT false,
    -- the next occurrence to run; null: nothing more (an instant that came)
    next_run TIMESTAMPTZ,
    -- the last occurrence run, and the execution it made
    last_run TIMESTAMPTZ,
    last_execution BIGINT,
    reason TEXT,
    -- the API token that made it (`api_token.id`)
    created_by BIGINT,
    created TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT schedule_timing CHECK ((cron IS NULL) <> (at IS NULL))
);
CREATE INDEX schedule_due_idx ON schedule (next_run) WHERE NOT paused AND next_run IS NOT NULL;

-- the schedule an execution came from, and the occurrence it is the run of (a retry keeps both)
ALTER TABLE execution ADD COLUMN schedule BIGINT;
ALTER TABLE execution ADD COLUMN scheduled_for TIMESTAMPTZ;
-- one first attempt per occurrence, whatever happens
CREATE UNIQUE INDEX execution_one_per_occurrence ON execution (schedule, scheduled_for)
    WHERE schedule IS NOT NULL AND original_execution IS NULL;

-- the API makes, changes and deletes schedules; the executors move them on
REVOKE INSERT, DELETE, TRUNCATE ON schedule FROM attune_executor;
REVOKE UPDATE ON schedule FROM attune_executor;
GRANT UPDATE (next_run, last_run, last_execution, updated) ON schedule TO attune_executor;
