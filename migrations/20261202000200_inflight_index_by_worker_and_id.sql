-- The workers' in-flight index keyed by worker, then id (issue 33). Keyed by worker alone, it was
-- what the planner took for every guarded write of a run (`WHERE id = $1 AND worker = $2 AND
-- status = 'running'`): with no statistics yet (a new table, or autovacuum off) it cannot tell the
-- primary key's one row from the worker's in-flight rows, and walked all of them for each claim
-- and each success, a heap fetch each. core.echo at maximum rate: 23 and 20 buffers per run for a
-- claim and a success, 19 and 16 with this index; at 5,000 held by one worker, 321 heap buffers
-- for one success, 9 (common/tests/run_claim.rs); at 60,000, 3,586 buffers for a claim of two. With
-- the id in the key, a guarded write that takes this index finds its row by worker and id, and the
-- counts per worker read it as before.
-- (the new index is built before the old one is dropped: the build lets the table be read, and
-- the drop's exclusive lock is held only from there to the commit)
CREATE INDEX execution_worker_inflight_by_id_idx ON execution (worker, id)
    WHERE status IN ('scheduled', 'running');
DROP INDEX execution_worker_inflight_idx;
ALTER INDEX execution_worker_inflight_by_id_idx RENAME TO execution_worker_inflight_idx;
