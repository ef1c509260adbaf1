//! Admission: whether a delivered dispatch may start here now.
//!
//! A dispatch that finds a run slot free goes on at once. Otherwise it is held until one is
//! free; it goes back to waiting for any worker (no retry spent) when it has waited
//! `hold_limit` (the runs here take longer than expected, and another worker may start it at
//! once), when the worker stops, and when the channel it came on is lost (the broker returns the
//! message to the queue, where it would expire and fail the execution unstarted). A dispatch that
//! must wait is checked for staleness on the way (`Worker::wait_for_slot`). Then, slot or not,
//! the worker's state decides (`admission`).

use attune_common::mq::{Disposition, Incoming};
use tokio::sync::SemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::Worker;

/// How the wait for a run slot ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Waited {
    Slot,
    /// The dispatch is stale (canceled, handed back, taken elsewhere).
    Stale,
    /// It waited `hold_limit`.
    TooLong,
    /// The worker stopped, or the channel was lost.
    Interrupted,
}

/// What the worker is when a dispatch's wait ends.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Now {
    pub(super) channel_lost: bool,
    pub(super) stopping: bool,
    /// Another process took the worker's name.
    pub(super) displaced: bool,
    pub(super) lease_expired: bool,
    /// Its lease file cannot be renewed (`Worker::tell_lease`): it reports itself unhealthy.
    pub(super) unfit: bool,
}

/// What becomes of a dispatch at admission.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Admission {
    Run,
    /// Nothing to do (stale): acknowledged.
    Drop,
    /// Back to waiting for any worker, one try (`Worker::give_back_held`), for this reason;
    /// then the message is answered so.
    GiveBack(&'static str, Disposition),
    /// The message goes back to the queue as it is (its redelivery finds the execution no
    /// longer here, or the new holder of the worker's name takes it).
    Requeue,
    /// The worker stops: handed back, waiting out a database outage (`Worker::hand_back`).
    HandBack,
}

/// The order of these looks is what keeps a dispatch from being lost or started by a worker
/// the executors may take for dead.
pub(super) fn admission(waited: Waited, now: Now) -> Admission {
    let slot = waited == Waited::Slot;
    if waited == Waited::Stale {
        return Admission::Drop;
    }
    if now.channel_lost && !slot {
        return Admission::GiveBack("its channel was lost", Disposition::Retry);
    }
    if waited == Waited::TooLong {
        return Admission::GiveBack("every run slot is still taken", Disposition::Ack);
    }
    if now.channel_lost {
        return Admission::Requeue;
    }
    if !slot || now.stopping {
        return if now.displaced { Admission::Requeue } else { Admission::HandBack };
    }
    // the executors may take this worker for dead any moment: the dispatch waits for another
    // (or for this one once its heartbeats land again)
    if now.lease_expired {
        return Admission::GiveBack("no heartbeat has landed within the lease", Disposition::Ack);
    }
    if now.unfit {
        return Admission::GiveBack("the worker's lease file cannot be renewed", Disposition::Ack);
    }
    Admission::Run
}

impl Worker {
    /// A run slot for dispatch `execution_id`, or how its message is answered.
    pub(super) async fn admit(
        &self,
        execution_id: i64,
        incoming: &Incoming,
        shutdown: &CancellationToken,
    ) -> Result<SemaphorePermit<'_>, Disposition> {
        let (waited, permit) = match self.run_slots.try_acquire() {
            Ok(permit) => (Waited::Slot, Some(permit)),
            Err(_) => tokio::select! {
                permit = self.wait_for_slot(execution_id) => match permit {
                    Some(permit) => (Waited::Slot, Some(permit)),
                    None => (Waited::Stale, None),
                },
                _ = tokio::time::sleep(self.hold_limit()) => (Waited::TooLong, None),
                _ = shutdown.cancelled() => (Waited::Interrupted, None),
                _ = incoming.channel_lost.cancelled() => (Waited::Interrupted, None),
            },
        };
        let now = Now {
            channel_lost: incoming.channel_lost.is_cancelled(),
            stopping: shutdown.is_cancelled(),
            displaced: self.displaced.load(std::sync::atomic::Ordering::SeqCst),
            lease_expired: self.lease.expired(),
            unfit: self.health.unfit(),
        };
        match admission(waited, now) {
            Admission::Run => Ok(permit.expect("admitted only with a run slot")),
            Admission::Drop => Err(Disposition::Ack),
            Admission::GiveBack(why, answer) => {
                self.give_back_held(execution_id, why).await;
                Err(answer)
            }
            Admission::Requeue => Err(Disposition::Retry),
            // (a stopping worker's hand-back may wait out an outage: not holding a slot meanwhile)
            Admission::HandBack => {
                drop(permit);
                Err(self.hand_back(execution_id).await)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dispatch_runs_only_with_a_slot_a_lease_and_a_fit_worker_and_otherwise_goes_back() {
        let quiet = Now::default();
        let lost = Now { channel_lost: true, ..quiet };
        let stopping = Now { stopping: true, ..quiet };
        let give_back = |why| Admission::GiveBack(why, Disposition::Ack);
        let table = [
            (Waited::Slot, quiet, Admission::Run),
            (Waited::Stale, lost, Admission::Drop),
            (Waited::Stale, quiet, Admission::Drop),
            // no slot and no channel: back to waiting, and the message to the queue
            (Waited::TooLong, lost, Admission::GiveBack("its channel was lost", Disposition::Retry)),
            (Waited::Interrupted, lost, Admission::GiveBack("its channel was lost", Disposition::Retry)),
            (Waited::TooLong, quiet, give_back("every run slot is still taken")),
            (Waited::TooLong, stopping, give_back("every run slot is still taken")),
            // a slot but no channel: the broker has the message back already
            (Waited::Slot, lost, Admission::Requeue),
            (Waited::Interrupted, stopping, Admission::HandBack),
            (Waited::Slot, stopping, Admission::HandBack),
            (Waited::Slot, Now { displaced: true, ..stopping }, Admission::Requeue),
            (Waited::Slot, Now { lease_expired: true, ..quiet }, give_back("no heartbeat has landed within the lease")),
            (Waited::Slot, Now { unfit: true, ..quiet }, give_back("the worker's lease file cannot be renewed")),
            // stopping goes before the lease: the hand-back waits out an outage
            (Waited::Slot, Now { lease_expired: true, ..stopping }, Admission::HandBack),
        ];
        for (waited, now, expected) in table {
            assert_eq!(admission(waited, now), expected, "{waited:?} {now:?}");
        }
    }
}
