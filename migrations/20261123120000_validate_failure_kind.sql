-- Checks the rows written before `execution_failure_kind_known` existed. VALIDATE CONSTRAINT
-- takes a SHARE UPDATE EXCLUSIVE lock: reads and writes of `execution` go on while it scans.
ALTER TABLE execution VALIDATE CONSTRAINT execution_failure_kind_known;
