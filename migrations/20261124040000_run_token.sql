-- The run token (issue 15: a worker trusts the database, not the message): 128 random bits as 32
-- hex digits, drawn by the worker that claims an execution (scheduled -> running) and written by
-- the claim itself; the worker sends it in every result it publishes for that run, and an
-- executor records a result only when its token is the row's (db::execution::Transition's
-- `run_token` guard), so whoever can publish to the broker cannot forge an outcome. NULL until
-- claimed, and for runs a worker of an earlier version claimed (their results carry no token and
-- still match). Never shown by the API. No CHECK here: one would scan the whole table under the
-- ALTER's lock.
ALTER TABLE execution ADD COLUMN run_token TEXT;
