//! The commands. Each prints JSON only with `--output json`; exit status 0 means the command
//! (and, with `--wait`, the execution) succeeded.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};

use crate::client::Client;
use crate::output::{self, text};
use crate::{
    ActionCommand, AuditCommand, Cli, Command, EventCommand, ExecutionCommand, Output, PackCommand, RuleCommand,
    ScheduleCommand, SecretCommand, WebhookCommand, WorkerCommand, WorkflowCommand,
};

fn print(output: Output, value: &Value, human: impl FnOnce(&Value) -> String) {
    match output {
        Output::Json => attune_cli::say!("{}", serde_json::to_string_pretty(value).expect("json prints")),
        Output::Table => attune_cli::say!("{}", human(value)),
    }
}

pub async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let config = crate::ConfigFile::load()?;
    let api_url = match cli.api_url.clone().or(config.api_url) {
        Some(url) => url,
        None => attune_common::settings::get("ATTUNE_API_URL")?,
    };
    let token = cli.token.clone().or(config.token);
    let client = Client::new(&api_url, token.clone()).with_reason(cli.reason.clone());
    let out = cli.output;
    match cli.command {
        Command::Migrate => crate::up::migrate(out).await.map(|()| 0),
        Command::Up { workers } => crate::up::run(workers).await.map(|()| 0),
        Command::Pause { kind, name } => {
            let Some(reason) = cli.reason.clone() else { bail!("a pause needs --reason: say why") };
            let path = format!("/api/v1/pauses/{kind}/{}", encode(&name));
            let pause = client.request(reqwest::Method::PUT, &path, &[], Some(&json!({"reason": reason}))).await?;
            print(out, &pause, |p| {
                format!(
                    "paused {} {} since {}: {}",
                    text(&p["kind"]),
                    text(&p["name"]),
                    text(&p["paused_at"]),
                    text(&p["reason"])
                )
            });
            Ok(0)
        }
        Command::Resume { kind, name } => {
            let path = format!("/api/v1/pauses/{kind}/{}", encode(&name));
            let pause = client.request(reqwest::Method::DELETE, &path, &[], None::<&()>).await?;
            print(out, &pause, |p| {
                format!("resumed {} {} (paused since {})", text(&p["kind"]), text(&p["name"]), text(&p["paused_at"]))
            });
            Ok(0)
        }
        Command::Pauses => {
            let pauses = client.get("/api/v1/pauses", &[]).await?;
            print(out, &pauses, |list| {
                let rows: Vec<Vec<String>> = list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        let by =
                            p["paused_by_name"].as_str().map(str::to_string).unwrap_or_else(|| text(&p["paused_by"]));
                        vec![text(&p["kind"]), text(&p["name"]), text(&p["paused_at"]), by, text(&p["reason"])]
                    })
                    .collect();
                output::table(&["KIND", "NAME", "SINCE", "BY", "REASON"], &rows)
            });
            Ok(0)
        }
        Command::Schedule(command) => schedule(&client, out, command, cli.reason.clone()).await,
        Command::Concurrency { action_ref, limit, key, no_limit, clear } => {
            let path = format!("/api/v1/actions/{}/concurrency", encode(&action_ref));
            let action = if clear {
                client.request(reqwest::Method::DELETE, &path, &[], None::<&()>).await?
            } else if limit.is_some() || no_limit {
                let Some(reason) = cli.reason.clone() else { bail!("a concurrency policy needs --reason: say why") };
                let body = json!({"limit": limit, "key": key, "reason": reason});
                client.request(reqwest::Method::PUT, &path, &[], Some(&body)).await?
            } else {
                client.get(&format!("/api/v1/actions/{}", encode(&action_ref)), &[]).await?
            };
            print(out, &action, |a| {
                let policy = match (&a["concurrency"]["limit"], a["concurrency"]["key"].as_str()) {
                    (Value::Null, _) => "no limit".to_string(),
                    (limit, None) => format!("at most {limit} at once"),
                    (limit, Some(key)) => format!("at most {limit} at once per value of '{key}'"),
                };
                let source = match &a["concurrency_set"] {
                    Value::Null => "its pack's".to_string(),
                    set => format!(
                        "an operator's (token {}, {}: {})",
                        text(&set["set_by"]),
                        text(&set["set_at"]),
                        text(&set["reason"])
                    ),
                };
                format!("{}: {policy}, {source}", text(&a["ref"]))
            });
            Ok(0)
        }
        Command::Token(command) => crate::tokens::run(command, out, cli.reason.as_deref()).await,
        Command::WorkerLogin(command) => crate::worker_logins::run(command, out).await,
        Command::Audit(AuditCommand::List { actor, route, target, since, limit }) => {
            let mut query = vec![("limit", limit.to_string())];
            for (name, value) in [("actor", actor), ("route", route), ("target", target), ("since", since)] {
                if let Some(value) = value {
                    query.push((name, value));
                }
            }
            let page = client.get("/api/v1/audit", &query).await?;
            print(out, &page, |page| {
                let rows: Vec<Vec<String>> = page["events"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| {
                        let who = e["token_name"].as_str().or(e["actor"].as_str()).unwrap_or("-").to_string();
                        vec![
                            e["id"].to_string(),
                            text(&e["at"]),
                            who,
                            format!("{} {}", text(&e["method"]), text(&e["path"])),
                            e["status"].to_string(),
                            text(&e["target"]),
                            text(&e["reason"]),
                        ]
                    })
                    .collect();
                output::table(&["ID", "AT", "WHO", "REQUEST", "STATUS", "TARGET", "REASON"], &rows)
            });
            Ok(0)
        }
        Command::Secret(SecretCommand::Reseal) => crate::reseal::run(out, cli.reason.as_deref()).await,
        Command::Secret(SecretCommand::Set { name, users }) => {
            let mut value = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut value).context("reading the value from stdin")?;
            let value = value.strip_suffix('\n').unwrap_or(&value);
            // without --users, the users it has (a new secret must be given them)
            let users = match users {
                Some(users) => users,
                None => {
                    let listed = client.get("/api/v1/secrets", &[]).await?;
                    let known = listed.as_array().and_then(|all| all.iter().find(|s| s["name"] == name.as_str()));
                    match known.and_then(|s| s["users"].as_array()) {
                        Some(users) => users.iter().map(text).collect(),
                        None => bail!(
                            "secret {name} is new: name the actions that may use it, --users pack.action,pack (or '*' for any)"
                        ),
                    }
                }
            };
            let body = json!({"value": value, "users": users});
            let set = client.put(&format!("/api/v1/secrets/{name}"), &body).await?;
            print(out, &set, |s| {
                format!("secret {} set at {}, for {}", text(&s["name"]), text(&s["updated"]), users_of(s))
            });
            Ok(0)
        }
        Command::Secret(SecretCommand::List) => {
            let secrets = client.get("/api/v1/secrets", &[]).await?;
            print(out, &secrets, |list| {
                let rows: Vec<Vec<String>> = list
                    .as_array()
                    .map(|items| {
                        items
                            .iter()
                            .map(|s| vec![text(&s["name"]), users_of(s), text(&s["created"]), text(&s["updated"])])
                            .collect()
                    })
                    .unwrap_or_default();
                output::table(&["name", "users", "created", "updated"], &rows)
            });
            Ok(0)
        }
        Command::Secret(SecretCommand::Delete { name }) => {
            client.delete(&format!("/api/v1/secrets/{name}")).await?;
            print(out, &json!({"deleted": name}), |_| format!("secret {name} deleted"));
            Ok(0)
        }
        Command::Pack(PackCommand::List) => {
            let packs = client.get("/api/v1/packs", &[]).await?;
            print(out, &packs, |list| {
                let rows: Vec<Vec<String>> = list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| vec![text(&p["ref"]), text(&p["version"]), text(&p["action_count"]), text(&p["path"])])
                    .collect();
                output::table(&["PACK", "VERSION", "ACTIONS", "PATH"], &rows)
            });
            Ok(0)
        }
        Command::Action(ActionCommand::List { pack }) => {
            let actions = client.get("/api/v1/actions", &[]).await?;
            let listed: Vec<Value> = actions
                .as_array()
                .into_iter()
                .flatten()
                .filter(|a| pack.as_deref().is_none_or(|pack| a["pack_ref"] == pack))
                .cloned()
                .collect();
            print(out, &Value::Array(listed), |list| {
                let rows: Vec<Vec<String>> = list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| {
                        vec![
                            text(&a["ref"]),
                            text(&a["runtime"]),
                            text(&a["timeout_seconds"]),
                            text(&a["max_retries"]),
                            text(&a["description"]),
                        ]
                    })
                    .collect();
                output::table(&["ACTION", "RUNTIME", "TIMEOUT", "RETRIES", "DESCRIPTION"], &rows)
            });
            Ok(0)
        }
        Command::Action(ActionCommand::Get { action_ref }) => {
            let action = client.get(&format!("/api/v1/actions/{action_ref}"), &[]).await?;
            print(out, &action, |a| serde_json::to_string_pretty(a).unwrap_or_default());
            Ok(0)
        }
        Command::Pack(PackCommand::Register { path, force }) => {
            let path =
                std::fs::canonicalize(&path).with_context(|| format!("pack directory {} not found", path.display()))?;
            let pack = client.post("/api/v1/packs", &json!({"path": path, "force": force})).await?;
            print(out, &pack, |p| {
                let mut told = format!(
                    "registered pack {} {} ({} actions)",
                    text(&p["ref"]),
                    text(&p["version"]),
                    text(&p["action_count"])
                );
                for warning in p["warnings"].as_array().into_iter().flatten() {
                    told.push_str(&format!("\nwarning: {}", text(warning)));
                }
                told
            });
            Ok(0)
        }
        Command::Webhook(WebhookCommand::List) => {
            let hooks = client.get("/api/v1/webhooks", &[]).await?;
            print(out, &hooks, |list| {
                let rows: Vec<Vec<String>> = list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|w| {
                        let set = if w["credential_set"].is_null() { "no".into() } else { text(&w["credential_set"]) };
                        vec![text(&w["name"]), text(&w["pack"]), text(&w["auth"]), text(&w["max_bytes"]), set]
                    })
                    .collect();
                output::table(&["NAME", "PACK", "AUTH", "MAX BYTES", "CREDENTIAL SET"], &rows)
            });
            Ok(0)
        }
        Command::Webhook(WebhookCommand::Credential { name, value_stdin }) => {
            let body = if value_stdin {
                let mut value = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut value)
                    .context("reading the value from stdin")?;
                serde_json::json!({"value": value.strip_suffix('\n').unwrap_or(&value)})
            } else {
                serde_json::json!({})
            };
            let set = client.put(&format!("/api/v1/webhooks/{name}/credential"), &body).await?;
            print(out, &set, |set| match set["token"].as_str() {
                Some(token) => format!(
                    "webhook {name}: token set (shown once; attune keeps only its hash)\n{token}\nsend it as X-Attune-Webhook-Token"
                ),
                None => format!("webhook {name}: credential set"),
            });
            Ok(0)
        }
        Command::Rule(RuleCommand::List) => {
            let rules = client.get("/api/v1/rules", &[]).await?;
            print(out, &rules, |list| {
                let rows: Vec<Vec<String>> = list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|r| vec![text(&r["ref"]), text(&r["trigger"]), text(&r["action_ref"]), text(&r["enabled"])])
                    .collect();
                output::table(&["RULE", "TRIGGER", "ACTION", "ENABLED"], &rows)
            });
            Ok(0)
        }
        Command::Rule(RuleCommand::Create { file }) => {
            let written = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            // (the file's errors name the file and the field before anything is sent)
            let spec = attune_core::rules::parse_rule(&file, &written)?;
            let made = client.post("/api/v1/rules", &spec).await?;
            print(out, &made, |r| {
                format!("rule {} made: {} -> {}", text(&r["ref"]), text(&r["trigger"]), text(&r["action_ref"]))
            });
            Ok(0)
        }
        Command::Rule(RuleCommand::Enable { rule }) => set_rule_enabled(&client, out, &rule, true).await,
        Command::Rule(RuleCommand::Disable { rule }) => set_rule_enabled(&client, out, &rule, false).await,
        Command::Rule(RuleCommand::Delete { rule }) => {
            client.delete(&format!("/api/v1/rules/{rule}")).await?;
            print(out, &json!({"deleted": rule}), |_| format!("rule {rule} deleted"));
            Ok(0)
        }
        Command::Event(EventCommand::List { trigger, limit }) => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(trigger.map(|t| ("trigger", t)));
            let events = client.get("/api/v1/events", &query).await?;
            print(out, &events, |list| {
                let mut rows = Vec::new();
                for e in list.as_array().into_iter().flatten() {
                    let matches: Vec<&Value> = e["matches"].as_array().into_iter().flatten().collect();
                    if matches.is_empty() {
                        rows.push(vec![
                            text(&e["id"]),
                            text(&e["received"]),
                            text(&e["trigger"]),
                            "-".into(),
                            "no rule".into(),
                        ]);
                    }
                    for m in matches {
                        let what = match m["execution"].as_i64() {
                            Some(id) => format!("execution {id}"),
                            None => m["reason"]
                                .as_str()
                                .map(|r| attune_cli::tail::escaped(r).into_owned())
                                .unwrap_or_default(),
                        };
                        rows.push(vec![
                            text(&e["id"]),
                            text(&e["received"]),
                            text(&e["trigger"]),
                            text(&m["rule"]),
                            what,
                        ]);
                    }
                }
                output::table(&["EVENT", "RECEIVED", "TRIGGER", "RULE", "MADE"], &rows)
            });
            Ok(0)
        }
        Command::Event(EventCommand::Get { id }) => {
            let event = client.get(&format!("/api/v1/events/{id}"), &[]).await?;
            print(out, &event, |e| serde_json::to_string_pretty(e).unwrap_or_default());
            Ok(0)
        }
        Command::Event(EventCommand::Replay { id }) => {
            let recorded = client.post(&format!("/api/v1/events/{id}/replay"), &serde_json::json!({})).await?;
            print(out, &recorded, |r| format!("event {id} replayed as event {}", text(&r["event"])));
            Ok(0)
        }
        Command::Worker(WorkerCommand::Drain { name }) => {
            let worker = client.put(&format!("/api/v1/workers/{}/drain", encode(&name)), &json!({})).await?;
            print(out, &worker, |w| {
                format!("worker {} drained: it finishes what it holds and is given nothing new", text(&w["name"]))
            });
            Ok(0)
        }
        Command::Worker(WorkerCommand::Undrain { name }) => {
            let worker = client.delete(&format!("/api/v1/workers/{}/drain", encode(&name))).await?;
            print(out, &worker, |w| format!("worker {} undrained: it is given work again", text(&w["name"])));
            Ok(0)
        }
        Command::Worker(WorkerCommand::List) => {
            let workers = client.get("/api/v1/workers", &[]).await?;
            print(out, &workers, |list| {
                let rows: Vec<Vec<String>> = list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|w| {
                        let health = &w["capabilities"]["health"];
                        vec![
                            text(&w["id"]),
                            text(&w["name"]),
                            if w["drained_at"].is_string() {
                                format!("{} (drained)", text(&w["status"]))
                            } else {
                                text(&w["status"])
                            },
                            text(&w["health"]),
                            text(&w["queue_depth"]),
                            text(&health["consecutive_failures"]),
                            format!("{} of {}", text(&health["failed_executions"]), text(&health["total_executions"])),
                            w["heartbeat_age_secs"].as_f64().map(|a| format!("{a:.1}s")).unwrap_or_else(|| "-".into()),
                            w["runtimes"]
                                .as_array()
                                .map(|r| r.iter().map(text).collect::<Vec<_>>().join(","))
                                .unwrap_or_default(),
                        ]
                    })
                    .collect();
                output::table(
                    &[
                        "id",
                        "name",
                        "status",
                        "health",
                        "queue",
                        "failures in a row",
                        "runs failed",
                        "heartbeat",
                        "runtimes",
                    ],
                    &rows,
                )
            });
            Ok(0)
        }
        Command::Workflow(WorkflowCommand::Get { id }) => {
            let run = client.get(&format!("/api/v1/workflows/{id}"), &[]).await?;
            print(out, &run, output::workflow_steps);
            Ok(0)
        }
        Command::Workflow(WorkflowCommand::Tree { id, step, all }) => {
            let path = format!("/api/v1/workflows/{id}");
            let query: Vec<(&str, String)> = step.iter().map(|step| ("step", step.clone())).collect();
            let mut run = client.get(&path, &query).await?;
            if all {
                for step in run["steps"].as_array_mut().into_iter().flatten() {
                    while let Some(after) = step["next_after"].as_i64() {
                        let name = step["name"].as_str().unwrap_or_default().to_string();
                        let query = [("step", name), ("after", after.to_string()), ("limit", "10000".into())];
                        let page = client.get(&path, &query).await?;
                        let more = &page["steps"][0];
                        let executions = more["executions"].as_array().cloned().unwrap_or_default();
                        if let Some(shown) = step["executions"].as_array_mut() {
                            shown.extend(executions);
                        }
                        step["next_after"] = more["next_after"].clone();
                    }
                }
            }
            print(out, &run, output::workflow_tree);
            Ok(0)
        }
        Command::Execution(ExecutionCommand::Get { id }) => {
            let execution = client.get(&format!("/api/v1/executions/{id}"), &[]).await?;
            print(out, &execution, output::execution);
            Ok(0)
        }
        Command::Execution(ExecutionCommand::Retry { id, params, wait, wait_timeout }) => {
            let body = if params.is_empty() {
                json!({})
            } else {
                let original = client.get(&format!("/api/v1/executions/{id}"), &[]).await?;
                let action = client.get(&format!("/api/v1/actions/{}", text(&original["action_ref"])), &[]).await?;
                // (only what changes: the API keeps the rest, sealed secrets as they were)
                json!({"parameters": parse_params(&action["parameters"], &params)?, "merge": true})
            };
            let retry = client.post(&format!("/api/v1/executions/{id}/retry"), &body).await?;
            finish(&client, out, retry, wait, wait_timeout).await
        }
        Command::Execution(ExecutionCommand::Cancel { id }) => {
            let canceled = client.post(&format!("/api/v1/executions/{id}/cancel"), &json!({})).await?;
            print(out, &canceled, |e| format!("execution {} {}", text(&e["id"]), text(&e["status"])));
            Ok(0)
        }
        Command::Config => {
            let config = client.get("/api/v1/config", &[]).await?;
            print(out, &config, |c| {
                let retry = &c["retry"];
                let health = &c["health"];
                format!(
                    "retry   enabled {}  backoff {} s, times {} per retry, at most {} s, jitter {}\nhealth  enabled {}  degraded at {} failures / queue {}  unhealthy at {} / {}  heartbeat max age {}s",
                    text(&retry["enabled"]),
                    text(&retry["base_backoff_secs"]),
                    text(&retry["backoff_multiplier"]),
                    text(&retry["max_backoff_secs"]),
                    text(&retry["jitter_factor"]),
                    text(&health["enabled"]),
                    text(&health["degraded_threshold"]),
                    text(&health["queue_depth_degraded"]),
                    text(&health["unhealthy_threshold"]),
                    text(&health["queue_depth_unhealthy"]),
                    text(&health["heartbeat_max_age_secs"])
                )
            });
            Ok(0)
        }
        Command::Execution(ExecutionCommand::Fail { id, reason }) => {
            let failed = client.post(&format!("/api/v1/executions/{id}/fail"), &json!({"reason": reason})).await?;
            print(out, &failed, |e| {
                format!("execution {} {} ({})", text(&e["id"]), text(&e["status"]), text(&e["error"]))
            });
            Ok(0)
        }
        Command::Execution(ExecutionCommand::Watch { id, wait_timeout }) => {
            watch(&client, out, id, Duration::from_secs(wait_timeout)).await
        }
        Command::Execution(ExecutionCommand::Tail { id, raw }) => {
            attune_cli::tail::tail(&client, id, out == Output::Json, raw).await
        }
        Command::Execution(ExecutionCommand::Explain { id }) => {
            let view = client.get(&format!("/api/v1/executions/{id}"), &[]).await?;
            print(out, &view, crate::output::explain);
            Ok(0)
        }
        Command::Execution(ExecutionCommand::Chain { id }) => {
            // the table shows only light fields; JSON has the attempts whole
            let fields = if out == Output::Json { "full" } else { "summary" };
            let chain = whole_chain(&client, id, fields).await?;
            print(out, &chain, |chain| {
                let secs = |v: &Value| v.as_f64().map(|s| format!("{s:.3}s")).unwrap_or_else(|| "-".into());
                let rows: Vec<Vec<String>> = chain["attempts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| {
                        vec![
                            text(&a["retry_count"]),
                            text(&a["id"]),
                            text(&a["status"]),
                            text(&a["retry_reason"]),
                            text(&a["failure_kind"]),
                            text(&a["worker"]),
                            secs(&a["backoff_secs"]),
                            secs(&a["gap_secs"]),
                            if a["status"] == "delayed" { text(&a["not_before"]) } else { text(&a["finished"]) },
                        ]
                    })
                    .collect();
                output::table(
                    &["attempt", "id", "status", "reason", "failure", "worker", "backoff", "gap", "finished / next at"],
                    &rows,
                )
            });
            Ok(0)
        }
        Command::Execution(ExecutionCommand::List { status, action, limit, offset }) => {
            let mut query = vec![("limit", limit.to_string()), ("offset", offset.to_string())];
            if let Some(status) = status {
                query.push(("status", status));
            }
            if let Some(action) = action {
                query.push(("action_ref", action));
            }
            let page = client.get("/api/v1/executions", &query).await?;
            print(out, &page, |page| {
                let rows: Vec<Vec<String>> = page["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| {
                        vec![
                            text(&e["id"]),
                            text(&e["action_ref"]),
                            // a failure retried already is handled: where its chain went on
                            match e["retried_by"].as_i64() {
                                Some(retry) => format!("{} → {retry}", text(&e["status"])),
                                None => text(&e["status"]),
                            },
                            text(&e["worker"]),
                            text(&e["retry_count"]),
                            text(&e["failure_kind"]),
                            text(&e["created"]),
                        ]
                    })
                    .collect();
                format!(
                    "{}\n({} of {}{})",
                    output::table(&["id", "action", "status", "worker", "retry", "failure", "created"], &rows),
                    rows.len(),
                    text(&page["total"]),
                    if page["total_exact"] == false { "+" } else { "" }
                )
            });
            Ok(0)
        }
        Command::Execution(ExecutionCommand::Bulk {
            action,
            status,
            action_ref,
            failure_kind,
            created_after,
            created_before,
            chain_root,
            limit,
            dry_run,
        }) => {
            let filter = json!({
                "status": status, "action_ref": action_ref, "failure_kind": failure_kind,
                "created_after": created_after, "created_before": created_before, "chain_root": chain_root,
            });
            // (only the conditions given)
            let filter: Map<String, Value> = filter
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let Some(reason) = cli.reason.clone() else { bail!("a bulk action needs --reason: say why") };
            let body =
                json!({"action": action, "filter": filter, "dry_run": dry_run, "limit": limit, "reason": reason});
            let outcome = client.post("/api/v1/executions/bulk", &body).await?;
            print(out, &outcome, |o| {
                let ids = |list: &Value, field: &str| -> String {
                    let shown: Vec<String> = list.as_array().into_iter().flatten().map(|x| text(&x[field])).collect();
                    if shown.is_empty() { "-".into() } else { shown.join(" ") }
                };
                let selected: Vec<String> = o["selected"].as_array().into_iter().flatten().map(text).collect();
                let mut lines = vec![
                    format!(
                        "{} {} selected{}: {}",
                        if o["dry_run"] == true { "dry run:" } else { "" },
                        selected.len(),
                        if o["more"] == true { " (more match: run again for the rest)" } else { "" },
                        if selected.is_empty() { "-".into() } else { selected.join(" ") }
                    )
                    .trim_start()
                    .to_string(),
                ];
                if o["dry_run"] != true {
                    lines.push(format!("done: {}", ids(&o["done"], "execution_id")));
                    let skipped: Vec<String> = o["skipped"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|s| format!("{} ({})", text(&s["id"]), text(&s["code"])))
                        .collect();
                    lines
                        .push(format!("skipped: {}", if skipped.is_empty() { "-".into() } else { skipped.join(", ") }));
                }
                lines.join("\n")
            });
            Ok(0)
        }
        Command::Run { action_ref, params, wait, wait_timeout, idempotency_key } => {
            let action = client.get(&format!("/api/v1/actions/{action_ref}"), &[]).await?;
            let parameters = parse_params(&action["parameters"], &params)?;
            let body = json!({"action_ref": action_ref, "parameters": parameters});
            let execution = submit(&client, &body, idempotency_key).await?;
            finish(&client, out, execution, wait, wait_timeout).await
        }
    }
}

async fn schedule(
    client: &Client,
    out: Output,
    command: ScheduleCommand,
    reason: Option<String>,
) -> anyhow::Result<i32> {
    let path = |name: &str, what: &str| format!("/api/v1/schedules/{}{what}", encode(name));
    let schedule = match command {
        ScheduleCommand::Create(spec) => {
            let body = schedule_body(client, spec, reason).await?;
            client.request(reqwest::Method::POST, "/api/v1/schedules", &[], Some(&body)).await?
        }
        ScheduleCommand::Edit(spec) => {
            let name = spec.name.clone();
            let body = schedule_body(client, spec, reason).await?;
            client.request(reqwest::Method::PUT, &path(&name, ""), &[], Some(&body)).await?
        }
        ScheduleCommand::Run { name, wait, wait_timeout } => {
            let made = client.request(reqwest::Method::POST, &path(&name, "/run"), &[], None::<&()>).await?;
            return finish(client, out, made, wait, wait_timeout).await;
        }
        ScheduleCommand::List => {
            // every page: the API answers at most 1,000 a call
            let mut all = Vec::new();
            loop {
                let mut query = vec![("limit", "1000".to_string())];
                if let Some(last) = all.last().and_then(|s: &Value| s["name"].as_str()) {
                    query.push(("after", last.to_string()));
                }
                let page = client.get("/api/v1/schedules", &query).await?;
                let page = page.as_array().cloned().unwrap_or_default();
                let done = page.is_empty();
                all.extend(page);
                if done {
                    break;
                }
            }
            let schedules = Value::Array(all);
            print(out, &schedules, |list| {
                let rows: Vec<Vec<String>> = list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| {
                        vec![
                            text(&s["name"]),
                            text(&s["action_ref"]),
                            when(s),
                            if s["paused"] == true { "paused".into() } else { text(&s["next_run"]) },
                            text(&s["last_run"]),
                            text(&s["last_execution"]),
                        ]
                    })
                    .collect();
                output::table(&["NAME", "ACTION", "WHEN", "NEXT", "LAST", "LAST EXECUTION"], &rows)
            });
            return Ok(0);
        }
        ScheduleCommand::Get { name } => client.get(&path(&name, ""), &[]).await?,
        ScheduleCommand::Pause { name } => {
            client.request(reqwest::Method::POST, &path(&name, "/pause"), &[], None::<&()>).await?
        }
        ScheduleCommand::Resume { name } => {
            client.request(reqwest::Method::POST, &path(&name, "/resume"), &[], None::<&()>).await?
        }
        ScheduleCommand::Delete { name } => {
            let deleted = client.request(reqwest::Method::DELETE, &path(&name, ""), &[], None::<&()>).await?;
            // (what was deleted, said as a deletion: not the line a made schedule gets)
            print(out, &deleted, |s| {
                format!(
                    "schedule {} deleted (it ran {}; its executions keep its id)",
                    text(&s["name"]),
                    text(&s["action_ref"])
                )
            });
            return Ok(0);
        }
    };
    print(out, &schedule, |s| {
        let next = if s["paused"] == true { "paused".to_string() } else { format!("next {}", text(&s["next_run"])) };
        format!("schedule {} runs {} {}: {next}", text(&s["name"]), text(&s["action_ref"]), when(s))
    });
    Ok(0)
}

/// A schedule's timing, as a person reads it.
fn when(schedule: &Value) -> String {
    match schedule["cron"].as_str() {
        Some(cron) => format!("'{cron}' ({})", text(&schedule["timezone"])),
        None => format!("at {}", text(&schedule["at"])),
    }
}

/// Prints a submitted execution, or waits for it and prints how it ended (exit 0 only if it
/// completed).
/// How often `attune run` sends its submission, and the waits between.
const SUBMISSION_RETRIES: [Duration; 3] = [Duration::from_millis(500), Duration::from_secs(1), Duration::from_secs(2)];

/// Submits `body` with an idempotency key (the one given, else one made for this command): a
/// submission whose answer never came (the connection broke, the API restarted, a 503) may have
/// been written, and is sent again with the same key, which gives the written execution back
/// rather than make a second one. Once it gives up, the error names the key to run again with.
async fn submit(client: &Client, body: &Value, key: Option<String>) -> anyhow::Result<Value> {
    let key = key.unwrap_or_else(|| format!("cli-{:032x}", rand::random::<u128>()));
    let headers = [("Idempotency-Key", key.clone())];
    let mut waits = SUBMISSION_RETRIES.iter();
    loop {
        let sent =
            client.request_with_headers(reqwest::Method::POST, "/api/v1/executions", &[], &headers, Some(body)).await;
        match sent {
            Err(e) if crate::client::unanswered(&e) => match waits.next() {
                Some(wait) => {
                    eprintln!("attune: no answer to the submission ({e:#}); sending it again with the same key");
                    tokio::time::sleep(*wait).await;
                }
                None => {
                    return Err(e.context(format!(
                        "the submission may have been written: run the command again with --idempotency-key {key} \
                         to get it back rather than make another"
                    )));
                }
            },
            other => return other,
        }
    }
}

async fn finish(client: &Client, out: Output, execution: Value, wait: bool, wait_timeout: u64) -> anyhow::Result<i32> {
    if !wait {
        print(out, &execution, |e| format!("execution {} {}", text(&e["id"]), text(&e["status"])));
        return Ok(0);
    }
    let id = execution["id"].as_i64().context("the API returned an execution without an id")?;
    let finished = wait_for(client, id, Duration::from_secs(wait_timeout)).await?;
    print(out, &finished, output::execution);
    Ok(if finished["status"] == "completed" { 0 } else { 2 })
}

/// Follows the retry chain of `id`: one line per attempt state change (or, with `--output json`,
/// the final chain), until its last attempt ends with no retry to come. Exit 0 if it completed.
async fn watch(client: &Client, out: Output, id: i64, timeout: Duration) -> anyhow::Result<i32> {
    let started = Instant::now();
    let mut seen: Vec<(i64, String)> = Vec::new();
    loop {
        let chain = whole_chain(client, id, "summary").await?;
        let attempts = chain["attempts"].as_array().cloned().unwrap_or_default();
        for attempt in &attempts {
            let state = (attempt["id"].as_i64().unwrap_or_default(), text(&attempt["status"]));
            if !seen.contains(&state) && out == Output::Table {
                let mut line =
                    format!("attempt {} (execution {}): {}", text(&attempt["retry_count"]), state.0, state.1);
                if state.1 == "delayed" {
                    line.push_str(&format!(", next attempt at {}", text(&attempt["not_before"])));
                }
                if let Some(kind) = attempt["failure_kind"].as_str() {
                    line.push_str(&format!(" ({kind})"));
                }
                attune_cli::say!("{line}");
            }
            if !seen.contains(&state) {
                seen.push(state);
            }
        }
        let Some(last) = attempts.last() else { bail!("execution {id} has no chain") };
        let status = last["status"].as_str().unwrap_or("unknown");
        if matches!(status, "completed" | "failed" | "timeout" | "canceled" | "abandoned") {
            let view = client.get(&format!("/api/v1/executions/{}", text(&last["id"])), &[]).await?;
            if view["retried_by"].is_null() {
                if out == Output::Json {
                    let chain = whole_chain(client, id, "full").await?;
                    attune_cli::say!("{}", serde_json::to_string_pretty(&chain)?);
                }
                return Ok(if status == "completed" { 0 } else { 2 });
            }
        }
        if started.elapsed() > timeout {
            bail!("the chain of execution {id} had not ended after {}s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The retry chain of `id`, every attempt of it (`fields`: `summary` or `full`): an answer of the
/// chain API holds what its byte budget allows and says where the rest start (`next_offset`), so
/// the pages are read until the last and returned as one answer.
async fn whole_chain(client: &Client, id: i64, fields: &str) -> anyhow::Result<Value> {
    let path = format!("/api/v1/executions/{id}/chain");
    let mut chain = client.get(&path, &[("fields", fields.to_string())]).await?;
    while let Some(next) = chain["next_offset"].as_i64() {
        let page = client.get(&path, &[("fields", fields.to_string()), ("offset", next.to_string())]).await?;
        let more = page["attempts"].as_array().cloned().unwrap_or_default();
        if more.is_empty() {
            break;
        }
        if let Some(attempts) = chain["attempts"].as_array_mut() {
            attempts.extend(more);
        }
        chain["next_offset"] = page["next_offset"].clone();
    }
    chain["next_offset"] = Value::Null;
    chain["truncated"] = Value::Bool(false);
    Ok(chain)
}

/// `key=value` pairs typed by the action's declared parameters: strings stay as written, other
/// types are parsed as JSON (`count=3`, `verbose=true`, `tags=["a","b"]`).
pub fn parse_params(declared: &Value, pairs: &[String]) -> anyhow::Result<Map<String, Value>> {
    let mut parameters = Map::new();
    for pair in pairs {
        let Some((key, raw)) = pair.split_once('=') else {
            bail!("parameter '{pair}' is not key=value");
        };
        let value = match declared[key]["type"].as_str() {
            Some("string") | None => Value::String(raw.to_string()),
            Some(kind) => serde_json::from_str(raw)
                .with_context(|| format!("parameter '{key}': '{raw}' is not a valid {kind}"))?,
        };
        parameters.insert(key.to_string(), value);
    }
    Ok(parameters)
}

/// Waits for execution `id` to end, following its automatic retries: returns the last attempt
/// of its chain once it has ended with no retry to come.
async fn wait_for(client: &Client, id: i64, timeout: Duration) -> anyhow::Result<Value> {
    const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
    let interactive = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut frame = 0;
    let mut current = id;
    let mut told: Option<String> = None;
    loop {
        let execution = client.get(&format!("/api/v1/executions/{current}"), &[]).await?;
        let status = execution["status"].as_str().unwrap_or("unknown");
        // (a script's log hears once what holds it, each time that changes; the short waits of
        // a line and a claim are not worth a line)
        let holding = execution["waiting"]["reason"].as_str().filter(|r| !matches!(*r, "queued" | "scheduling"));
        if !interactive && holding.map(str::to_string) != told {
            if let (Some(_), Some(why)) = (holding, output::waiting(&execution)) {
                eprintln!("execution {current} waits: {why}");
            }
            told = holding.map(str::to_string);
        }
        let terminal = matches!(status, "completed" | "failed" | "timeout" | "canceled" | "abandoned");
        if terminal && let Some(retry) = execution["retried_by"].as_i64() {
            if !interactive {
                eprintln!(
                    "execution {current} {status} ({}); retrying as execution {retry}",
                    text(&execution["failure_kind"])
                );
            }
            current = retry;
            continue;
        }
        if terminal {
            if interactive {
                eprint!("\r\x1b[2K");
            }
            return Ok(execution);
        }
        if started.elapsed() > timeout {
            match output::waiting(&execution) {
                Some(why) => bail!("execution {current} is still {status} after {}s: {why}", timeout.as_secs()),
                None => bail!("execution {current} is still {status} after {}s", timeout.as_secs()),
            }
        }
        if interactive {
            let attempt = execution["retry_count"].as_i64().unwrap_or(0);
            let detail = match (status, execution["not_before"].as_str(), output::waiting(&execution)) {
                ("delayed", Some(at), _) => format!("retry {attempt} waits until {at}"),
                (_, _, Some(why)) if attempt > 0 => format!("retry {attempt} {status}: {why}"),
                (_, _, Some(why)) => format!("{status}: {why}"),
                _ if attempt > 0 => format!("retry {attempt} {status}"),
                _ => status.to_string(),
            };
            eprint!(
                "\r\x1b[2K{} execution {current} {detail} ({:.1}s)",
                FRAMES[frame % FRAMES.len()],
                started.elapsed().as_secs_f64()
            );
            let _ = std::io::stderr().flush();
            frame += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `text` as one path segment: every byte but letters, digits and `-._~` percent-encoded.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A listed secret's users, comma-separated.
fn users_of(secret: &Value) -> String {
    let users: Vec<String> = secret["users"].as_array().map(|u| u.iter().map(text).collect()).unwrap_or_default();
    users.join(",")
}

async fn set_rule_enabled(client: &Client, out: Output, rule: &str, enabled: bool) -> anyhow::Result<i32> {
    let set = client.put(&format!("/api/v1/rules/{rule}/enabled"), &json!({"enabled": enabled})).await?;
    print(out, &set, |r| format!("rule {}: {}", text(&r["ref"]), if enabled { "enabled" } else { "disabled" }));
    Ok(0)
}

/// The body of `POST /schedules` (and `PUT /schedules/{name}`) for `spec`, its parameters typed
/// by the action's declarations.
async fn schedule_body(client: &Client, spec: crate::ScheduleSpec, reason: Option<String>) -> anyhow::Result<Value> {
    let crate::ScheduleSpec { name, action_ref, params, cron, timezone, at, catch_up, paused } = spec;
    let action = client.get(&format!("/api/v1/actions/{}", encode(&action_ref)), &[]).await?;
    let parameters = parse_params(&action["parameters"], &params)?;
    Ok(json!({"name": name, "action_ref": action_ref, "parameters": parameters, "cron": cron,
        "timezone": timezone, "at": at, "catch_up": catch_up, "paused": paused, "reason": reason}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_typed_by_their_declaration() {
        let declared =
            json!({"message": {"type": "string"}, "count": {"type": "integer"}, "flag": {"type": "boolean"}});
        let pairs = ["message=42".to_string(), "count=3".into(), "flag=true".into(), "extra=a=b".into()];
        let parsed = parse_params(&declared, &pairs).unwrap();
        assert_eq!(Value::Object(parsed), json!({"message": "42", "count": 3, "flag": true, "extra": "a=b"}));
        assert!(parse_params(&declared, &["count=three".into()]).unwrap_err().to_string().contains("count"));
        assert!(parse_params(&declared, &["novalue".into()]).is_err());
    }
}
