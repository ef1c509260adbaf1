//! The fence of a database outage that everyone shares
//! (docs/adr/0011-an-outage-everyone-shares-stops-nothing.md).
//!
//! A worker that no heartbeat could renew for its lease stops its runs, because the executors may
//! take it for dead and run its executions elsewhere (ADR 0008). When the executors cannot reach
//! the database either, none of them can take anyone for dead: an executor judges heartbeats only
//! once it has reached the database, without a failure, for the heartbeat limit. Each executor
//! says so every second on the control exchange, in a notice signed with the key only the
//! database gives out: "I will take no worker for dead within `judging_in_ms`". A worker whose
//! lease ran out goes on running while every executor it hears from says that, up to the
//! soonest such moment less `margin` (the notice's time on the way is at most its expiry, well
//! inside the margin).

use std::time::Duration;

use ring::hmac;
use serde::{Deserialize, Serialize};

/// How often each executor sends its notice.
pub const NOTICE_INTERVAL: Duration = Duration::from_secs(1);

/// How long before the executors may take a silent worker for dead its runs stop:
/// `max(max_age / 4, 1 s)`.
pub fn margin(max_age: Duration) -> Duration {
    (max_age / 4).max(Duration::from_secs(1))
}

/// A worker's lease on its runs (ADR 0008): `max_age - margin(max_age)`.
pub fn lease(max_age: Duration) -> Duration {
    max_age.saturating_sub(margin(max_age))
}

/// How long a notice may wait in the broker before it is dropped undelivered: half the margin, at
/// most 2 s. A worker counts a notice's promise from when it reads it, so the promise it keeps
/// is late by the notice's time on the way: the expiry bounds that well inside the margin.
pub fn notice_expiry(max_age: Duration) -> Duration {
    (margin(max_age) / 2).min(Duration::from_secs(2))
}

/// Executor → every worker (`ns.control`, fanout; `{"fence": {...}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceNotice {
    /// The executor process (random per process: a restarted executor is a new one).
    pub executor: String,
    /// Counts up per executor process: a notice not newer than the last one read is a replay.
    pub seq: u64,
    /// The executor takes no worker for dead for at least this long from when it sent this.
    pub judging_in_ms: u64,
    /// Its `ATTUNE_HEARTBEAT_MAX_AGE_SECS`: a worker with another one keeps to the smaller.
    pub max_age_secs: u64,
    /// HMAC-SHA-256 of the fields above (`signed_text`), hex, with the key of `db::fence`.
    pub mac: String,
}

impl FenceNotice {
    /// A notice signed with `key`.
    pub fn signed(key: &[u8], executor: &str, seq: u64, judging_in: Duration, max_age: Duration) -> FenceNotice {
        let mut notice = FenceNotice {
            executor: executor.to_string(),
            seq,
            judging_in_ms: judging_in.as_millis().min(u64::MAX as u128) as u64,
            max_age_secs: max_age.as_secs(),
            mac: String::new(),
        };
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), notice.signed_text().as_bytes());
        notice.mac = crate::secrets::to_hex(tag.as_ref());
        notice
    }

    /// Whether `mac` is the signature of the other fields with `key`.
    pub fn verify(&self, key: &[u8]) -> bool {
        let Some(tag) = crate::secrets::from_hex(&self.mac) else { return false };
        hmac::verify(&hmac::Key::new(hmac::HMAC_SHA256, key), self.signed_text().as_bytes(), &tag).is_ok()
    }

    pub fn judging_in(&self) -> Duration {
        Duration::from_millis(self.judging_in_ms)
    }

    pub fn max_age(&self) -> Duration {
        Duration::from_secs(self.max_age_secs)
    }

    fn signed_text(&self) -> String {
        format!("attune fence v1\n{}\n{}\n{}\n{}", self.executor, self.seq, self.judging_in_ms, self.max_age_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_verifies_with_its_key_only_and_not_once_changed() {
        let notice = FenceNotice::signed(b"k1", "e-1", 7, Duration::from_millis(30_000), Duration::from_secs(30));
        assert!(notice.verify(b"k1"));
        assert!(!notice.verify(b"k2"));
        for forged in [
            FenceNotice { judging_in_ms: 3_600_000, ..notice.clone() },
            FenceNotice { seq: 8, ..notice.clone() },
            FenceNotice { executor: "e-2".into(), ..notice.clone() },
            FenceNotice { max_age_secs: 300, ..notice.clone() },
            FenceNotice { mac: "zz".into(), ..notice.clone() },
        ] {
            assert!(!forged.verify(b"k1"), "{forged:?}");
        }
    }

    #[test]
    fn the_lease_and_the_margin_split_the_heartbeat_limit() {
        assert_eq!(lease(Duration::from_secs(30)), Duration::from_millis(22_500));
        assert_eq!(margin(Duration::from_secs(30)), Duration::from_millis(7_500));
        assert_eq!(lease(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(notice_expiry(Duration::from_secs(30)), Duration::from_secs(2));
        assert_eq!(notice_expiry(Duration::from_secs(5)), Duration::from_millis(625));
    }
}
