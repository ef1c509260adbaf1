-- Checks the existing rows against `execution_failure_kind_known`, a foreign key to `failure_kind`
-- since 20261127000000. VALIDATE CONSTRAINT takes a SHARE UPDATE EXCLUSIVE lock: reads and writes
-- of `execution` go on while it scans.
ALTER TABLE execution VALIDATE CONSTRAINT execution_failure_kind_known;
