-- A new failure kind: `operator_failed`, an execution an operator failed by hand
-- (`POST /api/v1/executions/{id}/fail`). The list is attune_core::FailureKind::ALL again
-- (checked by common/tests/state_lists.rs).
-- NOT VALID here, validated by 20261123120000 in a transaction of its own.
ALTER TABLE execution DROP CONSTRAINT execution_failure_kind_known;
ALTER TABLE execution ADD CONSTRAINT execution_failure_kind_known CHECK (
    failure_kind IS NULL OR failure_kind IN (
        'worker_unavailable', 'queue_timeout', 'worker_heartbeat_stale', 'transient_error',
        'manual_retry', 'validation_error', 'permission_denied', 'action_not_found',
        'invalid_parameters', 'action_failed', 'timeout', 'canceled', 'operator_failed',
        'poison_message'
    )
) NOT VALID;
