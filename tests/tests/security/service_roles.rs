//! One database role per service (issue 32): the services of every system test log in as their
//! own test logins (`attune_testkit::SERVICE_LOGINS`), members of the group roles the migrations
//! make. Here, what a worker's login can and cannot do, tried by hand as someone who took a
//! worker host would; what the executors' may not read; and `attune migrate` as the one step
//! that changes the schema.

use std::process::Command;
use std::time::Duration;

use attune_testkit::{System, TestDb};
use serde_json::{Value, json};
use sqlx::PgPool;

async fn log_in(db: &TestDb, login: &str) -> PgPool {
    PgPool::connect(&db.url_as(login)).await.unwrap_or_else(|e| panic!("log in as {login}: {e}"))
}

/// The SQLSTATE of `result`'s error (panics if it succeeded).
fn refused<T: std::fmt::Debug>(result: Result<T, sqlx::Error>, what: &str) -> String {
    match result {
        Err(sqlx::Error::Database(e)) => e.code().map(|c| c.to_string()).unwrap_or_default(),
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_s_login_reads_no_token_and_touches_no_execution_but_its_own() {
    let system = System::builder().worker("w1", &[]).start().await;
    // the services run as their own logins, and work
    let submitted = system.submit("core.echo", json!({"message": "hi"})).await;
    let done = system.wait_terminal(submitted["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let (w1, login): (i64, String) = sqlx::query_as("SELECT id, login::text FROM worker WHERE name = 'w1'")
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(login, "attune_test_worker", "the worker registered as its own login");

    // another worker host's login has a worker with work placed on it
    let other: i64 = sqlx::query_scalar(
        "INSERT INTO worker (name, status, login) VALUES ('other', 'active', 'attune_test_worker_b') RETURNING id",
    )
    .fetch_one(&system.db.pool)
    .await
    .unwrap();
    let theirs = system.submit("core.echo", json!({"message": "theirs"})).await["id"].as_i64().unwrap();
    attune_testkit::force_status(&system.db.pool, theirs, attune_core::ExecutionStatus::Scheduled, Some(other)).await;

    let worker = log_in(&system.db, "attune_test_worker").await;
    // no token, no key, no archive
    for table in ["api_token", "api_idempotency_key", "execution_archive", "audit_event"] {
        let code = refused(
            sqlx::query(sqlx::AssertSqlSafe(format!("SELECT * FROM {table}"))).fetch_all(&worker).await,
            &format!("reading {table}"),
        );
        assert_eq!(code, "42501", "reading {table}");
    }
    let code = refused(
        sqlx::query("INSERT INTO api_token (name, token_hash, role) VALUES ('x', '\\x00', 'admin')")
            .execute(&worker)
            .await,
        "creating a token",
    );
    assert_eq!(code, "42501");
    // no schema change, no server program
    assert_eq!(refused(sqlx::query("CREATE TABLE mine (x int)").execute(&worker).await, "CREATE TABLE"), "42501");
    assert_eq!(refused(sqlx::query("COPY (SELECT 1) TO PROGRAM 'true'").execute(&worker).await, "COPY"), "42501");
    assert_eq!(refused(sqlx::query("DELETE FROM execution").execute(&worker).await, "DELETE"), "42501");
    assert_eq!(
        refused(
            sqlx::query("INSERT INTO execution (action_ref) VALUES ('core.echo')").execute(&worker).await,
            "INSERT"
        ),
        "42501"
    );

    // the other login's execution: not seen, not changed, not claimed
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE id = $1")
        .bind(theirs)
        .fetch_one(&worker)
        .await
        .unwrap();
    assert_eq!(seen, 0, "a worker's login sees an execution placed on another login's worker");
    let mine: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE worker = $1")
        .bind(w1)
        .fetch_one(&worker)
        .await
        .unwrap();
    assert_eq!(mine, 1, "its own execution is seen");
    let changed = sqlx::query("UPDATE execution SET status = 'completed' WHERE id = $1")
        .bind(theirs)
        .execute(&worker)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(changed, 0);
    let claimed: Vec<i64> = sqlx::query_scalar("SELECT id FROM claim_runs(ARRAY[$1]::bigint[], ARRAY['t'], $2, false)")
        .bind(theirs)
        .bind(other)
        .fetch_all(&worker)
        .await
        .unwrap();
    assert!(claimed.is_empty(), "claimed another login's execution");
    // moving it onto its own worker is refused (a worker's login may not write `worker` at all)
    let moved =
        sqlx::query("UPDATE execution SET worker = $1 WHERE id = $2").bind(w1).bind(theirs).execute(&worker).await;
    assert_eq!(refused(moved, "moving another login's execution"), "42501");
    let touched = sqlx::query("UPDATE execution SET status = 'completed' WHERE id = $1")
        .bind(theirs)
        .execute(&worker)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(touched, 0, "another login's execution is not even seen to be updated");
    let status: String = sqlx::query_scalar("SELECT status::text FROM execution WHERE id = $1")
        .bind(theirs)
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(status, "scheduled", "another login's execution was changed");
    // nor its own executions onto another's worker
    let code = refused(
        sqlx::query("UPDATE execution SET worker = $1 WHERE worker = $2").bind(other).bind(w1).execute(&worker).await,
        "moving its own execution onto another login's worker",
    );
    assert_eq!(code, "42501");
    // its own execution: not rewritten (what runs, who asked, the chain), not requeued by hand
    let own: i64 =
        sqlx::query_scalar("SELECT id FROM execution WHERE worker = $1").bind(w1).fetch_one(&worker).await.unwrap();
    for rewrite in [
        "UPDATE execution SET action_ref = 'core.noop' WHERE id = $1",
        "UPDATE execution SET parameters = '{\"message\": \"x\"}' WHERE id = $1",
        "UPDATE execution SET submitted_by = NULL WHERE id = $1",
        "UPDATE execution SET original_execution = NULL WHERE id = $1",
        "UPDATE execution SET worker = NULL WHERE id = $1",
    ] {
        let code = refused(sqlx::query(rewrite).bind(own).execute(&worker).await, rewrite);
        assert_eq!(code, "42501", "{rewrite}");
    }
    // a finished one stays finished (not even seen to be updated)
    let requeue = "UPDATE execution SET status = 'requested' WHERE id = $1";
    assert_eq!(sqlx::query(requeue).bind(own).execute(&worker).await.unwrap().rows_affected(), 0, "requeued");
    // a hand-back goes through execution_hand_back: its own scheduled work only
    // (written as scheduled on w1 with no dispatch behind it: a submission would race the running
    // system, whose worker w1 could claim and run it before the hand-back)
    let held: i64 = sqlx::query_scalar(
        "INSERT INTO execution (action_ref, parameters, status, runtime, worker) \
         VALUES ('core.echo', '{\"message\": \"held\"}', 'scheduled', 'shell', $1) RETURNING id",
    )
    .bind(w1)
    .fetch_one(&system.db.pool)
    .await
    .unwrap();
    assert_eq!(refused(sqlx::query(requeue).bind(held).execute(&worker).await, "requeue by hand"), "42501");
    let back: Vec<i64> = sqlx::query_scalar("SELECT id FROM execution_hand_back($1, $2)")
        .bind(theirs)
        .bind(other)
        .fetch_all(&worker)
        .await
        .unwrap();
    assert!(back.is_empty(), "handed back another login's execution");
    let back: Option<i64> = sqlx::query_scalar("SELECT id FROM execution_hand_back($1, $2)")
        .bind(held)
        .bind(w1)
        .fetch_optional(&worker)
        .await
        .unwrap();
    assert_eq!(back, Some(held), "its own scheduled execution is handed back");

    // the other login's worker row: not changed, not forged
    let changed = sqlx::query("UPDATE worker SET status = 'inactive' WHERE id = $1")
        .bind(other)
        .execute(&worker)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(changed, 0);
    let code = refused(
        sqlx::query("INSERT INTO worker (name, login) VALUES ('forged', 'attune_test_worker_b')")
            .execute(&worker)
            .await,
        "registering a worker for another login",
    );
    assert_eq!(code, "42501");

    // a worker of another login cannot take w1's name: it stops, naming the login; a name the
    // owner registered (before logins were recorded) is taken over
    let out = tokio::process::Command::new(attune_testkit::workspace_binary("attune-worker"))
        .env("DATABASE_URL", system.db.url_as("attune_test_worker_b"))
        .env("AMQP_URL", attune_testkit::amqp_url())
        .env("ATTUNE_MQ_NAMESPACE", &system.namespace.name)
        .env("ATTUNE_WORKER_NAME", "w1")
        .env("ATTUNE_WORKER_ACTION_UIDS", "off")
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out).await.expect("the worker stops").unwrap();
    let told = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && told.contains("attune_test_worker"), "{told}");
    sqlx::query("INSERT INTO worker (name, status) VALUES ('legacy', 'inactive')")
        .execute(&system.db.pool)
        .await
        .unwrap();
    let taken = sqlx::query(
        "UPDATE worker SET status = 'inactive', updated = now(), login = session_user WHERE name = 'legacy'",
    )
    .execute(&log_in(&system.db, "attune_test_worker_b").await)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(taken, 1, "a name the owner registered is taken over by a worker login");
    // nor does a temporary table named pg_roles vouch for taking over another login's worker
    let mut attacker = worker.acquire().await.unwrap();
    let shadow =
        sqlx::query("CREATE TEMP TABLE pg_roles (rolname name, oid oid, rolsuper bool)").execute(&mut *attacker).await;
    assert_eq!(refused(shadow, "a temporary table"), "42501", "temporary tables are not for the services");
    sqlx::query("SET search_path = pg_temp, pg_catalog, public").execute(&mut *attacker).await.unwrap();
    let taken = sqlx::query("UPDATE worker SET login = session_user WHERE id = $1")
        .bind(other)
        .execute(&mut *attacker)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(taken, 0, "another login's worker was taken over");

    // the executors' login reads no token either; the API's does (it serves them)
    let executor = log_in(&system.db, "attune_test_executor").await;
    assert_eq!(refused(sqlx::query("SELECT * FROM api_token").fetch_all(&executor).await, "executor"), "42501");
    let api = log_in(&system.db, "attune_test_api").await;
    sqlx::query("SELECT id FROM api_token").fetch_all(&api).await.expect("the API reads tokens");
    // the audit trail: the API writes and reads it and changes nothing of it; the executors remove
    // what is past its age and write nothing into it
    sqlx::query("INSERT INTO audit_event (actor, method, route, path, status) VALUES ('x', 'CLI', 'r', 'p', 0)")
        .execute(&api)
        .await
        .expect("the API writes audit events");
    for change in ["UPDATE audit_event SET reason = 'rewritten'", "DELETE FROM audit_event"] {
        assert_eq!(refused(sqlx::query(change).execute(&api).await, change), "42501", "{change}");
    }
    let forged = "INSERT INTO audit_event (actor, method, route, path, status) VALUES ('x', 'CLI', 'r', 'p', 0)";
    assert_eq!(refused(sqlx::query(forged).execute(&executor).await, "executor"), "42501");
    sqlx::query("SELECT audit_prune(365 * 86400, 100, false)")
        .execute(&executor)
        .await
        .expect("the executors remove old audit events");
    // the executors never read the secret store
    assert_eq!(refused(sqlx::query("SELECT * FROM secret").fetch_all(&executor).await, "executor secrets"), "42501");

    // the secret store: not read, but for the secrets its own runs refer to
    sqlx::query("INSERT INTO secret (name, sealed, users) VALUES ('mine', '\\x01', '{*}'), ('theirs', '\\x02', '{*}'), ('unused', '\\x03', '{*}')")
        .execute(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(refused(sqlx::query("SELECT * FROM secret").fetch_all(&worker).await, "reading secret"), "42501");
    let uses = system.submit("core.echo", json!({"message": "mine"})).await["id"].as_i64().unwrap();
    attune_testkit::force_status(&system.db.pool, uses, attune_core::ExecutionStatus::Scheduled, Some(w1)).await;
    for (id, name) in [(uses, "mine"), (theirs, "theirs")] {
        sqlx::query("UPDATE execution SET parameters = jsonb_build_object('message', jsonb_build_object('$secret', $2::text)) WHERE id = $1")
            .bind(id)
            .bind(name)
            .execute(&system.db.pool)
            .await
            .unwrap();
    }
    let opened = |id: i64| {
        let worker = worker.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT name FROM run_secrets($1, ARRAY['mine', 'theirs', 'unused'])")
                .bind(id)
                .fetch_all(&worker)
                .await
                .unwrap()
        }
    };
    assert_eq!(opened(uses).await, ["mine"], "a run's secrets: those its parameters refer to");
    assert_eq!(opened(theirs).await, Vec::<String>::new(), "another login's run's secrets");
    attune_testkit::force_status(&system.db.pool, uses, attune_core::ExecutionStatus::Completed, Some(w1)).await;
    assert_eq!(opened(uses).await, Vec::<String>::new(), "a finished run's secrets");
    // nor may it set its finished run back to running, to open them again
    let reopened = sqlx::query("UPDATE execution SET status = 'running', finished = NULL WHERE id = $1")
        .bind(uses)
        .execute(&worker)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(reopened, 0, "a worker's login set its finished execution back to running");
    assert_eq!(opened(uses).await, Vec::<String>::new(), "a reopened run's secrets");

    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_start_only_on_a_current_schema_and_attune_migrate_makes_it_current() {
    let db = TestDb::empty().await;
    // a service does not migrate: it names the step
    let out = Command::new(attune_testkit::workspace_binary("attune-executor"))
        .env("DATABASE_URL", &db.url)
        .env("AMQP_URL", attune_testkit::amqp_url())
        .output()
        .unwrap();
    let told = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && told.contains("attune migrate"), "{told}");
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(tables, 0, "a service changed the schema");

    let migrate = || {
        let out = Command::new(attune_testkit::workspace_binary("attune"))
            .args(["migrate", "--output", "json"])
            .env("DATABASE_URL", &db.url)
            .output()
            .unwrap();
        assert!(out.status.success(), "attune migrate: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let first = migrate();
    assert!(first["applied"].as_array().is_some_and(|a| a.len() > 10), "{first}");
    assert_eq!(migrate()["applied"], json!([]), "a second run applies nothing");
    attune_common::db::check_schema(&db.pool).await.expect("current after attune migrate");
    db.drop_database().await;
}

/// The executors' login does its job and no more (issue 47): it cannot change what runs (actions,
/// packs, an execution's request), insert a first attempt (which would have a worker open any
/// secret and send it where the executor chose), nor remove audit events younger than the
/// database's retention floor; its retries copy their parent's request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_executor_s_login_changes_nothing_that_runs_and_erases_no_recent_audit_event() {
    let db = TestDb::new().await;
    let core = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs/core");
    attune_common::db::pack::register(&db.pool, &attune_common::pack::load_pack(&core).unwrap()).await.unwrap();
    let echo = attune_common::db::action::get_by_ref(&db.pool, "core.echo").await.unwrap().unwrap();
    let first = attune_common::db::execution::insert(&db.pool, &attune_testkit::echo_execution(&echo)).await.unwrap();
    let executor = log_in(&db, "attune_test_executor").await;

    for change in [
        "UPDATE action SET runtime = 'http', http = '{\"method\":\"GET\",\"url\":\"http://203.0.113.7/\"}' WHERE ref = 'core.echo'",
        "UPDATE action SET entrypoint = 'x.sh'",
        "DELETE FROM action",
        "UPDATE pack SET path = '/tmp'",
        "INSERT INTO pack (ref, version, path) VALUES ('evil', '1', '/tmp')",
        "UPDATE execution SET parameters = '{\"message\":{\"$secret\":\"shop\"}}'",
        "UPDATE execution SET action_ref = 'core.python_echo', runtime = 'python'",
        "UPDATE execution SET submitted_by = NULL",
        "INSERT INTO execution (action_ref, parameters) VALUES ('core.echo', '{\"message\":{\"$secret\":\"shop\"}}')",
        "DELETE FROM audit_event",
        "INSERT INTO audit_event_archive (actor, method, route, path, status) VALUES ('x', 'CLI', 'r', 'p', 0)",
        "UPDATE audit_retention SET min_age = interval '0'",
        "DELETE FROM _sqlx_migrations",
    ] {
        assert_eq!(
            refused(sqlx::query(sqlx::AssertSqlSafe(change)).execute(&executor).await, change),
            "42501",
            "{change}"
        );
    }
    // an insert of a first attempt through the definer functions is refused too
    let dressed_up = sqlx::query("SELECT * FROM execution_insert_retry($1, 'requested', 'action_failed', NULL, '{}')")
        .bind(first.id)
        .fetch_all(&executor)
        .await;
    assert_eq!(refused(dressed_up, "a retry of a run that has not failed"), "22023");

    // what it does do: move an execution along, and retry a failed one with its parent's request
    sqlx::query(
        "UPDATE execution SET status = 'failed', finished = now(), failure_kind = 'action_failed' WHERE id = $1",
    )
    .bind(first.id)
    .execute(&executor)
    .await
    .expect("the executors record an outcome");
    let failed = attune_common::db::execution::get(&db.pool, first.id).await.unwrap().unwrap();
    let mut asked = attune_common::db::execution::NewExecution::retry_of(
        &failed,
        attune_core::ExecutionStatus::Delayed,
        attune_core::FailureKind::ActionFailed,
        Some(json!({"message": {"$secret": "shop"}})),
        Some(chrono::Utc::now()),
    );
    asked.action_ref = "core.python_echo".into();
    let retry = attune_common::db::execution::insert_retry(&executor, &asked).await.expect("the executors retry");
    assert_eq!(
        (retry.action_ref.as_str(), &retry.parameters, retry.original_execution, retry.retry_count),
        ("core.echo", &failed.parameters, Some(first.id), 1),
        "a retry is its parent's request, whatever the executor asked"
    );
    assert_eq!(retry.config["retry_of"], first.id);
    let again = attune_common::db::execution::insert_retry(&executor, &asked).await;
    assert_eq!(refused(again, "a second retry of one parent"), "23505");

    // a finished run stays finished: set back to waiting, a worker would open its secrets again
    let reopened = sqlx::query("UPDATE execution SET status = 'requested', finished = NULL WHERE id = $1")
        .bind(first.id)
        .execute(&executor)
        .await;
    assert_eq!(refused(reopened, "a failed run set back to waiting"), "42501");

    // a schedule fires only while it is not paused, its token live, for an occurrence that is due
    let token = attune_common::db::token::create_with(&db.pool, "ops", attune_common::db::token::Role::Operator, None)
        .await
        .unwrap()
        .0
        .id;
    let schedule: i64 = sqlx::query_scalar(
        "INSERT INTO schedule (name, action_ref, parameters, at, created_by) \
         VALUES ('nightly', 'core.echo', '{\"message\": \"hi\"}', now(), $1) RETURNING id",
    )
    .bind(token)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let fire = |at: &'static str| {
        let executor = executor.clone();
        async move {
            sqlx::query_scalar::<_, Option<i64>>(sqlx::AssertSqlSafe(format!("SELECT schedule_fire($1, {at}, 300)")))
                .bind(schedule)
                .fetch_one(&executor)
                .await
                .unwrap()
        }
    };
    assert_eq!(fire("now() + interval '1 hour'").await, None, "an occurrence not due");
    sqlx::query("UPDATE schedule SET paused = true WHERE id = $1").bind(schedule).execute(&db.pool).await.unwrap();
    assert_eq!(fire("now() - interval '1 minute'").await, None, "a paused schedule");
    sqlx::query("UPDATE schedule SET paused = false WHERE id = $1").bind(schedule).execute(&db.pool).await.unwrap();
    sqlx::query("UPDATE api_token SET revoked = now() WHERE id = $1").bind(token).execute(&db.pool).await.unwrap();
    assert_eq!(fire("now() - interval '1 minute'").await, None, "a revoked token's schedule");
    sqlx::query("UPDATE api_token SET revoked = NULL WHERE id = $1").bind(token).execute(&db.pool).await.unwrap();
    assert!(fire("now() - interval '1 minute'").await.is_some(), "a due occurrence of a live schedule");

    // audit events: none younger than the floor goes, whatever age is asked
    sqlx::query(
        "INSERT INTO audit_event (actor, method, route, path, status, at) VALUES \
         ('x', 'CLI', 'r', 'p', 0, now() - interval '1 hour'), ('x', 'CLI', 'r', 'p', 0, now() - interval '400 days')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let removed = attune_common::db::audit::prune(&executor, 0.0, 100, false).await.expect("the executors prune");
    assert_eq!(removed, 1, "only the event past the retention floor goes");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_event").fetch_one(&db.pool).await.unwrap();
    assert_eq!(left, 1, "the hour-old event is kept");
    db.drop_database().await;
}

/// A worker's login serves only the runtimes the schema's owner granted it (issue 47): before, a
/// second worker login advertising every runtime received other runtimes' runs and opened their
/// secrets. Its row may not advertise another runtime, it neither sees nor claims such a run
/// placed on it, `run_secrets` opens nothing of it, and a worker asked to run only ungranted
/// runtimes refuses to start, naming the setting and the command that grants them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_s_login_serves_only_the_runtimes_it_is_granted() {
    let db = TestDb::new().await;
    let core = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs/core");
    attune_common::db::pack::register(&db.pool, &attune_common::pack::load_pack(&core).unwrap()).await.unwrap();
    let taken =
        attune_common::db::worker::deny_runtimes(&db.pool, "attune_test_worker_b", &["python".into()]).await.unwrap();
    assert_eq!(taken, 1);
    let worker = log_in(&db, "attune_test_worker_b").await;

    // what its rows advertise is held to the grant: the rest is left out, whatever it writes
    let everything = json!({"runtimes": ["shell", "python"], "slots": 4});
    let advertised: Value = sqlx::query_scalar(
        "INSERT INTO worker (name, status, capabilities) VALUES ('greedy', 'active', $1) RETURNING capabilities",
    )
    .bind(&everything)
    .fetch_one(&worker)
    .await
    .expect("a row of its own");
    assert_eq!(advertised, json!({"runtimes": ["shell"], "slots": 4}), "an ungranted runtime advertised");
    let id: i64 = sqlx::query_scalar("SELECT id FROM worker WHERE name = 'greedy'").fetch_one(&db.pool).await.unwrap();
    for forged in [everything.clone(), json!({"runtimes": "python"}), json!(["python"])] {
        let advertised: Value =
            sqlx::query_scalar("UPDATE worker SET capabilities = $2 WHERE id = $1 RETURNING capabilities")
                .bind(id)
                .bind(&forged)
                .fetch_one(&worker)
                .await
                .expect("a heartbeat goes on");
        assert!(
            advertised["runtimes"].as_array().is_some_and(|r| r.iter().all(|r| r == "shell")),
            "{forged} advertised {advertised}"
        );
    }
    // a runtime taken back from a running worker: its next heartbeat lands, without it
    attune_common::db::worker::deny_runtimes(&db.pool, "attune_test_worker_b", &["shell".into()]).await.unwrap();
    let advertised: Value =
        sqlx::query_scalar("UPDATE worker SET capabilities = $2 WHERE id = $1 RETURNING capabilities")
            .bind(id)
            .bind(&everything)
            .fetch_one(&worker)
            .await
            .expect("the heartbeat after a deny lands");
    assert_eq!(advertised["runtimes"], json!([]));
    attune_common::db::worker::allow_runtimes(&db.pool, "attune_test_worker_b", &["shell".into()]).await.unwrap();

    // a python run and a shell run, each with a secret, placed on its worker
    sqlx::query("INSERT INTO secret (name, sealed, users) VALUES ('shop', '\\x01', '{core}')")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut placed = Vec::new();
    for action in ["core.python_echo", "core.echo"] {
        let action = attune_common::db::action::get_by_ref(&db.pool, action).await.unwrap().unwrap();
        let new = attune_common::db::execution::NewExecution {
            parameters: json!({"message": {"$secret": "shop"}}),
            ..attune_testkit::echo_execution(&action)
        };
        let execution = attune_common::db::execution::insert(&db.pool, &new).await.unwrap().id;
        attune_testkit::force_status(&db.pool, execution, attune_core::ExecutionStatus::Scheduled, Some(id)).await;
        placed.push(execution);
    }
    let (python, shell) = (placed[0], placed[1]);
    let seen = |execution: i64| {
        let worker = worker.clone();
        async move {
            let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE id = $1")
                .bind(execution)
                .fetch_one(&worker)
                .await
                .unwrap();
            let claimed = sqlx::query("UPDATE execution SET status = 'running', started = now() WHERE id = $1")
                .bind(execution)
                .execute(&worker)
                .await
                .unwrap()
                .rows_affected();
            let opened: Vec<String> = sqlx::query_scalar("SELECT name FROM run_secrets($1, ARRAY['shop'])")
                .bind(execution)
                .fetch_all(&worker)
                .await
                .unwrap();
            (rows, claimed, opened)
        }
    };
    assert_eq!(seen(python).await, (0, 0, vec![]), "an ungranted runtime's run: not seen, claimed or opened");
    assert_eq!(seen(shell).await, (1, 1, vec!["shop".to_string()]), "a granted runtime's run");

    // the worker process: only ungranted runtimes asked for is a refusal that says what to do
    let out = Command::new(attune_testkit::workspace_binary("attune-worker"))
        .env("DATABASE_URL", db.url_as("attune_test_worker_b"))
        .env("AMQP_URL", attune_testkit::amqp_url())
        .env("ATTUNE_WORKER_NAME", "python-only")
        .env("ATTUNE_WORKER_RUNTIMES", "python")
        .output()
        .unwrap();
    let told = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{told}");
    assert!(told.contains("ATTUNE_WORKER_RUNTIMES") && told.contains("attune worker-login allow"), "{told}");

    // the owner's view and grant, through the CLI
    let cli = |args: &[&str]| {
        let out = Command::new(attune_testkit::workspace_binary("attune"))
            .args(args)
            .env("DATABASE_URL", &db.url)
            .output()
            .unwrap();
        assert!(out.status.success(), "attune {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    cli(&["worker-login", "allow", "attune_test_worker_b", "python"]);
    let listed: serde_json::Value = serde_json::from_str(&cli(&["worker-login", "list", "--output", "json"])).unwrap();
    let grant = listed.as_array().unwrap().iter().find(|g| g["login"] == "attune_test_worker_b").unwrap().clone();
    assert_eq!(grant["runtimes"], json!(["builtin", "http", "python", "shell"]), "{listed}");
    assert_eq!(seen(python).await.0, 1, "granted again, the python run is its own");
    db.drop_database().await;
}
