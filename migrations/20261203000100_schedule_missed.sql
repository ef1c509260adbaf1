-- Missed occurrences are shown with their schedule (issue 46): an occurrence no executor looked
-- at within the grace (a failover, a redeploy) and one that came while the schedule's action or
-- its runtime was paused. `missed` counts them (after `catch_up` decided: skipped, or standing
-- behind one run), `last_missed` is when a look last found one.
ALTER TABLE schedule ADD COLUMN missed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE schedule ADD COLUMN last_missed TIMESTAMPTZ;
GRANT UPDATE (missed, last_missed) ON schedule TO attune_executor;
