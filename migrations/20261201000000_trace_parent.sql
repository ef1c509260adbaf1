-- Traces (issue 35): the W3C `traceparent` an execution's spans hang under, when the API that
-- took it exported traces: its submission's span (`POST /executions`), or for a retry, the chain's
-- first submission's (every attempt of a chain is in the first's trace). Null with traces off.
-- (the check is added NOT VALID: every row written before is null, and a validation would read
-- the whole table under the lock that stops every service)
ALTER TABLE execution ADD COLUMN trace_parent TEXT;
ALTER TABLE execution ADD CONSTRAINT execution_trace_parent_w3c
    CHECK (trace_parent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;
-- (the archive keeps the table's columns, in its order)
ALTER TABLE execution_archive ADD COLUMN trace_parent TEXT;
