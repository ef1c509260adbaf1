//! Latency of the guarded transition itself (diagnostic).
use attune_common::db::{self, execution::Transition};
use attune_core::ExecutionStatus;
use std::time::Instant;

#[tokio::main]
async fn main() {
    let pool = db::connect("postgres://attune:attune@127.0.0.1:5432/attune", 4, std::time::Duration::from_secs(5))
        .await
        .unwrap();
    let ids: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM execution WHERE status = 'completed' ORDER BY id DESC LIMIT 300")
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut samples = Vec::new();
    for id in &ids {
        let t = Instant::now();
        // a stale miss (completed -> scheduling is no edge from completed): measures the statement
        let r = db::execution::transition(
            &pool,
            *id,
            &Transition::to(ExecutionStatus::Scheduling)
                .from(&[ExecutionStatus::Requested, ExecutionStatus::Scheduling]),
        )
        .await
        .unwrap();
        assert!(r.is_none());
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = samples.len();
    println!(
        "transition miss: p50 {:.2} p90 {:.2} p99 {:.2} ms",
        samples[n / 2],
        samples[n * 9 / 10],
        samples[n * 99 / 100]
    );
    let mut samples = Vec::new();
    for id in &ids {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let t = Instant::now();
        db::execution::get(&pool, *id).await.unwrap();
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "get after 5 ms idle: p50 {:.2} p90 {:.2} p99 {:.2} ms",
        samples[n / 2],
        samples[n * 9 / 10],
        samples[n * 99 / 100]
    );
}
