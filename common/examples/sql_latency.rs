//! Sequential statement latency through sqlx (diagnostic).
use std::time::Instant;

#[tokio::main]
async fn main() {
    let pool = attune_common::db::connect(
        "postgres://attune:attune@127.0.0.1:5432/attune",
        2,
        std::time::Duration::from_secs(5),
    )
    .await
    .unwrap();
    for (label, sql) in [
        ("select 1", "SELECT 1"),
        ("update", "UPDATE health_probe_config SET heartbeat_max_age_secs = heartbeat_max_age_secs"),
    ] {
        let mut samples = Vec::new();
        for _ in 0..300 {
            let t = Instant::now();
            sqlx::query(sql).execute(&pool).await.unwrap();
            samples.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("{label}: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms", samples[150], samples[270], samples[297]);
    }
    let mut samples = Vec::new();
    for _ in 0..300 {
        let t = Instant::now();
        let _ = attune_common::db::worker::candidates(&pool).await.unwrap();
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("candidates: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms", samples[150], samples[270], samples[297]);
}
