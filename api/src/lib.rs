//! attune-api: the HTTP API (`/api/v1/...`), health and readiness probes, and metrics.
//!
//! Every `/api/v1` route requires `Authorization: Bearer <token>`; `/healthz`, `/readyz` and
//! `/metrics` do not; nor do the dashboard's static pages under `/ui` (`dashboard`), which read
//! every datum from `/api/v1` with the user's token. Errors are `{"error": {"code", "message", "parameter"?}}`.

pub mod audit;
pub mod auth;
pub mod dashboard;
pub mod error;
pub mod openapi;
pub mod raised;
pub mod roles;
pub mod routes;
pub mod server;
pub mod streams;
pub mod submissions;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use attune_common::config::{CommonSettings, ConfigError, FromEnv, Source, read};
use attune_common::db;
use attune_common::mq::{Publisher, Topology};
use attune_core::health::HealthThresholds;
use axum::Router;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use error::ApiError;

pub use attune_common::ServiceError as Error;

#[derive(Debug, Clone)]
pub struct Settings {
    pub common: CommonSettings,
    pub health: HealthThresholds,
    /// `ATTUNE_API_ADDR` (default `0.0.0.0:8080`).
    pub addr: SocketAddr,
    pub worker_queue_ttl: Duration,
    /// `ATTUNE_TOKEN_CACHE_SECS` (10): how long a verified token is trusted without a database read.
    pub token_cache_ttl: Duration,
    /// `ATTUNE_SECRETS_KEY_FILE`: the key that seals secrets and secret parameters (none: both
    /// are refused).
    pub sealer: Option<attune_common::secrets::Sealer>,
    /// `ATTUNE_TOKEN_DEFAULT_EXPIRY` (unset: never): the lifetime of a token created without one.
    pub token_default_expiry: Option<chrono::Duration>,
    /// `ATTUNE_ACTION_CACHE_SECS` (5; 0: never): how long an action read for a submission is reused.
    /// A pack registered through this API is seen at once; one registered elsewhere within this time.
    pub action_cache_ttl: Duration,
    /// `ATTUNE_API_MAX_PARAMETERS_BYTES` (65536) and `ATTUNE_API_MAX_PARAMETER_VALUE_BYTES`
    /// (32768): how large a submission's parameters may be.
    pub parameter_limits: attune_core::params::SizeLimits,
    /// `ATTUNE_API_MAX_CONFIG_BYTES` (16384): how large a submission's `config` may be as JSON
    /// (each retry copies it).
    pub max_config_bytes: usize,
    /// How many live output streams (`GET /executions/{id}/output`) may be open, and how long
    /// one lasts (`streams`).
    pub streams: streams::StreamSettings,
    /// `ATTUNE_SCHEDULE_MIN_INTERVAL_SECS` (1): the shortest time a schedule may leave between runs.
    pub schedule_min_interval: Duration,
    /// `ATTUNE_SCHEDULES_PER_TOKEN` (100): the most schedules that may run as one token.
    pub schedules_per_token: i64,
    /// The HTTP server's bounds and TLS (`server`): header and request timeouts, connections,
    /// body size, the list pages' byte budget, the certificate.
    pub http: server::HttpSettings,
}

impl Settings {
    pub fn from_env() -> Result<Self, ConfigError> {
        <Self as FromEnv>::from_env()
    }
}

impl FromEnv for Settings {
    fn from_source(source: &dyn Source) -> Result<Self, ConfigError> {
        Ok(Settings {
            common: CommonSettings::from_source(source)?,
            health: HealthThresholds::from_source(source)?,
            addr: read(source, "ATTUNE_API_ADDR")?,
            worker_queue_ttl: Duration::from_secs(read(source, "ATTUNE_WORKER_QUEUE_TTL_SECS")?),
            token_cache_ttl: Duration::from_secs_f64(read(source, "ATTUNE_TOKEN_CACHE_SECS")?),
            token_default_expiry: attune_common::db::token::default_lifetime(source)?,
            sealer: attune_common::secrets::Sealer::from_source(source)?,
            action_cache_ttl: Duration::from_secs_f64(read(source, "ATTUNE_ACTION_CACHE_SECS")?),
            parameter_limits: attune_core::params::SizeLimits {
                total_bytes: read(source, "ATTUNE_API_MAX_PARAMETERS_BYTES")?,
                value_bytes: read(source, "ATTUNE_API_MAX_PARAMETER_VALUE_BYTES")?,
            },
            max_config_bytes: read(source, "ATTUNE_API_MAX_CONFIG_BYTES")?,
            streams: streams::StreamSettings::from_source(source)?,
            schedule_min_interval: Duration::from_secs(read(source, "ATTUNE_SCHEDULE_MIN_INTERVAL_SECS")?),
            schedules_per_token: read(source, "ATTUNE_SCHEDULES_PER_TOKEN")?,
            http: server::HttpSettings::from_source(source)?,
        })
    }
}

pub struct AppState {
    pub db: PgPool,
    /// Token hashes verified recently, with when to check them again (see `auth`).
    pub verified_tokens: auth::VerifiedTokens,
    /// Actions read recently, for submissions.
    pub actions: db::action::ActionCache,
    pub publisher: Publisher,
    /// First submissions, inserted in batches under load (see `submissions`).
    pub submissions: submissions::Submissions,
    /// The database's part of `/metrics`, read by one scrape at a time (see `routes::probes`).
    pub scraped_gauges: routes::probes::ScrapedGauges,
    /// The audit trail's writer (see `audit`).
    pub audit: audit::Trail,
    /// The broker connection live output streams follow on (`routes::executions::output`).
    pub followers: routes::executions::output::Followers,
    /// Fires when the API stops: live output streams end (they would hold the shutdown).
    pub streams_stop: CancellationToken,
    /// The live output streams open, by token (`streams`).
    pub streams: Arc<streams::StreamBudget>,
    /// Requests that change state, each carried out with its audit row apart from its
    /// connection (`audit::record`): waited for when the API stops.
    pub changes: tokio_util::task::TaskTracker,
    pub settings: Settings,
}

pub type State = Arc<AppState>;

/// The router and the OpenAPI document describing it (as served, JSON).
pub fn router_and_openapi(state: State) -> (Router<State>, serde_json::Value) {
    use utoipa::OpenApi;
    // the token is verified first (the outer layer), then its role checked against the route's
    // (and every request that could change state is audited, a refusal by role too)
    let api = routes::api_routes()
        .layer(axum::middleware::from_fn(roles::enforce))
        .layer(axum::middleware::from_fn_with_state(state.clone(), audit::record))
        .layer(axum::middleware::from_fn_with_state(state, auth::require_token));
    let (router, mut document) = utoipa_axum::router::OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .nest("/api/v1", api)
        .merge(routes::probe_routes())
        .merge(routes::hook_routes())
        .split_for_parts();
    openapi::document_rejections(&mut document);
    (router, openapi::document_storable_json(document))
}

pub fn router(state: State) -> Router {
    let (router, openapi) = router_and_openapi(state.clone());
    let document = Arc::new(openapi);
    router
        .route("/api/v1/openapi.json", axum::routing::get(move || async move { axum::Json(document.as_ref().clone()) }))
        .merge(dashboard::routes())
        .fallback(|| async { ApiError::not_found("route", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not answer that method (the OpenAPI document lists the ones it does)",
            )
        })
        .with_state(state)
}

/// Connects, checks the schema is current and builds the shared state.
pub async fn state(settings: Settings) -> Result<State, Error> {
    let pool = db::connect(&settings.common.database_url, 16, Duration::from_secs(60)).await?;
    db::check_schema(&pool).await?;
    if let Err(e) = register_packs(&pool, &settings.common.packs_dir).await {
        tracing::error!(error = %e, "packs in ATTUNE_PACKS_DIR were not all registered");
    }
    let topology = Topology::new(&settings.common.mq_namespace, settings.worker_queue_ttl);
    let followers = routes::executions::output::Followers::new(&settings.common.amqp_url, topology.clone());
    let publisher = Publisher::new(&settings.common.amqp_url, "attune-api", topology);
    if let Err(e) = publisher.ping().await {
        tracing::warn!(error = %e, "broker not reachable yet: cancel notices wait for it (submissions do not need it)");
    }
    let actions = db::action::ActionCache::new(settings.action_cache_ttl);
    let submissions = submissions::Submissions::start(pool.clone());
    let audit = audit::Trail::start(pool.clone());
    Ok(Arc::new(AppState {
        audit,
        db: pool,
        verified_tokens: Default::default(),
        actions,
        publisher,
        submissions,
        scraped_gauges: Default::default(),
        followers,
        streams_stop: CancellationToken::new(),
        streams: streams::StreamBudget::new(settings.streams.clone()),
        changes: tokio_util::task::TaskTracker::new(),
        settings,
    }))
}

#[derive(Debug, thiserror::Error)]
pub enum PackDirError {
    #[error("cannot read packs directory {0} (ATTUNE_PACKS_DIR): {1}")]
    Read(String, std::io::Error),
    #[error(transparent)]
    Pack(#[from] attune_common::pack::PackError),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Register(#[from] db::pack::RegisterError),
    #[error(transparent)]
    Location(#[from] attune_common::pack::PackLocationError),
}

/// Registers (or updates) every pack directory (one with a `pack.yaml`) under `dir`. A missing
/// directory registers nothing.
pub async fn register_packs(pool: &PgPool, dir: &std::path::Path) -> Result<usize, PackDirError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(PackDirError::Read(dir.display().to_string(), e)),
    };
    let (mut dirs, others): (Vec<_>, Vec<_>) = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .partition(|p| p.join("pack.yaml").is_file());
    // a directory that looks like a pack but names itself nowhere is said, not passed over
    for dir in others.iter().filter(|dir| dir.join("actions").is_dir() || dir.join("workflows").is_dir()) {
        tracing::warn!(
            dir = %dir.display(),
            "not a pack: it has actions but no pack.yaml (write one: ref: NAME, version: 1.0.0)"
        );
    }
    dirs.sort();
    let mut first_error = None;
    // a pack whose workflow names another pack's action waits for that pack: packs refused for
    // a step's action are tried again after the others, for as long as one more goes in
    let mut pending: Vec<&std::path::PathBuf> = dirs.iter().collect();
    loop {
        let attempted = pending.len();
        let mut waiting = Vec::new();
        let mut waiting_errors = Vec::new();
        for pack_dir in std::mem::take(&mut pending) {
            // one pack that does not load (or whose ref is registered from elsewhere: only an
            // admin's force takes a ref over) does not keep the others out
            let registered = match attune_common::pack::resolve_in_packs_dir(dir, pack_dir)
                .map_err(PackDirError::from)
                .and_then(|resolved| attune_common::pack::load_pack(&resolved).map_err(PackDirError::from))
            {
                Ok(loaded) => db::pack::register(pool, &loaded).await.map_err(PackDirError::from),
                Err(e) => Err(e),
            };
            match registered {
                Ok(registered) => {
                    tracing::info!(pack = %registered.pack_ref, actions = registered.action_count, "pack registered")
                }
                Err(PackDirError::Register(db::pack::RegisterError::Database(e))) => return Err(e.into()),
                Err(e @ PackDirError::Register(db::pack::RegisterError::Invalid(_))) => {
                    waiting.push(pack_dir);
                    waiting_errors.push(e);
                }
                Err(e) => {
                    tracing::error!(dir = %pack_dir.display(), error = %e, "pack not registered");
                    first_error.get_or_insert(e);
                }
            }
        }
        // none went in this time: what is left names what nobody registers
        if waiting.is_empty() || waiting.len() == attempted {
            for (pack_dir, e) in waiting.into_iter().zip(waiting_errors) {
                tracing::error!(dir = %pack_dir.display(), error = %e, "pack not registered");
                first_error.get_or_insert(e);
            }
            break;
        }
        pending = waiting;
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(dirs.len()),
    }
}

/// Serves on `listener` (HTTPS when the settings name a certificate) until `shutdown` fires,
/// then lets the requests in flight finish; bounded as `server` describes.
pub async fn serve(listener: TcpListener, state: State, shutdown: CancellationToken) -> Result<(), Error> {
    let settings = state.settings.http.clone();
    let scheme = if settings.tls.is_some() { "https" } else { "http" };
    tracing::info!(addr = %listener.local_addr()?, scheme, "api listening");
    let streams_stop = state.streams_stop.clone();
    let stopping = shutdown.clone();
    tokio::spawn(async move {
        stopping.cancelled().await;
        streams_stop.cancel();
    });
    // attune's own events, answered while the API serves
    let answering = tokio::spawn(raised::answer(state.clone(), shutdown.clone()));
    let changes = state.changes.clone();
    let app = server::with_limits(router(state), &settings);
    let served = server::serve(listener, app, &settings, shutdown.clone()).await;
    // (it returns at the shutdown; an answer in flight ends first, or rolls back)
    shutdown.cancel();
    let _ = answering.await;
    served?;
    // changes whose clients are gone (or were cut off at the shutdown timeout) end with their
    // audit rows before the process does
    changes.close();
    if tokio::time::timeout(settings.shutdown_timeout, changes.wait()).await.is_err() {
        tracing::warn!("requests still changing state at the shutdown timeout");
    }
    Ok(())
}

/// Binds `settings.addr` and serves until `shutdown` fires.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<(), Error> {
    let listener = TcpListener::bind(settings.addr).await?;
    let state = state(settings).await?;
    serve(listener, state, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use attune_common::config::Defaults;

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let settings = Settings::from_source(&Defaults).unwrap();
        assert_eq!(settings.addr, SocketAddr::from(([0, 0, 0, 0], 8080)));
        assert_eq!(
            (settings.worker_queue_ttl, settings.token_cache_ttl, settings.action_cache_ttl),
            (Duration::from_secs(300), Duration::from_secs(10), Duration::from_secs(5))
        );
        assert_eq!(settings.health, HealthThresholds::default());
    }
}
