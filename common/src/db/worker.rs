//! The worker table: registration, heartbeats, and the view of workers the scheduler ranks.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;

use attune_core::health::{HealthSignals, HealthThresholds, classify};
use attune_core::selection::Candidate;

/// Registers the worker called `name` (keeping its id if it registered before) and returns its id.
/// It stays `inactive`, so nothing is dispatched to it, until its first heartbeat: by then its
/// queue exists and its capabilities are known.
pub async fn register(db: &PgPool, name: &str, capabilities: &Value) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO worker (name, status, capabilities) VALUES ($1, 'inactive', $2) \
         ON CONFLICT (name) DO UPDATE SET status = 'inactive', capabilities = $2, updated = now() \
         RETURNING id",
    )
    .bind(name)
    .bind(capabilities)
    .fetch_one(db)
    .await
}

/// The process that holds a worker name: it registered it last and heartbeats under it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Instance {
    pub host: String,
    pub pid: u32,
    /// The kernel's boot id and the process's pid namespace: with the host name, they say
    /// whether a pid can be checked from here (the same machine, since the same boot, in the
    /// same pid namespace; containers sharing a host name do not share pids).
    #[serde(default)]
    pub boot: String,
    #[serde(default)]
    pub pid_ns: String,
}

impl Instance {
    /// Whether `other` ran where this process can see its pid.
    fn same_pid_space(&self, other: &Instance) -> bool {
        !self.boot.is_empty() && self.host == other.host && self.boot == other.boot && self.pid_ns == other.pid_ns
    }
}

/// The answer to a process that asks for a worker name.
#[derive(Debug, Clone, PartialEq)]
pub enum NameClaim {
    /// The name is this process's: the worker's id.
    Claimed(i64),
    /// Another worker login registered it (a worker's login takes over only its own names).
    OtherLogin { login: String },
    /// A live process holds it: who (if it said), and how old its last heartbeat is.
    Held { holder: Option<Instance>, heartbeat_age_secs: f64 },
}

/// Whether a worker name's holder still holds it (pure): it has not stopped, its heartbeat is
/// younger than `max_age_secs`, and it is not a dead process of this host (a worker restarted
/// after a crash takes its name back at once; the same pid in the same pid space is this process's
/// own earlier life, as in a container that restarted).
pub fn still_held(
    status: &str,
    heartbeat_age_secs: Option<f64>,
    max_age_secs: f64,
    holder: Option<&Instance>,
    me: &Instance,
    alive: impl Fn(u32) -> bool,
) -> bool {
    let fresh = heartbeat_age_secs.is_some_and(|age| age < max_age_secs);
    let dead_here = holder.is_some_and(|h| me.same_pid_space(h) && (h.pid == me.pid || !alive(h.pid)));
    status != "inactive" && fresh && !dead_here
}

/// A worker name's row as `claim_name` reads it: id, status, holder, heartbeat age (s), updated,
/// the login that registered it, and whether this session's login may take it over.
type NameRow = (i64, String, Option<Value>, Option<f64>, DateTime<Utc>, String, bool);

/// Registers the worker called `name` for this process (keeping its id if the name was used
/// before), unless a live process holds the name (`still_held`). It stays `inactive`, so nothing
/// is dispatched to it, until its first heartbeat: by then its queue exists and its capabilities
/// are known. Of two processes claiming a free name at once, the second takes it (the first has
/// not heartbeated yet) and the first, fenced out at its first heartbeat, stops: one process wins.
pub async fn claim_name(
    db: &PgPool,
    name: &str,
    me: &Instance,
    max_age: std::time::Duration,
    alive: impl Fn(u32) -> bool,
) -> Result<NameClaim, sqlx::Error> {
    let capabilities = serde_json::json!({ "instance": me });
    loop {
        // a worker login may take over only a name its own login registered, or one registered
        // by a login that is not a worker's (the row-level security of the worker table)
        let existing: Option<NameRow> = sqlx::query_as(
            "SELECT id, status, capabilities->'instance', EXTRACT(EPOCH FROM now() - last_heartbeat)::float8, updated, \
                    login::text, login = session_user OR NOT worker_login(login) OR NOT worker_login(session_user) \
             FROM worker WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(db)
        .await?;
        let Some((id, status, holder, age, seen, login, ours)) = existing else {
            let inserted: Option<i64> = sqlx::query_scalar(
                "INSERT INTO worker (name, status, capabilities) VALUES ($1, 'inactive', $2) \
                 ON CONFLICT (name) DO NOTHING RETURNING id",
            )
            .bind(name)
            .bind(&capabilities)
            .fetch_optional(db)
            .await?;
            match inserted {
                Some(id) => return Ok(NameClaim::Claimed(id)),
                None => continue,
            }
        };
        if !ours {
            return Ok(NameClaim::OtherLogin { login });
        }
        let holder: Option<Instance> = holder.and_then(|h| serde_json::from_value(h).ok());
        if still_held(&status, age, max_age.as_secs_f64(), holder.as_ref(), me, &alive) {
            return Ok(NameClaim::Held { holder, heartbeat_age_secs: age.unwrap_or_default() });
        }
        // taken only if nobody changed the row since it was read
        let taken: Option<i64> = sqlx::query_scalar(
            "UPDATE worker SET status = 'inactive', capabilities = $2, updated = now(), login = session_user \
             WHERE id = $1 AND updated = $3 RETURNING id",
        )
        .bind(id)
        .bind(&capabilities)
        .bind(seen)
        .fetch_optional(db)
        .await?;
        if let Some(id) = taken {
            return Ok(NameClaim::Claimed(id));
        }
    }
}

/// Records a heartbeat: the worker is `active` from its first one on, except that a worker that
/// is stopping (`capabilities.draining`, or already `draining`) stays draining until it stops.
/// Fenced by the process that holds the name (`capabilities.instance`, when given): `false`
/// when another process has taken it over.
pub async fn heartbeat(db: &PgPool, worker_id: i64, capabilities: &Value) -> Result<bool, sqlx::Error> {
    sqlx::query(
        "UPDATE worker SET capabilities = $2, last_heartbeat = now(), updated = now(), \
            status = CASE WHEN status = 'draining' OR ($2->>'draining')::boolean THEN 'draining' ELSE 'active' END \
         WHERE id = $1 AND ($2->'instance' IS NULL OR capabilities->'instance' IS NULL \
            OR capabilities->'instance' = $2->'instance')",
    )
    .bind(worker_id)
    .bind(capabilities)
    .execute(db)
    .await
    .map(|done| done.rows_affected() == 1)
}

/// The worker is stopping: no executor dispatches to it from its next read of the fleet on.
pub async fn drain(db: &PgPool, worker_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE worker SET status = 'draining', updated = now() WHERE id = $1")
        .bind(worker_id)
        .execute(db)
        .await
        .map(|_| ())
}

pub async fn deactivate(db: &PgPool, worker_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE worker SET status = 'inactive', updated = now() WHERE id = $1")
        .bind(worker_id)
        .execute(db)
        .await
        .map(|_| ())
}

/// Records the broker user worker `worker_id` publishes live output as (`mq::broker_user`).
pub async fn record_broker_user(db: &PgPool, worker_id: i64, broker_user: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE worker SET broker_user = $2 WHERE id = $1")
        .bind(worker_id)
        .bind(broker_user)
        .execute(db)
        .await
        .map(|_| ())
}

/// The broker user of the worker execution `execution_id` runs on, when it is running and that
/// worker recorded one: the only `user_id` a follower believes live output from.
pub async fn broker_user_running(db: &PgPool, execution_id: i64) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT w.broker_user FROM execution e JOIN worker w ON w.id = e.worker \
         WHERE e.id = $1 AND e.status = 'running'",
    )
    .bind(execution_id)
    .fetch_optional(db)
    .await
    .map(Option::flatten)
}

/// The queue a worker of this name declared last time it ran, if it ever did.
pub async fn queue_of(db: &PgPool, name: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT capabilities->>'queue' FROM worker WHERE name = $1")
        .bind(name)
        .fetch_optional(db)
        .await
        .map(Option::flatten)
}

/// How many of the named workers are active with a heartbeat at or after `since`.
pub async fn active_since(db: &PgPool, names: &[String], since: DateTime<Utc>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM worker WHERE name = ANY($1) AND status = 'active' AND updated >= $2")
        .bind(names)
        .bind(since)
        .fetch_one(db)
        .await
}

/// Marks inactive the workers whose heartbeat is older than `max_age` (or that never sent one):
/// evidence that they are gone, where expired work alone is not. `only`: that worker alone (the
/// dead-letter handler's check), else every such worker (the monitor's sweep). Returns their ids.
pub async fn deactivate_silent(
    db: &PgPool,
    only: Option<i64>,
    max_age: std::time::Duration,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE worker SET status = 'inactive', updated = now() WHERE status <> 'inactive' \
         AND ($2::bigint IS NULL OR id = $2) \
         AND (last_heartbeat IS NULL OR last_heartbeat < now() - make_interval(secs => $1)) \
         AND fence_open($1) RETURNING id",
    )
    .bind(max_age.as_secs_f64())
    .bind(only)
    .fetch_all(db)
    .await
}

/// Records that a dispatch to the worker was lost though it heartbeats: no executor dispatches
/// to it for `for_` (its heartbeats do not end that; see `not_receiving_until`).
pub async fn not_receiving(db: &PgPool, worker_id: i64, for_: std::time::Duration) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE worker SET not_receiving_until = now() + make_interval(secs => $2) WHERE id = $1")
        .bind(worker_id)
        .bind(for_.as_secs_f64())
        .execute(db)
        .await
        .map(|_| ())
}

/// Records that the worker is not consuming (a dispatch expired in its queue): no executor
/// dispatches to it until its next heartbeat says otherwise. Its status is left alone.
pub async fn mark_not_consuming(db: &PgPool, worker_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE worker SET capabilities = jsonb_set(capabilities, '{consuming}', 'false'), updated = now() \
         WHERE id = $1",
    )
    .bind(worker_id)
    .execute(db)
    .await
    .map(|_| ())
}

#[derive(Debug, Clone, sqlx::FromRow)]
struct WorkerRow {
    id: i64,
    name: String,
    status: String,
    capabilities: Value,
    last_heartbeat: Option<DateTime<Utc>>,
    /// Dispatched and not yet finished.
    inflight: i64,
    /// Until when a dispatch lost on its way to this worker has it passed over, when it does now.
    not_receiving_until: Option<DateTime<Utc>>,
    /// When an operator drained it (it is dispatched nothing new), if one did.
    drained_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
}

const WORKER_ROWS: &str = "SELECT w.id, w.name, w.status, w.capabilities, w.last_heartbeat, \
        COALESCE(q.inflight, 0) AS inflight, \
        CASE WHEN w.not_receiving_until > now() THEN w.not_receiving_until END AS not_receiving_until, \
        w.drained_at, now() AS now \
    FROM worker w \
    LEFT JOIN worker_inflight_counts() q ON q.worker = w.id";

impl WorkerRow {
    fn signals(&self) -> HealthSignals {
        let health = &self.capabilities["health"];
        let int = |field: &str| health[field].as_i64().unwrap_or(0);
        // as `worker_health_class`: the recent window's counts, else the lifetime ones
        let recent = |field: &str, lifetime: &str| health[field].as_i64().unwrap_or_else(|| int(lifetime));
        HealthSignals {
            last_heartbeat: self.last_heartbeat,
            consecutive_failures: int("consecutive_failures"),
            total_executions: recent("recent_executions", "total_executions"),
            failed_executions: recent("recent_failed_executions", "failed_executions"),
            last_failure_at: health["last_failure_at"].as_str().and_then(|at| at.parse().ok()),
            // as `get_worker_queue_depth`: what was dispatched and has not finished, or what the
            // worker reported if that is more
            queue_depth: self.inflight.max(int("queue_depth")),
        }
    }

    /// How many executions the worker takes at once, started or not (its concurrency plus its
    /// look-ahead); `None` for a worker that does not say (an earlier version).
    fn slots(&self) -> Option<i64> {
        self.capabilities["slots"].as_i64()
    }

    /// Whether the worker's consumer is up; a worker that does not say is taken to be consuming.
    fn consuming(&self) -> bool {
        self.capabilities["consuming"].as_bool().unwrap_or(true)
    }

    fn runtimes(&self) -> Vec<String> {
        self.capabilities["runtimes"]
            .as_array()
            .map(|list| list.iter().filter_map(|r| r.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    }
}

/// Whether a worker offering `runtime` is draining with a heartbeat younger than `max_age`: it
/// finishes its runs before it stops or restarts, and a request for the runtime waits for it (or
/// its return) rather than counting as placed nowhere.
pub async fn draining_offers(db: &PgPool, runtime: &str, max_age: std::time::Duration) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM worker WHERE status = 'draining' \
         AND last_heartbeat > now() - make_interval(secs => $2) AND capabilities->'runtimes' ? $1)",
    )
    .bind(runtime)
    .bind(max_age.as_secs_f64())
    .fetch_one(db)
    .await
}

/// Whether an active worker runs without the secrets key (`capabilities.opens_secrets: false`):
/// only then may a request that needs the key wait with no worker to take it.
pub async fn any_keyless(db: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM worker WHERE status = 'active' AND NOT worker_opens_secrets(capabilities))",
    )
    .fetch_one(db)
    .await
}

/// Those of `workers` that run without the secrets key (`worker_opens_secrets`).
pub async fn keyless_among(db: &PgPool, workers: &[i64]) -> Result<std::collections::HashSet<i64>, sqlx::Error> {
    let ids: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM worker WHERE id = ANY($1) AND NOT worker_opens_secrets(capabilities)")
            .bind(workers)
            .fetch_all(db)
            .await?;
    Ok(ids.into_iter().collect())
}

/// Active workers as scheduling candidates, with their in-flight counts and the database's clock.
pub async fn candidates(db: &PgPool) -> Result<(Vec<Candidate>, DateTime<Utc>), sqlx::Error> {
    let mut candidates = fleet(db).await?;
    let (counts, now) = inflight(db).await?;
    add_inflight(&mut candidates, &counts);
    Ok((candidates, now))
}

/// Active workers with what they reported (queue depth: their own report only; whether their
/// consumer is up), without the in-flight counts: the part of the scheduling picture that may be
/// cached briefly. Draining and inactive workers are not candidates.
pub async fn fleet(db: &PgPool) -> Result<Vec<Candidate>, sqlx::Error> {
    let rows: Vec<WorkerRow> = sqlx::query_as(
        "SELECT w.id, w.name, w.status, w.capabilities, w.last_heartbeat, 0::bigint AS inflight, \
            NULL::timestamptz AS not_receiving_until, NULL::timestamptz AS drained_at, now() AS now \
         FROM worker w WHERE w.status = 'active' AND w.drained_at IS NULL",
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .iter()
        .map(|row| Candidate {
            worker_id: row.id,
            name: row.name.clone(),
            runtimes: row.runtimes(),
            signals: row.signals(),
            slots: row.slots(),
            concurrency: row.capabilities["concurrency"].as_i64(),
            run_ms: row.capabilities["recent_execution_time_ms"].as_f64().filter(|ms| ms.is_finite() && *ms >= 0.0),
            consuming: row.consuming(),
        })
        .collect())
}

/// A worker's queue depth, as `get_worker_queue_depth`: what was dispatched to it and has not
/// finished, or what it reported if that is more.
pub fn add_inflight(candidates: &mut [Candidate], inflight: &std::collections::HashMap<i64, i64>) {
    for candidate in candidates {
        candidate.signals = with_inflight(candidate, inflight);
    }
}

/// One candidate's signals with its in-flight count merged in (see `add_inflight`).
pub fn with_inflight(candidate: &Candidate, inflight: &std::collections::HashMap<i64, i64>) -> HealthSignals {
    let dispatched = inflight.get(&candidate.worker_id).copied().unwrap_or(0);
    HealthSignals { queue_depth: candidate.signals.queue_depth.max(dispatched), ..candidate.signals }
}

/// Executions dispatched and not finished, per worker, with the database's clock: one indexed
/// read whose cost follows the work in flight, not the size of the fleet.
pub async fn inflight(db: &PgPool) -> Result<(std::collections::HashMap<i64, i64>, DateTime<Utc>), sqlx::Error> {
    let read = in_flight(db).await?;
    Ok((read.counts, read.now))
}

/// What is in flight on each worker, the database's clock, and the workers passed over now for a
/// dispatch lost on its way to them (`not_receiving`), read fresh for every scheduling picture in
/// one round trip (the fleet may be cached, and a lost dispatch handed back is scheduled again at
/// once: from a cached fleet it could go straight back).
pub struct InFlight {
    pub counts: std::collections::HashMap<i64, i64>,
    pub now: DateTime<Utc>,
    pub not_receiving: Vec<i64>,
}

pub async fn in_flight(db: &PgPool) -> Result<InFlight, sqlx::Error> {
    let (now, counts, not_receiving): (DateTime<Utc>, Value, Vec<i64>) = sqlx::query_as(
        "SELECT now(), (SELECT COALESCE(jsonb_object_agg(worker, inflight), '{}') FROM worker_inflight_counts()), \
            ARRAY(SELECT id FROM worker WHERE not_receiving_until > now())",
    )
    .fetch_one(db)
    .await?;
    let counts = counts
        .as_object()
        .map(|map| map.iter().filter_map(|(k, v)| Some((k.parse().ok()?, v.as_i64()?))).collect())
        .unwrap_or_default();
    Ok(InFlight { counts, now, not_receiving })
}

/// A worker as the API and CLI show it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct WorkerView {
    pub id: i64,
    pub name: String,
    pub status: String,
    /// The class the scheduler computes now: healthy, degraded or unhealthy.
    #[schema(value_type = String)]
    pub health: &'static str,
    pub queue_depth: i64,
    pub heartbeat_age_secs: Option<f64>,
    pub last_heartbeat: Option<DateTime<Utc>>,
    pub runtimes: Vec<String>,
    /// As reported: runtimes, concurrency, queue, health {status, last_check, consecutive_failures,
    /// total_executions, failed_executions, average_execution_time_ms, queue_depth}.
    #[schema(value_type = Object)]
    pub capabilities: Value,
    /// Set while a dispatch lost on its way to this worker, though it heartbeats, has executors
    /// send it nothing unless no other worker of its runtimes could take work (it may be cut
    /// off from the broker alone): until when.
    pub not_receiving_until: Option<DateTime<Utc>>,
    /// When an operator drained it: it is dispatched nothing new until undrained.
    pub drained_at: Option<DateTime<Utc>>,
}

pub async fn list(db: &PgPool, config: &HealthThresholds) -> Result<Vec<WorkerView>, sqlx::Error> {
    let rows: Vec<WorkerRow> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("{WORKER_ROWS} ORDER BY w.name"))).fetch_all(db).await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let signals = row.signals();
            WorkerView {
                id: row.id,
                health: classify(config, &signals, row.now).as_str(),
                queue_depth: signals.queue_depth,
                heartbeat_age_secs: row.last_heartbeat.map(|at| (row.now - at).num_milliseconds() as f64 / 1000.0),
                runtimes: row.runtimes(),
                name: row.name,
                status: row.status,
                last_heartbeat: row.last_heartbeat,
                capabilities: row.capabilities,
                not_receiving_until: row.not_receiving_until,
                drained_at: row.drained_at,
            }
        })
        .collect())
}

/// Drains (`by`: the token) or undrains (`None`) the worker named `name`; its row as the API
/// shows it, `None` when there is no such worker.
pub async fn set_drained(
    db: &PgPool,
    config: &HealthThresholds,
    name: &str,
    by: Option<i64>,
) -> Result<Option<WorkerView>, sqlx::Error> {
    let updated = sqlx::query(
        "UPDATE worker SET drained_at = CASE WHEN $2::bigint IS NULL THEN NULL ELSE COALESCE(drained_at, now()) END, \
            drained_by = $2 WHERE name = $1",
    )
    .bind(name)
    .bind(by)
    .execute(db)
    .await?;
    if updated.rows_affected() == 0 {
        return Ok(None);
    }
    Ok(list(db, config).await?.into_iter().find(|w| w.name == name))
}

/// Writes the thresholds the executor runs with, so the SQL view classifies as it does.
pub async fn store_health_config(db: &PgPool, c: &HealthThresholds) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE health_probe_config SET heartbeat_max_age_secs = $1, degraded_threshold = $2, \
            unhealthy_threshold = $3, queue_depth_degraded = $4, queue_depth_unhealthy = $5, \
            failure_rate_degraded = $6, failure_rate_unhealthy = $7, failure_rate_min_executions = $8, \
            enabled = $9",
    )
    .bind(c.heartbeat_max_age_secs as i32)
    .bind(c.degraded_threshold as i32)
    .bind(c.unhealthy_threshold as i32)
    .bind(c.queue_depth_degraded as i32)
    .bind(c.queue_depth_unhealthy as i32)
    .bind(c.failure_rate_degraded)
    .bind(c.failure_rate_unhealthy)
    .bind(c.failure_rate_min_executions as i32)
    .bind(c.enabled)
    .execute(db)
    .await
    .map(|_| ())
}

/// The executors' global retry settings, as the last executor to start wrote them.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct StoredRetryConfig {
    pub enabled: bool,
    pub base_backoff_secs: f64,
    pub max_backoff_secs: f64,
    pub backoff_multiplier: f64,
    pub jitter_factor: f64,
    pub updated: DateTime<Utc>,
}

/// Writes the executor's retry settings where SQL and the API read them (`retry_config`).
pub async fn store_retry_config(db: &PgPool, c: &attune_core::retry::RetrySettings) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE retry_config SET enabled = $1, base_backoff_secs = $2, max_backoff_secs = $3, \
            backoff_multiplier = $4, jitter_factor = $5, updated = now()",
    )
    .bind(c.enabled)
    .bind(c.base_backoff_secs)
    .bind(c.max_backoff_secs)
    .bind(c.backoff_multiplier)
    .bind(c.jitter_factor)
    .execute(db)
    .await
    .map(|_| ())
}

/// The retry settings in force (see `store_retry_config`).
pub async fn retry_config(db: &PgPool) -> Result<StoredRetryConfig, sqlx::Error> {
    sqlx::query_as(
        "SELECT enabled, base_backoff_secs, max_backoff_secs, backoff_multiplier, jitter_factor, updated FROM retry_config",
    )
    .fetch_one(db)
    .await
}

/// The health thresholds in force, as the executors wrote them (`health_probe_config`).
pub async fn health_config(db: &PgPool) -> Result<serde_json::Value, sqlx::Error> {
    sqlx::query_scalar("SELECT to_jsonb(c) - 'singleton' FROM health_probe_config c").fetch_one(db).await
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn a_name_is_held_by_a_live_process_with_a_fresh_heartbeat_only() {
        let instance =
            |host: &str, pid: u32| Instance { host: host.into(), pid, boot: "b1".into(), pid_ns: "ns1".into() };
        let me = instance("h1", 100);
        let other_host = instance("h2", 7);
        let here = instance("h1", 7);
        let other_container = Instance { pid_ns: "ns2".into(), ..here.clone() };
        let before_reboot = Instance { boot: "b0".into(), ..here.clone() };
        let alive = |pid: u32| pid == 7;
        let dead = |_: u32| false;
        assert!(still_held("active", Some(3.0), 30.0, Some(&other_host), &me, alive));
        assert!(still_held("draining", Some(3.0), 30.0, Some(&here), &me, alive), "a live process here");
        assert!(!still_held("active", Some(3.0), 30.0, Some(&here), &me, dead), "a dead process here");
        assert!(
            !still_held("active", Some(3.0), 30.0, Some(&Instance { pid: 100, ..here.clone() }), &me, alive),
            "this pid on this host is this process's earlier life"
        );
        assert!(!still_held("active", Some(30.0), 30.0, Some(&other_host), &me, alive), "a stale heartbeat");
        assert!(!still_held("active", None, 30.0, Some(&other_host), &me, alive), "never heartbeated");
        assert!(!still_held("inactive", Some(1.0), 30.0, Some(&other_host), &me, alive), "stopped");
        assert!(still_held("active", Some(1.0), 30.0, None, &me, alive), "an older worker that does not say who");
        let dead = |_: u32| false;
        assert!(
            still_held("active", Some(1.0), 30.0, Some(&other_container), &me, dead),
            "its pid is not ours to check"
        );
        assert!(still_held("active", Some(1.0), 30.0, Some(&before_reboot), &me, dead), "another boot's pid");
    }
}

/// The runtimes the session's login may serve (`worker_login_runtime`): `None` when it is not a
/// worker login (the owner, a single-role set-up), which row-level security does not bound.
pub async fn granted_runtimes(db: &PgPool) -> Result<Option<Vec<String>>, sqlx::Error> {
    let (worker_login, granted): (bool, Vec<String>) = sqlx::query_as(
        "SELECT worker_login(session_user), COALESCE(array_agg(runtime ORDER BY runtime), '{}') \
         FROM worker_login_runtime WHERE login = session_user",
    )
    .fetch_one(db)
    .await?;
    Ok(worker_login.then_some(granted))
}

/// One login's grant of runtimes, as `attune worker-login list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct RuntimeGrant {
    pub login: String,
    pub runtimes: Vec<String>,
    /// whether the login exists and is a member of attune_worker
    pub worker_login: bool,
}

/// Every login's grant of runtimes, by login.
pub async fn runtime_grants(db: &PgPool) -> Result<Vec<RuntimeGrant>, sqlx::Error> {
    sqlx::query_as(
        "SELECT login::text AS login, array_agg(runtime ORDER BY runtime) AS runtimes, worker_login(login) AS worker_login \
         FROM worker_login_runtime GROUP BY login ORDER BY login",
    )
    .fetch_all(db)
    .await
}

/// Lets `login` serve `runtimes` (the schema's owner only); how many were new.
pub async fn allow_runtimes(db: &PgPool, login: &str, runtimes: &[String]) -> Result<u64, sqlx::Error> {
    sqlx::query(
        "INSERT INTO worker_login_runtime (login, runtime) SELECT $1, r FROM unnest($2::text[]) AS r \
         ON CONFLICT DO NOTHING",
    )
    .bind(login)
    .bind(runtimes)
    .execute(db)
    .await
    .map(|done| done.rows_affected())
}

/// Takes back `runtimes` from `login` (all of them when empty); how many went.
pub async fn deny_runtimes(db: &PgPool, login: &str, runtimes: &[String]) -> Result<u64, sqlx::Error> {
    sqlx::query(
        "DELETE FROM worker_login_runtime WHERE login = $1 AND (cardinality($2::text[]) = 0 OR runtime = ANY($2))",
    )
    .bind(login)
    .bind(runtimes)
    .execute(db)
    .await
    .map(|done| done.rows_affected())
}
