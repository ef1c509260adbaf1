//! The audit trail's writer: every request to an `/api/v1` route that could change state (every
//! method but GET and HEAD) is written to `audit_event` with who asked (the token and its role),
//! the route and path, the status it was answered (a refusal too), what it made when the path
//! does not say (`Target`, set by the handler), and the reason given in `X-Attune-Reason`. The row
//! is written before the answer is sent (in batches under load: `attune_common::batch`), so an
//! answered change is never missing from the trail; and a change runs with its row apart from
//! its connection (`AppState::changes`), so one whose client hung up, or whose request timed out,
//! is not left without it. (A submission writes its row in its own insert.)

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use attune_common::batch::Batcher;
use attune_common::db::{self, audit::NewEvent};

use crate::ApiError;
use crate::auth::Caller;

/// The header that carries why a person asks for a change (at most `MAX_REASON_CHARS`).
pub const REASON_HEADER: &str = "X-Attune-Reason";
pub const MAX_REASON_CHARS: usize = 1000;

/// What a request made, for its audit row (`execution:43`): a response extension. `written`: the
/// handler wrote the row itself, in the transaction of the change (a batched submission).
/// `reason`: the reason its body gave (a fail's), recorded when no `X-Attune-Reason` was sent.
#[derive(Debug, Clone)]
pub struct Target {
    pub what: Option<String>,
    pub written: bool,
    pub reason: Option<String>,
}

impl Target {
    pub fn new(what: String) -> Target {
        Target { what: Some(what), written: false, reason: None }
    }

    /// The reason a request's body gave.
    pub fn reason(reason: &str) -> Target {
        Target { what: None, written: false, reason: Some(reason.to_string()) }
    }
}

/// The audit writer: events written together under load, each request waiting for its own.
pub struct Trail(Batcher<NewEvent, Result<(), String>>);

impl Trail {
    pub fn start(db: sqlx::PgPool) -> Trail {
        Trail(Batcher::start(256, move |events: Vec<NewEvent>| {
            let db = db.clone();
            async move {
                let written =
                    db::retry_while_unavailable("writing audit events", || db::audit::insert_many(&db, &events));
                match written.await {
                    Ok(_) => events.iter().map(|_| Ok(())).collect(),
                    Err(e) => events.iter().map(|_| Err(e.to_string())).collect(),
                }
            }
        }))
    }
}

/// The reason a request gives: `X-Attune-Reason`, once, printable text of at most
/// `MAX_REASON_CHARS` characters (UTF-8); a malformed one is a 400 naming the header.
pub fn reason(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(REASON_HEADER).iter();
    let Some(value) = values.next() else { return Ok(None) };
    let malformed = |message: String| ApiError::bad_request(Some(REASON_HEADER), message);
    if values.next().is_some() {
        return Err(malformed(format!("send the {REASON_HEADER} header once")));
    }
    let text = std::str::from_utf8(value.as_bytes())
        .map_err(|_| malformed(format!("the {REASON_HEADER} header must be UTF-8 text")))?
        .trim();
    if text.chars().count() > MAX_REASON_CHARS {
        return Err(malformed(format!(
            "the {REASON_HEADER} header takes {} characters, more than the limit of {MAX_REASON_CHARS}",
            text.chars().count()
        )));
    }
    if text.chars().any(char::is_control) {
        return Err(malformed(format!("the {REASON_HEADER} header must not contain control characters")));
    }
    Ok((!text.is_empty()).then(|| text.to_string()))
}

/// A `reason` field of a request's body (a bulk call's, a pause's): what the header takes, and
/// required; a 422 naming `reason` otherwise.
pub fn body_reason(reason: &str) -> Result<(), ApiError> {
    crate::error::storable("reason", reason)?;
    if reason.trim().is_empty() || reason.chars().count() > MAX_REASON_CHARS {
        return Err(ApiError::invalid(
            "reason",
            format!("'reason' must say why, in 1 to {MAX_REASON_CHARS} characters"),
        ));
    }
    Ok(())
}

/// Writes the audit row of each request that could change state (runs inside `auth`, outside
/// `roles::enforce`, so that a refusal is written too).
pub async fn record(State(state): State<crate::State>, request: Request, next: Next) -> Response {
    if matches!(*request.method(), Method::GET | Method::HEAD) {
        return next.run(request).await;
    }
    let reason = match reason(request.headers()) {
        Ok(reason) => reason,
        Err(error) => return error.into_response(),
    };
    let caller = request.extensions().get::<Caller>().copied();
    let withdrawal = request.extensions().get::<crate::server::Withdrawal>().cloned();
    let route = request.extensions().get::<MatchedPath>().map(|path| path.as_str().to_string());
    // (the path as sent: inside `/api/v1` the router sees it without that prefix)
    let uri = request.extensions().get::<axum::extract::OriginalUri>().map(|original| &original.0);
    let path = uri.unwrap_or(request.uri()).path().to_string();
    let method = request.method().to_string();
    // A submission writes its audit row in its own statement, and may be withdrawn by the
    // request timeout until it is taken into a batch. Every other change is carried out to its
    // end with its audit row whatever becomes of the request: it runs apart from the connection
    // (a client that hangs up, a request timeout, the API stopping do not drop it after its
    // change committed), and the timeout waits for its outcome rather than answer that nothing
    // was written (it may have been).
    let submission = route.as_deref() == Some(SUBMISSIONS_ROUTE) && method == "POST";
    if !submission && let Some(withdrawal) = &withdrawal {
        withdrawal.begin_write();
    }
    let changes = state.changes.clone();
    let work = async move {
        let response = next.run(request).await;
        // what was done is answered as done: from here the request timeout waits for the audit
        // row instead of answering that nothing was written
        if let Some(withdrawal) = withdrawal {
            withdrawal.begin_write();
        }
        audit(&state, response, caller, method, route, path, reason).await
    };
    if submission {
        return work.await;
    }
    match changes.spawn(work).await {
        Ok(response) => response,
        Err(e) => {
            tracing::error!(error = %e, "a request's handler failed");
            axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// The route of submissions (`POST`), which audit themselves.
const SUBMISSIONS_ROUTE: &str = "/api/v1/executions";

/// Writes the audit row of a request that was answered `response`, unless the handler wrote it.
async fn audit(
    state: &crate::State,
    response: Response,
    caller: Option<Caller>,
    method: String,
    route: Option<String>,
    path: String,
    reason: Option<String>,
) -> Response {
    let target = response.extensions().get::<Target>();
    if target.is_some_and(|target| target.written) {
        return response;
    }
    let event = NewEvent {
        token_id: caller.map(|caller| caller.token_id),
        role: caller.map(|caller| caller.role.as_str().to_string()),
        actor: None,
        method,
        // (a request no route matched changes nothing: it reaches the fallback's 404)
        route: route.unwrap_or_else(|| "(no route)".into()),
        path,
        status: response.status().as_u16() as i16,
        target: target.and_then(|target| target.what.clone()),
        reason: reason.or_else(|| target.and_then(|target| target.reason.clone())),
    };
    match state.audit.0.submit(event).await {
        Some(Ok(())) => {}
        Some(Err(e)) => tracing::error!(error = %e, "the audit event of a request could not be written"),
        None => tracing::error!("the audit writer is gone"),
    }
    response
}
