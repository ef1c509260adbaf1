//! Every SQL statement of the Phase 3 quick reference (the seed, copied verbatim to
//! `testkit/fixtures/phase3-quickref.txt`), run as written against a database where a real run
//! happened, each checked against what we know happened.

use std::time::Duration;

use attune_system_tests::seed::statements;
use attune_testkit::System;
use attune_testkit::system::repo_root;
use serde_json::json;
use sqlx::Row;

const DEADLINE: Duration = Duration::from_secs(90);

type Rows = Vec<Vec<String>>;

async fn run(system: &System, sql: &str) -> Rows {
    let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_all(&system.db.pool)
        .await
        .unwrap_or_else(|e| panic!("seed statement failed: {e}\n{sql}"));
    rows.iter()
        .map(|row| {
            (0..row.columns().len())
                .map(|i| {
                    let text: Option<String> = row
                        .try_get::<Option<String>, _>(i)
                        .or_else(|_| row.try_get::<Option<i64>, _>(i).map(|v| v.map(|v| v.to_string())))
                        .or_else(|_| row.try_get::<Option<i32>, _>(i).map(|v| v.map(|v| v.to_string())))
                        .or_else(|_| row.try_get::<Option<bool>, _>(i).map(|v| v.map(|v| v.to_string())))
                        .or_else(|_| row.try_get::<Option<serde_json::Value>, _>(i).map(|v| v.map(|v| v.to_string())))
                        .unwrap_or(Some("<other>".into()));
                    text.unwrap_or_else(|| "NULL".into())
                })
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_seed_query_runs_as_written_and_tells_the_truth() {
    let seed = std::fs::read_to_string(repo_root().join("testkit/fixtures/phase3-quickref.txt")).unwrap();
    let sql = statements(&seed);
    assert_eq!(sql.len(), 13, "{sql:#?}");

    let system = System::builder()
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.2")
        .worker("alpha", &[])
        .worker("beta", &[])
        .pack(repo_root().join("testkit/packs/e2e"))
        .start()
        .await;
    system.force_health("beta", Some(json!({"consecutive_failures": 4, "queue_depth": 7})));
    system.wait_worker_health("beta", "degraded").await;
    let pool = &system.db.pool;

    // A real run: execution 100 fails twice then succeeds (ids after it are its retries, or other
    // work), execution 123 fails once then succeeds, a failed core.fail is retried by hand.
    sqlx::query("SELECT setval('execution_id_seq', 99)").execute(pool).await.unwrap();
    let hundred = system.submit("e2e.flaky", json!({"fail_times": 2})).await;
    assert_eq!(hundred["id"], 100);
    let chain100 = system.wait_chain(100, DEADLINE).await;
    sqlx::query("SELECT setval('execution_id_seq', 122)").execute(pool).await.unwrap();
    let one_two_three = system.submit("e2e.flaky", json!({"fail_times": 1})).await;
    assert_eq!(one_two_three["id"], 123);
    let chain123 = system.wait_chain(123, DEADLINE).await;
    assert_eq!((chain100.len(), chain123.len()), (3, 2));
    let failed = system.submit("core.fail", json!({})).await;
    system.wait_terminal(failed["id"].as_i64().unwrap(), DEADLINE).await;
    let (status, manual) = system
        .post(&format!("/api/v1/executions/{}/retry", failed["id"]), &json!({"parameters": {"exit_code": 0}}))
        .await;
    assert_eq!(status, 201, "{manual}");
    system.wait_terminal(manual["id"].as_i64().unwrap(), DEADLINE).await;
    // 3 originals (100, 123, the core.fail) and 4 retries (2 + 1 transient, 1 manual)

    // 1. SELECT * FROM healthy_workers; (alpha healthy, beta degraded: both may receive work)
    let rows = run(&system, &sql[0]).await;
    let mut names: Vec<&str> = rows.iter().map(|r| r[1].as_str()).collect();
    names.sort();
    assert_eq!(names, ["alpha", "beta"], "{rows:?}");
    assert!(rows.iter().any(|r| r[1] == "beta" && r[3] == "degraded"), "{rows:?}");

    // 2. one worker's reported health (worker 1 is whichever registered first)
    let rows = run(&system, &sql[1]).await;
    assert_eq!(rows.len(), 1);
    let worker1: (String, serde_json::Value) =
        sqlx::query_as("SELECT name, capabilities FROM worker WHERE id = 1").fetch_one(pool).await.unwrap();
    let health = &worker1.1["health"];
    assert_eq!(
        rows[0],
        vec![
            worker1.0.clone(),
            health["status"].as_str().unwrap().to_string(),
            health["queue_depth"].to_string(),
            health["consecutive_failures"].to_string()
        ]
    );

    // 3. is_execution_retriable(123): it was retried already
    assert_eq!(run(&system, &sql[2]).await, vec![vec!["false".to_string()]]);
    // 4. get_worker_queue_depth(1): nothing in flight, and worker 1 reports what it reports
    let reported = health["queue_depth"].as_i64().unwrap().to_string();
    assert_eq!(run(&system, &sql[3]).await, vec![vec![reported]]);
    // 5. the view again
    assert_eq!(run(&system, &sql[4]).await.len(), 2);

    // 6. Example 1: the chain of execution 100
    let rows = run(&system, &sql[5]).await;
    let expected: Vec<Vec<String>> = chain100
        .iter()
        .map(|a| {
            vec![
                a["id"].to_string(),
                a["retry_count"].to_string(),
                a["retry_reason"].as_str().map(str::to_string).unwrap_or("NULL".into()),
                a["original_execution"].as_i64().map(|v| v.to_string()).unwrap_or("NULL".into()),
                a["status"].as_str().unwrap().to_string(),
            ]
        })
        .collect();
    assert_eq!(rows, expected);

    // 7. Example 2: success rate of retries by reason
    let rows = run(&system, &sql[6]).await;
    let shown: Vec<(String, String, String)> =
        rows.iter().map(|r| (r[0].clone(), r[1].clone(), r[2].clone())).collect();
    assert_eq!(
        shown,
        vec![
            ("transient_error".to_string(), "3".to_string(), "2".to_string()),
            ("manual_retry".to_string(), "1".to_string(), "1".to_string())
        ],
        "{rows:?}"
    );
    // (NUMERIC read through a wrapper; the statement inside is the seed's)
    let wrapped = format!("SELECT success_rate::float8 FROM ({}) seed", sql[6].trim_end_matches(';'));
    let rates: Vec<f64> = sqlx::query_scalar(sqlx::AssertSqlSafe(wrapped)).fetch_all(pool).await.unwrap();
    assert_eq!(rates, vec![66.67, 100.0]);

    // 8. Example 3: active workers, healthy before degraded
    let rows = run(&system, &sql[7]).await;
    let order: Vec<(&str, &str)> = rows.iter().map(|r| (r[0].as_str(), r[2].as_str())).collect();
    assert_eq!(order, [("alpha", "healthy"), ("beta", "degraded")]);
    assert!(rows.iter().any(|r| r[0] == "beta" && r[3] == "7" && r[4] == "4"), "{rows:?}");

    // 9. retry rate over the last hour: 3 originals, 4 retries
    let rows = run(&system, &sql[8]).await;
    assert_eq!(rows[0][..2], ["3".to_string(), "4".to_string()], "{rows:?}");
    let wrapped = format!("SELECT retry_rate::float8 FROM ({}) seed", sql[8].trim_end_matches(';'));
    let rate: f64 = sqlx::query_scalar(sqlx::AssertSqlSafe(wrapped)).fetch_one(pool).await.unwrap();
    assert_eq!(rate, 133.33);

    // 10. worker health distribution
    let mut rows = run(&system, &sql[9]).await;
    rows.sort();
    assert_eq!(
        rows.iter().map(|r| (r[0].as_str(), r[1].as_str())).collect::<Vec<_>>(),
        [("degraded", "1"), ("healthy", "1")]
    );

    // 11-13. troubleshooting
    assert!(run(&system, &sql[10]).await.is_empty(), "there is no action called 'action.name'");
    assert_eq!(run(&system, &sql[11]).await.len(), 2);
    // "Verify max_retries": the config shows the budget in force (and the count so far)
    let config = run(&system, &sql[12]).await;
    let config: serde_json::Value = serde_json::from_str(&config[0][0]).unwrap();
    assert_eq!((config["max_retries"].as_i64(), config["retry_count"].as_i64()), (Some(3), Some(0)), "{config}");
    system.stop().await;
}
