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
#[utoipa::path(get, path = "/readyz", tag = "probes", security(()), responses((status = 200, description = "Database and broker answer"), (status = 503, description = "A dependency is down; the body says which")))]
pub async fn readyz(State(state): State<crate::State>) -> (StatusCode, Json<Value>) {
    let database = attune_common::db::ping(&state.db).await.map_err(|e| e.to_string());
    let broker = state.publisher.ping().await.map_err(|e| e.to_string());
    let status = |r: &Result<(), String>| match r {
        Ok(()) => json!("ok"),
        Err(e) => json!(format!("unavailable: {e}")),
    };
    let ready = database.is_ok() && broker.is_ok();
    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(json!({"ready": ready, "database": status(&database), "broker": status(&broker)})))
}

/// Prometheus text: this process's metrics, then gauges read from the database.
#[utoipa::path(get, path = "/metrics", tag = "probes", security(()), responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(State(state): State<crate::State>) -> Result<impl IntoResponse, ApiError> {
    use attune_common::metrics::{self as m, render_gauge};
    let rows = attune_common::db::stats::by_status_and_action(&state.db).await?;
    let mut out = m::render();
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
    let circuits: Vec<_> = attune_common::db::circuit::states(&state.db)
        .await?
        .into_iter()
        .map(|(action, circuit)| (vec![("action", action)], circuit.gauge()))
        .collect();
    render_gauge(&mut out, &m::ACTION_CIRCUIT_STATE, &circuits);
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out))
}
