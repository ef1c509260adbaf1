-- `failure_kind` holds one of the kinds the code knows (attune_core::FailureKind), or nothing.
-- Every version wrote only these; the services read the column back as that enum, and the
-- state-list parity test (common/tests/state_lists.rs) compares this list with the code's.
-- Added NOT VALID (a moment's lock, no scan); 20261123120000 validates the existing rows
-- without blocking writers.
ALTER TABLE execution ADD CONSTRAINT execution_failure_kind_known CHECK (
    failure_kind IS NULL OR failure_kind IN (
        'worker_unavailable', 'queue_timeout', 'worker_heartbeat_stale', 'transient_error',
        'manual_retry', 'validation_error', 'permission_denied', 'action_not_found',
        'invalid_parameters', 'action_failed', 'timeout', 'canceled', 'poison_message'
    )
) NOT VALID;
