//! `attune pause | resume | pauses`: what an operator paused (`db::pause::Pause`).

use anyhow::bail;
use attune_cli::client::{Answer, Client};
use attune_cli::output::shown;
use attune_common::db::pause::Pause;
use serde_json::json;

use super::{encode, print, print_list};
use crate::Output;

/// `attune pause KIND NAME --reason TEXT`
pub async fn pause(
    client: &Client,
    out: Output,
    kind: &str,
    name: &str,
    reason: Option<String>,
) -> anyhow::Result<i32> {
    let Some(reason) = reason else { bail!("a pause needs --reason: say why") };
    let path = format!("/api/v1/pauses/{kind}/{}", encode(name));
    let pause: Answer<Pause> = client.put(&path, &json!({"reason": reason})).await?;
    print(out, &pause, |p| format!("paused {} {} since {}: {}", p.kind, p.name, shown(&p.paused_at), p.reason));
    Ok(0)
}

/// `attune resume KIND NAME`
pub async fn resume(client: &Client, out: Output, kind: &str, name: &str) -> anyhow::Result<i32> {
    let pause: Answer<Pause> = client.delete(&format!("/api/v1/pauses/{kind}/{}", encode(name))).await?;
    print(out, &pause, |p| format!("resumed {} {} (paused since {})", p.kind, p.name, shown(&p.paused_at)));
    Ok(0)
}

/// `attune pauses`
pub async fn list(client: &Client, out: Output) -> anyhow::Result<i32> {
    let pauses: Vec<Answer<Pause>> = client.get("/api/v1/pauses", &[]).await?;
    print_list(out, &pauses, &["KIND", "NAME", "SINCE", "BY", "REASON"], |p| {
        let by = p.paused_by_name.clone().unwrap_or_else(|| shown(&p.paused_by));
        vec![p.kind.clone(), p.name.clone(), shown(&p.paused_at), by, p.reason.clone()]
    });
    Ok(0)
}
