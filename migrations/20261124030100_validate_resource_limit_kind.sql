-- Checks the existing rows against `execution_failure_kind_known` as 20261124030000 widened it
-- (to `resource_limit`). VALIDATE CONSTRAINT takes a SHARE UPDATE EXCLUSIVE lock: reads and
-- writes of `execution` go on while it scans.
ALTER TABLE execution VALIDATE CONSTRAINT execution_failure_kind_known;
