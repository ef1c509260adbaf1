//! attune-worker: registers itself, heartbeats its capabilities and health, consumes its own
//! queue, runs each action (a child process, or in the worker for `builtin` and `http`), records a
//! success itself and reports a failure to the executors (their RetryManager decides on the
//! retry).
//!
//! Trust: a dispatch names only the executions (one, or every one a scheduling claim placed here:
//! each handled on its own, `handle`) and the worker. The claim (`scheduled → running`, fenced
//! by this worker's id) reads what to run from PostgreSQL in the same statement and stores
//! a run token this worker drew; every result it publishes carries the token, and executors record
//! only results whose token is the row's. The entrypoint runs only from inside its pack directory
//! (`runner::resolve_entrypoint`), and a cancel notice stops a run only once the database no longer
//! has it here (see `docs/security-broker.md`).
//!
//! Capacity: the worker runs `ATTUNE_WORKER_CONCURRENCY` actions at once and takes a few more
//! dispatches ahead (delivered, held, not started: a message delivered to a consumer does not
//! expire): up to `ATTUNE_WORKER_PREFETCH`, fewer when its recent execution time says they would
//! wait longer than a quarter of the queue TTL (`selection::lookahead`). It reports the sum as
//! its `slots` with every heartbeat, and executors
//! dispatch to it only while fewer executions than that are dispatched to it and unfinished, so
//! its queue stays short and a healthy worker's dispatches never expire. It keeps what it holds
//! marked in the database with every heartbeat, and reports whether its consumer is up.
//!
//! Stopping (SIGTERM): the worker marks itself `draining` (no executor picks it from its next read
//! of the fleet on), unbinds its queue (a dispatch still sent to it is unroutable, and its sender
//! puts the execution back to waiting), hands back every dispatch it had not started
//! (scheduled → requested: no retry spent), keeps heartbeating while its running actions finish
//! (up to `ATTUNE_WORKER_DRAIN_SECS`), then deletes its queue and marks itself inactive.
//!
//! The rooms: `settings`, `lifecycle` (start, drain, stop), `heartbeat` (and the lease),
//! `slots` (what runs and what is held), `run` (a dispatch from delivery to its outcome, stage by stage), `record` (its
//! outcome), `control` (cancels and follow requests), `live` (live output to followers); `runner`, `supervise` and `http` run actions, `action_users`
//! gives each its own user id (and kills what it leaves behind), `destination` bounds where HTTP
//! actions go.

mod action;
mod action_users;
mod control;
pub mod destination;
mod fence;
pub mod health;
mod heartbeat;
pub mod http;
mod lifecycle;
pub mod live;
mod record;
mod run;
pub mod runner;
mod settings;
mod slots;
pub mod supervise;
mod writes;

use std::sync::Arc;
use std::time::Duration;

use attune_common::mq::Publisher;
use attune_core::health::HealthClass;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::health::HealthState;
use crate::runner::Runtimes;

pub use attune_common::ServiceError as Error;

use heartbeat::Lease;
pub use lifecycle::run;
pub use settings::{DEFAULT_ACTION_UIDS, Settings};
use slots::Running;

/// Deliveries the worker accepts beyond its slots (see `run`).
const PREFETCH_MARGIN: u16 = 2;
/// How long a dispatch waits for a run slot before it is checked for staleness (`wait_for_slot`).
const STALE_CHECK_AFTER: Duration = Duration::from_millis(50);
/// The shortest time a dispatch taken ahead waits for a run slot here before it goes back to
/// waiting for any worker (`Worker::hold_limit`).
const HOLD_FLOOR: Duration = Duration::from_secs(1);
/// The longest the worker waits to keep a run's report in its row (`Worker::keep_report`).
const REPORT_WRITE_LIMIT: Duration = Duration::from_secs(2);
/// How often the worker looks whether its lease ran out (`Worker::lease_loop`).
const LEASE_CHECK: Duration = Duration::from_millis(100);
/// How often the look-ahead is measured against the runs that take every slot.
const LOOKAHEAD_CHECK: Duration = Duration::from_millis(250);

struct Worker {
    id: i64,
    queue: String,
    /// Executions running now, each with the token that stops it when a cancel notice comes.
    running: std::sync::Mutex<Running>,
    /// Run slots: `concurrency` permits.
    run_slots: tokio::sync::Semaphore,
    /// Dispatches delivered and not yet started.
    held: std::sync::Mutex<std::collections::HashSet<i64>>,
    /// Executions between delivery and the end of their handling (held or running).
    busy: std::sync::atomic::AtomicUsize,
    /// Whether the consumer of the worker's queue is up.
    consuming: tokio::sync::watch::Sender<bool>,
    /// Set once the worker is stopping: its heartbeats say so, and it stays `draining`.
    draining: std::sync::atomic::AtomicBool,
    /// What its last heartbeat reported that executors schedule by (`Reported`); a change sends
    /// a heartbeat early.
    reported: tokio::sync::watch::Sender<Reported>,
    settings: Settings,
    db: PgPool,
    /// The claims and successes, written in batches.
    writes: writes::Writes,
    publisher: Publisher,
    runtimes: Runtimes,
    health: HealthState,
    /// Fires when the drain deadline has passed: running actions are killed.
    abort: CancellationToken,
    /// The worker's shutdown: fired by the worker itself if another process takes its name.
    shutdown: CancellationToken,
    /// Another process took this worker's name: this one stops its own runs and exits, and
    /// touches nothing it shares with the new holder (the row, the queue, their dispatches).
    displaced: std::sync::atomic::AtomicBool,
    /// The lease on its runs (ADR 0008).
    lease: Lease,
    /// The executors' fence notices, which may hold the lease (ADR 0011).
    notices: fence::Notices,
    /// Runs stopped because the lease ran out (reported as `worker_heartbeat_stale`).
    lease_lost: std::sync::Mutex<std::collections::HashSet<i64>>,
    /// The runs a follow request may stream (`live`), while they run.
    live: std::sync::Mutex<std::collections::HashMap<i64, Arc<live::LiveRun>>>,
}

/// What a heartbeat reports that executors schedule by: the look-ahead, the health class, the
/// last failure (a probe that failed must restart the probation at once) and the recent
/// execution time (when to look at a full worker again: a change of more than twice is sent
/// early, `run_time_moved`).
type Reported = (u16, HealthClass, Option<chrono::DateTime<chrono::Utc>>, Option<f64>);

/// Whether the recent execution time moved far enough from what was last reported (more than
/// twice, or half) for the executors to hear of it before the next heartbeat: they time their
/// looks at a full worker by it.
fn run_time_moved(reported: Option<f64>, now: Option<f64>) -> bool {
    match (reported, now) {
        (None, Some(_)) => true,
        (Some(reported), Some(now)) => now > 2.0 * reported.max(0.5) || 2.0 * now.max(0.5) < reported,
        (_, None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recent_execution_time_is_reported_early_when_it_moves_past_twice_or_half() {
        // (last reported, now, sent early)
        let table = [
            (None, Some(3.0), true),
            (None, None, false),
            (Some(3.0), None, false),
            (Some(3.0), Some(5.9), false),
            (Some(3.0), Some(6.1), true),
            (Some(70.0), Some(36.0), false),
            (Some(70.0), Some(34.0), true),
            // under a millisecond, the noise of a fraction of one is not news
            (Some(0.1), Some(0.9), false),
            (Some(0.1), Some(1.1), true),
            (Some(0.9), Some(0.1), false),
            (Some(1.1), Some(0.1), true),
        ];
        for (reported, now, early) in table {
            assert_eq!(run_time_moved(reported, now), early, "{reported:?} → {now:?}");
        }
    }
}
