//! The audit trail's writer: every request to an `/api/v1` route that could change state (every
//! method but GET and HEAD) is written to `audit_event` with who asked (the token and its role),
//! the route and path, the status it was answered (a refusal too), what it made when the path
//! does not say (`Target`, set by the handler), and the reason given in `X-Attune-Reason`.
//!
//! A request that changes state writes its row in the change's own transaction: the middleware
//! (`record`) puts who asks and how (`Asking`) in the request's extensions, and the handler writes
//! the row with the status it will answer and commits both at once (`Asking::commit`), then
//! answers with its `Target` marked `written`. So a committed change always has its row, and
//! exactly one: a change whose row cannot be written is not made (its transaction rolls back, and
//! it is answered with an error saying so). (A batched submission writes its row in its own
//! insert, `db::execution::Submitter`.) Every other request, a refusal or one that changed nothing
//! (a dry run), is written by the middleware once it is answered, before the answer is sent (in
//! batches under load: `attune_common::batch`). A change runs apart from its connection
//! (`AppState::changes`), so one whose client hung up, or whose request timed out, is carried out
//! to its answer.

use axum::Extension;
use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode};
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
/// handler wrote the row itself, in the transaction of the change (`Asking::commit`, a batched
/// submission). `reason`: the reason its body gave (a fail's), recorded when no `X-Attune-Reason`
/// was sent.
#[derive(Debug, Clone, Default)]
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

/// Who asks for a change and how, as `record` read it from the request: a request extension,
/// taken by a handler that writes its audit row in its change's transaction.
#[derive(Debug, Clone)]
pub struct Asking {
    caller: Option<Caller>,
    method: String,
    /// The route matched (none: the fallback's 404).
    route: Option<String>,
    /// The path as sent.
    path: String,
    /// `X-Attune-Reason`, checked.
    reason: Option<String>,
}

impl Asking {
    /// The reason the request gave (`X-Attune-Reason`), checked.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// The audit row of this request answered `status`, having made `target`.
    pub fn event(&self, status: StatusCode, target: &Target) -> NewEvent {
        NewEvent {
            token_id: self.caller.map(|caller| caller.token_id),
            role: self.caller.map(|caller| caller.role.as_str().to_string()),
            actor: None,
            method: self.method.clone(),
            // (a request no route matched changes nothing: it reaches the fallback's 404)
            route: self.route.clone().unwrap_or_else(|| "(no route)".into()),
            path: self.path.clone(),
            status: status.as_u16() as i16,
            target: target.what.clone(),
            reason: self.reason.clone().or_else(|| target.reason.clone()),
        }
    }

    /// What a batched submission's row records besides its token (`db::execution::Submitter`).
    pub fn asked(&self) -> Option<db::audit::Asked> {
        let caller = self.caller?;
        Some(db::audit::Asked { role: caller.role.as_str().into(), reason: self.reason.clone() })
    }

    /// Writes the audit row of the change `transaction` holds, as answered `status` having made
    /// `target`, and commits the two together: the target to answer with, marked written. A row
    /// that cannot be written rolls the change back: it is not made, and the request is answered
    /// with an error that says so (503 when the database is away, to try again).
    pub async fn commit(
        &self,
        mut transaction: sqlx::Transaction<'_, sqlx::Postgres>,
        status: StatusCode,
        target: Target,
    ) -> Result<Extension<Target>, ApiError> {
        let event = self.event(status, &target);
        if let Err(e) = db::audit::insert_many(&mut *transaction, std::slice::from_ref(&event)).await {
            if db::is_transient(&e) {
                return Err(e.into());
            }
            tracing::error!(error = %e, route = %event.route, path = %event.path, "a change's audit row could not be written: the change is not made");
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "not_audited",
                "the change was not made: its audit row could not be written; see the server log",
            ));
        }
        if let Err(e) = transaction.commit().await {
            if db::is_connection_lost(&e) {
                // the change and its row were both made or neither: no second row is written
                // for it, and the answer does not say which
                tracing::error!(error = %e, route = %event.route, path = %event.path, "a change's commit was not acknowledged: it and its audit row were made together or not at all");
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    OUTCOME_UNKNOWN,
                    "the database did not acknowledge the change: it was made with its audit row, or not at all; read it back before trying again",
                ));
            }
            return Err(e.into());
        }
        Ok(Extension(Target { written: true, ..target }))
    }
}

/// The error code of a change whose commit was not acknowledged (`Asking::commit`): its audit row
/// went with it, and the middleware writes none.
pub const OUTCOME_UNKNOWN: &str = "outcome_unknown";

impl<S: Send + Sync> FromRequestParts<S> for Asking {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Asking>().cloned().ok_or_else(|| {
            ApiError::internal("a change's audit context is missing", "the route is not under audit::record")
        })
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
pub async fn record(State(state): State<crate::State>, mut request: Request, next: Next) -> Response {
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
    let submission = route.as_deref() == Some(SUBMISSIONS_ROUTE) && method == "POST";
    let asking = Asking { caller, method, route, path, reason };
    request.extensions_mut().insert(asking.clone());
    // A submission may be withdrawn by the request timeout until it is taken into a batch. Every
    // other change is carried out to its answer whatever becomes of the request: it runs apart
    // from the connection (a client that hangs up, a request timeout, the API stopping do not
    // drop it while its commit may be under way), and the timeout waits for its outcome rather
    // than answer that nothing was written (it may have been).
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
        audit(&state, response, &asking).await
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

/// Writes the audit row of a request that was answered `response`, unless the handler wrote it
/// with its change.
async fn audit(state: &crate::State, response: Response, asking: &Asking) -> Response {
    let target = response.extensions().get::<Target>().cloned().unwrap_or_default();
    let unknown = response.extensions().get::<crate::error::ErrorCode>().is_some_and(|code| code.0 == OUTCOME_UNKNOWN);
    if target.written || unknown {
        return response;
    }
    let event = asking.event(response.status(), &target);
    match state.audit.0.submit(event).await {
        Some(Ok(())) => {}
        Some(Err(e)) => tracing::error!(error = %e, "the audit event of a request could not be written"),
        None => tracing::error!("the audit writer is gone"),
    }
    response
}
