-- A worker's claims and its record of successes, for many executions in one statement (one round
-- trip, one commit). Each execution gets its own guarded statement, found by its primary key:
-- written as one multi-row UPDATE joined to the arrays, the planner, misled by statistics that
-- say few rows are in flight, would walk the in-flight index of the worker and every dead entry
-- in it on each call.

-- scheduled -> running on `worker_id` for each of `ids`, storing the run token of the same
-- position. With `landed_too` (after an outage) a row already running there with that token is
-- returned as claimed: the earlier attempt landed and its acknowledgement was lost.
CREATE FUNCTION claim_runs(ids bigint[], tokens text[], worker_id bigint, landed_too boolean)
RETURNS SETOF execution LANGUAGE plpgsql AS $$
DECLARE
    changed execution;
BEGIN
    FOR i IN 1 .. coalesce(array_length(ids, 1), 0) LOOP
        UPDATE execution SET status = 'running', updated = now(), started = now(), run_token = tokens[i]
        WHERE id = ids[i] AND worker = worker_id AND status = 'scheduled'
        RETURNING * INTO changed;
        IF NOT FOUND AND landed_too THEN
            SELECT * INTO changed FROM execution
            WHERE id = ids[i] AND worker = worker_id AND status = 'running' AND run_token = tokens[i];
        END IF;
        IF FOUND THEN
            RETURN NEXT changed;
        END IF;
    END LOOP;
END
$$;

-- running -> completed on `worker_id` for each of `ids` whose run token is the one of the same
-- position, with the outcome of that position (a NULL keeps what the row has). With
-- `landed_too`, a row already completed there with that token is returned as recorded.
CREATE FUNCTION complete_runs(
    ids bigint[], tokens text[], results jsonb[], errors text[], exit_codes int[], stdouts text[],
    stderrs text[], http_statuses int[], worker_id bigint, landed_too boolean)
RETURNS SETOF execution LANGUAGE plpgsql AS $$
DECLARE
    changed execution;
BEGIN
    FOR i IN 1 .. coalesce(array_length(ids, 1), 0) LOOP
        UPDATE execution SET status = 'completed', updated = now(), finished = now(),
            result = coalesce(results[i], result), error = coalesce(errors[i], error),
            exit_code = coalesce(exit_codes[i], exit_code), stdout = coalesce(stdouts[i], stdout),
            stderr = coalesce(stderrs[i], stderr), http_status = coalesce(http_statuses[i], http_status)
        WHERE id = ids[i] AND worker = worker_id AND status = 'running'
          AND run_token IS NOT DISTINCT FROM tokens[i]
        RETURNING * INTO changed;
        IF NOT FOUND AND landed_too THEN
            SELECT * INTO changed FROM execution
            WHERE id = ids[i] AND worker = worker_id AND status = 'completed'
              AND run_token IS NOT DISTINCT FROM tokens[i];
        END IF;
        IF FOUND THEN
            RETURN NEXT changed;
        END IF;
    END LOOP;
END
$$;
