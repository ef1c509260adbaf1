//! What the executors' fence notices let this worker do when its heartbeats cannot land
//! (`attune_common::fence`; docs/adr/0011-an-outage-everyone-shares-stops-nothing.md).
//!
//! Each executor says every second how long it will take no worker for dead. The worker keeps
//! the last notice of each executor it heard within twice the heartbeat limit, and its runs may
//! go on past the lease until the soonest of their promises, less the margin the notice's time on
//! the way needs: one executor that could judge now (its promise already kept) is enough to hold
//! nothing. A notice not signed with the database's key, or not newer than the last from its
//! executor, is ignored.

use std::collections::HashMap;
use std::time::Duration;

use attune_common::fence::{FenceNotice, margin};

use crate::heartbeat::Lease;
use crate::{Worker, supervise};

struct Heard {
    seq: u64,
    /// When it was read (boot clock).
    read_at: u128,
    /// Until when, by this worker's boot clock, the executor judges no one, less the margin.
    holds_until: u128,
}

/// The notices heard, and the key to check them with.
pub(crate) struct Notices {
    key: Option<Vec<u8>>,
    max_age: Duration,
    heard: std::sync::Mutex<HashMap<String, Heard>>,
    /// Executors whose heartbeat limit differs from this worker's (each said once).
    mismatched: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Notices {
    /// `key` is `None` where the database gives none (it is then as if no executor spoke).
    pub(crate) fn new(key: Option<Vec<u8>>, max_age: Duration) -> Notices {
        Notices { key, max_age, heard: Default::default(), mismatched: Default::default() }
    }

    /// Reads a notice; the hold it allows now, if it was believed (`None`: ignored).
    fn read(&self, notice: &FenceNotice, lease: &Lease) -> Option<u128> {
        let key = self.key.as_deref()?;
        if !notice.verify(key) {
            tracing::warn!(executor = %notice.executor, "a fence notice not signed with the database's key was ignored");
            return None;
        }
        let now = supervise::boot_clock_ns();
        if notice.max_age() != self.max_age
            && self.mismatched.lock().expect("fence poisoned").insert(notice.executor.clone())
        {
            tracing::error!(
                executor = %notice.executor,
                executor_max_age_secs = notice.max_age_secs,
                worker_max_age_secs = self.max_age.as_secs(),
                "ATTUNE_HEARTBEAT_MAX_AGE_SECS differs between this worker and an executor: set it alike everywhere \
                 (this worker keeps its lease inside the smaller)"
            );
            attune_common::metrics::increment(
                &attune_common::metrics::SETTING_MISMATCHES,
                &[("setting", "ATTUNE_HEARTBEAT_MAX_AGE_SECS")],
                1,
            );
        }
        if notice.max_age() < self.max_age {
            lease.shorten_to(attune_common::fence::lease(notice.max_age().max(Duration::from_secs(1))));
        }
        let mut heard = self.heard.lock().expect("fence poisoned");
        if heard.get(&notice.executor).is_some_and(|last| last.seq >= notice.seq) {
            tracing::warn!(executor = %notice.executor, seq = notice.seq, "a fence notice older than one already read was ignored");
            return None;
        }
        let promise = (now + notice.judging_in().as_nanos()).saturating_sub(margin(notice.max_age()).as_nanos());
        heard.insert(notice.executor.clone(), Heard { seq: notice.seq, read_at: now, holds_until: promise });
        let forget_after = 2 * self.max_age.as_nanos();
        heard.retain(|_, h| now.saturating_sub(h.read_at) <= forget_after);
        Some(heard.values().map(|h| h.holds_until).min().unwrap_or(0))
    }
}

impl Worker {
    /// A fence notice: the hold on the lease it allows, written for the supervisors too.
    pub(crate) fn handle_fence(&self, notice: &FenceNotice) {
        if let Some(until) = self.notices.read(notice, &self.lease) {
            self.lease.hold(until);
            // (also when the deadline came nearer: a hold ended, or a shorter limit heard of)
            self.tell_lease();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"the key";

    fn notice(executor: &str, seq: u64, judging_in_secs: u64) -> FenceNotice {
        FenceNotice::signed(KEY, executor, seq, Duration::from_secs(judging_in_secs), Duration::from_secs(30))
    }

    fn lease() -> Lease {
        Lease::new(supervise::boot_clock_ns(), Duration::from_millis(22_500))
    }

    fn secs_from_now(until: u128) -> f64 {
        (until as f64 - supervise::boot_clock_ns() as f64) / 1e9
    }

    #[test]
    fn the_soonest_promise_less_the_margin_holds_and_one_executor_that_may_judge_holds_nothing() {
        let notices = Notices::new(Some(KEY.to_vec()), Duration::from_secs(30));
        let lease = lease();
        let until = notices.read(&notice("a", 1, 30), &lease).unwrap();
        assert!((22.0..=22.5).contains(&secs_from_now(until)), "{}", secs_from_now(until));
        let until = notices.read(&notice("b", 1, 20), &lease).unwrap();
        assert!((12.0..=12.5).contains(&secs_from_now(until)), "{}", secs_from_now(until));
        let until = notices.read(&notice("a", 2, 0), &lease).unwrap();
        assert!(secs_from_now(until) < -7.0, "an executor that may judge now holds nothing");
    }

    #[test]
    fn a_forged_or_replayed_notice_is_ignored() {
        let notices = Notices::new(Some(KEY.to_vec()), Duration::from_secs(30));
        let lease = lease();
        let forged = FenceNotice::signed(b"not the key", "a", 1, Duration::from_secs(3600), Duration::from_secs(30));
        assert_eq!(notices.read(&forged, &lease), None);
        assert!(notices.read(&notice("a", 5, 30), &lease).is_some());
        assert_eq!(notices.read(&notice("a", 5, 30), &lease), None, "replayed");
        assert_eq!(notices.read(&notice("a", 4, 30), &lease), None, "older");
        assert_eq!(Notices::new(None, Duration::from_secs(30)).read(&notice("a", 1, 30), &lease), None);
    }

    #[test]
    fn an_executor_with_a_shorter_heartbeat_limit_shortens_the_lease() {
        let notices = Notices::new(Some(KEY.to_vec()), Duration::from_secs(60));
        let lease = Lease::new(supervise::boot_clock_ns(), attune_common::fence::lease(Duration::from_secs(60)));
        notices.read(&notice("a", 1, 0), &lease).unwrap();
        assert_eq!(lease.length(), Duration::from_millis(22_500));
    }
}
