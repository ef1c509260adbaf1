//! `attune pack list | register`: the registered packs (`db::pack::Pack`).

use anyhow::Context;
use attune_cli::client::{Answer, Client};
use attune_cli::output::shown;
use attune_common::db::pack::Pack;
use serde_json::json;

use super::{print, print_list};
use crate::Output;

/// `attune pack list`
pub async fn list(client: &Client, out: Output) -> anyhow::Result<i32> {
    let packs: Vec<Answer<Pack>> = client.get("/api/v1/packs", &[]).await?;
    print_list(out, &packs, &["PACK", "VERSION", "ACTIONS", "PATH"], |p| {
        vec![p.pack_ref.clone(), p.version.clone(), p.action_count.to_string(), shown(&p.path)]
    });
    Ok(0)
}

/// `attune pack register PATH [--force]`, with what the loader warned of.
pub async fn register(client: &Client, out: Output, path: &std::path::Path, force: bool) -> anyhow::Result<i32> {
    let path = std::fs::canonicalize(path).with_context(|| format!("pack directory {} not found", path.display()))?;
    let pack: Answer<Pack> = client.post("/api/v1/packs", &json!({"path": path, "force": force})).await?;
    print(out, &pack, |p| {
        let mut told = format!("registered pack {} {} ({} actions)", p.pack_ref, p.version, p.action_count);
        for warning in &p.warnings {
            told.push_str(&format!("\nwarning: {warning}"));
        }
        told
    });
    Ok(0)
}
