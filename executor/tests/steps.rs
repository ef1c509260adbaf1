//! The executor's steps driven one at a time against the real PostgreSQL (and a broker namespace
//! of the test's own, which these steps only connect to): a monitor pass, a retry-timer pass and
//! the recording of a result, each checked in the record. No worker or scheduler loop runs, so
//! each test says exactly which step did what.

use std::time::Duration;

use attune_common::config::CommonSettings;
use attune_common::db::{self, execution::NewExecution, execution::Transition};
use attune_common::mq::{ExecutionResult, Publisher, ResultStatus, Topology};
use attune_core::ExecutionStatus::{self, *};
use attune_core::FailureKind;
use attune_core::health::HealthThresholds;
use attune_core::retention::{Age, Retention};
use attune_core::retry::RetrySettings;
use attune_executor::history::{self, HistorySettings};
use attune_executor::{Context, Settings, completion, monitor, retry_timer, scheduler};
use attune_testkit::{Namespace, TestDb};
use serde_json::json;

struct Step {
    context: Context,
    db: TestDb,
    namespace: Namespace,
    action: db::action::Action,
}

impl Step {
    async fn new() -> Step {
        let db = TestDb::new().await;
        let namespace = Namespace::new();
        let packs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs/core");
        db::pack::register(&db.pool, &attune_common::pack::load_pack(&packs).unwrap()).await.unwrap();
        let action = db::action::get_by_ref(&db.pool, "core.echo").await.unwrap().unwrap();
        let settings = Settings {
            common: CommonSettings {
                database_url: db.url.clone(),
                amqp_url: attune_testkit::amqp_url(),
                mq_namespace: namespace.name.clone(),
                packs_dir: packs.clone(),
                default_timeout_secs: 300,
            },
            health: HealthThresholds::default(),
            // backoff of a few milliseconds, no jitter: a retry is due as soon as it exists
            retry: RetrySettings {
                base_backoff_secs: 0.001,
                max_backoff_secs: 0.001,
                jitter_factor: 0.0,
                ..Default::default()
            },
            retry_poll: Duration::from_millis(100),
            prefetch: 8,
            worker_queue_ttl: Duration::from_secs(60),
            worker_wait: Duration::from_secs(30),
            worker_cache: Duration::ZERO,
            inflight_cache: Duration::from_millis(10),
            action_cache_ttl: Duration::from_secs(5),
            monitor_interval: Duration::from_secs(5),
            scheduling_timeout: Duration::from_secs(30),
            running_grace: Duration::from_secs(30),
            probation: Duration::from_secs(60),
            history: HistorySettings {
                retention: Retention::default(),
                workers: Age::days(7),
                audit: Age::days(365),
                archive: false,
                interval: Duration::from_secs(30),
                batch: 500,
            },
        };
        let topology = Topology::new(&namespace.name, settings.worker_queue_ttl);
        let context = Context {
            db: db.pool.clone(),
            health_probe: attune_executor::health_probe::WorkerHealthProbe::new(
                db.pool.clone(),
                settings.health.clone(),
            ),
            retry_manager: attune_executor::retry_manager::RetryManager::new(db.pool.clone(), settings.retry.clone()),
            waiting: Default::default(),
            dispatches: tokio_util::task::TaskTracker::new(),
            actions: db::action::ActionCache::new(settings.action_cache_ttl),
            publisher: Publisher::new(&settings.common.amqp_url, "attune-step-test", topology),
            fence: attune_executor::fence::Judging::new(settings.health.heartbeat_max_age()),
            workflows: Default::default(),
            settings,
        };
        // the monitor runs alone here: the database's record of the pulses says it may judge
        // for the test's length (an executor's fence loop keeps it so, a pulse a second)
        sqlx::query(
            "UPDATE fence SET pulsed_at = clock_timestamp() + interval '1 hour', \
             writable_since = clock_timestamp() - interval '1 hour'",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        Step { context, db, namespace, action }
    }

    fn pool(&self) -> &sqlx::PgPool {
        &self.db.pool
    }

    /// A worker that heartbeated just now.
    async fn worker(&self, name: &str) -> i64 {
        let id = db::worker::register(self.pool(), name, &json!({})).await.unwrap();
        db::worker::heartbeat(self.pool(), id, &json!({"runtimes": ["shell"], "slots": 8})).await.unwrap();
        id
    }

    /// A request of `core.echo` with `max_retries`, taken to `status` on `worker`.
    async fn execution(&self, status: ExecutionStatus, worker: i64, max_retries: i32) -> i64 {
        let new =
            NewExecution { runtime: Some("shell".into()), max_retries, ..attune_testkit::echo_execution(&self.action) };
        let id = db::execution::insert(self.pool(), &new).await.unwrap().id;
        let path: &[ExecutionStatus] = match status {
            Requested => &[],
            Scheduled => &[Scheduled],
            Running => &[Scheduled, Running],
            other => panic!("no path to {other} here"),
        };
        for to in path {
            let transition = match to {
                Scheduled => Transition::to(Scheduled).assign_worker(worker),
                _ => Transition::to(*to).owned_by(worker),
            };
            db::execution::transition(self.pool(), id, &transition).await.unwrap().expect("moved");
        }
        id
    }

    async fn get(&self, id: i64) -> db::execution::Execution {
        db::execution::get(self.pool(), id).await.unwrap().unwrap()
    }

    /// Ages a row or a heartbeat (the test's stand-in for the passing of time).
    async fn age(&self, sql: &str, id: i64) {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_string())).bind(id).execute(self.pool()).await.unwrap();
    }

    async fn stop(self) {
        self.namespace.delete(&[]).await;
        self.db.drop_database().await;
    }
}

#[tokio::test]
async fn a_monitor_pass_hands_back_a_dead_workers_dispatch_and_fails_its_run() {
    let step = Step::new().await;
    let dead = step.worker("dead").await;
    let dispatched = step.execution(Scheduled, dead, 3).await;
    let running = step.execution(Running, dead, 3).await;
    step.age("UPDATE worker SET last_heartbeat = now() - interval '1 hour' WHERE id = $1", dead).await;

    assert!(monitor::tick(&step.context, true).await.unwrap(), "the monitor holds its lock");

    let handed_back = step.get(dispatched).await;
    assert_eq!((handed_back.status, handed_back.worker, handed_back.retry_count), (Requested, None, 0));
    assert!(db::execution::retry_of(step.pool(), dispatched).await.unwrap().is_none(), "no retry spent");
    let failed = step.get(running).await;
    assert_eq!((failed.status, failed.failure_kind), (Failed, Some(FailureKind::WorkerHeartbeatStale)));
    let retry = db::execution::retry_of(step.pool(), running).await.unwrap().expect("a retry");
    assert_eq!((retry.status, retry.retry_count), (Delayed, 1));
    let status: String =
        sqlx::query_scalar("SELECT status FROM worker WHERE id = $1").bind(dead).fetch_one(step.pool()).await.unwrap();
    assert_eq!(status, "inactive");

    // a second pass finds nothing more to do
    assert!(monitor::tick(&step.context, true).await.unwrap());
    assert_eq!(db::execution::chain(step.pool(), running).await.unwrap().len(), 2);
    assert_eq!(step.get(dispatched).await.status, Requested);
    step.stop().await;
}

#[tokio::test]
async fn one_executor_at_a_time_removes_old_history_and_counts_it_into_the_rollup() {
    let step = Step::new().await;
    let worker = step.worker("w").await;
    let old = step.execution(Running, worker, 0).await;
    let young = step.execution(Running, worker, 0).await;
    let outcome = db::execution::Outcome::default();
    for id in [old, young] {
        let done = Transition::completion(worker, &outcome);
        db::execution::transition(step.pool(), id, &done).await.unwrap().expect("completed");
    }
    step.age(
        "UPDATE execution SET created = now() - interval '9 days', finished = now() - interval '8 days' WHERE id = $1",
        old,
    )
    .await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut progress = history::Progress::default();

    // another executor holds the job: this one does nothing
    let mut other = step.pool().acquire().await.unwrap();
    assert!(db::try_advisory_lock(&mut other, history::HISTORY_LOCK).await.unwrap());
    assert_eq!(history::tick(&step.context, &shutdown, &mut progress).await.unwrap(), None);
    assert!(db::execution::get(step.pool(), old).await.unwrap().is_some());
    db::advisory_unlock(&mut other, history::HISTORY_LOCK).await.unwrap();
    // (returned to the pool: closing the pool at the end waits for every connection)
    drop(other);

    let pass = history::tick(&step.context, &shutdown, &mut progress).await.unwrap().expect("its turn");
    assert_eq!(pass.removed, 1);
    assert!(db::execution::get(step.pool(), old).await.unwrap().is_none(), "8 days after it completed");
    assert!(db::execution::get(step.pool(), young).await.unwrap().is_some());
    let counted: i64 = sqlx::query_scalar("SELECT COALESCE(sum(total), 0)::bigint FROM execution_rollup")
        .fetch_one(step.pool())
        .await
        .unwrap();
    assert_eq!(counted, 1, "the removed execution was counted first (the young one's minute is not over)");
    assert_eq!(progress.removed_since_vacuum, 1);
    step.stop().await;
}

#[tokio::test]
async fn a_monitor_pass_times_out_an_overdue_run_and_hands_back_a_lost_dispatch_on_a_live_worker() {
    let step = Step::new().await;
    let live = step.worker("live").await;
    let overdue = step.execution(Running, live, 3).await;
    let lost = step.execution(Scheduled, live, 3).await;
    let recent = step.execution(Scheduled, live, 3).await;
    // 30 s timeout + 30 s grace have passed for the run; queue TTL 60 s + grace for the dispatch
    step.age("UPDATE execution SET started = now() - interval '61 seconds' WHERE id = $1", overdue).await;
    step.age("UPDATE execution SET updated = now() - interval '91 seconds' WHERE id = $1", lost).await;

    monitor::tick(&step.context, true).await.unwrap();

    let timed_out = step.get(overdue).await;
    assert_eq!((timed_out.status, timed_out.failure_kind), (Timeout, Some(FailureKind::Timeout)));
    assert!(db::execution::retry_of(step.pool(), overdue).await.unwrap().is_none(), "timeouts retry only by policy");
    assert_eq!(step.get(lost).await.status, Requested);
    assert_eq!(step.get(recent).await.status, Scheduled, "a recent dispatch is left alone");
    step.stop().await;
}

#[tokio::test]
async fn a_recorded_failure_creates_one_retry_that_the_timer_requests() {
    let step = Step::new().await;
    let worker = step.worker("w").await;
    let running = step.execution(Running, worker, 2).await;
    let result = ExecutionResult {
        execution_id: running,
        worker_id: worker,
        status: ResultStatus::Failed,
        result: None,
        failure_kind: Some(FailureKind::TransientError),
        error: Some("try again".into()),
        exit_code: Some(75),
        stdout: String::new(),
        stderr: String::new(),
        duration_ms: 5,
        http_status: None,
        retry_after_ms: None,
        run_token: None,
        trace: None,
    };
    // a result from a worker that does not own the execution changes nothing
    completion::record(&step.context, &ExecutionResult { worker_id: worker + 1, ..result.clone() }).await.unwrap();
    assert_eq!(step.get(running).await.status, Running);

    completion::record(&step.context, &result).await.unwrap();
    completion::record(&step.context, &result).await.unwrap(); // a redelivery
    let failed = step.get(running).await;
    assert_eq!(
        (failed.status, failed.failure_kind, failed.exit_code),
        (Failed, Some(FailureKind::TransientError), Some(75))
    );
    let retry = db::execution::retry_of(step.pool(), running).await.unwrap().expect("a retry");
    assert_eq!((retry.status, retry.retry_reason.as_deref()), (Delayed, Some("transient_error")));
    assert_eq!(
        db::execution::chain(step.pool(), running).await.unwrap().len(),
        2,
        "one retry, whatever the redeliveries"
    );

    // the retry is due at once (a millisecond's backoff): one timer pass requests it
    attune_testkit::wait_for("the retry to be promoted", Duration::from_secs(10), || async {
        (retry_timer::tick(&step.context).await.unwrap() == 1).then_some(())
    })
    .await;
    assert_eq!(step.get(retry.id).await.status, Requested);
    assert_eq!(retry_timer::tick(&step.context).await.unwrap(), 0, "promoted once");
    step.stop().await;
}

#[tokio::test]
async fn a_committed_request_marks_its_runtime_for_the_next_look_and_a_lost_listener_marks_all() {
    let step = Step::new().await;
    let waiting = std::sync::Arc::new(scheduler::Waiting::default());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let listener = {
        let (url, waiting, shutdown) = (step.db.url.clone(), waiting.clone(), shutdown.clone());
        let workflows = attune_executor::workflows::Marks::default();
        tokio::spawn(async move { scheduler::listen(&url, &waiting, &workflows, shutdown).await })
    };
    // the marks taken until `done` holds of what was taken
    let taken_until = |what: &'static str, done: fn(&scheduler::Marked) -> bool| {
        let waiting = waiting.clone();
        async move {
            attune_testkit::wait_for(what, Duration::from_secs(10), || {
                let marked = waiting.take();
                async move { done(&marked).then_some(marked) }
            })
            .await
        }
    };
    // subscribing marks every runtime: what was committed before was not announced to it
    taken_until("the subscription", |marked| marked.all).await;

    step.execution(Requested, 0, 0).await;
    let marked = taken_until("the request's runtime", |marked| !marked.runtimes.is_empty()).await;
    assert_eq!((marked.runtimes.into_iter().collect::<Vec<_>>(), marked.all), (vec!["shell".to_string()], false));

    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND query LIKE 'LISTEN%'",
    )
    .bind(&step.db.name)
    .fetch_all(step.pool())
    .await
    .unwrap();
    assert_eq!(killed, [true], "the listener's connection");
    taken_until("every runtime, after the lost connection", |marked| marked.all).await;
    // listening again (it may take a reconnection or two): new requests are announced as before
    attune_testkit::wait_for("a request announced after the reconnection", Duration::from_secs(10), || async {
        step.execution(Requested, 0, 0).await;
        waiting.take().runtimes.contains("shell").then_some(())
    })
    .await;

    shutdown.cancel();
    listener.await.unwrap();
    step.stop().await;
}

/// Issue 46 (review R15): a statement that fails for one execution ends neither the pass nor
/// the judging of the others: the dead worker's other run is failed in the same pass, and the
/// pass does not count as the database out of reach.
#[tokio::test]
async fn a_failure_on_one_execution_does_not_stop_the_monitor_s_sweep() {
    let step = Step::new().await;
    let dead = step.worker("dead").await;
    let refused = step.execution(Running, dead, 3).await;
    let running = step.execution(Running, dead, 3).await;
    // the first row cannot be failed (a trigger of the test's refuses it)
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.id = {refused} AND NEW.status <> OLD.status THEN RAISE EXCEPTION 'refused by the test'; END IF; \
             RETURN NEW; END $$; \
         CREATE TRIGGER refuse BEFORE UPDATE ON execution FOR EACH ROW EXECUTE FUNCTION refuse();"
    )))
    .execute(step.pool())
    .await
    .unwrap();
    step.age("UPDATE worker SET last_heartbeat = now() - interval '1 hour' WHERE id = $1", dead).await;

    assert!(monitor::tick(&step.context, true).await.unwrap(), "the pass ends well");
    assert_eq!(step.get(refused).await.status, Running);
    let failed = step.get(running).await;
    assert_eq!((failed.status, failed.failure_kind), (Failed, Some(FailureKind::WorkerHeartbeatStale)));
    step.stop().await;
}

/// ADR 0011: a monitor pass that decided to judge heartbeats before an outage began, and whose
/// statements run after it (a stall of commits holds them, reads go on), judges no one: the
/// database's record of the executors' pulses (`fence_open`) says writes came back too lately,
/// or not at all, for the workers to have heartbeated again.
#[tokio::test]
async fn no_worker_is_judged_until_the_pulses_have_come_for_the_heartbeat_limit() {
    let step = Step::new().await;
    let dead = step.worker("dead").await;
    let running = step.execution(Running, dead, 3).await;
    step.age("UPDATE worker SET last_heartbeat = now() - interval '1 hour' WHERE id = $1", dead).await;
    for (what, sql) in [
        (
            "writes came back a moment ago",
            "UPDATE fence SET pulsed_at = clock_timestamp(), writable_since = clock_timestamp()",
        ),
        (
            "no pulse for 10 s",
            "UPDATE fence SET pulsed_at = clock_timestamp() - interval '10 s', writable_since = clock_timestamp() - interval '1 hour'",
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_string())).execute(step.pool()).await.unwrap();
        assert!(monitor::tick(&step.context, true).await.unwrap());
        assert_eq!(step.get(running).await.status, Running, "{what}: the run was judged");
    }
    sqlx::query(
        "UPDATE fence SET pulsed_at = clock_timestamp(), writable_since = clock_timestamp() - interval '1 hour'",
    )
    .execute(step.pool())
    .await
    .unwrap();
    assert!(monitor::tick(&step.context, true).await.unwrap());
    assert_eq!(step.get(running).await.failure_kind, Some(FailureKind::WorkerHeartbeatStale));
    step.stop().await;
}
