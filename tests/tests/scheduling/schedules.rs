//! Schedules against the real binaries: due runs are created once with two executors and one of
//! them SIGKILLed around the due moment; a missed window follows the catch-up policy; the routes
//! refuse what is wrong by name, record the schedule on its executions, and the CLI drives them.

use std::time::Duration;

use attune_testkit::{System, wait_for};
use chrono::{DateTime, Timelike, Utc};
use serde_json::{Value, json};

async fn post(system: &System, path: &str, body: Option<Value>) -> (u16, Value) {
    system.request(reqwest::Method::POST, path, body.as_ref(), Some(&system.token)).await
}

/// (execution id, scheduled_for, status) of every execution a schedule made, first attempts only.
async fn runs_of(system: &System, schedule: i64) -> Vec<(i64, DateTime<Utc>, String)> {
    sqlx::query_as(
        "SELECT id, scheduled_for, status::text FROM execution WHERE schedule = $1 AND original_execution IS NULL \
         ORDER BY scheduled_for",
    )
    .bind(schedule)
    .fetch_all(&system.db.pool)
    .await
    .unwrap()
}

async fn sleep_until(at: DateTime<Utc>) {
    // the fault's moment (the scenario), not a synchronisation
    if let Ok(wait) = (at - Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_runs_are_created_once_whatever_executor_is_killed_at_the_due_moment() {
    let mut system = System::builder().worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "builtin")]).start().await;
    system.spawn_executor("executor-2");

    // five instants a tenth of a second apart, both executors SIGKILLed among them
    let due = (Utc::now() + chrono::Duration::seconds(3)).with_nanosecond(0).unwrap();
    let mut instants = Vec::new();
    for n in 0..5 {
        let at = due + chrono::Duration::milliseconds(100 * n);
        let (status, made) = post(
            &system,
            "/api/v1/schedules",
            Some(json!({"name": format!("at-{n}"), "action_ref": "core.noop", "at": at.to_rfc3339()})),
        )
        .await;
        assert_eq!(status, 201, "{made}");
        assert_eq!(made["next_run"].as_str().map(|t| t.parse::<DateTime<Utc>>().unwrap()), Some(at), "{made}");
        instants.push(made["id"].as_i64().unwrap());
    }
    // and one every second, from before the kills to after the restart
    let (status, every) = post(
        &system,
        "/api/v1/schedules",
        Some(json!({"name": "every-second", "action_ref": "core.noop", "cron": "* * * * * *", "reason": "heartbeat"})),
    )
    .await;
    assert_eq!(status, 201, "{every}");
    let every = every["id"].as_i64().unwrap();
    sleep_until(due + chrono::Duration::milliseconds(150)).await;
    system.signal("executor", 9);
    system.signal("executor-2", 9);
    // nobody looks for three seconds, then one executor comes back
    sleep_until(due + chrono::Duration::seconds(3)).await;
    system.restart("executor");
    let pool = system.db.pool.clone();
    wait_for("every instant's run to complete", Duration::from_secs(60), || {
        let pool = pool.clone();
        let instants = instants.clone();
        async move {
            let done: i64 =
                sqlx::query_scalar("SELECT count(*) FROM execution WHERE schedule = ANY($1) AND status = 'completed'")
                    .bind(&instants)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            (done >= 5).then_some(())
        }
    })
    .await;
    sleep_until(Utc::now() + chrono::Duration::seconds(2)).await;
    let (status, paused) = post(&system, "/api/v1/schedules/every-second/pause", None).await;
    assert_eq!((status, &paused["paused"]), (200, &json!(true)), "{paused}");

    for (n, schedule) in instants.iter().enumerate() {
        let runs = runs_of(&system, *schedule).await;
        assert_eq!(runs.len(), 1, "instant {n} ran {} times: {runs:?}", runs.len());
        assert_eq!(runs[0].1, due + chrono::Duration::milliseconds(100 * n as i64));
        let (_, made) = system.get(&format!("/api/v1/schedules/at-{n}")).await;
        assert_eq!((&made["next_run"], made["last_execution"].as_i64()), (&Value::Null, Some(runs[0].0)), "{made}");
    }
    // every second from the first run to the last has its one run, the seconds no executor
    // looked at included (they were within the grace when one came back)
    let runs = runs_of(&system, every).await;
    assert!(runs.len() >= 6, "{runs:?}");
    for pair in runs.windows(2) {
        assert_eq!(pair[1].1 - pair[0].1, chrono::Duration::seconds(1), "a second missed or run twice: {runs:?}");
    }
    let first = runs[0].0;
    let (_, execution) = system.get(&format!("/api/v1/executions/{first}")).await;
    assert_eq!(
        (execution["schedule"].as_i64(), &execution["config"]["schedule"]),
        (Some(every), &json!("every-second"))
    );
    assert_eq!(execution["submitted_by"], system.get("/api/v1/whoami").await.1["token_id"], "{execution}");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_window_is_skipped_or_run_once_and_the_routes_name_what_is_wrong() {
    let system = System::builder().worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "builtin,shell")]).start().await;
    let far = (Utc::now().hour() + 12) % 24;
    let cron = format!("0 {far} * * *");
    for (name, catch_up) in [("skipping", "skip"), ("catching-up", "once")] {
        let body = json!({"name": name, "action_ref": "core.echo", "parameters": {"message": name},
            "cron": cron, "timezone": "UTC", "catch_up": catch_up, "paused": true});
        let (status, made) = post(&system, "/api/v1/schedules", Some(body)).await;
        assert_eq!(status, 201, "{made}");
    }
    // an outage: the occurrences of the last two days were missed
    let missed_from: DateTime<Utc> = sqlx::query_scalar(
        "UPDATE schedule SET paused = false, next_run = next_run - interval '2 days' WHERE name IN ('skipping', 'catching-up') \
         RETURNING next_run",
    )
    .fetch_one(&system.db.pool)
    .await
    .unwrap();
    let pool = system.db.pool.clone();
    wait_for("both schedules moved on", Duration::from_secs(30), || {
        let pool = pool.clone();
        async move {
            let moved: i64 = sqlx::query_scalar("SELECT count(*) FROM schedule WHERE next_run > now()")
                .fetch_one(&pool)
                .await
                .unwrap();
            (moved == 2).then_some(())
        }
    })
    .await;
    let (_, skipping) = system.get("/api/v1/schedules/skipping").await;
    let (_, catching) = system.get("/api/v1/schedules/catching-up").await;
    // what was missed is shown with the schedule (and counted by attune_scheduled_missed_total)
    for schedule in [&skipping, &catching] {
        assert_eq!(schedule["missed"], 2, "{schedule}");
        assert!(schedule["last_missed"].is_string(), "{schedule}");
    }
    assert_eq!(runs_of(&system, skipping["id"].as_i64().unwrap()).await, vec![], "skip ran a missed occurrence");
    let once = runs_of(&system, catching["id"].as_i64().unwrap()).await;
    assert_eq!(once.len(), 1, "once: {once:?}");
    assert_eq!(once[0].1, missed_from, "the catch-up run is recorded for the first missed occurrence");
    let ran = system.wait_terminal(once[0].0, Duration::from_secs(30)).await;
    assert_eq!((ran["status"].as_str(), ran["stdout"].as_str()), (Some("completed"), Some("catching-up\n")), "{ran}");

    // what is wrong is named
    for (body, code, parameter) in [
        (
            json!({"name": "x", "action_ref": "core.echo", "parameters": {"message": "m"}, "cron": "61 * * * *"}),
            422,
            Some("cron"),
        ),
        (
            json!({"name": "x", "action_ref": "core.echo", "parameters": {"message": "m"}, "cron": "* * * * *", "timezone": "Mars/Olympus"}),
            422,
            Some("timezone"),
        ),
        (json!({"name": "x", "action_ref": "core.echo", "parameters": {"message": "m"}}), 422, Some("cron")),
        (
            json!({"name": "x", "action_ref": "core.echo", "parameters": {"message": "m"}, "cron": "* * * * *", "at": "2030-01-01T00:00:00Z"}),
            422,
            Some("cron"),
        ),
        (
            json!({"name": "x", "action_ref": "core.echo", "parameters": {"message": "m"}, "at": "2020-01-01T00:00:00Z"}),
            422,
            Some("at"),
        ),
        // a malformed instant names 'at' (it was "invalid JSON body")
        (
            json!({"name": "x", "action_ref": "core.echo", "parameters": {"message": "m"}, "at": "tomorrow"}),
            422,
            Some("at"),
        ),
        (
            json!({"name": "x", "action_ref": "core.echo", "parameters": {}, "cron": "* * * * *"}),
            422,
            Some("parameters.message"),
        ),
        (json!({"name": "a/b", "action_ref": "core.echo", "cron": "* * * * *"}), 422, Some("name")),
        (json!({"name": "x", "action_ref": "core.nope", "cron": "* * * * *"}), 404, None),
        (
            json!({"name": "skipping", "action_ref": "core.echo", "parameters": {"message": "m"}, "cron": "* * * * *"}),
            409,
            None,
        ),
    ] {
        let (status, answer) = post(&system, "/api/v1/schedules", Some(body.clone())).await;
        assert_eq!((status, answer["error"]["parameter"].as_str()), (code, parameter), "{body}: {answer}");
    }
    let (status, _) = post(&system, "/api/v1/schedules/nope/pause", None).await;
    assert_eq!(status, 404);

    // the CLI: create, list, pause, resume, delete
    let attune = |args: &[&str]| {
        let out = system.attune(args);
        let shown = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), shown)
    };
    let (ok, shown) = attune(&[
        "--reason",
        "nightly report",
        "schedule",
        "create",
        "nightly",
        "core.echo",
        "message=report",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Paris",
    ]);
    assert!(ok && shown.contains("schedule nightly runs core.echo '0 3 * * *' (Europe/Paris): next"), "{shown}");
    let (ok, listed) = attune(&["schedule", "list"]);
    assert!(ok && listed.starts_with("NAME") && listed.contains("nightly") && listed.contains("skipping"), "{listed}");
    // changed, and run now outside its timing
    let (ok, changed) = attune(&[
        "schedule",
        "edit",
        "nightly",
        "core.echo",
        "message=changed",
        "--cron",
        "0 4 * * *",
        "--timezone",
        "UTC",
    ]);
    assert!(ok && changed.contains("schedule nightly runs core.echo '0 4 * * *' (UTC): next"), "{changed}");
    let (_, shown) = system.get("/api/v1/schedules/nightly").await;
    assert_eq!((&shown["cron"], &shown["parameters"]["message"]), (&json!("0 4 * * *"), &json!("changed")), "{shown}");
    let (ok, ran) = attune(&["--output", "json", "schedule", "run", "nightly", "--wait"]);
    assert!(ok, "{ran}");
    let ran: Value =
        serde_json::from_str(ran.lines().take_while(|l| !l.is_empty()).collect::<Vec<_>>().join("\n").as_str())
            .unwrap_or_else(|e| panic!("{e}: {ran}"));
    assert_eq!(
        (&ran["status"], &ran["config"]["schedule"], &ran["parameters"]["message"]),
        (&json!("completed"), &json!("nightly"), &json!("changed")),
        "{ran}"
    );
    let (_, after) = system.get("/api/v1/schedules/nightly").await;
    assert_eq!(after["next_run"], shown["next_run"], "a run now leaves the next run as it was");
    let (status, refused) = post(&system, "/api/v1/schedules/nope/run", None).await;
    assert_eq!(status, 404, "{refused}");
    assert!(attune(&["schedule", "pause", "nightly"]).1.contains("paused"));
    assert!(attune(&["schedule", "resume", "nightly"]).1.contains("next"));
    let (ok, deleted) = attune(&["schedule", "delete", "nightly"]);
    assert!(ok && deleted.contains("schedule nightly deleted"), "{deleted}");
    let (ok, gone) = attune(&["schedule", "get", "nightly"]);
    assert!(!ok && gone.contains("no schedule named 'nightly'"), "{gone}");
    // each change is in the audit trail; the made one with its reason
    let audited: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT method, path, reason FROM audit_event WHERE path LIKE '/api/v1/schedules%' AND status < 300 \
         AND (target = 'schedule:nightly' OR path LIKE '%/nightly%') ORDER BY id",
    )
    .fetch_all(&system.db.pool)
    .await
    .unwrap();
    let methods: Vec<&str> = audited.iter().map(|(m, _, _)| m.as_str()).collect();
    assert_eq!(methods, ["POST", "PUT", "POST", "POST", "POST", "DELETE"], "{audited:?}");
    assert_eq!(audited[0].2.as_deref(), Some("nightly report"));
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_cut_off_while_it_creates_a_run_leaves_it_to_be_created_once() {
    let mut system = System::builder().worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "builtin")]).start().await;
    // the executor reaches PostgreSQL through a proxy that cuts its connection right after the
    // statement that creates a scheduled run: its transaction (run and schedule moved on) is lost
    let cut = attune_testkit::pgcut::PgCut::start("127.0.0.1:5432").await;
    system.restart_with("executor", &[("DATABASE_URL", &cut.url(&system.db.url))]);
    cut.arm("SELECT schedule_fire(");
    let at = Utc::now() + chrono::Duration::seconds(2);
    let (status, made) = post(
        &system,
        "/api/v1/schedules",
        Some(json!({"name": "cut", "action_ref": "core.noop", "at": at.to_rfc3339()})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let schedule = made["id"].as_i64().unwrap();
    let pool = system.db.pool.clone();
    wait_for("the run, made again after the cut", Duration::from_secs(60), || {
        let pool = pool.clone();
        async move {
            let done: i64 =
                sqlx::query_scalar("SELECT count(*) FROM execution WHERE schedule = $1 AND status = 'completed'")
                    .bind(schedule)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            (done > 0).then_some(())
        }
    })
    .await;
    assert_eq!(cut.sprung(), 1, "the connection was cut as the run was created");
    let runs = runs_of(&system, schedule).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(Some(runs[0].1), made["next_run"].as_str().map(|t| t.parse::<DateTime<Utc>>().unwrap()));
    system.stop().await;
}

/// Issue 46: a schedule of a paused action does not pile up one run per occurrence behind the
/// pause (all started at the resume): its occurrences are missed, and `catch_up` says what stands
/// for them, `skip` nothing and `once` one run, which waits for the resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedules_of_a_paused_action_follow_their_catch_up() {
    let system = System::builder().worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "builtin,shell")]).start().await;
    let (status, _) = system
        .request(
            reqwest::Method::PUT,
            "/api/v1/pauses/action/core.echo",
            Some(&json!({"reason": "hold"})),
            Some(&system.token),
        )
        .await;
    assert_eq!(status, 201);
    let mut ids = Vec::new();
    for (name, catch_up) in [("every-second-skip", "skip"), ("every-second-once", "once")] {
        let body = json!({"name": name, "action_ref": "core.echo", "parameters": {"message": name},
            "cron": "* * * * * *", "timezone": "UTC", "catch_up": catch_up});
        let (status, made) = post(&system, "/api/v1/schedules", Some(body)).await;
        assert_eq!(status, 201, "{made}");
        ids.push(made["id"].as_i64().unwrap());
    }
    wait_for("five occurrences missed by each", Duration::from_secs(30), || async {
        let missed: Vec<i64> =
            sqlx::query_scalar("SELECT missed FROM schedule ORDER BY id").fetch_all(&system.db.pool).await.ok()?;
        missed.iter().all(|m| *m >= 5).then_some(())
    })
    .await;
    assert_eq!(runs_of(&system, ids[0]).await.len(), 0, "skip: nothing waits behind the pause");
    let once = runs_of(&system, ids[1]).await;
    assert_eq!(once.len(), 1, "once: one run stands for them all: {once:?}");
    assert_eq!(once[0].2, "requested");
    let (status, _) =
        system.request(reqwest::Method::DELETE, "/api/v1/pauses/action/core.echo", None, Some(&system.token)).await;
    assert_eq!(status, 200);
    let resumed_at = Utc::now();
    let ran = system.wait_terminal(once[0].0, Duration::from_secs(30)).await;
    assert_eq!(ran["status"], "completed", "{ran}");
    // after the resume each occurrence runs again, once
    let after = wait_for("runs of occurrences after the resume", Duration::from_secs(30), || async {
        let runs = runs_of(&system, ids[0]).await;
        (!runs.is_empty()).then_some(runs)
    })
    .await;
    assert!(after.iter().all(|(_, at, _)| *at >= resumed_at - chrono::Duration::seconds(1)), "{after:?}");
    system.stop().await;
}

/// A schedule runs as its token (issue 47): revoking the token stops its schedules at once
/// (paused, `paused_reason` saying why, in the revocation's audited change); one whose token
/// expired is stopped by the executor, not run, with its own audit row; resumed, a schedule runs
/// as whoever resumed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_or_expired_token_s_schedules_stop() {
    let system = System::builder().worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "builtin")]).start().await;
    let make = |token: String, name: &'static str| {
        let system = &system;
        async move {
            let body = json!({"name": name, "action_ref": "core.noop", "cron": "* * * * * *"});
            let (status, made) =
                system.request(reqwest::Method::POST, "/api/v1/schedules", Some(&body), Some(&token)).await;
            assert_eq!(status, 201, "{made}");
            made["id"].as_i64().unwrap()
        }
    };
    let token_id = |token: &str| {
        let system = &system;
        let token = token.to_string();
        async move {
            let (_, me) = system.request(reqwest::Method::GET, "/api/v1/whoami", None, Some(&token)).await;
            me["token_id"].as_i64().unwrap_or_else(|| panic!("{me}"))
        }
    };
    let ops = system.cli(&["token", "create", "--name", "ops", "--role", "operator"]).trim().to_string();
    let night = system.cli(&["token", "create", "--name", "night", "--role", "operator"]).trim().to_string();
    let (ops_id, night_id) = (token_id(&ops).await, token_id(&night).await);
    let revoked = make(ops.clone(), "as-ops").await;
    let expired = make(night.clone(), "as-night").await;
    wait_for("both schedules to run", Duration::from_secs(30), || async {
        (!runs_of(&system, revoked).await.is_empty() && !runs_of(&system, expired).await.is_empty()).then_some(())
    })
    .await;

    // revoked through the API: paused in the same change, none run after
    let (status, answer) =
        system.request(reqwest::Method::DELETE, &format!("/api/v1/tokens/{ops_id}"), None, Some(&system.token)).await;
    assert_eq!(status, 200, "{answer}");
    let runs_at_revocation = runs_of(&system, revoked).await.len();
    let (_, shown) = system.get("/api/v1/schedules/as-ops").await;
    assert_eq!(shown["paused"], true, "{shown}");
    let reason = shown["paused_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("was revoked") && reason.contains("'ops'"), "{shown}");

    // expired (no API call ends it): the executor stops it rather than run it, and audits that
    sqlx::query("UPDATE api_token SET expires = now() WHERE id = $1")
        .bind(night_id)
        .execute(&system.db.pool)
        .await
        .unwrap();
    let shown = wait_for("the executor to stop the expired token's schedule", Duration::from_secs(30), || async {
        let (_, shown) = system.get("/api/v1/schedules/as-night").await;
        (shown["paused"] == true).then_some(shown)
    })
    .await;
    assert!(shown["paused_reason"].as_str().unwrap_or_default().contains("has expired"), "{shown}");
    let runs_at_expiry = runs_of(&system, expired).await.len();
    let (_, trail) = system.get("/api/v1/audit?limit=50").await;
    let stop = trail["events"]
        .as_array()
        .and_then(|events| events.iter().find(|e| e["target"] == "schedule:as-night"))
        .unwrap_or_else(|| panic!("no audit row for the stop: {trail:#}"));
    assert_eq!(stop["actor"], "executor", "{stop}");

    // meanwhile, a schedule of a token that can act runs on, three times: the stopped ones not once
    let live = make(system.token.clone(), "as-admin").await;
    wait_for("the live schedule to run three times", Duration::from_secs(30), || async {
        (runs_of(&system, live).await.len() >= 3).then_some(())
    })
    .await;
    assert_eq!(runs_of(&system, revoked).await.len(), runs_at_revocation, "a revoked token's schedule ran");
    assert_eq!(runs_of(&system, expired).await.len(), runs_at_expiry, "an expired token's schedule ran");

    // resumed by the admin, it runs as the admin
    let (status, resumed) = post(&system, "/api/v1/schedules/as-ops/resume", None).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!((resumed["paused"].as_bool(), resumed["paused_reason"].as_str()), (Some(false), None), "{resumed}");
    assert_eq!(resumed["created_by"].as_i64(), Some(token_id(&system.token).await), "{resumed}");
    wait_for("the resumed schedule to run", Duration::from_secs(30), || async {
        (runs_of(&system, revoked).await.len() > runs_at_revocation).then_some(())
    })
    .await;
    system.stop().await;
}

/// Schedules are bounded (issue 47): no `cron` more often than `ATTUNE_SCHEDULE_MIN_INTERVAL_SECS`
/// and no more than `ATTUNE_SCHEDULES_PER_TOKEN` per token, each refusal naming what was wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_bounded_in_frequency_and_number_per_token() {
    let system = System::builder()
        .env("ATTUNE_SCHEDULE_MIN_INTERVAL_SECS", "60")
        .env("ATTUNE_SCHEDULES_PER_TOKEN", "2")
        .worker("w1", &[("ATTUNE_WORKER_RUNTIMES", "builtin")])
        .start()
        .await;
    let schedule = |name: &str, cron: &str| json!({"name": name, "action_ref": "core.noop", "cron": cron});
    for cron in ["* * * * * *", "*/30 * * * * *", "0,59 * * * * *"] {
        let (status, refused) = post(&system, "/api/v1/schedules", Some(schedule("often", cron))).await;
        assert_eq!((status, refused["error"]["parameter"].as_str()), (422, Some("cron")), "{cron}: {refused}");
        assert!(
            refused["error"]["message"].as_str().unwrap().contains("ATTUNE_SCHEDULE_MIN_INTERVAL_SECS"),
            "{refused}"
        );
    }
    for name in ["first", "second"] {
        let (status, made) = post(&system, "/api/v1/schedules", Some(schedule(name, "*/5 * * * *"))).await;
        assert_eq!(status, 201, "{made}");
    }
    let (status, refused) = post(&system, "/api/v1/schedules", Some(schedule("third", "*/5 * * * *"))).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (409, Some("schedule_limit")), "{refused}");
    // another token has its own count
    let other = system.cli(&["token", "create", "--name", "other", "--role", "operator"]).trim().to_string();
    let body = schedule("third", "*/5 * * * *");
    let (status, made) = system.request(reqwest::Method::POST, "/api/v1/schedules", Some(&body), Some(&other)).await;
    assert_eq!(status, 201, "{made}");
    system.stop().await;
}
