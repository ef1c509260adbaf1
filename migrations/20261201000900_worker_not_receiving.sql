-- A worker that did not receive a dispatch (issue 36): its heartbeats go on, but the broker's
-- messages do not reach it (a host cut off from the broker alone, before either end's AMQP
-- heartbeat notices). The monitor hands such a dispatch back after a few seconds; without this,
-- the scheduler would pick the same worker again at once, and the execution would go round until
-- the link healed. Until `not_receiving_until`, executors dispatch nothing to the worker; after
-- it, the next dispatch is the test of whether it receives again.
ALTER TABLE worker ADD COLUMN not_receiving_until timestamptz;
COMMENT ON COLUMN worker.not_receiving_until IS
    'a dispatch to this worker was lost though it heartbeats: executors send it nothing until then';
-- (read with the in-flight counts for every scheduling picture: only the stamped rows are indexed)
CREATE INDEX worker_not_receiving_idx ON worker (not_receiving_until) WHERE not_receiving_until IS NOT NULL;
