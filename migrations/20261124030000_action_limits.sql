-- Resource limits of actions (issue 15), see attune_core::pack::ActionLimits.
--
-- The action's `limits:` block as written in its YAML (`memory_mb`, `cpu_secs`, `open_files`,
-- `output_kb`, each optional); NULL when it has none. The worker fills what is unset from its own
-- defaults (ATTUNE_ACTION_*) and caps each value at its maximum, so what a run was held to is the
-- worker's decision, not this column alone.
ALTER TABLE action ADD COLUMN limits JSONB CHECK (limits IS NULL OR jsonb_typeof(limits) = 'object');

-- A new failure kind: `resource_limit`, an action killed for passing one of its limits. The list
-- is attune_core::FailureKind::ALL again (checked by common/tests/state_lists.rs).
-- NOT VALID here (a moment's lock, no scan), validated by 20261124030100 in a transaction of its
-- own.
ALTER TABLE execution DROP CONSTRAINT execution_failure_kind_known;
ALTER TABLE execution ADD CONSTRAINT execution_failure_kind_known CHECK (
    failure_kind IS NULL OR failure_kind IN (
        'worker_unavailable', 'queue_timeout', 'worker_heartbeat_stale', 'transient_error',
        'manual_retry', 'validation_error', 'permission_denied', 'action_not_found',
        'invalid_parameters', 'action_failed', 'timeout', 'canceled', 'operator_failed',
        'poison_message', 'resource_limit'
    )
) NOT VALID;
