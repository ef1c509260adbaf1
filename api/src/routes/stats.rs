//! The quick reference's key metrics as numbers, with its alert thresholds reported as flags:
//! retry rate > 20 %, retry success rate < 70 %, more than half the workers unhealthy, average
//! queue depth of 20 or more. `/stats/retries/series` gives the retry numbers per time bucket, for charts.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use attune_common::db;

use crate::ApiError;

pub const ALERT_RETRY_RATE_PERCENT: f64 = 20.0;
pub const ALERT_RETRY_SUCCESS_PERCENT: f64 = 70.0;
pub const ALERT_UNHEALTHY_SHARE_PERCENT: f64 = 50.0;
pub const ALERT_AVERAGE_QUEUE_DEPTH: f64 = 20.0;

/// The quick reference's "Average should stay < 20": an average of 20 or more is the alert's,
/// as `AttuneQueueDepthHigh` (`>= 20`) has it.
fn queue_depth_high(average: Option<f64>) -> bool {
    average.is_some_and(|depth| depth >= ALERT_AVERAGE_QUEUE_DEPTH)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// How far back to look, in seconds (default 3600, at most 30 days).
    #[param(minimum = 1, maximum = 2592000)]
    pub window_secs: Option<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ReasonStats {
    pub reason: String,
    pub total: i64,
    pub succeeded: i64,
    pub success_rate: Option<f64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RetryAlerts {
    pub high_retry_rate: bool,
    pub low_retry_success_rate: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RetryStats {
    pub window_secs: i64,
    pub original_executions: i64,
    pub retry_executions: i64,
    /// Retries per 100 original executions (the quick reference's "retry rate").
    pub retry_rate: Option<f64>,
    /// Percent of finished retries that completed.
    pub retry_success_rate: Option<f64>,
    pub average_retries_per_execution: Option<f64>,
    pub reasons: Vec<ReasonStats>,
    pub alerts: RetryAlerts,
}

fn percent(part: i64, whole: i64) -> Option<f64> {
    (whole > 0).then(|| (10000.0 * part as f64 / whole as f64).round() / 100.0)
}

#[utoipa::path(get, path = "/stats/retries", operation_id = "retry_stats", tag = "stats", params(Window),
    responses((status = 200, body = RetryStats),
        (status = 422, description = "`window_secs` out of range", body = crate::openapi::ErrorBody),))]
pub async fn retries(
    State(state): State<crate::State>,
    query: Result<Query<Window>, QueryRejection>,
) -> Result<Json<RetryStats>, ApiError> {
    let Query(query) = query?;
    let window_secs = query.window_secs.unwrap_or(3600);
    if !(1..=30 * 86400).contains(&window_secs) {
        return Err(ApiError::invalid("window_secs", "'window_secs' must be between 1 and 2592000 (30 days)"));
    }
    let (originals, retries, succeeded, finished) = db::stats::retry_totals(&state.db, window_secs as f64).await?;
    let rows = db::stats::retries_by_reason(&state.db, window_secs as f64).await?;
    let retry_rate = percent(retries, originals);
    let retry_success_rate = percent(succeeded, finished);
    Ok(Json(RetryStats {
        window_secs,
        original_executions: originals,
        retry_executions: retries,
        retry_rate,
        retry_success_rate,
        average_retries_per_execution: (originals > 0)
            .then(|| (100.0 * retries as f64 / originals as f64).round() / 100.0),
        reasons: rows
            .into_iter()
            .map(|(reason, total, succeeded, finished)| ReasonStats {
                reason,
                total,
                succeeded,
                success_rate: percent(succeeded, finished),
            })
            .collect(),
        alerts: RetryAlerts {
            high_retry_rate: retry_rate.is_some_and(|r| r > ALERT_RETRY_RATE_PERCENT),
            low_retry_success_rate: retry_success_rate.is_some_and(|r| r < ALERT_RETRY_SUCCESS_PERCENT),
        },
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SeriesQuery {
    /// How far back to look, in seconds (default 3600, at most 30 days).
    #[param(minimum = 1, maximum = 2592000)]
    pub window_secs: Option<i64>,
    /// How many equal buckets to cut the window into (default 30, 1 to 240).
    #[param(minimum = 1, maximum = 240)]
    pub buckets: Option<i64>,
}

/// The retry numbers of the executions created in one bucket `[start, start + bucket_secs)`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RetryBucket {
    pub start: DateTime<Utc>,
    pub original_executions: i64,
    pub retry_executions: i64,
    /// Retries per 100 original executions in this bucket (none without originals).
    pub retry_rate: Option<f64>,
    /// Percent of this bucket's finished retries that completed (none without finished retries).
    pub retry_success_rate: Option<f64>,
    /// Retries created in this bucket by reason (`retry_reason`, `unknown` when missing).
    #[schema(value_type = Object)]
    pub reasons: BTreeMap<String, i64>,
}

/// The quick reference's alert thresholds, so charts mark them where they are defined.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RetryThresholds {
    /// Alert when the retry rate is above this (percent).
    pub retry_rate_percent: f64,
    /// Alert when the retry success rate is below this (percent).
    pub retry_success_percent: f64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RetrySeries {
    pub window_secs: i64,
    pub bucket_secs: f64,
    /// Oldest first; every bucket of the window is present, empty ones with zero counts.
    pub buckets: Vec<RetryBucket>,
    pub thresholds: RetryThresholds,
}

#[utoipa::path(get, path = "/stats/retries/series", operation_id = "retry_stats_series", tag = "stats", params(SeriesQuery),
    responses((status = 200, body = RetrySeries),
        (status = 422, description = "`window_secs` or `buckets` out of range", body = crate::openapi::ErrorBody),))]
pub async fn retry_series(
    State(state): State<crate::State>,
    query: Result<Query<SeriesQuery>, QueryRejection>,
) -> Result<Json<RetrySeries>, ApiError> {
    let Query(query) = query?;
    let window_secs = query.window_secs.unwrap_or(3600);
    if !(1..=30 * 86400).contains(&window_secs) {
        return Err(ApiError::invalid("window_secs", "'window_secs' must be between 1 and 2592000 (30 days)"));
    }
    let count = query.buckets.unwrap_or(30);
    if !(1..=240).contains(&count) {
        return Err(ApiError::invalid("buckets", "'buckets' must be between 1 and 240"));
    }
    let bucket_secs = window_secs as f64 / count as f64;
    let now = db::now(&state.db).await?;
    let start = now - chrono::Duration::milliseconds(window_secs * 1000);
    // one row per (bucket, reason); reason is NULL for the original executions
    let rows = db::stats::retry_buckets(&state.db, start, now, bucket_secs, count).await?;
    let mut buckets: Vec<RetryBucket> = (0..count)
        .map(|n| RetryBucket {
            start: start + chrono::Duration::milliseconds((n as f64 * bucket_secs * 1000.0) as i64),
            original_executions: 0,
            retry_executions: 0,
            retry_rate: None,
            retry_success_rate: None,
            reasons: BTreeMap::new(),
        })
        .collect();
    let mut finished = vec![(0i64, 0i64); buckets.len()];
    for (n, reason, total, completed, terminal) in rows {
        let Some(bucket) = usize::try_from(n).ok().and_then(|n| buckets.get_mut(n)) else { continue };
        match reason {
            None => bucket.original_executions += total,
            Some(reason) => {
                bucket.retry_executions += total;
                *bucket.reasons.entry(reason).or_default() += total;
                finished[n as usize].0 += completed;
                finished[n as usize].1 += terminal;
            }
        }
    }
    for (bucket, (completed, terminal)) in buckets.iter_mut().zip(finished) {
        bucket.retry_rate = percent(bucket.retry_executions, bucket.original_executions);
        bucket.retry_success_rate = percent(completed, terminal);
    }
    Ok(Json(RetrySeries {
        window_secs,
        bucket_secs,
        buckets,
        thresholds: RetryThresholds {
            retry_rate_percent: ALERT_RETRY_RATE_PERCENT,
            retry_success_percent: ALERT_RETRY_SUCCESS_PERCENT,
        },
    }))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WorkerAlerts {
    pub unhealthy_over_half: bool,
    pub high_average_queue_depth: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WorkerStats {
    pub active_workers: usize,
    pub healthy: usize,
    pub degraded: usize,
    pub unhealthy: usize,
    pub average_queue_depth: Option<f64>,
    /// Mean of failed/total over active workers that have run anything (0..1).
    pub average_failure_rate: Option<f64>,
    pub alerts: WorkerAlerts,
}

#[utoipa::path(get, path = "/stats/workers", operation_id = "worker_stats", tag = "stats", responses((status = 200, body = WorkerStats)))]
pub async fn workers(State(state): State<crate::State>) -> Result<Json<WorkerStats>, ApiError> {
    let workers = attune_common::db::worker::list(&state.db, &state.settings.health).await?;
    let active: Vec<_> = workers.iter().filter(|w| w.status == "active").collect();
    let count = |class: &str| active.iter().filter(|w| w.health == class).count();
    let rates: Vec<f64> = active
        .iter()
        .filter_map(|w| {
            let health = &w.capabilities["health"];
            let total = health["total_executions"].as_f64().unwrap_or(0.0);
            (total > 0.0).then(|| health["failed_executions"].as_f64().unwrap_or(0.0) / total)
        })
        .collect();
    let mean = |values: &[f64]| {
        (!values.is_empty()).then(|| (10000.0 * values.iter().sum::<f64>() / values.len() as f64).round() / 10000.0)
    };
    let depths: Vec<f64> = active.iter().map(|w| w.queue_depth as f64).collect();
    let average_queue_depth = mean(&depths);
    let unhealthy = count("unhealthy");
    Ok(Json(WorkerStats {
        active_workers: active.len(),
        healthy: count("healthy"),
        degraded: count("degraded"),
        unhealthy,
        average_queue_depth,
        average_failure_rate: mean(&rates),
        alerts: WorkerAlerts {
            unhealthy_over_half: !active.is_empty()
                && 100.0 * unhealthy as f64 / active.len() as f64 > ALERT_UNHEALTHY_SHARE_PERCENT,
            high_average_queue_depth: queue_depth_high(average_queue_depth),
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::queue_depth_high;

    #[test]
    fn an_average_queue_depth_of_20_is_high_as_the_alert_says() {
        assert!(!queue_depth_high(None));
        assert!(!queue_depth_high(Some(19.9)));
        assert!(queue_depth_high(Some(20.0)));
        assert!(queue_depth_high(Some(35.0)));
    }
}
