-- The broker user a worker publishes live output as (issue 47): RabbitMQ checks a message's
-- `user_id` against the user of the connection that publishes it, a worker sets it on its live
-- output, and the API shows a follower only the chunks whose `user_id` is the broker user of the
-- worker the execution runs on. A worker records its own when it takes its name; a worker's login
-- may change it on its own rows only (the row-level security of the worker table). NULL (a worker
-- of an earlier version): nothing of its runs is streamed live, the stored output is shown at the
-- end.
ALTER TABLE worker ADD COLUMN broker_user text;
COMMENT ON COLUMN worker.broker_user IS
    'the RabbitMQ user this worker publishes live output as: only chunks with this user_id are shown';
GRANT UPDATE (broker_user) ON worker TO attune_worker;
