//! What a client can make the API hold, served by the real `attune-api` binary (no executor or
//! worker): a submission's `config` is bounded at the door (`ATTUNE_API_MAX_CONFIG_BYTES`, 413
//! naming `config`), and a retry chain is answered within the list pages' byte budget
//! (`ATTUNE_API_LIST_BUDGET_BYTES`), however large its attempts are.

use attune_testkit::api::Api;
use serde_json::{Value, json};

/// Asserts a 413 `too_large` that names `config` and the limit.
fn assert_config_refused(status: u16, body: &Value, limit: usize) {
    assert_eq!(status, 413, "{body}");
    assert_eq!(
        (body["error"]["code"].as_str(), body["error"]["parameter"].as_str()),
        (Some("too_large"), Some("config")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&limit.to_string()) && message.contains("ATTUNE_API_MAX_CONFIG_BYTES"),
        "the message names the limit: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_over_its_limit_is_refused_with_413_naming_config_and_nothing_is_stored() {
    const LIMIT: usize = 16_384;
    // the default limit, below the body limit (1 MiB) and the parameters' (64 KiB)
    let api = Api::start(&[], None).await;
    let big = json!({"note": "x".repeat(LIMIT)});

    // a first attempt, with and without an idempotency key
    let submission = json!({"action_ref": "core.noop", "config": big});
    let (status, body) = api.post("/api/v1/executions", &submission, None).await;
    assert_config_refused(status, &body, LIMIT);
    let (status, body) = api.post("/api/v1/executions", &submission, Some("big-config")).await;
    assert_config_refused(status, &body, LIMIT);

    // a manual retry expressed as a submission (`config.retry_of`) of a finished execution
    let finished: i64 = sqlx::query_scalar(
        "INSERT INTO execution (action_ref, status, finished) VALUES ('core.noop', 'failed', now()) RETURNING id",
    )
    .fetch_one(&api.db.pool)
    .await
    .unwrap();
    let mut retry_config = big.clone();
    retry_config["retry_of"] = finished.into();
    let (status, body) =
        api.post("/api/v1/executions", &json!({"action_ref": "core.noop", "config": retry_config}), None).await;
    assert_config_refused(status, &body, LIMIT);
    assert_eq!(api.executions().await, 1, "nothing is stored");

    // within the limit, the same submissions are taken
    let small = json!({"note": "x".repeat(LIMIT / 2)});
    let (status, body) =
        api.post("/api/v1/executions", &json!({"action_ref": "core.noop", "config": small}), None).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["config"]["note"], small["note"]);
    let mut retry_config = small.clone();
    retry_config["retry_of"] = finished.into();
    let (status, body) =
        api.post("/api/v1/executions", &json!({"action_ref": "core.noop", "config": retry_config}), None).await;
    assert_eq!((status, body["original_execution"].as_i64()), (201, Some(finished)), "{body}");
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_retry_chain_of_large_attempts_is_answered_within_the_byte_budget() {
    const BUDGET: usize = 4 * 1024 * 1024;
    const ATTEMPTS: usize = 20;
    let api = Api::start(&[("ATTUNE_API_LIST_BUDGET_BYTES", &BUDGET.to_string())], None).await;
    // twenty attempts of one chain, each carrying a megabyte of config (as retries copy it; rows
    // written before the config limit, or inserted by hand): 20 MB in all
    let mut ids: Vec<i64> = Vec::new();
    for retry_count in 0..ATTEMPTS as i32 {
        let last = retry_count == ATTEMPTS as i32 - 1;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO execution (action_ref, config, status, retry_count, max_retries, original_execution, \
                 retry_reason, retry_decision, stdout, started, finished) \
             VALUES ('core.noop', jsonb_build_object('blob', repeat('c', 1000000)), $1::execution_status, $2, 100, $3, \
                 CASE WHEN $3::bigint IS NULL THEN NULL ELSE 'transient_error' END, \
                 CASE WHEN $4 THEN NULL ELSE '{\"retried\": true, \"rule\": \"retried\"}'::jsonb END, \
                 'out', now(), now()) RETURNING id",
        )
        .bind(if last { "completed" } else { "failed" })
        .bind(retry_count)
        .bind(ids.last().copied())
        .bind(last)
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
        ids.push(id);
    }

    // by default, whole attempts (as before), as many as the budget holds, and where the rest start
    let (status, body) = api.get(&format!("/api/v1/executions/{}/chain", ids[7])).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body[..body.len().min(300)]));
    assert!(body.len() <= BUDGET, "a chain answer took {} bytes, more than its budget of {BUDGET}", body.len());
    let chain: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((chain["execution_id"].as_i64(), chain["total"].as_i64()), (Some(ids[7]), Some(ATTEMPTS as i64)));

    // page through the rest: every attempt once, first attempt first, each whole
    let mut seen: Vec<i64> = Vec::new();
    let mut page = chain;
    loop {
        let attempts = page["attempts"].as_array().unwrap();
        assert!(!attempts.is_empty(), "an empty chain page before the end: {}", page["next_offset"]);
        for attempt in attempts {
            assert_eq!(attempt["config"]["blob"].as_str().map(str::len), Some(1_000_000), "a whole attempt");
            assert!(attempt.get("backoff_secs").is_some() && attempt.get("gap_secs").is_some());
            seen.push(attempt["id"].as_i64().unwrap());
        }
        let Some(next) = page["next_offset"].as_i64() else {
            assert_eq!(page["truncated"], false, "{}", page["truncated"]);
            break;
        };
        assert_eq!(page["truncated"], true, "an answer short of the chain says so");
        assert_eq!(next, page["offset"].as_i64().unwrap() + attempts.len() as i64);
        let (status, body) = api.get(&format!("/api/v1/executions/{}/chain?offset={next}", ids[0])).await;
        assert_eq!(status, 200);
        assert!(body.len() <= BUDGET, "a chain page took {} bytes, more than its budget of {BUDGET}", body.len());
        page = serde_json::from_slice(&body).unwrap();
    }
    assert_eq!(seen, ids, "every attempt once, in retry order");

    // light: the whole chain in one small answer, the retry decisions kept, the heavy fields left out
    let (status, body) = api.get(&format!("/api/v1/executions/{}/chain?fields=summary", ids[19])).await;
    assert_eq!(status, 200);
    assert!(body.len() < 64 * 1024, "a light chain of {ATTEMPTS} took {} bytes", body.len());
    let light: Value = serde_json::from_slice(&body).unwrap();
    let attempts = light["attempts"].as_array().unwrap();
    let light_ids: Vec<i64> = attempts.iter().map(|a| a["id"].as_i64().unwrap()).collect();
    assert_eq!((light_ids, light["truncated"].as_bool()), (ids.clone(), Some(false)));
    assert!(light["next_offset"].is_null(), "{}", light["next_offset"]);
    for attempt in attempts {
        for heavy in ["parameters", "config", "result", "stdout", "stderr"] {
            assert!(attempt.get(heavy).is_none(), "a light attempt carries {heavy}");
        }
        for kept in ["id", "status", "retry_count", "retry_reason", "finished", "backoff_secs", "gap_secs"] {
            assert!(attempt.get(kept).is_some(), "a light attempt lacks {kept}");
        }
    }
    assert_eq!(attempts[0]["retry_decision"]["rule"], "retried", "the decision stays in a light attempt");

    // an offset past the chain is an empty answer, an unknown `fields` a 400/422 naming it
    let (status, past) = api.get_json(&format!("/api/v1/executions/{}/chain?offset=50", ids[0])).await;
    assert_eq!((status, past["attempts"].as_array().map(Vec::len)), (200, Some(0)), "{past}");
    let (status, _) = api.get_json(&format!("/api/v1/executions/{}/chain?offset=-1", ids[0])).await;
    assert!(status == 400 || status == 422, "a negative offset: {status}");

    // six at once: each answer within the budget, so the API holds a few of them, not the chain
    let before = api.memory_mib();
    let path = format!("/api/v1/executions/{}/chain", ids[0]);
    let requests: Vec<_> = (0..6).map(|_| api.get(&path)).collect();
    for (status, body) in futures_util::future::join_all(requests).await {
        assert_eq!(status, 200);
        assert!(body.len() <= BUDGET, "{} bytes", body.len());
    }
    let after = api.memory_mib();
    eprintln!("API memory (RSS, peak) in MiB: before {before:?}, after six chains at once {after:?}");
    // the issue measured 35 -> 647 MiB for six unbounded chains; six budgets are 24 MiB of answers
    let (before, after) = (before.unwrap().1, after.unwrap().1);
    assert!(after < before + 128, "the API's peak memory grew from {before} to {after} MiB for six chain reads");
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audit_page_stays_within_the_byte_budget_and_says_where_the_rest_start() {
    const BUDGET: usize = 1024 * 1024;
    let api = Api::start(&[("ATTUNE_API_LIST_BUDGET_BYTES", &BUDGET.to_string())], None).await;
    // a thousand requests with 8 KB paths and long reasons: 9 MB of events
    sqlx::query(
        "INSERT INTO audit_event (actor, method, route, path, status, reason) \
         SELECT 'cli:test', 'POST', '/api/v1/executions', '/api/v1/executions?' || repeat('p', 8000), 201, repeat('r', 1000) \
         FROM generate_series(1, 1000)",
    )
    .execute(&api.db.pool)
    .await
    .unwrap();
    let mut seen = 0;
    let mut path = "/api/v1/audit?limit=1000&actor=cli:test".to_string();
    let mut pages = 0;
    loop {
        let (status, body) = api.get(&path).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body[..body.len().min(300)]));
        assert!(body.len() <= BUDGET, "an audit page took {} bytes, more than its budget of {BUDGET}", body.len());
        let page: Value = serde_json::from_slice(&body).unwrap();
        let events = page["events"].as_array().unwrap();
        assert!(!events.is_empty());
        seen += events.len();
        pages += 1;
        match page["next_before"].as_i64() {
            Some(before) => path = format!("/api/v1/audit?limit=1000&actor=cli:test&before={before}"),
            None => break,
        }
    }
    assert_eq!(seen, 1000, "every event, once, over the pages");
    assert!(pages >= 9, "{pages} pages");
    api.stop().await;
}
