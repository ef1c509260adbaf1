//! Aggregates over executions for `/stats/*` and `/metrics`, at a cost that does not grow with
//! history. Terminal states are bound from `ExecutionStatus::TERMINAL`, never written out in SQL.
//!
//! A window's executions are read in two parts: the whole minutes the history job has already
//! counted (`execution_rollup`, up to `history_state.rolled_up_until`) and, from `execution`
//! through its `created` index, the rest: the window's first partial minute and everything
//! created since the rollup's reach (normally the last minute or two). Both parts are counted the
//! same way, so the totals are those of the rows themselves, except for executions still
//! unfinished when their minute was counted (see `db::history::ROLLUP_HOLD_SECS`) and for what
//! retention removed, which the rollup still counts.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use sqlx::PgPool;

use attune_core::ExecutionStatus;

/// Which part of `[from, now]` is read from where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Whole minutes `[start, end)` read from `execution_rollup`, if any.
    pub rollup: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// Rows read from `execution`: created in `[from, live_until)` or at or after `live_since`.
    pub from: DateTime<Utc>,
    pub live_until: DateTime<Utc>,
    pub live_since: DateTime<Utc>,
}

/// How `[from, …)` splits, given where the rollup reaches.
pub fn split(from: DateTime<Utc>, rolled_up_until: Option<DateTime<Utc>>) -> Split {
    let minute = TimeDelta::minutes(1);
    let first_whole = from.duration_trunc(minute).map(|t| if t == from { t } else { t + minute }).unwrap_or(from);
    match rolled_up_until {
        Some(until) if first_whole < until => {
            Split { rollup: Some((first_whole, until)), from, live_until: first_whole, live_since: until }
        }
        _ => Split { rollup: None, from, live_until: from, live_since: from },
    }
}

/// The database's time and where the rollup reaches.
pub async fn reach(db: &PgPool) -> Result<(DateTime<Utc>, Option<DateTime<Utc>>), sqlx::Error> {
    sqlx::query_as("SELECT now(), rolled_up_until FROM history_state").fetch_one(db).await
}

/// The live rows of a split (`$1..$3`).
const LIVE: &str = "((created >= $1 AND created < $2) OR created >= $3)";

/// The window of the last `window_secs`, split.
async fn window(db: &PgPool, window_secs: f64) -> Result<Split, sqlx::Error> {
    let (now, until) = reach(db).await?;
    Ok(split(now - TimeDelta::milliseconds((window_secs * 1000.0) as i64), until))
}

/// Over the executions created in the last `window_secs`: originals, retries, retries that
/// completed, and retries that finished (any terminal state).
pub async fn retry_totals(db: &PgPool, window_secs: f64) -> Result<(i64, i64, i64, i64), sqlx::Error> {
    let split = window(db, window_secs).await?;
    let live: (i64, i64, i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE retry_count = 0), count(*) FILTER (WHERE retry_count > 0), \
            count(*) FILTER (WHERE retry_count > 0 AND status = 'completed'), \
            count(*) FILTER (WHERE retry_count > 0 AND status = ANY($4)) \
         FROM execution WHERE {LIVE}"
    )))
    .bind(split.from)
    .bind(split.live_until)
    .bind(split.live_since)
    .bind(&ExecutionStatus::TERMINAL[..])
    .fetch_one(db)
    .await?;
    let Some((start, end)) = split.rollup else { return Ok(live) };
    let counted: (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT COALESCE(sum(total) FILTER (WHERE reason = ''), 0)::bigint, \
            COALESCE(sum(total) FILTER (WHERE reason <> ''), 0)::bigint, \
            COALESCE(sum(completed) FILTER (WHERE reason <> ''), 0)::bigint, \
            COALESCE(sum(finished) FILTER (WHERE reason <> ''), 0)::bigint \
         FROM execution_rollup WHERE minute >= $1 AND minute < $2",
    )
    .bind(start)
    .bind(end)
    .fetch_one(db)
    .await?;
    Ok((live.0 + counted.0, live.1 + counted.1, live.2 + counted.2, live.3 + counted.3))
}

/// Per retry reason over the same window: (reason, retries, completed, finished), most first.
pub async fn retries_by_reason(db: &PgPool, window_secs: f64) -> Result<Vec<(String, i64, i64, i64)>, sqlx::Error> {
    let split = window(db, window_secs).await?;
    let mut rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT COALESCE(retry_reason, 'unknown'), count(*), count(*) FILTER (WHERE status = 'completed'), \
            count(*) FILTER (WHERE status = ANY($4)) \
         FROM execution WHERE retry_count > 0 AND {LIVE} GROUP BY 1"
    )))
    .bind(split.from)
    .bind(split.live_until)
    .bind(split.live_since)
    .bind(&ExecutionStatus::TERMINAL[..])
    .fetch_all(db)
    .await?;
    if let Some((start, end)) = split.rollup {
        let counted: Vec<(String, i64, i64, i64)> = sqlx::query_as(
            "SELECT reason, sum(total)::bigint, sum(completed)::bigint, sum(finished)::bigint \
             FROM execution_rollup WHERE minute >= $1 AND minute < $2 AND reason <> '' GROUP BY 1",
        )
        .bind(start)
        .bind(end)
        .fetch_all(db)
        .await?;
        for (reason, total, completed, finished) in counted {
            match rows.iter_mut().find(|row| row.0 == reason) {
                Some(row) => (row.1, row.2, row.3) = (row.1 + total, row.2 + completed, row.3 + finished),
                None => rows.push((reason, total, completed, finished)),
            }
        }
    }
    rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(rows)
}

/// One row per (bucket, reason) of the executions created in `[start, end]`, cut into `count`
/// buckets of `bucket_secs`: (bucket, reason — `None` for originals, total, completed, finished).
/// With buckets of a minute or more, the minutes the rollup counted fall in the bucket where
/// they start (an execution lands at most a minute's width from its own bucket); with shorter
/// buckets every row is read.
pub async fn retry_buckets(
    db: &PgPool,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    bucket_secs: f64,
    count: i64,
) -> Result<Vec<(i64, Option<String>, i64, i64, i64)>, sqlx::Error> {
    let (_, until) = reach(db).await?;
    let split = if bucket_secs >= 60.0 { split(start, until) } else { split(start, None) };
    let mut rows: Vec<(i64, Option<String>, i64, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT LEAST(floor(extract(epoch FROM created - $1) / $4)::bigint, $5 - 1), \
            CASE WHEN retry_count > 0 THEN COALESCE(retry_reason, 'unknown') END, count(*), \
            count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = ANY($7)) \
         FROM execution WHERE {LIVE} AND created <= $6 GROUP BY 1, 2"
    )))
    .bind(split.from)
    .bind(split.live_until)
    .bind(split.live_since)
    .bind(bucket_secs)
    .bind(count)
    .bind(end)
    .bind(&ExecutionStatus::TERMINAL[..])
    .fetch_all(db)
    .await?;
    if let Some((rollup_start, rollup_end)) = split.rollup {
        let counted: Vec<(i64, Option<String>, i64, i64, i64)> = sqlx::query_as(
            "SELECT LEAST(floor(extract(epoch FROM minute - $1) / $2)::bigint, $3 - 1), NULLIF(reason, ''), \
                sum(total)::bigint, sum(completed)::bigint, sum(finished)::bigint \
             FROM execution_rollup WHERE minute >= $4 AND minute < $5 GROUP BY 1, 2",
        )
        .bind(start)
        .bind(bucket_secs)
        .bind(count)
        .bind(rollup_start)
        .bind(rollup_end.min(end))
        .fetch_all(db)
        .await?;
        rows.extend(counted);
    }
    Ok(rows)
}

/// Unfinished executions by status and action, for the `attune_executions` gauge: one index
/// range per unfinished status, whatever the history holds.
pub async fn unfinished_by_status_and_action(db: &PgPool) -> Result<Vec<(ExecutionStatus, String, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT status, action_ref, count(*) FROM execution WHERE status = ANY($1) \
         GROUP BY status, action_ref ORDER BY 1, 2",
    )
    .bind(&ExecutionStatus::UNFINISHED[..])
    .fetch_all(db)
    .await
}

/// How long the execution waiting longest to be scheduled has waited, by runtime (`unknown` for
/// one whose action had none), for the `attune_oldest_waiting_seconds` gauge: since it became
/// `requested` (`updated`: its insert, a retry coming due, a hand-back), not since it was created.
/// One index range of the waiting rows, whatever the history holds. Paused work (`db::pause`)
/// waits on purpose and is left out.
pub async fn oldest_waiting_by_runtime(db: &PgPool) -> Result<Vec<(String, f64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT coalesce(runtime, 'unknown'), EXTRACT(EPOCH FROM now() - min(updated))::float8 \
         FROM execution e WHERE status = 'requested' \
           AND NOT EXISTS (SELECT 1 FROM pause p WHERE (p.kind = 'runtime' AND p.name = e.runtime) \
                           OR (p.kind = 'action' AND p.name = e.action_ref)) \
         GROUP BY 1 ORDER BY 1",
    )
    .persistent(false)
    .fetch_all(db)
    .await
}

/// The runtimes registered actions need.
pub async fn action_runtimes(db: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT DISTINCT runtime FROM action ORDER BY 1").fetch_all(db).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_window_reads_whole_counted_minutes_from_the_rollup_and_its_edges_live() {
        let from = at("2026-11-25T10:00:30Z");
        let split = split(from, Some(at("2026-11-25T12:00:00Z")));
        assert_eq!(split.rollup, Some((at("2026-11-25T10:01:00Z"), at("2026-11-25T12:00:00Z"))));
        assert_eq!((split.live_until, split.live_since), (at("2026-11-25T10:01:00Z"), at("2026-11-25T12:00:00Z")));
        // a window starting on a minute has no partial minute
        let split = super::split(at("2026-11-25T10:00:00Z"), Some(at("2026-11-25T12:00:00Z")));
        assert_eq!(split.live_until, at("2026-11-25T10:00:00Z"));
        // nothing counted yet, or the window starts after the rollup's reach: all live
        for until in [None, Some(at("2026-11-25T10:00:00Z")), Some(at("2026-11-25T10:01:00Z"))] {
            let split = super::split(from, until);
            assert_eq!((split.rollup, split.live_until, split.live_since), (None, from, from), "{until:?}");
        }
    }
}
