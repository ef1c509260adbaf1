//! Worker selection: which worker gets the next execution.
//!
//! Only active workers that support the action's runtime are candidates. Healthy workers come
//! first by queue depth ascending, then degraded ones by queue depth ascending; unhealthy workers
//! never get work. Ties are broken by a caller-supplied random value so equal workers share a
//! burst. The queue depth counts what this system dispatched to the worker and has not seen
//! finish (or the worker's own report, if higher), so a burst between two heartbeats spreads out
//! instead of piling onto one worker.
//!
//! Capacity is not health: a worker gets work only while it has a free slot (its concurrency
//! plus a small look-ahead, minus what was dispatched to it and has not finished). Among the
//! workers with a free slot the order above applies; `plan` places a batch of waiting
//! executions one slot at a time in that order.
//!
//! A worker that is unhealthy because of its own failures is not written off: once its last
//! failure is the probation old, it gets one probe execution at a time (`Room::probation`, after
//! every healthy and degraded worker), and requests for its runtime wait for it rather than fail
//! (`could_take_work`).

use chrono::{DateTime, Utc};

use crate::health::{HealthClass, HealthSignals, HealthThresholds, classify};

#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub worker_id: i64,
    pub name: String,
    pub runtimes: Vec<String>,
    pub signals: HealthSignals,
    /// How many executions it takes at once, started or not (`None`: it does not say, and only
    /// its health bounds it).
    pub slots: Option<i64>,
    /// How many of them it runs at once (`None`: it does not say); the rest are its look-ahead.
    pub concurrency: Option<i64>,
    /// Its recent execution time in milliseconds, as it reported (`None`: it has timed no run
    /// yet, or does not say): how soon its runs free room.
    pub run_ms: Option<f64>,
    /// Whether its consumer is up: a worker that cannot consume gets no work, but its runtimes
    /// still count as offered (it is alive and reconnecting).
    pub consuming: bool,
}

impl Candidate {
    pub fn offers(&self, runtime: &str) -> bool {
        self.runtimes.iter().any(|r| r == runtime)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Ranked {
    pub worker_id: i64,
    pub class: HealthClass,
    pub queue_depth: i64,
}

/// The worker as a ranked candidate, or `None` if it must not get work (unhealthy).
fn eligible(config: &HealthThresholds, worker_id: i64, signals: &HealthSignals, now: DateTime<Utc>) -> Option<Ranked> {
    let class = classify(config, signals, now);
    (class != HealthClass::Unhealthy).then_some(Ranked { worker_id, class, queue_depth: signals.queue_depth })
}

/// The order of eligible workers: healthy before degraded, then by queue depth, then the
/// random tie-break.
fn order_key(ranked: &Ranked, tie: u64) -> (HealthClass, i64, u64) {
    (ranked.class, ranked.queue_depth, tie)
}

/// Every eligible worker for `runtime`, best first. `tie_break` gives each worker id a random
/// key so that equally good workers are chosen in varying order.
pub fn rank(
    config: &HealthThresholds,
    candidates: &[Candidate],
    runtime: &str,
    now: DateTime<Utc>,
    mut tie_break: impl FnMut(i64) -> u64,
) -> Vec<Ranked> {
    let mut ranked: Vec<(Ranked, u64)> = candidates
        .iter()
        .filter(|c| c.runtimes.iter().any(|r| r == runtime))
        .filter_map(|c| eligible(config, c.worker_id, &c.signals, now))
        .map(|r| {
            let tie = tie_break(r.worker_id);
            (r, tie)
        })
        .collect();
    ranked.sort_by_key(|(r, tie)| order_key(r, *tie));
    ranked.into_iter().map(|(r, _)| r).collect()
}

/// The best worker for `runtime`, or `None` (the retriable failure `worker_unavailable`).
pub fn select(
    config: &HealthThresholds,
    candidates: &[Candidate],
    runtime: &str,
    now: DateTime<Utc>,
    tie_break: impl FnMut(i64) -> u64,
) -> Option<Ranked> {
    let offering = candidates.iter().filter(|c| c.runtimes.iter().any(|r| r == runtime));
    best(config, offering.map(|c| (c.worker_id, c.signals)), now, tie_break)
}

/// The best of `workers` (each already known to offer the runtime), in the order `rank` gives,
/// without sorting or copying the rest: one pass.
pub fn best(
    config: &HealthThresholds,
    workers: impl IntoIterator<Item = (i64, HealthSignals)>,
    now: DateTime<Utc>,
    mut tie_break: impl FnMut(i64) -> u64,
) -> Option<Ranked> {
    workers
        .into_iter()
        .filter_map(|(worker_id, signals)| eligible(config, worker_id, &signals, now))
        .map(|r| {
            let tie = tie_break(r.worker_id);
            (r, tie)
        })
        .min_by_key(|(r, tie)| order_key(r, *tie))
        .map(|(r, _)| r)
}

/// Whether a worker would take work if it had room: healthy or degraded by every signal but how
/// busy it is. A request waits (rather than fails) while a worker offering its runtime could.
/// A worker unhealthy by its failures alone could too: it gets a probe after its probation.
pub fn could_take_work(config: &HealthThresholds, signals: &HealthSignals, now: DateTime<Utc>) -> bool {
    classify(config, &HealthSignals { queue_depth: 0, ..*signals }, now) != HealthClass::Unhealthy
        || crate::health::may_be_probed(config, signals, now)
}

/// A worker offering the runtime, with its signals and how many more executions it has room for.
#[derive(Debug, Clone, PartialEq)]
pub struct Room {
    pub worker_id: i64,
    pub signals: HealthSignals,
    pub free: i64,
    /// An unhealthy worker on probation (`health::on_probation`): its one free slot is a probe,
    /// placed after every healthy and degraded worker's.
    pub probation: bool,
}

/// Places up to `limit` executions, one at a time, each on the best worker (in `rank`'s order)
/// that still has a free slot, counting what this plan already gave it in its queue depth.
/// Returns the chosen worker of each placement, in order; shorter than `limit` when the room
/// runs out.
pub fn plan(
    config: &HealthThresholds,
    mut rooms: Vec<Room>,
    limit: usize,
    now: DateTime<Utc>,
    mut tie_break: impl FnMut(i64) -> u64,
) -> Vec<i64> {
    let mut placed = Vec::new();
    while placed.len() < limit {
        let best = rooms
            .iter()
            .enumerate()
            .filter(|(_, room)| room.free > 0)
            .filter_map(|(i, room)| {
                let ranked = eligible(config, room.worker_id, &room.signals, now).or_else(|| {
                    // one probe at a time: only while nothing is in flight on it
                    (room.probation && room.signals.queue_depth == 0).then_some(Ranked {
                        worker_id: room.worker_id,
                        class: HealthClass::Unhealthy,
                        queue_depth: room.signals.queue_depth,
                    })
                });
                ranked.map(|r| (i, r))
            })
            .map(|(i, r)| {
                let tie = tie_break(r.worker_id);
                (i, r, tie)
            })
            .min_by_key(|(_, r, tie)| order_key(r, *tie))
            .map(|(i, _, _)| i);
        let Some(i) = best else { break };
        let room = &mut rooms[i];
        room.free -= 1;
        room.signals.queue_depth += 1;
        placed.push(room.worker_id);
    }
    placed
}

/// The share of its queue TTL that a dispatch may expect to wait at a worker before it starts.
pub const LOOKAHEAD_WAIT_SHARE: f64 = 0.25;

/// How many dispatches a worker takes ahead of the ones it runs (its slots are `concurrency`
/// plus this). Enough to keep it busy while the next dispatch travels (up to `max`,
/// `ATTUNE_WORKER_PREFETCH`), but never so many that, at its recent execution time, the last of
/// them would expect to wait longer than a quarter of the queue TTL: a dispatch held ahead waits
/// `lookahead × duration / concurrency`. Until the worker has timed an execution, as many as it
/// runs at once.
pub fn lookahead(concurrency: u16, max: u16, recent_duration_ms: Option<f64>, queue_ttl: std::time::Duration) -> u16 {
    let Some(duration_ms) = recent_duration_ms.filter(|d| d.is_finite() && *d >= 0.0) else {
        return concurrency.min(max);
    };
    let budget_ms = queue_ttl.as_secs_f64() * 1000.0 * LOOKAHEAD_WAIT_SHARE;
    let fits = f64::from(concurrency) * budget_ms / duration_ms.max(1.0);
    fits.floor().clamp(0.0, f64::from(max)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lookahead_keeps_held_work_well_inside_the_ttl() {
        let ttl = |secs| std::time::Duration::from_secs(secs);
        // (concurrency, max, recent duration ms, ttl, look-ahead)
        let table = [
            (4, 16, None, ttl(300), 4),         // nothing timed yet: as many as it runs
            (4, 2, None, ttl(300), 2),          // ... but never past the maximum
            (4, 16, Some(1.0), ttl(300), 16),   // fast actions: the whole maximum
            (4, 16, Some(0.0), ttl(300), 16),   // under a millisecond counts as one
            (2, 16, Some(5000.0), ttl(15), 1),  // 5 s actions, 2 at once, 15 s TTL: 3.75 s of waiting
            (4, 16, Some(1000.0), ttl(30), 16), // 1 s actions, 4 at once, 30 s TTL: 30 would fit
            (4, 16, Some(60_000.0), ttl(300), 5),
            (4, 16, Some(600_000.0), ttl(300), 0), // longer than the budget: nothing held ahead
            (4, 0, Some(1.0), ttl(300), 0),        // ATTUNE_WORKER_PREFETCH=0: never
            (4, 16, Some(f64::NAN), ttl(300), 4),
        ];
        for (concurrency, max, recent, queue_ttl, expected) in table {
            assert_eq!(
                lookahead(concurrency, max, recent, queue_ttl),
                expected,
                "{concurrency} {max} {recent:?} {queue_ttl:?}"
            );
            if let Some(d) = recent.filter(|d| *d >= 1.0) {
                let wait_ms = f64::from(expected) * d / f64::from(concurrency);
                assert!(wait_ms <= queue_ttl.as_secs_f64() * 1000.0 * LOOKAHEAD_WAIT_SHARE, "{wait_ms}");
            }
        }
    }
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
                last_failure_at: None,
            },
            slots: None,
            concurrency: None,
            run_ms: None,
            consuming: true,
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
            rank(&HealthThresholds::default(), &workers, "shell", now(), |_| 0).iter().map(|r| r.worker_id).collect();
        assert_eq!(order, vec![1, 2, 3]);
    }

    #[test]
    fn filters_by_runtime_and_reports_no_worker() {
        let workers = vec![worker(1, 0, 0, &["shell"])];
        let config = HealthThresholds::default();
        assert!(select(&config, &workers, "python", now(), |_| 0).is_none());
        assert_eq!(select(&config, &workers, "shell", now(), |_| 0).unwrap().worker_id, 1);
    }

    #[test]
    fn ties_are_broken_by_the_random_key() {
        let workers = vec![worker(1, 0, 3, &["shell"]), worker(2, 0, 3, &["shell"])];
        let config = HealthThresholds::default();
        let first = select(&config, &workers, "shell", now(), |id| if id == 2 { 0 } else { 1 });
        assert_eq!(first.unwrap().worker_id, 2);
        let first = select(&config, &workers, "shell", now(), |id| if id == 1 { 0 } else { 1 });
        assert_eq!(first.unwrap().worker_id, 1);
    }

    /// A small deterministic generator, so that the property tests below are repeatable.
    fn lcg(state: &mut u64) -> u64 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *state >> 33
    }

    fn random_worker(id: i64, state: &mut u64) -> Candidate {
        let runtimes: &[&str] = match lcg(state) % 3 {
            0 => &["shell"],
            1 => &["python"],
            _ => &["shell", "python"],
        };
        let mut w = worker(id, (lcg(state) % 12) as i64, (lcg(state) % 120) as i64, runtimes);
        w.signals.last_heartbeat = Some(now() - Duration::seconds((lcg(state) % 40) as i64));
        w.signals.total_executions = (lcg(state) % 20) as i64;
        w.signals.failed_executions = (lcg(state) % 20) as i64 % (w.signals.total_executions + 1);
        w
    }

    #[test]
    fn the_one_pass_choice_is_the_first_of_the_ranking() {
        let config = HealthThresholds::default();
        let mut state = 7;
        for round in 0..500 {
            let workers: Vec<Candidate> = (0..(round % 12)).map(|id| random_worker(id, &mut state)).collect();
            let salt = lcg(&mut state);
            let tie = |id: i64| (id as u64).wrapping_mul(salt) % 5;
            for runtime in ["shell", "python", "ruby"] {
                let ranked = rank(&config, &workers, runtime, now(), tie);
                assert_eq!(select(&config, &workers, runtime, now(), tie), ranked.first().cloned(), "{workers:?}");
            }
        }
    }

    /// The executor's shortlist leaves out workers that its reads alone make unhealthy: that is
    /// sound only because more queue depth and a later clock never make a worker's class better.
    #[test]
    fn more_queue_depth_and_a_later_clock_never_improve_a_class() {
        let config = HealthThresholds::default();
        let mut state = 11;
        for _ in 0..2000 {
            let base = random_worker(1, &mut state).signals;
            let later = HealthSignals { queue_depth: base.queue_depth + (lcg(&mut state) % 60) as i64, ..base };
            let then = now() + Duration::seconds((lcg(&mut state) % 40) as i64);
            assert!(classify(&config, &later, then) >= classify(&config, &base, now()), "{base:?} → {later:?}");
        }
    }

    fn room(id: i64, consecutive_failures: i64, queue_depth: i64, free: i64) -> Room {
        Room {
            worker_id: id,
            signals: worker(id, consecutive_failures, queue_depth, &["shell"]).signals,
            free,
            probation: false,
        }
    }

    #[test]
    fn a_plan_fills_free_slots_only_and_never_more() {
        let config = HealthThresholds::default();
        // worker 1 is full, 2 has two slots, 3 has one
        let rooms = vec![room(1, 0, 4, 0), room(2, 0, 2, 2), room(3, 0, 3, 1)];
        let placed = plan(&config, rooms.clone(), 10, now(), |_| 0);
        let count = |id| placed.iter().filter(|w| **w == id).count();
        assert_eq!((placed.len(), count(1), count(2), count(3)), (3, 0, 2, 1), "{placed:?}");
        assert_eq!(plan(&config, rooms, 2, now(), |_| 0).len(), 2, "the limit bounds the plan");
    }

    #[test]
    fn a_plan_keeps_the_seed_order_among_workers_with_room() {
        let config = HealthThresholds::default();
        // healthy by queue depth, then degraded; unhealthy never, room or not
        let rooms = vec![room(4, 10, 0, 5), room(3, 3, 0, 5), room(2, 0, 20, 1), room(1, 0, 5, 1)];
        assert_eq!(plan(&config, rooms, 10, now(), |_| 0), vec![1, 2, 3, 3, 3, 3, 3]);
    }

    #[test]
    fn a_plan_spreads_a_batch_by_queue_depth() {
        let config = HealthThresholds::default();
        let rooms = vec![room(1, 0, 0, 8), room(2, 0, 0, 8)];
        let placed = plan(&config, rooms, 8, now(), |id| id as u64);
        assert_eq!(placed.iter().filter(|w| **w == 1).count(), 4, "{placed:?}");
    }

    #[test]
    fn a_busy_worker_could_take_work_and_a_failing_one_could_not() {
        let config = HealthThresholds::default();
        assert!(could_take_work(&config, &worker(1, 0, 500, &["shell"]).signals, now()));
        assert!(!could_take_work(&config, &worker(1, 10, 0, &["shell"]).signals, now()));
        // failing, but it said when: it is probed after its probation, so requests wait for it
        let mut probed = worker(1, 10, 0, &["shell"]);
        probed.signals.last_failure_at = Some(now() - Duration::seconds(5));
        assert!(could_take_work(&config, &probed.signals, now()));
    }

    #[test]
    fn a_probe_goes_to_a_worker_on_probation_only_when_nobody_better_has_room() {
        let config = HealthThresholds::default();
        let mut on_probation = room(3, 10, 0, 4);
        on_probation.probation = true;
        let placed = plan(&config, vec![on_probation.clone(), room(1, 0, 0, 2)], 4, now(), |id| id as u64);
        assert_eq!(placed, [1, 1, 3], "the healthy worker's slots first, then one probe");
        let placed = plan(&config, vec![on_probation.clone()], 4, now(), |id| id as u64);
        assert_eq!(placed, [3], "one probe at a time");
        let placed = plan(&config, vec![room(3, 10, 0, 4)], 4, now(), |id| id as u64);
        assert!(placed.is_empty(), "never an unhealthy worker that is not on probation");
    }
}
