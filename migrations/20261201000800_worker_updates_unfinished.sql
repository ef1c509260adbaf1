-- A worker's login changes only its executions that are still scheduled or running (issue 32,
-- after review): a finished execution stays finished, whatever its column grants allow. Every
-- write of a worker is guarded by the state it moves from anyway; this keeps a taken worker host
-- from setting one of its finished runs back to `running` (where `run_secrets` would answer for
-- it again, with the secrets' current values).
-- (an UPDATE policy without WITH CHECK would hold the new row to its USING too: a run could not
-- be completed; what the new row may be is `execution_own`'s check)
CREATE POLICY execution_own_unfinished ON execution AS RESTRICTIVE FOR UPDATE TO attune_worker
    USING (status IN ('scheduled', 'running')) WITH CHECK (true);
