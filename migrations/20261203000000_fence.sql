-- The fence of a database outage (docs/adr/0011-an-outage-everyone-shares-stops-nothing.md).
--
-- Each executor writes `pulsed_at` every second: a committed write, so an outage or a stall of
-- commits (a synchronous standby gone) is seen as one even where reads still work. What it reads
-- back is the key its notices to the workers are signed with (HMAC-SHA-256): only a service
-- with a database login of the executors' or the workers' can make a notice a worker believes,
-- not whoever can publish to the broker's control exchange.
CREATE TABLE fence (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    key       text NOT NULL,
    pulsed_at timestamptz
);
-- 244 random bits (two version-4 UUIDs from the server's strong generator)
INSERT INTO fence (key) VALUES (replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));

REVOKE ALL ON fence FROM attune_api;
GRANT SELECT, UPDATE ON fence TO attune_executor;
GRANT SELECT (key) ON fence TO attune_worker;
