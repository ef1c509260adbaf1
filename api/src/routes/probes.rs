//! Liveness, readiness and metrics; no token needed.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde_json::{Value, json};

use crate::ApiError;

#[utoipa::path(get, path = "/healthz", tag = "probes", security(()), responses((status = 200, description = "The process is up")))]
pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready when both the database and the broker answer.
#[utoipa::path(get, path = "/readyz", tag = "probes", security(()), responses((status = 200, description = "Database and broker answer"), (status = 503, description = "A dependency is down; the body says which (`unavailable`), and the API's log why")))]
pub async fn readyz(State(state): State<crate::State>) -> (StatusCode, Json<Value>) {
    let database = attune_common::db::ping(&state.db).await.map_err(|e| e.to_string());
    let broker = state.publisher.ping().await.map_err(|e| e.to_string());
    // The answer (to anyone: no token) names the dependency that is away and nothing of it: its
    // error may carry an address or a user name. The reason is the operator's, in the log.
    for (dependency, result) in [("database", &database), ("broker", &broker)] {
        if let Err(error) = result {
            tracing::warn!(dependency, %error, "not ready: a dependency does not answer");
        }
    }
    let status = |r: &Result<(), String>| match r {
        Ok(()) => json!("ok"),
        Err(_) => json!("unavailable"),
    };
    let ready = database.is_ok() && broker.is_ok();
    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(json!({"ready": ready, "database": status(&database), "broker": status(&broker)})))
}

/// How long the database's gauges of one scrape serve the next ones.
pub const GAUGES_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// The gauges `/metrics` reads from the database, as last rendered, and when. Scrapes take turns
/// (a lock held across the read), so however many scrapers there are, `/metrics` holds at most
/// one of the pool's connections, and scrapes within `GAUGES_FRESH_FOR` of a read share it.
#[derive(Default)]
pub struct ScrapedGauges(tokio::sync::Mutex<Option<(std::time::Instant, String)>>);

/// Prometheus text: this process's metrics, then gauges read from the database (unfinished
/// executions, workers, circuits: what is read does not grow with history).
#[utoipa::path(get, path = "/metrics", tag = "probes", security(()), responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(State(state): State<crate::State>) -> Result<impl IntoResponse, ApiError> {
    let mut out = attune_common::metrics::render();
    let mut last = state.scraped_gauges.0.lock().await;
    match last.as_ref() {
        Some((at, gauges)) if at.elapsed() < GAUGES_FRESH_FOR => out.push_str(gauges),
        _ => {
            let gauges = read_gauges(&state).await?;
            out.push_str(&gauges);
            *last = Some((std::time::Instant::now(), gauges));
        }
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out))
}

async fn read_gauges(state: &crate::AppState) -> Result<String, ApiError> {
    use attune_common::metrics::{self as m, render_gauge};
    let mut out = String::new();
    let rows = attune_common::db::stats::unfinished_by_status_and_action(&state.db).await?;
    let samples: Vec<_> = rows
        .into_iter()
        .map(|(status, action, count)| (vec![("status", status.to_string()), ("action", action)], count as f64))
        .collect();
    render_gauge(&mut out, &m::EXECUTIONS_BY_STATUS, &samples);
    let workers = attune_common::db::worker::list(&state.db, &state.settings.health).await?;
    let active: Vec<_> = workers.iter().filter(|w| w.status == "active").collect();
    let by_class: Vec<_> = ["healthy", "degraded", "unhealthy"]
        .iter()
        .map(|class| (vec![("health", class.to_string())], active.iter().filter(|w| w.health == *class).count() as f64))
        .collect();
    render_gauge(&mut out, &m::WORKERS_BY_HEALTH, &by_class);
    let depths: Vec<_> = active.iter().map(|w| (vec![("worker", w.name.clone())], w.queue_depth as f64)).collect();
    render_gauge(&mut out, &m::WORKER_QUEUE_DEPTH, &depths);
    let mut runtimes: std::collections::BTreeMap<String, usize> =
        attune_common::db::stats::action_runtimes(&state.db).await?.into_iter().map(|r| (r, 0)).collect();
    for runtime in active.iter().flat_map(|w| w.runtimes.iter()) {
        *runtimes.entry(runtime.clone()).or_default() += 1;
    }
    let offered: Vec<_> = runtimes.into_iter().map(|(r, n)| (vec![("runtime", r)], n as f64)).collect();
    render_gauge(&mut out, &m::RUNTIME_WORKERS, &offered);
    let waiting: Vec<_> = attune_common::db::stats::oldest_waiting_by_runtime(&state.db)
        .await?
        .into_iter()
        .map(|(runtime, age)| (vec![("runtime", runtime)], age))
        .collect();
    render_gauge(&mut out, &m::OLDEST_WAITING, &waiting);
    // 0 when nothing waits: the series is there to alert on from the first scrape
    let event_age = attune_common::db::events::oldest_raised_waiting(&state.db).await?.unwrap_or(0.0);
    render_gauge(&mut out, &m::OLDEST_EVENT_WAITING, &[(vec![], event_age)]);
    let circuits: Vec<_> = attune_common::db::circuit::states(&state.db)
        .await?
        .into_iter()
        .map(|(action, circuit)| (vec![("action", action)], circuit.gauge()))
        .collect();
    render_gauge(&mut out, &m::ACTION_CIRCUIT_STATE, &circuits);
    Ok(out)
}
