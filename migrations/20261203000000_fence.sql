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
    pulsed_at timestamptz,
    -- since when the pulses have come without a gap of more than 5 s (`fence_open`)
    writable_since timestamptz
);
-- 244 random bits (two version-4 UUIDs from the server's strong generator)
INSERT INTO fence (key) VALUES (replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));

REVOKE ALL ON fence FROM attune_api, attune_executor;
GRANT SELECT, UPDATE ON fence TO attune_executor;
GRANT SELECT (key) ON fence TO attune_worker;

-- Whether the heartbeats of workers may be judged now, by the database's own record: the pulses
-- have come without a gap for the heartbeat limit, and one came within 5 s. A monitor pass that
-- decided to judge before an outage began, and whose statements ran after it (a stall of
-- commits holds them, reads go on), judges no one until the workers have had the limit to
-- heartbeat again. Without a fence row (no executor of this version has pulsed) no one is judged.
CREATE FUNCTION fence_open(max_age_secs float8) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT f.writable_since <= clock_timestamp() - make_interval(secs => max_age_secs)
                            AND f.pulsed_at > clock_timestamp() - interval '5 s'
                     FROM fence f), false)
$$;
