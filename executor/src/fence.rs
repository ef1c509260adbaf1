//! When this executor may take a silent worker for dead, and its notices of it to the workers
//! (`attune_common::fence`; docs/adr/0011-an-outage-everyone-shares-stops-nothing.md).
//!
//! After the database was out of its reach, workers' heartbeats could not land either: the
//! executor judges heartbeats again only once it has reached the database without a failure for
//! the heartbeat limit. Every second it writes its pulse (a committed write: a stall of commits
//! counts as an outage, though reads still work) and tells every worker how long it will take no
//! worker for dead. It starts as if it had just failed: a worker that heard only from executors
//! cut off from the database may be running on past its lease, and must hear from this one first.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use attune_common::db;
use attune_common::fence::{FenceNotice, NOTICE_INTERVAL, notice_expiry};
use attune_common::mq::ControlMessage;
use tokio_util::sync::CancellationToken;

use crate::Context;

/// When this executor last failed to reach the database, and so when it may judge heartbeats.
pub struct Judging {
    last_failure: Mutex<Instant>,
    /// When a pulse and its notice last both went through: an executor whose notices do not
    /// reach the workers (the broker away, its fence loop stalled) judges no one.
    last_told: Mutex<Option<Instant>>,
    max_age: Duration,
}

/// How long the notices' broker channel may take to open.
const CONNECT_PATIENCE: Duration = Duration::from_secs(5);

/// How recently an executor must have pulsed and told the workers to judge heartbeats.
const TOLD_WITHIN: Duration = Duration::from_secs(3);

impl Judging {
    /// Starts as at a failure: no worker is judged for `max_age`.
    pub fn new(max_age: Duration) -> Judging {
        Judging { last_failure: Mutex::new(Instant::now()), last_told: Mutex::new(None), max_age }
    }

    /// A pulse landed and its notice went out.
    pub fn told(&self) {
        *self.last_told.lock().expect("fence poisoned") = Some(Instant::now());
    }

    /// The database could not be reached (a pulse or a monitor pass failed).
    pub fn failed(&self) {
        *self.last_failure.lock().expect("fence poisoned") = Instant::now();
    }

    /// How long before this executor may take a silent worker for dead.
    pub fn judging_in(&self) -> Duration {
        let since = self.last_failure.lock().expect("fence poisoned").elapsed();
        self.max_age.saturating_sub(since)
    }

    /// Whether heartbeats may be judged now (the database also checks, `fence_open`).
    pub fn may_judge(&self) -> bool {
        let told = self.last_told.lock().expect("fence poisoned").is_some_and(|at| at.elapsed() <= TOLD_WITHIN);
        told && self.judging_in().is_zero()
    }
}

/// Pulses and sends a notice every `NOTICE_INTERVAL` until `shutdown`.
pub async fn run(context: Arc<Context>, shutdown: CancellationToken) {
    let executor = format!("{:016x}", rand::random::<u64>());
    let max_age = context.fence.max_age;
    let expiry = notice_expiry(max_age);
    // a pulse may take as long as a notice may wait in the broker: the first notice that says
    // the database is away must reach the workers before a heartbeat sent just before the outage
    // runs out of lease (`NOTICE_INTERVAL` plus this, against at least the margin)
    let patience = expiry;
    let exchange = context.publisher.topology().control_exchange();
    // a connection of its own: a broker user not allowed to write to the control exchange (set
    // up before this) has its channel closed at each notice, which must not touch dispatches
    let publisher = attune_common::mq::Publisher::new(
        &context.settings.common.amqp_url,
        "attune-executor-fence",
        context.publisher.topology().clone(),
    );
    let mut key: Option<Vec<u8>> = None;
    let mut tick = tokio::time::interval(NOTICE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut cut_off = false;
    for seq in 1u64.. {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match tokio::time::timeout(patience, db::fence::pulse(&context.db)).await {
            Ok(Ok(read)) => {
                if cut_off {
                    tracing::warn!(
                        judging_in_secs = context.fence.judging_in().as_secs_f64(),
                        "the database is reachable again: workers are judged by their heartbeats once they have had the heartbeat limit to send one"
                    );
                    cut_off = false;
                }
                key = Some(read);
            }
            failed => {
                context.fence.failed();
                if !cut_off {
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {patience:?}"),
                    };
                    tracing::warn!(%error, "the database cannot be written: no worker is taken for dead until it has been reachable for the heartbeat limit");
                    cut_off = true;
                }
            }
        }
        // (before its first pulse the executor has no key: the workers hear from it once it has
        // reached the database, and it judges no one before the heartbeat limit from its start)
        let Some(key) = key.as_deref() else { continue };
        // the channel first (a connection may take a while to open): the notice says what holds
        // when it is sent, and its sending is bounded by its expiry
        if let Err(e) = tokio::time::timeout(CONNECT_PATIENCE, publisher.ping())
            .await
            .unwrap_or(Err(attune_common::mq::MqError::Timeout(CONNECT_PATIENCE)))
        {
            tracing::debug!(error = %e, "no broker channel for the fence notice: no worker is judged meanwhile");
            context.fence.failed();
            continue;
        }
        let notice = FenceNotice::signed(key, &executor, seq, context.fence.judging_in(), max_age);
        let payload = ControlMessage::Fence(notice).to_vec();
        match publisher.publish_expiring(&exchange, "", &payload, expiry).await {
            // (unroutable: no worker listens)
            Ok(()) | Err(attune_common::mq::MqError::Unroutable(_)) => {
                if !cut_off {
                    context.fence.told();
                }
            }
            Err(e) => {
                // workers that do not hear from this executor may be held by others' notices:
                // it judges no one until they hear from it again
                tracing::debug!(error = %e, "could not send the fence notice: no worker is judged meanwhile");
                context.fence.failed();
            }
        }
    }
}
