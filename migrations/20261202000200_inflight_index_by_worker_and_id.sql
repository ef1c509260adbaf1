-- The workers' in-flight index keyed by worker, then id (issue 33). Keyed by worker alone, it was
-- what the planner took for every guarded write of a run (`WHERE id = $1 AND worker = $2 AND
-- status = 'running'`): with no statistics yet (a new table, or autovacuum off) it cannot tell the
-- primary key's one row from the worker's in-flight rows, and walked all of them for each claim
-- and each success, a heap fetch each. core.echo at maximum rate: 21 buffers per claim of one run
-- where 7 do; at 60,000 in flight on one worker, 3,586 buffers and 14 ms for a claim of two. With
-- the id in the key, a guarded write that takes this index finds its row by worker and id, and the
-- counts per worker read it as before.
DROP INDEX execution_worker_inflight_idx;
CREATE INDEX execution_worker_inflight_idx ON execution (worker, id)
    WHERE status IN ('scheduled', 'running');

-- The claim's count of its planned workers' in-flight runs, as worker_inflight_counts: by index
-- scan, which marks the entries of runs that moved on as dead (a bitmap scan never does, and
-- visits them all again; migration inflight_counts_by_index_scan).
ALTER FUNCTION execution_claim(TEXT, BIGINT[]) SET enable_bitmapscan = off;
