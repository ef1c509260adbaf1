//! Worker selection: which worker gets the next execution.
//!
//! Only active workers that support the action's runtime are candidates. Healthy workers come
//! first by queue depth ascending, then degraded ones by queue depth ascending; unhealthy workers
//! never get work. Ties are broken by a caller-supplied random value so equal workers share a
//! burst. The queue depth counts what this system dispatched to the worker and has not seen
//! finish (or the worker's own report, if higher), so a burst between two heartbeats spreads out
//! instead of piling onto one worker.

use chrono::{DateTime, Utc};

use crate::health::{HealthClass, HealthProbeConfig, HealthSignals, classify};

#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub worker_id: i64,
    pub name: String,
    pub runtimes: Vec<String>,
    pub signals: HealthSignals,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Ranked {
    pub worker_id: i64,
    pub class: HealthClass,
    pub queue_depth: i64,
}

/// Every eligible worker for `runtime`, best first. `tie_break` gives each worker id a random
/// key so that equally good workers are chosen in varying order.
pub fn rank(
    config: &HealthProbeConfig,
    candidates: &[Candidate],
    runtime: &str,
    now: DateTime<Utc>,
    mut tie_break: impl FnMut(i64) -> u64,
) -> Vec<Ranked> {
    let mut ranked: Vec<(Ranked, u64)> = candidates
        .iter()
        .filter(|c| c.runtimes.iter().any(|r| r == runtime))
        .map(|c| {
            let class = classify(config, &c.signals, now);
            (Ranked { worker_id: c.worker_id, class, queue_depth: c.signals.queue_depth }, tie_break(c.worker_id))
        })
        .filter(|(r, _)| r.class != HealthClass::Unhealthy)
        .collect();
    ranked.sort_by_key(|(r, key)| (r.class, r.queue_depth, *key));
    ranked.into_iter().map(|(r, _)| r).collect()
}

/// The best worker, or `None` (the retriable failure `worker_unavailable`).
pub fn select(
    config: &HealthProbeConfig,
    candidates: &[Candidate],
    runtime: &str,
    now: DateTime<Utc>,
    tie_break: impl FnMut(i64) -> u64,
) -> Option<Ranked> {
    rank(config, candidates, runtime, now, tie_break).into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-02-09T12:00:00Z").unwrap().with_timezone(&Utc)
    }

    fn worker(id: i64, consecutive_failures: i64, queue_depth: i64, runtimes: &[&str]) -> Candidate {
        Candidate {
            worker_id: id,
            name: format!("w{id}"),
            runtimes: runtimes.iter().map(|r| r.to_string()).collect(),
            signals: HealthSignals {
                last_heartbeat: Some(now() - Duration::seconds(2)),
                consecutive_failures,
                total_executions: 0,
                failed_executions: 0,
                queue_depth,
            },
        }
    }

    #[test]
    fn the_seed_example_selects_a_then_b_then_c_never_d() {
        // A healthy q=5, B healthy q=20, C degraded q=10, D unhealthy q=0
        let workers = vec![
            worker(4, 10, 0, &["shell"]),
            worker(3, 3, 10, &["shell"]),
            worker(2, 0, 20, &["shell"]),
            worker(1, 0, 5, &["shell"]),
        ];
        let order: Vec<i64> =
            rank(&HealthProbeConfig::default(), &workers, "shell", now(), |_| 0).iter().map(|r| r.worker_id).collect();
        assert_eq!(order, vec![1, 2, 3]);
    }

    #[test]
    fn filters_by_runtime_and_reports_no_worker() {
        let workers = vec![worker(1, 0, 0, &["shell"])];
        let config = HealthProbeConfig::default();
        assert!(select(&config, &workers, "python", now(), |_| 0).is_none());
        assert_eq!(select(&config, &workers, "shell", now(), |_| 0).unwrap().worker_id, 1);
    }

    #[test]
    fn ties_are_broken_by_the_random_key() {
        let workers = vec![worker(1, 0, 3, &["shell"]), worker(2, 0, 3, &["shell"])];
        let config = HealthProbeConfig::default();
        let first = select(&config, &workers, "shell", now(), |id| if id == 2 { 0 } else { 1 });
        assert_eq!(first.unwrap().worker_id, 2);
        let first = select(&config, &workers, "shell", now(), |id| if id == 1 { 0 } else { 1 });
        assert_eq!(first.unwrap().worker_id, 1);
    }
}
