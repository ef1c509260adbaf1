-- A schedule runs as the token that made it (or last resumed it): once that token is revoked or
-- has expired, the schedule stops (issue 47). The revocation pauses the token's schedules in its
-- own transaction, saying why in `paused_reason`; the executors pause any they find due whose
-- token can no longer act (one made while its token was being revoked, one whose token expired)
-- rather than run it.
ALTER TABLE schedule ADD COLUMN paused_reason TEXT;
GRANT UPDATE (paused, paused_reason) ON schedule TO attune_executor;
-- whether a token can still act: its id, revocation and expiry, never its hash
GRANT SELECT (id, name, revoked, expires) ON api_token TO attune_executor;
-- the executors' audit row of such a stop: through this function alone, which writes nothing but
-- that (the executors may not write audit rows of their choosing)
CREATE FUNCTION audit_schedule_stopped(schedule_name TEXT, why TEXT) RETURNS void
    LANGUAGE sql SECURITY DEFINER SET search_path = public AS $$
    INSERT INTO audit_event (actor, method, route, path, status, target, reason)
    VALUES ('executor', 'STOP', 'schedule stopped', 'schedule ' || schedule_name, 0, 'schedule:' || schedule_name, why)
$$;
REVOKE ALL ON FUNCTION audit_schedule_stopped(TEXT, TEXT) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION audit_schedule_stopped(TEXT, TEXT) TO attune_executor;
