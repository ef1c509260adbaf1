//! `attune audit list`: the audit trail (`routes::audit::AuditPage`).

use attune_api::routes::audit::AuditPage;
use attune_cli::client::{Answer, Client};
use attune_cli::output::{self, shown};

use super::print;
use crate::Output;

/// The filters of `attune audit list`.
pub struct Filter {
    pub actor: Option<String>,
    pub route: Option<String>,
    pub target: Option<String>,
    pub since: Option<String>,
    pub limit: u32,
}

/// `attune audit list [--actor A] [--route R] [--target T] [--since TIME] [--limit N]`
pub async fn list(client: &Client, out: Output, filter: Filter) -> anyhow::Result<i32> {
    let Filter { actor, route, target, since, limit } = filter;
    let mut query = vec![("limit", limit.to_string())];
    for (name, value) in [("actor", actor), ("route", route), ("target", target), ("since", since)] {
        if let Some(value) = value {
            query.push((name, value));
        }
    }
    let page: Answer<AuditPage> = client.get("/api/v1/audit", &query).await?;
    print(out, &page, |page| {
        let rows: Vec<Vec<String>> = page
            .events
            .iter()
            .map(|e| {
                let who = e.token_name.as_deref().or(e.actor.as_deref()).unwrap_or("-").to_string();
                vec![
                    e.id.to_string(),
                    shown(&e.at),
                    who,
                    format!("{} {}", e.method, e.path),
                    e.status.to_string(),
                    shown(&e.target),
                    shown(&e.reason),
                ]
            })
            .collect();
        output::table(&["ID", "AT", "WHO", "REQUEST", "STATUS", "TARGET", "REASON"], &rows)
    });
    Ok(0)
}
