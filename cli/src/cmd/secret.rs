//! `attune secret set | list | delete`: the secret store as the API lists it
//! (`db::secret::SecretInfo`: names and users, never a value). `secret reseal` talks to the
//! database (`crate::reseal`).

use anyhow::bail;
use attune_cli::client::{Answer, Client};
use attune_cli::output::shown;
use attune_common::db::secret::SecretInfo;
use serde::de::IgnoredAny;
use serde_json::json;

use super::{print, print_list, value_from_stdin};
use crate::Output;

/// `attune secret set NAME [--users A,B]`: the value read from stdin; without `--users`, the
/// users it has (a new secret must be given them).
pub async fn set(client: &Client, out: Output, name: &str, users: Option<Vec<String>>) -> anyhow::Result<i32> {
    let value = value_from_stdin()?;
    let users = match users {
        Some(users) => users,
        None => {
            let listed: Vec<SecretInfo> = client.get("/api/v1/secrets", &[]).await?;
            match listed.into_iter().find(|s| s.name == name) {
                Some(known) => known.users,
                None => bail!(
                    "secret {name} is new: name the actions that may use it, --users pack.action,pack (or '*' for any)"
                ),
            }
        }
    };
    let set: Answer<SecretInfo> =
        client.put(&format!("/api/v1/secrets/{name}"), &json!({"value": value, "users": users})).await?;
    print(out, &set, |s| format!("secret {} set at {}, for {}", s.name, shown(&s.updated), s.users.join(",")));
    Ok(0)
}

/// `attune secret list`
pub async fn list(client: &Client, out: Output) -> anyhow::Result<i32> {
    let secrets: Vec<Answer<SecretInfo>> = client.get("/api/v1/secrets", &[]).await?;
    print_list(out, &secrets, &["name", "users", "created", "updated"], |s| {
        vec![s.name.clone(), s.users.join(","), shown(&s.created), shown(&s.updated)]
    });
    Ok(0)
}

/// `attune secret delete NAME`
pub async fn delete(client: &Client, out: Output, name: &str) -> anyhow::Result<i32> {
    let _: IgnoredAny = client.delete(&format!("/api/v1/secrets/{name}")).await?;
    print(out, &json!({"deleted": name}), |_| format!("secret {name} deleted"));
    Ok(0)
}
