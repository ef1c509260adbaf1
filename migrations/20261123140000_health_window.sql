-- The failure rate of a worker is its rate over a recent window: workers report
-- `recent_executions` and `recent_failed_executions` (over `window_secs`) in their health, and
-- the classification uses them, falling back to the lifetime counts of a worker that does not
-- report a window. Mirrors attune_core::health (common::db::worker reads the same fields).
CREATE OR REPLACE FUNCTION worker_health_class(
    capabilities JSONB, last_heartbeat TIMESTAMPTZ, queue_depth INTEGER, at TIMESTAMPTZ
) RETURNS TEXT
LANGUAGE sql STABLE AS $$
    WITH c AS (SELECT * FROM health_probe_config),
    h AS (
        SELECT
            COALESCE((capabilities->'health'->>'consecutive_failures')::BIGINT, 0) AS failures,
            COALESCE((capabilities->'health'->>'recent_executions')::BIGINT,
                     (capabilities->'health'->>'total_executions')::BIGINT, 0) AS total,
            COALESCE((capabilities->'health'->>'recent_failed_executions')::BIGINT,
                     (capabilities->'health'->>'failed_executions')::BIGINT, 0) AS failed
    )
    SELECT CASE
        WHEN NOT c.enabled THEN 'healthy'
        WHEN last_heartbeat IS NULL
          OR at - last_heartbeat >= make_interval(secs => c.heartbeat_max_age_secs) THEN 'unhealthy'
        WHEN h.failures >= c.unhealthy_threshold THEN 'unhealthy'
        WHEN queue_depth >= c.queue_depth_unhealthy THEN 'unhealthy'
        WHEN h.total > 0 AND h.total >= c.failure_rate_min_executions
         AND h.failed::DOUBLE PRECISION / h.total >= c.failure_rate_unhealthy THEN 'unhealthy'
        WHEN h.failures >= c.degraded_threshold THEN 'degraded'
        WHEN queue_depth >= c.queue_depth_degraded THEN 'degraded'
        WHEN h.total > 0 AND h.total >= c.failure_rate_min_executions
         AND h.failed::DOUBLE PRECISION / h.total >= c.failure_rate_degraded THEN 'degraded'
        ELSE 'healthy'
    END
    FROM c, h
$$;
