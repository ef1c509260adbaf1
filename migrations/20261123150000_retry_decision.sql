-- What the RetryManager decided for a failed execution, and why: its failure kind, its retry
-- count, the policy in force and the rule that decided (attune_core::retry::DecisionRecord).
-- Shown by the chain API and `attune execution explain`. NULL: no decision was made (the
-- execution has not failed, or failed before this column existed).
ALTER TABLE execution ADD COLUMN retry_decision JSONB;
