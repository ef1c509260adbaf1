-- The failure kinds as a table: `execution.failure_kind` names one of its rows, or is NULL.
--
-- The CHECK that listed them (`failure_kind IN (...)`) was evaluated by every statement that
-- touched an execution, and PostgreSQL reads a CHECK's stored expression back into a tree each
-- time a statement starts: 13 µs per statement for that list, a quarter of a worker's claim of one
-- execution. A foreign key is checked only when `failure_kind` is written with a value, which is
-- when an execution fails. The constraint keeps its name; the rows are attune_core::FailureKind::ALL
-- (checked by common/tests/state_lists.rs). An SRE can list them: SELECT name FROM failure_kind;
--
-- NOT VALID here (a moment's lock, no scan), validated by 20261127000100 in a transaction of its
-- own.
CREATE TABLE failure_kind (
    name TEXT PRIMARY KEY
);

INSERT INTO failure_kind (name) VALUES
    ('worker_unavailable'), ('queue_timeout'), ('worker_heartbeat_stale'), ('transient_error'),
    ('manual_retry'), ('validation_error'), ('permission_denied'), ('action_not_found'),
    ('invalid_parameters'), ('action_failed'), ('timeout'), ('canceled'), ('operator_failed'),
    ('poison_message'), ('resource_limit');

ALTER TABLE execution DROP CONSTRAINT execution_failure_kind_known;
ALTER TABLE execution ADD CONSTRAINT execution_failure_kind_known
    FOREIGN KEY (failure_kind) REFERENCES failure_kind (name) NOT VALID;
