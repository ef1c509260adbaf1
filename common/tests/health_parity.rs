//! The SQL classification (`worker_health_class`, `get_worker_queue_depth`, `healthy_workers`)
//! and the Rust one (`health::classify` over `db::worker::candidates`) agree on random worker
//! states, drawn mostly near the thresholds, under the default and a random configuration.

use attune_common::db;
use attune_core::health::{HealthThresholds, classify};
use attune_testkit::TestDb;
use chrono::{DateTime, Duration, Utc};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;

fn near(rng: &mut StdRng, points: &[i64]) -> i64 {
    let point = points[rng.random_range(0..points.len())];
    (point + rng.random_range(-2..=2)).max(0)
}

async fn check(test: &TestDb, config: &HealthThresholds, rng: &mut StdRng, workers: usize) {
    let pool = &test.pool;
    sqlx::query("DELETE FROM execution").execute(pool).await.unwrap();
    sqlx::query("DELETE FROM worker").execute(pool).await.unwrap();
    db::worker::store_health_config(pool, config).await.unwrap();
    let at: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await.unwrap();
    let pack_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs/core");
    db::pack::register(pool, &attune_common::pack::load_pack(&pack_dir).unwrap()).await.unwrap();
    let action: i64 =
        sqlx::query_scalar("SELECT id FROM action WHERE ref = 'core.noop'").fetch_one(pool).await.unwrap();
    for i in 0..workers {
        let total = near(rng, &[0, config.failure_rate_min_executions, 100]);
        let failed = if total == 0 { 0 } else { rng.random_range(0..=total) };
        let mut health = json!({
            "consecutive_failures": near(rng, &[0, config.degraded_threshold, config.unhealthy_threshold]),
            "total_executions": total,
            "failed_executions": failed,
            "queue_depth": near(rng, &[0, config.queue_depth_degraded, config.queue_depth_unhealthy]),
        });
        // most workers report a recent window (the rate is its rate), some only lifetime counts
        if rng.random_range(0..4) != 0 {
            let recent = near(rng, &[0, config.failure_rate_min_executions, 50]).min(total);
            health["recent_executions"] = json!(recent);
            health["recent_failed_executions"] = json!(if recent == 0 { 0 } else { rng.random_range(0..=recent) });
            health["window_secs"] = json!(600);
        }
        let age_ms = near(rng, &[0, config.heartbeat_max_age_secs * 1000, 5000]) + rng.random_range(0..3);
        let heartbeat = (rng.random_range(0..20) != 0).then(|| at - Duration::milliseconds(age_ms));
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO worker (name, status, capabilities, last_heartbeat) VALUES ($1, 'active', $2, $3) RETURNING id",
        )
        .bind(format!("w{i}"))
        .bind(json!({"runtimes": ["shell"], "health": health}))
        .bind(heartbeat)
        .fetch_one(pool)
        .await
        .unwrap();
        // Some in-flight work the worker has not reported yet.
        for _ in 0..rng.random_range(0..3) {
            sqlx::query(
                "INSERT INTO execution (action, action_ref, status, worker) VALUES ($1, 'core.noop', 'running', $2)",
            )
            .bind(action)
            .bind(id)
            .execute(pool)
            .await
            .unwrap();
        }
    }
    let (candidates, _) = db::worker::candidates(pool).await.unwrap();
    assert_eq!(candidates.len(), workers);
    for candidate in candidates {
        let (sql_class, sql_depth): (String, i32) = sqlx::query_as(
            "SELECT worker_health_class(capabilities, last_heartbeat, get_worker_queue_depth(id), $2), \
                    get_worker_queue_depth(id) FROM worker WHERE id = $1",
        )
        .bind(candidate.worker_id)
        .bind(at)
        .fetch_one(pool)
        .await
        .unwrap();
        let rust_class = classify(config, &candidate.signals, at);
        assert_eq!(sql_depth as i64, candidate.signals.queue_depth, "{candidate:?}");
        assert_eq!(sql_class, rust_class.as_str(), "{config:?}\n{candidate:?}");
    }
}

#[tokio::test]
async fn sql_and_rust_classify_workers_alike() {
    let test = TestDb::new().await;
    let mut rng = StdRng::seed_from_u64(0x5eed_a77e);
    check(&test, &HealthThresholds::default(), &mut rng, 300).await;
    for _ in 0..3 {
        let degraded_threshold = rng.random_range(1..6);
        let queue_depth_degraded = rng.random_range(5..40);
        let failure_rate_degraded = rng.random_range(1..5) as f64 / 10.0;
        let config = HealthThresholds {
            enabled: true,
            heartbeat_max_age_secs: rng.random_range(5..60),
            degraded_threshold,
            unhealthy_threshold: degraded_threshold + rng.random_range(1..8),
            queue_depth_degraded,
            queue_depth_unhealthy: queue_depth_degraded + rng.random_range(1..50),
            failure_rate_degraded,
            failure_rate_unhealthy: failure_rate_degraded + rng.random_range(1..5) as f64 / 10.0,
            failure_rate_min_executions: rng.random_range(1..20),
        };
        check(&test, &config, &mut rng, 100).await;
    }
    // The view lists exactly the workers the Rust side would schedule on.
    let (candidates, now) = db::worker::candidates(&test.pool).await.unwrap();
    let config = HealthThresholds::default();
    db::worker::store_health_config(&test.pool, &config).await.unwrap();
    let mut expected: Vec<String> = candidates
        .iter()
        .filter(|c| classify(&config, &c.signals, now) != attune_core::health::HealthClass::Unhealthy)
        .map(|c| c.name.clone())
        .collect();
    expected.sort();
    let mut listed: Vec<String> =
        sqlx::query_scalar("SELECT name FROM healthy_workers").fetch_all(&test.pool).await.unwrap();
    listed.sort();
    // Heartbeats near the limit can cross it between the two reads; compare only clear cases.
    let borderline: Vec<String> = candidates
        .iter()
        .filter(|c| c.signals.last_heartbeat.is_some_and(|h| ((now - h).num_seconds() - 30).abs() <= 1))
        .map(|c| c.name.clone())
        .collect();
    expected.retain(|n| !borderline.contains(n));
    listed.retain(|n| !borderline.contains(n));
    assert_eq!(listed, expected);
    test.drop_database().await;
}
