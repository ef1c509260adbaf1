//! Bulk actions by filter against the real binaries: a dry run selects and changes nothing; a
//! fail, a retry and a cancel of 500 executions each act on all of them by their own rules; the
//! same retry again makes none; the calls are in the audit trail with their reasons.

use attune_testkit::System;
use serde_json::{Value, json};

async fn bulk(system: &System, body: Value, reason: Option<&str>) -> (u16, Value) {
    let mut request =
        system.http.post(format!("{}/api/v1/executions/bulk", system.api_url)).bearer_auth(&system.token).json(&body);
    if let Some(reason) = reason {
        request = request.header("X-Attune-Reason", reason);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn count(system: &System, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string())).fetch_one(&system.db.pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_fail_retry_and_cancel_act_on_every_execution_selected_once() {
    // no worker: what is submitted waits, requested
    let system = System::builder().start().await;
    for _ in 0..10 {
        let submissions = (0..50).map(|n| system.submit("core.echo", json!({"message": format!("m{n}")})));
        futures_util::future::join_all(submissions).await;
    }
    let waiting = json!({"status": "requested", "action_ref": "core.echo"});

    // refusals name what is wrong, and change nothing
    for (body, parameter) in [
        (json!({"action": "cancel", "filter": {}, "reason": "r"}), "filter"),
        (json!({"action": "cancel", "filter": {"status": "sleeping"}, "reason": "r"}), "filter.status"),
        (json!({"action": "cancel", "filter": waiting, "limit": 1001, "reason": "r"}), "limit"),
        (json!({"action": "fail", "filter": waiting, "reason": "  "}), "reason"),
        (json!({"action": "fail", "filter": waiting, "reason": "x".repeat(1001)}), "reason"),
        (json!({"action": "fail", "filter": waiting}), "reason"),
    ] {
        let (status, answer) = bulk(&system, body.clone(), None).await;
        assert_eq!((status, answer["error"]["parameter"].as_str()), (422, Some(parameter)), "{body}: {answer}");
    }
    // a dry run: which, and nothing changed
    let (status, dry) = bulk(
        &system,
        json!({"action": "fail", "filter": waiting, "dry_run": true, "limit": 1000, "reason": "drill"}),
        None,
    )
    .await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!((dry["selected"].as_array().unwrap().len(), dry["more"].as_bool()), (500, Some(false)));
    assert!(dry["done"].as_array().unwrap().is_empty());
    assert_eq!(count(&system, "SELECT count(*) FROM execution WHERE status = 'requested'").await, 500);

    // fail them all
    let (_, failed) =
        bulk(&system, json!({"action": "fail", "filter": waiting, "limit": 1000, "reason": "host retired"}), None)
            .await;
    assert_eq!(failed["done"].as_array().unwrap().len(), 500, "{failed}");
    assert_eq!(
        count(
            &system,
            "SELECT count(*) FROM execution WHERE status = 'failed' AND failure_kind = 'operator_failed' \
                        AND error = 'failed by an operator: host retired' AND ended_by IS NOT NULL"
        )
        .await,
        500
    );

    // retry them all; the same call again retries none
    let retry = json!({"action": "retry", "filter": {"failure_kind": "operator_failed"}, "limit": 1000, "reason": "host is back"});
    let (_, retried) = bulk(&system, retry.clone(), None).await;
    assert_eq!(
        (retried["done"].as_array().unwrap().len(), retried["skipped"].as_array().unwrap().len()),
        (500, 0),
        "{retried}"
    );
    let retries = "SELECT count(*) FROM execution WHERE original_execution IS NOT NULL AND retry_reason = 'manual_retry' \
                   AND status = 'requested' AND submitted_by IS NOT NULL";
    assert_eq!(count(&system, retries).await, 500);
    let (_, again) = bulk(&system, retry, None).await;
    assert_eq!(
        (again["selected"].as_array().unwrap().len(), again["done"].as_array().unwrap().len()),
        (0, 0),
        "{again}"
    );
    assert_eq!(count(&system, "SELECT count(*) FROM execution").await, 1000, "a second retry was made");

    // cancel the retries, 300 in a first call and the rest in a second
    let cancel = json!({"action": "cancel", "filter": {"status": "requested"}, "limit": 300, "reason": "drained"});
    let (_, first) = bulk(&system, cancel.clone(), None).await;
    assert_eq!((first["done"].as_array().unwrap().len(), first["more"].as_bool()), (300, Some(true)));
    let (_, rest) = bulk(&system, cancel, None).await;
    assert_eq!((rest["done"].as_array().unwrap().len(), rest["more"].as_bool()), (200, Some(false)));
    assert_eq!(count(&system, "SELECT count(*) FROM execution WHERE status = 'canceled'").await, 500);

    // the chain filter: one chain's attempts only
    let root: i64 = sqlx::query_scalar("SELECT min(id) FROM execution").fetch_one(&system.db.pool).await.unwrap();
    let (_, chain) = bulk(
        &system,
        json!({"action": "retry", "filter": {"chain_root": root, "status": "canceled"}, "dry_run": true, "reason": "look"}),
        None,
    )
    .await;
    let retry_of_root: i64 = sqlx::query_scalar("SELECT id FROM execution WHERE original_execution = $1")
        .bind(root)
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(chain["selected"], json!([retry_of_root]), "{chain}");

    // the audit trail has each call with its reason and how many it selected
    let (_, trail) = system.get("/api/v1/audit?route=/api/v1/executions/bulk&limit=1000").await;
    let events = trail["events"].as_array().unwrap();
    // (six refusals, two dry runs, fail, retry twice, cancel twice)
    assert_eq!(events.len(), 13, "{trail}");
    let retry_call = events.iter().find(|e| e["reason"] == "host is back" && e["target"] == "executions:500");
    assert!(retry_call.is_some_and(|e| e["status"] == 200), "{trail}");
    // (a fail's reason, given in its body, is the audit's reason too)
    assert!(events.iter().any(|e| e["reason"] == "host retired" && e["target"] == "executions:500"), "{trail}");
    // a dry run's row says it was one: it changed nothing
    let drill = events.iter().find(|e| e["reason"] == "drill").expect("the dry run's row");
    assert!(drill["target"].as_str().unwrap().starts_with("dry run: executions:"), "{drill}");

    // the CLI's dry run
    let out = std::process::Command::new(attune_testkit::workspace_binary("attune"))
        .args(["execution", "bulk", "retry", "--status", "canceled", "--limit", "5", "--dry-run", "--reason", "look"])
        .env("ATTUNE_API_URL", &system.api_url)
        .env("ATTUNE_TOKEN", &system.token)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && shown.starts_with("dry run: 5 selected (more match"),
        "{shown}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    system.stop().await;
}

/// Issue 46 (review R4): a bulk cancel whose client hangs up part-way (a client timeout, a
/// proxy) still ends with exactly one audit row: its changes and the row are one transaction,
/// carried out to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_cancel_whose_client_hangs_up_still_writes_its_one_audit_row() {
    let system = System::builder().start().await;
    for _ in 0..10 {
        let submissions = (0..50).map(|n| system.submit("core.echo", json!({"message": format!("m{n}")})));
        futures_util::future::join_all(submissions).await;
    }
    let body = json!({"action": "cancel", "filter": {"status": "requested", "action_ref": "core.echo"}, "limit": 500, "reason": "hung up"});
    // the client gives up well before 500 cancels are done
    let sent = system
        .http
        .post(format!("{}/api/v1/executions/bulk", system.api_url))
        .bearer_auth(&system.token)
        .timeout(std::time::Duration::from_millis(150))
        .json(&body)
        .send()
        .await;
    assert!(sent.is_err(), "the client gave up before the answer: {sent:?}");
    // the call's cancels and its audit row commit together, whenever it ends
    let audited = attune_testkit::wait_for("the audit row", std::time::Duration::from_secs(60), || {
        let system = &system;
        async move {
            let rows = count(system, "SELECT count(*) FROM audit_event WHERE route LIKE '%/executions/bulk'").await;
            (rows > 0).then_some(rows)
        }
    })
    .await;
    let canceled = count(&system, "SELECT count(*) FROM execution WHERE status = 'canceled'").await;
    assert_eq!(canceled, 500, "the call's changes came with its audit row");
    assert_eq!(audited, 1, "one request, one audit row ({canceled} executions canceled)");
    system.stop().await;
}
