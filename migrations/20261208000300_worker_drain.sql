-- A worker drained by an operator (issue 50) is dispatched nothing new until it is undrained: it
-- finishes what it runs and what it holds, heartbeats, and stays registered. `drained_by`: the
-- API token that drained it.
ALTER TABLE worker ADD COLUMN drained_at TIMESTAMPTZ, ADD COLUMN drained_by BIGINT;
