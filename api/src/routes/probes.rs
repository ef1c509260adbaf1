//! Liveness, readiness and metrics; no token needed.

use std::fmt::Write;

use attune_common::ExecutionStatus;
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde_json::{Value, json};

use crate::ApiError;

pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready when both the database and the broker answer.
pub async fn readyz(State(state): State<crate::State>) -> (StatusCode, Json<Value>) {
    let database = sqlx::query("SELECT 1").execute(&state.db).await.map(|_| ()).map_err(|e| e.to_string());
    let broker = state.publisher.ping().await.map_err(|e| e.to_string());
    let status = |r: &Result<(), String>| match r {
        Ok(()) => json!("ok"),
        Err(e) => json!(format!("unavailable: {e}")),
    };
    let ready = database.is_ok() && broker.is_ok();
    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(json!({"ready": ready, "database": status(&database), "broker": status(&broker)})))
}

/// Prometheus text: executions by status and action, workers by health class.
pub async fn metrics(State(state): State<crate::State>) -> Result<impl IntoResponse, ApiError> {
    let rows: Vec<(ExecutionStatus, String, i64)> =
        sqlx::query_as("SELECT status, action_ref, count(*) FROM execution GROUP BY status, action_ref ORDER BY 1, 2")
            .fetch_all(&state.db)
            .await?;
    let mut out = String::new();
    out.push_str(
        "# HELP attune_executions Executions in the record, by status and action.\n# TYPE attune_executions gauge\n",
    );
    for (status, action_ref, count) in rows {
        let _ = writeln!(out, "attune_executions{{status=\"{status}\",action=\"{}\"}} {count}", escape(&action_ref));
    }
    let workers = attune_common::db::worker::list(&state.db, &state.settings.health).await?;
    out.push_str("# HELP attune_workers Active workers by health class.\n# TYPE attune_workers gauge\n");
    for class in ["healthy", "degraded", "unhealthy"] {
        let count = workers.iter().filter(|w| w.status == "active" && w.health == class).count();
        let _ = writeln!(out, "attune_workers{{health=\"{class}\"}} {count}");
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out))
}

fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
