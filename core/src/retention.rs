//! How long history is kept: an age per terminal status, and the rule that removes a retry chain
//! only as a whole.
//!
//! A finished execution may be removed once it finished longer ago than its status's age, and a
//! retry chain (an execution, its retry, that retry's retry...) goes only when every one of its
//! executions may: so nothing is removed while any attempt of its chain waits, runs or is
//! younger than its own age, and no retry is ever left without the execution it retries.
//! Defaults: completed and canceled executions 7 days, failed, timed-out and abandoned ones 30
//! days (the ones an operator comes back to), inactive worker rows 7 days.
//!
//! The database applies the rule in one statement per batch (`attune_common::db::history`);
//! [`Retention::removable`] is the same rule over plain data, which the tests hold together.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::ExecutionStatus;

/// How long something is kept: a duration, or `off` (kept for ever).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Age(pub Option<Duration>);

impl Age {
    pub const fn days(days: u64) -> Self {
        Age(Some(Duration::from_secs(days * 86_400)))
    }

    pub const OFF: Age = Age(None);

    /// Seconds, for SQL; `None` when kept for ever.
    pub fn secs(self) -> Option<f64> {
        self.0.map(|d| d.as_secs_f64())
    }
}

impl FromStr for Age {
    type Err = String;

    /// `off` (or `never`), or a whole number with a unit: `s`, `m`, `h` or `d` (`90d`, `12h`,
    /// `30m`); a number alone is seconds.
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if matches!(text, "off" | "never") {
            return Ok(Age::OFF);
        }
        let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
            Some(at) => text.split_at(at),
            None => (text, "s"),
        };
        let unit_secs = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3_600,
            "d" => 86_400,
            _ => return Err(format!("unknown unit '{unit}' (expected s, m, h or d, or 'off')")),
        };
        let number: u64 = number.parse().map_err(|_| format!("'{text}' is not a number with a unit, such as 7d"))?;
        if number == 0 {
            return Err("an age of 0 would remove what just finished; use 'off' to keep for ever".into());
        }
        number.checked_mul(unit_secs).map(|s| Age(Some(Duration::from_secs(s)))).ok_or_else(|| "too long".into())
    }
}

impl fmt::Display for Age {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => write!(f, "off"),
            Some(d) => write!(f, "{}s", d.as_secs()),
        }
    }
}

/// The ages of history, per terminal status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    pub completed: Age,
    pub failed: Age,
    pub timeout: Age,
    pub canceled: Age,
    pub abandoned: Age,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            completed: Age::days(7),
            failed: Age::days(30),
            timeout: Age::days(30),
            canceled: Age::days(7),
            abandoned: Age::days(30),
        }
    }
}

/// One execution of a chain, as the rule sees it.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    pub status: ExecutionStatus,
    /// How long ago it finished (`None`: it has not).
    pub finished_ago: Option<Duration>,
}

impl Retention {
    /// The age of executions that ended in `status`; `None` for an unfinished status.
    pub fn age(&self, status: ExecutionStatus) -> Option<Age> {
        use ExecutionStatus::*;
        match status {
            Completed => Some(self.completed),
            Failed => Some(self.failed),
            Timeout => Some(self.timeout),
            Canceled => Some(self.canceled),
            Abandoned => Some(self.abandoned),
            Requested | Scheduling | Scheduled | Running | Delayed => None,
        }
    }

    /// The terminal statuses that are removed at all, with their ages in seconds (what the
    /// database's statement is given).
    pub fn removed(&self) -> Vec<(ExecutionStatus, f64)> {
        ExecutionStatus::TERMINAL
            .into_iter()
            .filter_map(|status| self.age(status).and_then(Age::secs).map(|secs| (status, secs)))
            .collect()
    }

    /// Whether a whole chain may go: every attempt finished, longer ago than its own status's age.
    pub fn removable(&self, chain: &[Attempt]) -> bool {
        !chain.is_empty()
            && chain.iter().all(|attempt| {
                match (self.age(attempt.status).and_then(|age| age.0), attempt.finished_ago) {
                    (Some(age), Some(ago)) => ago > age,
                    _ => false,
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ExecutionStatus::*;

    #[test]
    fn ages_parse_with_units_and_name_what_is_wrong() {
        let secs = |s| Age(Some(Duration::from_secs(s)));
        assert_eq!("7d".parse::<Age>().unwrap(), secs(7 * 86_400));
        assert_eq!("12h".parse::<Age>().unwrap(), secs(12 * 3_600));
        assert_eq!(" 30m ".parse::<Age>().unwrap(), secs(1_800));
        assert_eq!("45".parse::<Age>().unwrap(), secs(45));
        assert_eq!("off".parse::<Age>().unwrap(), Age::OFF);
        assert!("0d".parse::<Age>().unwrap_err().contains("'off'"));
        assert!("7w".parse::<Age>().unwrap_err().contains("unknown unit 'w'"));
        assert!("d".parse::<Age>().is_err());
        assert!("-1d".parse::<Age>().is_err());
        assert!("99999999999999999d".parse::<Age>().is_err());
    }

    #[test]
    fn a_chain_goes_only_when_every_attempt_is_past_its_own_age() {
        let retention = Retention::default();
        let day = |d: u64| Some(Duration::from_secs(d * 86_400 + 1));
        let attempt = |status, finished_ago| Attempt { status, finished_ago };
        assert!(retention.removable(&[attempt(Completed, day(7))]));
        assert!(!retention.removable(&[attempt(Completed, day(6))]));
        // a failed first attempt keeps its 30 days even when its retry completed long ago
        assert!(!retention.removable(&[attempt(Failed, day(10)), attempt(Completed, day(8))]));
        assert!(retention.removable(&[attempt(Failed, day(30)), attempt(Completed, day(29))]));
        // a retry still waiting or running keeps the whole chain
        assert!(!retention.removable(&[attempt(Failed, day(90)), attempt(Delayed, None)]));
        assert!(!retention.removable(&[attempt(Failed, day(90)), attempt(Running, None)]));
        assert!(!retention.removable(&[]));
        let kept = Retention { completed: Age::OFF, ..Retention::default() };
        assert!(!kept.removable(&[attempt(Completed, day(900))]));
        assert_eq!(kept.removed().len(), 4);
        assert!(kept.removed().iter().all(|(status, _)| *status != Completed));
    }
}
