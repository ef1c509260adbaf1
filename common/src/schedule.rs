//! When a schedule runs: its timing (a cron expression read in an IANA time zone, or one instant)
//! and what a look at a due schedule creates (`Timing::due`). Cron expressions are parsed by
//! `croner` (5 fields, or 6 with seconds first; `L`, `W`, `#`, names and `@daily`-style macros);
//! a local time skipped by a daylight-saving change runs at the first time after it, and one that
//! occurs twice runs once.

use chrono::{DateTime, SubsecRound, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use serde::{Deserialize, Serialize};

/// A due occurrence at most this old when an executor looks is run as usual (an executor
/// restarting, or another taking over, within it misses nothing); older ones follow `CatchUp`.
pub const GRACE: chrono::Duration = chrono::Duration::seconds(60);

/// Most runs one look creates for one schedule (occurrences within `GRACE` of a schedule with a
/// seconds field).
const MOST_PER_LOOK: usize = 60;

/// What a look after an outage does with occurrences older than `GRACE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// They are not run.
    Skip,
    /// One run stands for them all (recorded for the first of them).
    Once,
}

impl CatchUp {
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::Skip => "skip",
            CatchUp::Once => "once",
        }
    }

    pub fn parse(text: &str) -> Option<CatchUp> {
        match text {
            "skip" => Some(CatchUp::Skip),
            "once" => Some(CatchUp::Once),
            _ => None,
        }
    }
}

/// When a schedule's runs are due.
#[derive(Debug, Clone)]
pub enum Timing {
    Cron { cron: Box<Cron>, zone: Tz },
    At(DateTime<Utc>),
}

/// What one look at a due schedule does: the occurrences to run (oldest first), and the next
/// occurrence to wait for (`None`: the schedule has no more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub run: Vec<DateTime<Utc>>,
    pub next: Option<DateTime<Utc>>,
    /// Occurrences older than the grace that were not run (`skip`), or that the one catch-up run
    /// stands for (`once`).
    pub missed: u64,
}

impl Timing {
    /// A cron expression in the time zone `zone`; the error names the field (`cron`, `timezone`).
    pub fn cron(expression: &str, zone: &str) -> Result<Timing, (&'static str, String)> {
        let zone: Tz = zone.parse().map_err(|_| {
            ("timezone", format!("unknown time zone '{zone}' (an IANA name such as 'UTC' or 'Europe/Paris')"))
        })?;
        if expression.trim().is_empty() || expression.len() > 255 {
            return Err(("cron", "a cron expression is 1 to 255 characters".into()));
        }
        let cron = Cron::new(expression)
            .with_seconds_optional()
            .parse()
            .map_err(|e| ("cron", format!("'{expression}' is not a cron expression: {e}")))?;
        let timing = Timing::Cron { cron: Box::new(cron), zone };
        // an expression that never matches (30 February) is refused rather than never run
        if timing.first_after(Utc::now()).is_none() {
            return Err(("cron", format!("'{expression}' never comes")));
        }
        Ok(timing)
    }

    /// The shortest time between two of the first `count` occurrences after `t` (none for an
    /// instant, or a cron expression with fewer occurrences).
    pub fn shortest_gap(&self, t: DateTime<Utc>, count: usize) -> Option<chrono::Duration> {
        let mut previous = self.first_after(t)?;
        let mut shortest: Option<chrono::Duration> = None;
        for _ in 1..count {
            let Some(next) = self.first_after(previous) else { break };
            let gap = next - previous;
            shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
            previous = next;
        }
        shortest
    }

    /// The first occurrence strictly after `t`.
    pub fn first_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Timing::At(at) => (*at > t).then_some(*at),
            Timing::Cron { cron, zone } => {
                // croner reads an ambiguous local time (the hour a change back from daylight
                // saving repeats) as its earlier instant, which may lie before `t`: its later
                // instant then, or the next local time after it
                let mut from = zone.from_utc_datetime(&t.trunc_subsecs(0).naive_utc());
                for _ in 0..10_000 {
                    let next = cron.find_next_occurrence(&from, false).ok()?;
                    if next.with_timezone(&Utc) > t {
                        return Some(next.with_timezone(&Utc));
                    }
                    if let Some(later) = zone.from_local_datetime(&next.naive_local()).latest()
                        && later.with_timezone(&Utc) > t
                    {
                        return Some(later.with_timezone(&Utc));
                    }
                    from = next;
                }
                None
            }
        }
    }

    /// The first occurrence at or after `t`.
    fn first_from(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Timing::At(at) => (*at >= t).then_some(*at),
            Timing::Cron { .. } => {
                let whole = t.trunc_subsecs(0);
                let from = if whole == t { whole - chrono::Duration::seconds(1) } else { whole };
                self.first_after(from)
            }
        }
    }

    /// What a look at `now` does for a schedule whose next occurrence is `next_run` (due: at or
    /// before `now`). The occurrences within `GRACE` of `now` run, each once; older ones are
    /// skipped, or (`once`) stand behind one run recorded for the first of them.
    pub fn due(&self, next_run: DateTime<Utc>, now: DateTime<Utc>, catch_up: CatchUp) -> Due {
        let recent = now - GRACE;
        let mut run = Vec::new();
        let mut missed = 0u64;
        if next_run < recent {
            // what was missed: counted only as far as the look must walk anyway
            let mut at = Some(next_run);
            while let Some(t) = at.filter(|t| *t < recent) {
                missed += 1;
                if missed > 10_000 {
                    break;
                }
                at = self.first_after(t);
            }
            if catch_up == CatchUp::Once {
                run.push(next_run);
            }
        }
        let mut at = self.first_from(next_run.max(recent));
        while let Some(t) = at.filter(|t| *t <= now) {
            if run.len() >= MOST_PER_LOOK {
                break;
            }
            run.push(t);
            at = self.first_after(t);
        }
        let next = match run.last() {
            // more within the grace than one look takes: the next look goes on from there
            Some(last) if run.len() >= MOST_PER_LOOK => self.first_after(*last),
            _ => self.first_after(now),
        };
        Due { run, next, missed }
    }

    /// What a look at `now` does for a schedule whose action (or its runtime) is paused: every
    /// due occurrence is missed, whatever its age; `once` keeps one run for the first of them
    /// unless one already waits (`waiting`: a run of this schedule not started yet, which stands
    /// for what comes until the resume).
    pub fn due_while_paused(
        &self,
        next_run: DateTime<Utc>,
        now: DateTime<Utc>,
        catch_up: CatchUp,
        waiting: bool,
    ) -> Due {
        let mut missed = 0u64;
        let mut at = Some(next_run);
        while let Some(t) = at.filter(|t| *t <= now) {
            missed += 1;
            if missed > 10_000 {
                break;
            }
            at = self.first_after(t);
        }
        let run = if catch_up == CatchUp::Once && !waiting && missed > 0 { vec![next_run] } else { Vec::new() };
        Due { run, next: self.first_after(now), missed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn cron_is_read_in_its_time_zone_and_across_daylight_saving() {
        let daily = Timing::cron("30 2 * * *", "Europe/Paris").unwrap();
        // 02:30 in Paris is 01:30 UTC in winter
        assert_eq!(daily.first_after(t("2026-01-10T12:00:00Z")), Some(t("2026-01-11T01:30:00Z")));
        // 29 March 2026: 02:00 → 03:00 in Paris; 02:30 does not exist that day and runs at 03:00 local
        let spring = daily.first_after(t("2026-03-28T12:00:00Z")).unwrap();
        assert_eq!(spring, t("2026-03-29T01:00:00Z"));
        let seconds = Timing::cron("*/10 * * * * *", "UTC").unwrap();
        assert_eq!(seconds.first_after(t("2026-01-10T12:00:00.5Z")), Some(t("2026-01-10T12:00:10Z")));
    }

    #[test]
    fn the_hour_a_change_back_from_daylight_saving_repeats_never_goes_back_in_time() {
        // 25 October 2026, Paris: 03:00 CEST (01:00 UTC) becomes 02:00 CET; 02:00-02:59 comes twice
        let minutely = Timing::cron("* * * * *", "Europe/Paris").unwrap();
        // in the second pass (02:30 CET is 01:30 UTC): the next minute is after it, not an hour back
        assert_eq!(minutely.first_after(t("2026-10-25T01:30:20Z")), Some(t("2026-10-25T01:31:00Z")));
        let seconds = Timing::cron("* * * * * *", "Europe/Paris").unwrap();
        assert_eq!(seconds.first_after(t("2026-10-25T01:30:20Z")), Some(t("2026-10-25T01:30:21Z")));
        // a daily time in the repeated hour runs once, at its first instant
        let daily = Timing::cron("30 2 * * *", "Europe/Paris").unwrap();
        let first = daily.first_after(t("2026-10-24T12:00:00Z")).unwrap();
        assert_eq!(first, t("2026-10-25T00:30:00Z"));
        assert_eq!(daily.first_after(first), Some(t("2026-10-26T01:30:00Z")));
        // a look within the repeated hour finds nothing due before it
        let due = seconds.due(t("2026-10-25T01:30:20Z"), t("2026-10-25T01:30:20Z"), CatchUp::Skip);
        assert_eq!((due.run.len(), due.next), (1, Some(t("2026-10-25T01:30:21Z"))));
    }

    #[test]
    fn bad_timings_name_their_field() {
        assert_eq!(Timing::cron("61 * * * *", "UTC").unwrap_err().0, "cron");
        assert_eq!(Timing::cron("", "UTC").unwrap_err().0, "cron");
        assert_eq!(Timing::cron("* * * * *", "Mars/Olympus").unwrap_err().0, "timezone");
        assert_eq!(Timing::cron("0 0 30 2 *", "UTC").unwrap_err().0, "cron");
    }

    #[test]
    fn a_look_runs_each_recent_occurrence_once_and_follows_the_catch_up_after_an_outage() {
        let minutely = Timing::cron("* * * * *", "UTC").unwrap();
        let now = t("2026-01-10T12:00:20Z");
        // on time (20 s late): the one occurrence runs, the next is the coming minute
        let due = minutely.due(t("2026-01-10T12:00:00Z"), now, CatchUp::Skip);
        assert_eq!(due, Due { run: vec![t("2026-01-10T12:00:00Z")], next: Some(t("2026-01-10T12:01:00Z")), missed: 0 });
        // ten minutes down: skip runs only the occurrence within the grace
        let due = minutely.due(t("2026-01-10T11:50:00Z"), now, CatchUp::Skip);
        assert_eq!((due.run, due.missed), (vec![t("2026-01-10T12:00:00Z")], 10));
        // once: one run for the ten missed, recorded for the first, and the recent one
        let due = minutely.due(t("2026-01-10T11:50:00Z"), now, CatchUp::Once);
        assert_eq!(due.run, vec![t("2026-01-10T11:50:00Z"), t("2026-01-10T12:00:00Z")]);
        // an hourly schedule down for two hours: skip runs nothing, once runs one
        let hourly = Timing::cron("0 * * * *", "UTC").unwrap();
        let now = t("2026-01-10T12:30:00Z");
        let due = hourly.due(t("2026-01-10T10:00:00Z"), now, CatchUp::Skip);
        assert_eq!(due, Due { run: vec![], next: Some(t("2026-01-10T13:00:00Z")), missed: 3 });
        assert_eq!(hourly.due(t("2026-01-10T10:00:00Z"), now, CatchUp::Once).run, vec![t("2026-01-10T10:00:00Z")]);
        // an instant: within the grace it runs, and there is no next
        let at = Timing::At(t("2026-01-10T12:29:30Z"));
        assert_eq!(
            at.due(t("2026-01-10T12:29:30Z"), now, CatchUp::Skip),
            Due { run: vec![t("2026-01-10T12:29:30Z")], next: None, missed: 0 }
        );
        let late = Timing::At(t("2026-01-10T12:00:00Z"));
        assert_eq!(late.due(t("2026-01-10T12:00:00Z"), now, CatchUp::Skip).run, Vec::<DateTime<Utc>>::new());
        assert_eq!(late.due(t("2026-01-10T12:00:00Z"), now, CatchUp::Once).run, vec![t("2026-01-10T12:00:00Z")]);
    }

    #[test]
    fn while_its_action_is_paused_every_occurrence_is_missed_and_once_keeps_one_run_waiting() {
        let minutely = Timing::cron("* * * * *", "UTC").unwrap();
        let now = t("2026-01-10T12:00:20Z");
        // even the recent occurrence is missed: nothing piles up behind the pause
        let due = minutely.due_while_paused(t("2026-01-10T11:58:00Z"), now, CatchUp::Skip, false);
        assert_eq!(due, Due { run: vec![], next: Some(t("2026-01-10T12:01:00Z")), missed: 3 });
        let due = minutely.due_while_paused(t("2026-01-10T11:58:00Z"), now, CatchUp::Once, false);
        assert_eq!((due.run, due.missed), (vec![t("2026-01-10T11:58:00Z")], 3));
        // one run already waits behind the pause: it stands for these too
        let due = minutely.due_while_paused(t("2026-01-10T12:00:00Z"), now, CatchUp::Once, true);
        assert_eq!((due.run, due.missed), (vec![], 1));
    }
}
