-- What a run printed before it was canceled or failed by hand is kept (issue 50): the worker that
-- stopped it writes its stdout and stderr into the ended row, which its login may otherwise no
-- longer update (`execution_own_unfinished`). Only the worker that ran it (by its login, and the
-- run's token), only an execution ended by hand, only once.
CREATE FUNCTION execution_stopped_output(p_execution BIGINT, p_worker BIGINT, p_run_token TEXT,
    p_stdout TEXT, p_stderr TEXT) RETURNS BOOLEAN
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH kept AS (
        UPDATE public.execution e SET stdout = p_stdout, stderr = p_stderr, updated = now()
        WHERE e.id = p_execution AND e.worker = p_worker
          AND e.run_token IS NOT DISTINCT FROM p_run_token
          AND e.status IN ('canceled', 'failed') AND e.ended_by IS NOT NULL
          AND e.stdout IS NULL AND e.stderr IS NULL
          AND (NOT public.worker_login(session_user)
               OR p_worker IN (SELECT w.id FROM public.worker w WHERE w.login = session_user))
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM kept)
$$;
REVOKE ALL ON FUNCTION execution_stopped_output(BIGINT, BIGINT, TEXT, TEXT, TEXT) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION execution_stopped_output(BIGINT, BIGINT, TEXT, TEXT, TEXT) TO attune_worker;
