//! The secret store (`attune_common::secrets`): an admin sets and deletes named secrets; an
//! operator lists their names to refer to them (`{"$secret": "<name>"}` as a parameter's value),
//! only in the parameters of the actions the secret names as its users.
//! No route answers a value: it is sealed with `ATTUNE_SECRETS_KEY_FILE` before it is written.

use attune_common::db::{self, secret::SecretInfo};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;

use crate::ApiError;
use crate::auth::Caller;

/// The most characters a secret's value may hold.
pub const MAX_SECRET_CHARS: usize = 16 * 1024;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetSecret {
    /// The value (1 to 16384 characters); sealed before it is stored, never answered.
    #[schema(min_length = 1, max_length = 16384, pattern = r"^[^\x00]*$")]
    pub value: String,
    /// The actions it may be given to: action refs (`pack.name`), packs (`pack`, each of its
    /// actions) or `"*"` (any action); 1 to 64. (`attune secret set` without `--users` sends the
    /// users the secret has.)
    #[schema(min_items = 1, max_items = 64)]
    pub users: Vec<String>,
}

/// The most users one secret may name.
pub const MAX_SECRET_USERS: usize = 64;
/// What each of a secret's users is: an action (`pack.name`), a pack, or `*` (the form the
/// table's `secret_users_form` holds them to; the OpenAPI document states it).
pub const USER_PATTERN: &str = r"^(\*|[A-Za-z0-9_-]{1,128}(\.[A-Za-z0-9_-]{1,128})?)$";

fn checked_users(users: &[String]) -> Result<(), ApiError> {
    let valid_name = |part: &str| {
        (1..=128).contains(&part.len()) && part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
    };
    if users.is_empty() || users.len() > MAX_SECRET_USERS {
        return Err(ApiError::invalid("users", format!("'users' names 1 to {MAX_SECRET_USERS} actions or packs")));
    }
    for user in users {
        let valid = user == "*"
            || match user.split_once('.') {
                Some((pack, action)) => valid_name(pack) && valid_name(action),
                None => valid_name(user),
            };
        if !valid {
            return Err(ApiError::invalid(
                "users",
                format!("{user:?} is neither an action ('pack.name'), a pack ('pack') nor '*' (any action)"),
            ));
        }
    }
    Ok(())
}

/// Every secret's name and when it was set; never a value.
#[utoipa::path(get, path = "/secrets", operation_id = "list_secrets", tag = "secrets",
    responses((status = 200, body = Vec<SecretInfo>)))]
pub async fn list(State(state): State<crate::State>) -> Result<Json<Vec<SecretInfo>>, ApiError> {
    Ok(Json(db::secret::list(&state.db).await?))
}

fn checked_name(name: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(name) = name?;
    let valid = (1..=128).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !valid {
        return Err(ApiError::invalid("name", "a secret's name is 1 to 128 letters, digits, '_', '.' or '-'"));
    }
    Ok(name)
}

/// Sets a secret (made or replaced), sealed with the API's key; answers what is listed of it.
#[utoipa::path(put, path = "/secrets/{name}", operation_id = "set_secret", tag = "secrets", request_body = SetSecret,
    params(("name" = String, Path, description = "The secret's name: 1 to 128 letters, digits, '_', '.' or '-'", pattern = r"^[A-Za-z0-9_.-]{1,128}$")),
    responses((status = 200, description = "The secret as listed (never its value)", body = SecretInfo),
        (status = 422, description = "A bad name or value (`parameter` names it), or no key to seal with (`value`)", body = crate::openapi::ErrorBody)))]
pub async fn set(
    State(state): State<crate::State>,
    Extension(caller): Extension<Caller>,
    asking: crate::audit::Asking,
    name: Result<Path<String>, PathRejection>,
    crate::error::JsonObject(body): crate::error::JsonObject<SetSecret>,
) -> Result<(Extension<crate::audit::Target>, Json<SecretInfo>), ApiError> {
    let name = checked_name(name)?;
    crate::error::storable("value", &body.value)?;
    if body.value.is_empty() || body.value.chars().count() > MAX_SECRET_CHARS {
        return Err(ApiError::invalid("value", format!("'value' must be 1 to {MAX_SECRET_CHARS} characters")));
    }
    let sealer = state.settings.sealer.as_ref().ok_or_else(|| {
        ApiError::invalid("value", format!("this API has no {} to seal secrets with", attune_common::secrets::KEY_FILE))
    })?;
    checked_users(&body.users)?;
    let mut transaction = state.db.begin().await?;
    let sealed = sealer.seal(&name, &body.value);
    let info = db::secret::set(&mut *transaction, &name, &sealed, &body.users, caller.token_id).await?;
    let target = asking.commit(transaction, StatusCode::OK, Default::default()).await?;
    tracing::info!(name = %info.name, by = caller.token_id, "secret set");
    Ok((target, Json(info)))
}

/// Deletes a secret: executions that refer to it fail as `invalid_parameters` when they run.
#[utoipa::path(delete, path = "/secrets/{name}", operation_id = "delete_secret", tag = "secrets",
    params(("name" = String, Path, description = "The secret's name", pattern = r"^[A-Za-z0-9_.-]{1,128}$")),
    responses((status = 204, description = "Deleted"),
        (status = 404, description = "No such secret", body = crate::openapi::ErrorBody),
        (status = 422, description = "Not a secret's name (`parameter`: `name`)", body = crate::openapi::ErrorBody)))]
pub async fn delete(
    State(state): State<crate::State>,
    Extension(caller): Extension<Caller>,
    asking: crate::audit::Asking,
    name: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Extension<crate::audit::Target>), ApiError> {
    let name = checked_name(name)?;
    let mut transaction = state.db.begin().await?;
    if !db::secret::delete(&mut *transaction, &name).await? {
        return Err(ApiError::not_found("secret", format!("secret '{name}' does not exist")));
    }
    let target = asking.commit(transaction, StatusCode::NO_CONTENT, Default::default()).await?;
    tracing::info!(%name, by = caller.token_id, "secret deleted");
    Ok((StatusCode::NO_CONTENT, target))
}
