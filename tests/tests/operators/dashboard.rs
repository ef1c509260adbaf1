//! The SRE dashboard (`/ui`) in a real headless chromium, against a running system with real
//! executions and retries: the login form and a refused token, the workers page with health
//! classes and live refresh, the executions list and its status filter, an automatic retry chain
//! with its reasons and backoff gaps, a delayed retry's "next attempt at", Retry and Cancel
//! clicked on the page, and the retry charts with their alert thresholds; a workflow run as its
//! graph of steps.
//!
//! With `ATTUNE_SCREENSHOTS_DIR` set, it writes a PNG of each page there (the book's pictures
//! come from `ATTUNE_SCREENSHOTS_DIR=book/src/screenshots`).

use std::path::PathBuf;
use std::time::Duration;

use attune_testkit::browser::Browser;
use attune_testkit::system::repo_root;
use attune_testkit::{System, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

async fn screenshot(browser: &Browser, name: &str) {
    let Ok(dir) = std::env::var("ATTUNE_SCREENSHOTS_DIR") else { return };
    let dir = PathBuf::from(dir);
    let dir = if dir.is_absolute() { dir } else { repo_root().join(dir) };
    browser.screenshot(&dir.join(format!("{name}.png"))).await;
}

/// The rows of the executions table as (id, status), in page order.
async fn listed(browser: &Browser) -> Vec<(i64, String)> {
    let rows = browser
        .eval(
            "return Array.from(document.querySelectorAll('#executions tbody tr'))
                .map(r => [Number(r.dataset.execution), r.querySelector('[data-badge]').textContent])",
        )
        .await;
    rows.as_array().unwrap().iter().map(|r| (r[0].as_i64().unwrap(), r[1].as_str().unwrap().to_string())).collect()
}

async fn ids_where(system: &System, condition: &str) -> Vec<i64> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT id FROM execution WHERE {condition} ORDER BY id DESC")))
        .fetch_all(&system.db.pool)
        .await
        .unwrap()
}

/// What the timeline shows for each attempt: (execution id, status, reason, gap, worker) texts.
async fn timeline(browser: &Browser) -> Vec<[String; 5]> {
    let attempts = browser
        .eval(
            "return Array.from(document.querySelectorAll('#chain li')).map(li => [li.dataset.execution,
                li.querySelector('[data-badge]').textContent, li.querySelector('[data-field=reason]').textContent,
                li.querySelector('[data-field=gap]').textContent, li.querySelector('[data-field=worker]').textContent])",
        )
        .await;
    attempts.as_array().unwrap().iter().map(|a| std::array::from_fn(|i| a[i].as_str().unwrap().to_string())).collect()
}

async fn wait_status(system: &System, id: i64, status: &str) {
    wait_for(&format!("execution {id} to be {status}"), DEADLINE, || async move {
        let (_, body) = system.get(&format!("/api/v1/executions/{id}")).await;
        (body["status"] == status).then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_workers_executions_retry_chains_and_charts_and_acts_through_the_api() {
    let system = System::builder()
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.5")
        .worker("worker-a", &[])
        .worker("worker-b", &[])
        .pack(repo_root().join("testkit/packs/e2e"))
        .start()
        .await;
    let ui = format!("{}/ui", system.api_url);

    // The pages are static and need no token; they carry a strict CSP and none of the data.
    let page = system.http.get(format!("{ui}/workers")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("script-src 'self'") && csp.contains("default-src 'none'"), "{csp}");
    assert!(!page.text().await.unwrap().contains("worker-a"), "the shell carries no data");
    // the bare address is the dashboard too
    let bare = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let root = bare.get(format!("{}/", system.api_url)).send().await.unwrap();
    assert_eq!((root.status().as_u16(), root.headers()["location"].to_str().unwrap()), (303, "/ui/workers"));

    // Real executions: completed ones, a permanent failure, an automatic retry chain.
    let mut completed = Vec::new();
    for message in ["hello", "from", "the dashboard test"] {
        completed.push(system.submit("core.echo", json!({"message": message})).await);
    }
    completed.push(system.submit("core.python_echo", json!({"message": "hi", "repeat": 2})).await);
    let failed = system.submit("core.fail", json!({"exit_code": 3, "message": "disk full"})).await;
    let flaky = system.submit("core.flaky", json!({"fail_times": 2})).await;
    for execution in &completed {
        assert_eq!(system.wait_terminal(id(execution), DEADLINE).await["status"], "completed");
    }
    let failed = system.wait_terminal(id(&failed), DEADLINE).await;
    assert_eq!((failed["status"].as_str(), failed["failure_kind"].as_str()), (Some("failed"), Some("action_failed")));
    let chain = system.wait_chain(id(&flaky), DEADLINE).await;
    let statuses: Vec<&str> = chain.iter().map(|a| a["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["failed", "failed", "completed"], "{chain:#?}");
    let (_, workers) = system.get("/api/v1/workers").await;
    let worker_name = |worker: &Value| {
        workers.as_array().unwrap().iter().find(|w| w["id"] == *worker).unwrap()["name"].as_str().unwrap().to_string()
    };

    // worker-b reports enough consecutive failures to be degraded
    system.force_health("worker-b", Some(json!({"consecutive_failures": 4})));
    system.wait_worker_health("worker-b", "degraded").await;

    let browser = Browser::start().await;

    // A wrong token: the login form shows the API's refusal and the browser keeps no data.
    browser.goto(&format!("{ui}/login")).await;
    browser.type_into("#token", "not-a-real-token").await;
    browser.click("#login-submit").await;
    let refusal = browser.text("#login-message .error").await;
    assert!(refusal.contains("unknown or revoked token"), "{refusal}");
    assert!(browser.url().await.contains("/ui/login"));
    assert_eq!(browser.eval("return sessionStorage.getItem('attune.token')").await, Value::Null);
    screenshot(&browser, "login-refused").await;
    // ... and a page opened with a token the API refuses goes back to the login form, showing why
    browser.eval("sessionStorage.setItem('attune.token', 'revoked-or-wrong'); return null").await;
    browser.goto(&format!("{ui}/workers")).await;
    browser.wait("the login form after a refused token", "return location.pathname === '/ui/login'").await;
    let refusal = browser.text("#login-message .error").await;
    assert!(refusal.contains("The API refused the token: unknown or revoked token"), "{refusal}");
    let shown = browser.page_text().await;
    assert!(!shown.contains("worker-a") && !shown.contains("healthy"), "no data after a refusal: {shown}");

    // the refused requests are in the console as errors; from here on there must be none
    let refused = browser.console_errors().await;
    assert!(!refused.is_empty() && refused.iter().all(|e| e.contains("401")), "{refused:#?}");

    // Log in with the real token: back to the page that was asked for.
    browser.type_into("#token", &system.token).await;
    browser.click("#login-submit").await;
    browser.wait("the workers page", "return location.pathname === '/ui/workers'").await;

    // Workers: both, with their class as text and colour, counts by class.
    let health =
        |name: &str| format!("return document.querySelector('[data-worker=\"{name}\"] [data-health]')?.textContent");
    assert_eq!(browser.wait("worker-a's health", &health("worker-a")).await, "healthy");
    assert_eq!(browser.wait("worker-b's health", &health("worker-b")).await, "degraded");
    let count =
        |class: &str| format!("return document.querySelector('[data-count=\"{class}\"] .card-value')?.textContent");
    assert_eq!(browser.wait("the healthy count", &count("healthy")).await, "1");
    assert_eq!(browser.wait("the degraded count", &count("degraded")).await, "1");
    assert_eq!(browser.wait("the unhealthy count", &count("unhealthy")).await, "0");
    let row = browser.text("[data-worker=\"worker-b\"]").await;
    assert!(row.contains("shell, python, builtin"), "runtimes: {row}");
    let consecutive = browser.text("[data-worker=\"worker-b\"] [data-field=consecutive_failures]").await;
    assert_eq!(consecutive, "4");
    let colour = browser
        .eval("return getComputedStyle(document.querySelector('[data-worker=\"worker-b\"] [data-health]')).color")
        .await;
    assert_eq!(colour, "rgb(154, 103, 0)", "degraded is amber");
    screenshot(&browser, "workers").await;
    // it refreshes live: worker-b recovers and the open page shows it without a reload
    browser.eval("document.body.dataset.marker = 'not reloaded'; return null").await;
    system.force_health("worker-b", None);
    browser.wait("worker-b to turn healthy on the open page", &format!("{} === 'healthy'", health("worker-b"))).await;
    assert_eq!(browser.wait("the healthy count", &count("healthy")).await, "2");
    assert_eq!(browser.eval("return document.body.dataset.marker").await, "not reloaded");
    // an operator drains worker-a and undrains it: the API's record, and the page, say so
    browser.click("[data-drain=\"worker-a\"]").await;
    let drained = browser.wait("the drained status", "return document.querySelector('[data-worker=\"worker-a\"] [data-field=status]')?.textContent.includes('drained since') || null").await;
    assert_eq!(drained, json!(true));
    let worker_a = || async {
        let (_, workers) = system.get("/api/v1/workers").await;
        workers.as_array().unwrap().iter().find(|w| w["name"] == "worker-a").unwrap().clone()
    };
    let worker = worker_a().await;
    assert!(worker["drained_at"].is_string(), "{worker}");
    browser.click("[data-undrain=\"worker-a\"]").await;
    browser.wait("the undrained status", "return document.querySelector('[data-worker=\"worker-a\"] [data-field=status]')?.textContent === 'active' || null").await;
    let worker = worker_a().await;
    assert_eq!(worker["drained_at"], Value::Null, "{worker}");

    // Executions: every execution, newest first; the status filter shows only failed ones.
    browser.goto(&format!("{ui}/executions")).await;
    browser.wait("the executions table", "return document.querySelector('#executions tbody tr') !== null").await;
    let all = ids_where(&system, "true").await;
    let rows = listed(&browser).await;
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), all, "{rows:?}");
    assert!(browser.text("#page-range").await.ends_with(&format!("of {}", all.len())));
    screenshot(&browser, "executions").await;
    browser.click("#filter-status option[value=\"failed\"]").await;
    browser.click("#filter-apply").await;
    browser
        .wait(
            "the filtered list",
            "return location.search.includes('status=failed') && document.querySelector('#executions') !== null",
        )
        .await;
    let rows = listed(&browser).await;
    let failed_ids = ids_where(&system, "status = 'failed'").await;
    assert_eq!(failed_ids.len(), 3, "two failed flaky attempts and core.fail");
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), failed_ids, "{rows:?}");
    assert!(rows.iter().all(|(_, status)| status == "failed"), "{rows:?}");
    // The time window: a core.echo run moved two hours back is outside the last hour only.
    let echoes = ids_where(&system, "action_ref = 'core.echo'").await;
    assert_eq!(echoes.len(), 3);
    sqlx::query("UPDATE execution SET created = now() - interval '2 hours' WHERE id = $1")
        .bind(id(&completed[0]))
        .execute(&system.db.pool)
        .await
        .unwrap();
    let recent: Vec<i64> = echoes.iter().copied().filter(|e| *e != id(&completed[0])).collect();
    browser.goto(&format!("{ui}/executions?action_ref=core.echo&window=3600")).await;
    browser.wait("the core.echo list", "return document.querySelector('#executions tbody tr') !== null").await;
    assert_eq!(listed(&browser).await.iter().map(|r| r.0).collect::<Vec<_>>(), recent);
    browser.goto(&format!("{ui}/executions?action_ref=core.echo")).await;
    browser.wait("the core.echo list", "return document.querySelectorAll('#executions tbody tr').length === 3").await;
    assert_eq!(listed(&browser).await.iter().map(|r| r.0).collect::<Vec<_>>(), echoes);
    // a window the page does not offer is ignored, not an error
    browser.goto(&format!("{ui}/executions?action_ref=core.echo&window=abc")).await;
    browser.wait("the core.echo list", "return document.querySelectorAll('#executions tbody tr').length === 3").await;

    // Pagination: 25 a page, newest first; "older →" and "← newer" move through pages pinned to
    // the first load, so an execution submitted meanwhile does not shift them.
    for _ in 0..20 {
        system.submit("core.noop", json!({})).await;
    }
    let all = ids_where(&system, "true").await;
    assert!(all.len() > 25 && all.len() <= 50, "{}", all.len());
    browser.goto(&format!("{ui}/executions")).await;
    let first_row =
        |id: i64| format!("return document.querySelector('#executions tbody tr')?.dataset.execution === '{id}'");
    browser.wait("page 1", &first_row(all[0])).await;
    assert_eq!(listed(&browser).await.iter().map(|r| r.0).collect::<Vec<_>>(), all[..25]);
    assert_eq!(browser.text("#page-range").await, format!("1–25 of {}", all.len()));
    system.submit("core.noop", json!({})).await;
    browser.click("#page-next").await;
    browser.wait("page 2", &first_row(all[25])).await;
    assert_eq!(listed(&browser).await.iter().map(|r| r.0).collect::<Vec<_>>(), all[25..]);
    assert_eq!(browser.text("#page-range").await, format!("26–{} of {}", all.len(), all.len()));
    assert_eq!(browser.eval("return document.querySelector('#page-next')").await, Value::Null, "the last page");
    browser.click("#page-prev").await;
    browser.wait("page 1 again", &first_row(all[0])).await;
    assert_eq!(listed(&browser).await.len(), 25);

    // The automatic retry chain: every attempt with its worker, reason and backoff gap.
    let last = id(chain.last().unwrap());
    browser.goto(&format!("{ui}/executions/{last}")).await;
    browser.wait("the chain", "return document.querySelectorAll('#chain li').length === 3").await;
    let shown = timeline(&browser).await;
    for (attempt, (shown, expected)) in shown.iter().zip(&chain).enumerate() {
        assert_eq!(shown[0], id(expected).to_string());
        assert_eq!(shown[1], expected["status"].as_str().unwrap());
        assert_eq!(shown[4], format!("worker: {}", worker_name(&expected["worker"])));
        if attempt == 0 {
            assert_eq!((shown[2].as_str(), shown[3].as_str()), ("reason: —", "first attempt"));
        } else {
            assert_eq!(shown[2], "reason: transient_error");
            let backoff = expected["backoff_secs"].as_f64().unwrap();
            let gap = expected["gap_secs"].as_f64().unwrap();
            // "backoff 0.52 s · waited 0.61 s before starting", as the API gives them (rounded)
            let numbers: Vec<f64> = shown[3]
                .split(|c: char| !(c.is_ascii_digit() || c == '.'))
                .filter(|n| !n.is_empty())
                .map(|n| n.parse().unwrap())
                .collect();
            assert!(shown[3].starts_with("backoff ") && shown[3].ends_with(" s before starting"), "{}", shown[3]);
            assert_eq!(numbers.len(), 2, "{}", shown[3]);
            assert!((numbers[0] - backoff).abs() < 0.051 && (numbers[1] - gap).abs() < 0.051, "{}", shown[3]);
            // the policy: 0.5 s, then 1 s, each ±20 %
            let nominal = 0.5 * 2f64.powi(attempt as i32 - 1);
            assert!((nominal * 0.8 - 0.01..=nominal * 1.2 + 0.01).contains(&backoff), "attempt {attempt}: {backoff}");
        }
    }
    assert_eq!(browser.text("#stdout").await.trim(), "attempt 2: done");
    assert_eq!(browser.text("[data-fact=\"retry reason\"]").await, "transient_error");
    // finished and not retried yet: an operator may retry it; it cannot be canceled
    assert_eq!(browser.eval("return document.querySelector('#retry').disabled").await, false);
    assert_eq!(browser.eval("return document.querySelector('#cancel').disabled").await, true);
    screenshot(&browser, "execution").await;

    // A retry waiting out its backoff shows when the next attempt runs, then runs.
    let waiting = system.submit("e2e.flaky_fixed", json!({"fail_times": 1})).await;
    browser.goto(&format!("{ui}/executions/{}", id(&waiting))).await;
    let next = browser
        .wait("the delayed retry", "return document.querySelector('#chain [data-field=next]')?.textContent")
        .await;
    let (_, view) = system.get(&format!("/api/v1/executions/{}", id(&waiting))).await;
    let next_at = view["next_attempt_at"].as_str().expect("the API shows the next attempt");
    let expected = format!("next attempt at {}", next_at[..19].replace('T', " "));
    assert_eq!(next, expected);
    assert_eq!(browser.text("[data-fact=\"next attempt at\"]").await, next_at[..19].replace('T', " "));
    screenshot(&browser, "execution-delayed").await;
    browser
        .wait(
            "the retry to complete on the open page",
            "return document.querySelector('#chain li:last-child [data-badge]')?.textContent === 'completed'",
        )
        .await;

    // Retry on the permanent failure: the new attempt appears in the chain on the page.
    let failed_id = id(&failed);
    browser.goto(&format!("{ui}/executions/{failed_id}")).await;
    browser.wait("one attempt", "return document.querySelectorAll('#chain li').length === 1").await;
    assert_eq!(browser.eval("return document.querySelector('#retry').disabled").await, false);
    browser.click("#retry").await;
    browser.wait("the manual retry in the chain", "return document.querySelectorAll('#chain li').length === 2").await;
    let (retry_id, reason): (i64, Option<String>) =
        sqlx::query_as("SELECT id, retry_reason FROM execution WHERE original_execution = $1")
            .bind(failed_id)
            .fetch_one(&system.db.pool)
            .await
            .unwrap();
    assert_eq!(reason.as_deref(), Some("manual_retry"));
    let shown = timeline(&browser).await;
    assert_eq!(shown[1][0], retry_id.to_string());
    assert_eq!(shown[1][2], "reason: manual_retry");
    assert!(browser.text("[data-notice=retry]").await.contains(&format!("execution #{retry_id}")));
    browser
        .wait(
            "the retry to fail again on the page",
            "return document.querySelector('#chain li:last-child [data-badge]')?.textContent === 'failed'",
        )
        .await;
    assert_eq!(browser.eval("return document.querySelector('#retry').disabled").await, true, "already retried");
    let retries: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE original_execution = $1")
        .bind(failed_id)
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(retries, 1);

    // Cancel a running execution from its page (two clicks: arm, confirm).
    let sleeper = system.submit("core.sleep", json!({"seconds": 45})).await;
    wait_status(&system, id(&sleeper), "running").await;
    browser.goto(&format!("{ui}/executions/{}", id(&sleeper))).await;
    browser
        .wait(
            "the running execution",
            "return document.querySelector('.title [data-badge]')?.textContent === 'running'",
        )
        .await;
    // while it runs, the page follows its output (fetch with the token in a header, not a URL)
    browser.wait("the live output section", "return document.querySelector('#live-state') !== null").await;
    browser.type_into("#action-reason", "started by mistake").await;
    browser.click("#cancel").await;
    assert_eq!(browser.text("#cancel").await, "Confirm cancel");
    browser.click("#cancel").await;
    browser
        .wait(
            "the page to show it canceled",
            "return document.querySelector('.title [data-badge]')?.textContent === 'canceled'",
        )
        .await;
    let status: String = sqlx::query_scalar("SELECT status::text FROM execution WHERE id = $1")
        .bind(id(&sleeper))
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    assert_eq!(status, "canceled");
    // the reason typed went with the cancel: into the record and the audit trail
    let (error, audited): (Option<String>, Option<String>) = sqlx::query_as(
        "SELECT e.error, (SELECT a.reason FROM audit_event a WHERE a.path = '/api/v1/executions/' || e.id || '/cancel' \
         ORDER BY a.id DESC LIMIT 1) FROM execution e WHERE e.id = $1",
    )
    .bind(id(&sleeper))
    .fetch_one(&system.db.pool)
    .await
    .unwrap();
    assert!(error.as_deref().is_some_and(|e| e.ends_with("started by mistake")), "{error:?}");
    assert_eq!(audited.as_deref(), Some("started by mistake"));
    assert_eq!(browser.eval("return document.querySelector('#cancel').disabled").await, true);
    browser
        .wait(
            "the live output to end with the execution",
            "return document.querySelector('#live-state')?.dataset.ended === 'canceled'",
        )
        .await;

    // The audit trail (the test's token is an admin's): the cancel and the retry clicked above,
    // newest first, each with who asked and what it was answered.
    browser.goto(&format!("{ui}/audit")).await;
    let cancel_path = format!("POST /api/v1/executions/{}/cancel", id(&sleeper));
    let request = browser
        .wait(
            "the audit trail",
            "return document.querySelector('#audit-table tbody tr [data-field=request]')?.textContent",
        )
        .await;
    assert_eq!(request, cancel_path);
    assert_eq!(browser.text("#audit-table tbody tr [data-field=status]").await, "200");
    assert!(browser.text("#audit-table tbody tr [data-field=who]").await.ends_with("(admin)"));
    let filtered = format!("{ui}/audit?route=%2Fapi%2Fv1%2Fexecutions%2F%7Bid%7D%2Fretry");
    browser.goto(&filtered).await;
    let retried = browser
        .wait(
            "the filtered trail",
            "return document.querySelector('#audit-table tbody tr [data-field=request]')?.textContent",
        )
        .await;
    assert_eq!(retried, format!("POST /api/v1/executions/{failed_id}/retry"));
    screenshot(&browser, "audit").await;
    assert_eq!(browser.eval("return document.querySelector('[data-nav=audit]').hidden").await, false);

    // The series behind the charts: out-of-range parameters are named; its buckets add up to the
    // window's totals.
    for (query, parameter) in [("buckets=0", "buckets"), ("buckets=241", "buckets"), ("window_secs=0", "window_secs")] {
        let (status, body) = system.get(&format!("/api/v1/stats/retries/series?{query}")).await;
        assert_eq!(status, 422, "{query}: {body}");
        assert_eq!(body["error"]["parameter"], parameter, "{query}: {body}");
    }
    let (_, stats) = system.get("/api/v1/stats/retries?window_secs=300").await;
    let (status, series) = system.get("/api/v1/stats/retries/series?window_secs=300&buckets=7").await;
    assert_eq!(status, 200, "{series}");
    let buckets = series["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 7);
    let sum = |field: &str| buckets.iter().map(|b| b[field].as_i64().unwrap()).sum::<i64>();
    assert_eq!(sum("retry_executions"), stats["retry_executions"].as_i64().unwrap(), "{series}");
    assert_eq!(sum("original_executions"), stats["original_executions"].as_i64().unwrap(), "{series}");

    // Retries: the numbers and three charts, with the quick reference's thresholds marked.
    browser.goto(&format!("{ui}/retries?window=300")).await;
    for chart in ["retry-rate", "retry-success", "retry-reasons"] {
        browser
            .wait(
                &format!("the {chart} chart"),
                &format!("return document.querySelector('svg[data-chart=\"{chart}\"]') !== null"),
            )
            .await;
    }
    let threshold = |chart: &str| {
        format!("return document.querySelector('svg[data-chart=\"{chart}\"] line.threshold')?.dataset.threshold")
    };
    assert_eq!(browser.wait("the retry rate threshold", &threshold("retry-rate")).await, "20");
    assert_eq!(browser.wait("the success threshold", &threshold("retry-success")).await, "70");
    let bars = |reason: &str| {
        format!(
            "return document.querySelectorAll('svg[data-chart=\"retry-reasons\"] rect.bar[data-reason=\"{reason}\"]').length"
        )
    };
    assert!(browser.eval(&bars("transient_error")).await.as_i64().unwrap() >= 1);
    assert!(browser.eval(&bars("manual_retry")).await.as_i64().unwrap() >= 1);
    assert_eq!(browser.eval(&bars("worker_unavailable")).await, 0);
    let rate = browser.text("[data-stat=retry_rate] .card-value").await;
    assert_eq!(rate, format!("{:.1} %", stats["retry_rate"].as_f64().unwrap()));
    assert_eq!(browser.text("[data-stat=retry_executions] .card-value").await, stats["retry_executions"].to_string());
    let reasons = browser.text("#reasons").await;
    assert!(reasons.contains("transient_error") && reasons.contains("manual_retry"), "{reasons}");
    screenshot(&browser, "retries").await;

    // A bulk retry of what the list's filters select: a preview first, then the retries.
    // (among the executions there now: a retry made here may fail in turn while this runs)
    let newest: i64 = sqlx::query_scalar("SELECT max(id) FROM execution").fetch_one(&system.db.pool).await.unwrap();
    let unretried = "SELECT count(*) FROM execution e WHERE e.status = 'failed' AND e.id <= $1 \
                     AND NOT EXISTS (SELECT 1 FROM execution r WHERE r.original_execution = e.id)";
    let waiting: i64 = sqlx::query_scalar(unretried).bind(newest).fetch_one(&system.db.pool).await.unwrap();
    assert!(waiting >= 1, "a failed execution not yet retried");
    browser.goto(&format!("{ui}/executions?status=failed")).await;
    browser.wait("the bulk panel", "return document.querySelector('#bulk-preview') !== null").await;
    browser.type_into("#bulk-reason", "after the fix").await;
    browser.click("#bulk-preview").await;
    let preview =
        browser.wait("the preview", "return document.querySelector('[data-bulk=preview]')?.textContent").await;
    assert_eq!(preview, format!("retry: {waiting} selected"));
    browser.click("#bulk-apply").await;
    let done = browser.wait("the bulk retry", "return document.querySelector('[data-bulk=done]')?.textContent").await;
    assert_eq!(done, format!("retry: {waiting} done, 0 skipped"));
    let left: i64 = sqlx::query_scalar(unretried).bind(newest).fetch_one(&system.db.pool).await.unwrap();
    assert_eq!(left, 0, "every failed execution selected was retried");
    screenshot(&browser, "bulk").await;

    // Pause a runtime from the workers page, see it listed with its reason, resume it.
    browser.goto(&format!("{ui}/workers")).await;
    browser.wait("the pause form", "return document.querySelector('#pause-apply') !== null").await;
    browser.eval("document.querySelector('#pause-kind').value = 'runtime'; return true").await;
    browser.type_into("#pause-name", "python").await;
    browser.type_into("#pause-reason", "interpreter upgrade").await;
    browser.click("#pause-apply").await;
    browser
        .wait("the pause listed", "return document.querySelector('[data-pause=\"runtime/python\"]')?.textContent")
        .await;
    let listed = browser.text("[data-pause=\"runtime/python\"]").await;
    assert!(listed.contains("interpreter upgrade") && listed.contains("test"), "{listed}");
    screenshot(&browser, "pauses").await;
    browser.click("[data-resume=\"runtime/python\"]").await;
    browser.wait("the pause gone", "return document.querySelector('#no-pauses') !== null").await;
    let (_, pauses) = system.get("/api/v1/pauses").await;
    assert_eq!(pauses, serde_json::json!([]));

    // an operator's concurrency limit, set and cleared on the Workers page
    browser.wait("the concurrency form", "return document.querySelector('#concurrency-apply') !== null").await;
    browser.type_into("#concurrency-action", "core.echo").await;
    browser.type_into("#concurrency-limit", "2").await;
    browser.type_into("#concurrency-reason", "the backend takes two").await;
    browser.click("#concurrency-apply").await;
    browser
        .wait(
            "the limit listed",
            "return document.querySelector('[data-concurrency=\"core.echo\"] [data-field=limit]')?.textContent",
        )
        .await;
    let listed = browser.text("[data-concurrency=\"core.echo\"]").await;
    assert!(listed.contains('2') && listed.contains("the backend takes two"), "{listed}");
    let (_, action) = system.get("/api/v1/actions/core.echo").await;
    assert_eq!(action["concurrency"], serde_json::json!({"limit": 2, "key": null}), "{action}");
    browser.click("[data-clear-concurrency=\"core.echo\"]").await;
    browser.wait("the limit gone", "return document.querySelector('#no-concurrency') !== null").await;

    // a schedule made, paused and deleted on the Schedules page
    browser.goto(&format!("{ui}/schedules")).await;
    browser.wait("the schedule form", "return document.querySelector('#schedule-apply') !== null").await;
    browser.type_into("#schedule-name", "nightly").await;
    browser.type_into("#schedule-action", "core.echo").await;
    browser.type_into("#schedule-parameters", "{\"message\": \"report\"}").await;
    browser.type_into("#schedule-cron", "0 3 * * *").await;
    browser.type_into("#schedule-timezone", "Europe/Paris").await;
    browser.click("#schedule-apply").await;
    browser
        .wait(
            "the schedule listed",
            "return document.querySelector('[data-schedule=\"nightly\"] [data-field=timing]')?.textContent",
        )
        .await;
    assert_eq!(browser.text("[data-schedule=\"nightly\"] [data-field=timing]").await, "0 3 * * * (Europe/Paris)");
    screenshot(&browser, "schedules").await;
    // ... changed in place: Edit loads it into the form, Save replaces its definition
    browser.click("[data-edit-schedule=\"nightly\"]").await;
    assert_eq!(browser.eval("return document.querySelector('#schedule-cron').value").await, "0 3 * * *");
    assert_eq!(browser.eval("return document.querySelector('#schedule-name').readOnly").await, true);
    browser.type_into("#schedule-cron", "30 4 * * *").await;
    browser.type_into("#schedule-parameters", "{\"message\": \"changed\"}").await;
    browser.click("#schedule-apply").await;
    browser
        .wait("the change saved", "return document.querySelector('[data-changed=\"nightly\"]') !== null || null")
        .await;
    browser
        .wait(
            "the changed timing listed",
            "return document.querySelector('[data-schedule=\"nightly\"] [data-field=timing]')?.textContent === '30 4 * * * (Europe/Paris)' || null",
        )
        .await;
    let (_, nightly) = system.get("/api/v1/schedules/nightly").await;
    assert_eq!(
        (&nightly["cron"], &nightly["parameters"]["message"]),
        (&json!("30 4 * * *"), &json!("changed")),
        "{nightly}"
    );
    browser.click("#schedule-cancel-edit").await;
    assert_eq!(browser.text("#schedule-apply").await, "Make");
    browser.click("[data-run-schedule=\"nightly\"]").await;
    wait_for("the schedule's run now", DEADLINE, || async {
        let runs: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM execution e JOIN schedule s ON s.id = e.schedule WHERE s.name = 'nightly' AND e.config->>'run_now' = 'true'",
        )
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
        (runs == 1).then_some(())
    })
    .await;
    browser.click("[data-pause-schedule=\"nightly\"]").await;
    browser
        .wait(
            "the schedule paused",
            "return document.querySelector('[data-schedule=\"nightly\"] [data-field=next]')?.textContent === 'paused' || null",
        )
        .await;
    browser.click("[data-delete-schedule=\"nightly\"]").await;
    browser.wait("the schedule gone", "return document.querySelector('#no-schedules') !== null").await;
    let (_, schedules) = system.get("/api/v1/schedules").await;
    assert_eq!(schedules, serde_json::json!([]));

    // the Actions pages: the packs and their actions, and an action run from its form
    browser.goto(&format!("{ui}/actions")).await;
    browser
        .wait("the actions listed", "return document.querySelector('[data-action=\"core.echo\"] a') !== null || null")
        .await;
    assert!(browser.text("#pack-table").await.contains("core"), "the packs listed");
    browser.click("[data-action=\"core.echo\"] a").await;
    browser.wait("the run form", "return document.querySelector('#param-message') !== null || null").await;
    assert!(browser.text("#parameters").await.contains("message"), "its parameters listed");
    browser.type_into("#param-message", "from the form").await;
    browser.click("#run").await;
    let made = browser.wait("the execution made", "return document.querySelector('[data-made]')?.dataset.made").await;
    let made: i64 = made.as_str().unwrap().parse().unwrap();
    let ran = system.wait_terminal(made, DEADLINE).await;
    assert_eq!(
        (&ran["status"], &ran["parameters"]["message"]),
        (&json!("completed"), &json!("from the form")),
        "{ran}"
    );
    screenshot(&browser, "action").await;

    // the Events page: a pack's rule enabled by hand, the event a failure raises with the
    // rule's answer to it, and a replay
    browser.goto(&format!("{ui}/events")).await;
    let rule = "core.notify_on_exhausted";
    let state = format!(
        "return document.querySelector('#rule-table [data-rule=\"{rule}\"] [data-field=enabled]')?.textContent"
    );
    assert_eq!(browser.wait("the rule listed", &state).await, "disabled");
    browser.click(&format!("[data-enable-rule=\"{rule}\"]")).await;
    browser.wait("the rule enabled", &format!("{state} === 'enabled' || null")).await;
    let (_, rules) = system.get("/api/v1/rules").await;
    let shown = rules.as_array().unwrap().iter().find(|r| r["ref"] == rule).unwrap();
    assert_eq!((&shown["enabled"], shown["enabled_by"].is_i64()), (&json!(true), true), "{shown}");
    let failing = system.submit("core.fail", json!({"exit_code": 2, "message": "for the events page"})).await;
    assert_eq!(system.wait_terminal(id(&failing), DEADLINE).await["status"], "failed");
    let answer = format!(
        "return document.querySelector('#event-table tr[data-rule=\"{rule}\"] [data-field=answer]')?.textContent"
    );
    let said = browser.wait("the event and its answer", &answer).await;
    // (the core pack's rule needs the secrets notify_url and notify_signing_key: none here)
    assert!(said.as_str().unwrap().contains("which is not stored (an admin sets it"), "{said}");
    let event: i64 = browser
        .eval(&format!("return Number(document.querySelector('#event-table tr[data-rule=\"{rule}\"]').dataset.event)"))
        .await
        .as_i64()
        .unwrap();
    screenshot(&browser, "events").await;
    browser.click(&format!("[data-replay=\"{event}\"]")).await;
    browser
        .wait("the replay listed", &format!("return document.body.textContent.includes('replay of #{event}') || null"))
        .await;
    browser.click(&format!("[data-disable-rule=\"{rule}\"]")).await;
    browser.wait("the rule disabled", &format!("{state} === 'disabled' || null")).await;

    // no script error, CSP violation or failed request on any page
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "the browser console shows errors: {errors:#?}");

    drop(browser);
    system.stop().await;
}

/// Issue 48: a workflow run's page shows the run as its graph (each step with its state, what it
/// needs, its items, and links to the executions it made), and a step's page links back to its
/// run; the book's worked example, run as the book does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_runs_page_shows_each_step_with_its_state_items_and_executions() {
    let system = System::builder().pack(repo_root().join("packs/examples")).worker("w1", &[]).start().await;
    let hosts = json!(["web-1", "web-2", "web-3"]);
    let run = id(&system.submit("examples.remediate", json!({"hosts": hosts, "unhealthy": ["web-2"]})).await);
    assert_eq!(system.wait_terminal(run, DEADLINE).await["status"], "completed");
    let (_, graph) = system.get(&format!("/api/v1/workflows/{run}")).await;
    let restarted = graph["steps"][1]["executions"][0]["id"].as_i64().unwrap();

    let browser = Browser::start().await;
    let ui = format!("{}/ui", system.api_url);
    browser.goto(&format!("{ui}/login")).await;
    browser.type_into("#token", &system.token).await;
    browser.click("#login-submit").await;
    browser.wait("the workers page", "return location.pathname === '/ui/workers'").await;
    browser.goto(&format!("{ui}/executions/{run}")).await;
    let rows = browser
        .wait(
            "the run's steps",
            "const rows = [...document.querySelectorAll('#workflow tbody tr')]; \
             return rows.length === 5 ? rows.map((r) => [r.dataset.step, r.dataset.state, \
               [...r.cells].map((c) => c.textContent.trim())]) : null",
        )
        .await;
    let shown: Vec<(String, String)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|row| (row[0].as_str().unwrap().to_string(), row[1].as_str().unwrap().to_string()))
        .collect();
    let expected = [
        ("check", "succeeded"),
        ("restart", "succeeded"),
        ("verify", "succeeded"),
        ("notify", "succeeded"),
        ("page", "not_run"),
    ];
    assert_eq!(shown, expected.map(|(s, t)| (s.to_string(), t.to_string())), "{rows:#}");
    let cells = |step: usize| -> Vec<String> {
        rows[step][2].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect()
    };
    let restart = cells(1);
    assert_eq!(restart[1], "examples.restart_service", "{restart:?}");
    assert_eq!(restart[2], "succeeded", "the state shown as its badge: {restart:?}");
    assert_eq!(restart[3], "check", "what it starts after: {restart:?}");
    assert_eq!(restart[4], "1/1 (0 running, 0 failed)", "its items: {restart:?}");
    assert!(restart[6].contains(&format!("#{restarted}")), "a link to the item's execution: {restart:?}");
    assert!(cells(4)[0].contains("(on-failure)"), "{:?}", cells(4));
    screenshot(&browser, "workflow-run").await;

    // the step's own page says whose step it is, and links back
    browser.click(&format!("#workflow a[href='/ui/executions/{restarted}']")).await;
    let fact = browser
        .wait(
            "the step's page",
            "return document.querySelector('[data-fact=\"workflow\"]')?.textContent?.trim() || null",
        )
        .await;
    assert_eq!(fact, format!("step restart of run #{run}"));
    browser.click(&format!("[data-fact='workflow'] a[href='/ui/executions/{run}']")).await;
    browser.wait("the run's page again", &format!("return location.pathname === '/ui/executions/{run}'")).await;
    let errors = browser.console_errors().await;
    assert!(errors.is_empty(), "{errors:#?}");
    system.stop().await;
}
