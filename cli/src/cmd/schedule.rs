//! `attune schedule create | edit | run | list | get | pause | resume | delete`: actions run on a
//! schedule (`db::schedule::Schedule`); a schedule's run now is answered as the execution it made.

use attune_cli::client::{Answer, Client};
use attune_cli::output::shown;
use attune_common::db::execution::Execution;
use attune_common::db::schedule::Schedule;
use reqwest::Method;
use serde_json::{Value, json};

use super::run::finish;
use super::{action, encode, print, print_list};
use crate::{Output, ScheduleSpec};

/// `/api/v1/schedules/{name}` and what follows it.
fn path(name: &str, what: &str) -> String {
    format!("/api/v1/schedules/{}{what}", encode(name))
}

/// `attune schedule create NAME REF [key=value ...] (--cron EXPR [--timezone TZ] | --at TIME)`
pub async fn create(client: &Client, out: Output, spec: ScheduleSpec, reason: Option<String>) -> anyhow::Result<i32> {
    let body = body(client, spec, reason).await?;
    let made: Answer<Schedule> = client.post("/api/v1/schedules", &body).await?;
    print(out, &made, |s| told(s));
    Ok(0)
}

/// `attune schedule edit NAME REF ...`: the same arguments as create, all of them.
pub async fn edit(client: &Client, out: Output, spec: ScheduleSpec, reason: Option<String>) -> anyhow::Result<i32> {
    let name = spec.name.clone();
    let body = body(client, spec, reason).await?;
    let changed: Answer<Schedule> = client.put(&path(&name, ""), &body).await?;
    print(out, &changed, |s| told(s));
    Ok(0)
}

/// `attune schedule run NAME [--wait]`: its action now, once, outside its timing.
pub async fn run(client: &Client, out: Output, name: &str, wait: bool, wait_timeout: u64) -> anyhow::Result<i32> {
    let made: Answer<Execution> = client.request(Method::POST, &path(name, "/run"), &[], None::<&()>).await?;
    finish(client, out, made, wait, wait_timeout).await
}

/// `attune schedule list`: every page (the API answers at most 1,000 a call).
pub async fn list(client: &Client, out: Output) -> anyhow::Result<i32> {
    let mut all: Vec<Answer<Schedule>> = Vec::new();
    loop {
        let mut query = vec![("limit", "1000".to_string())];
        query.extend(all.last().map(|last| ("after", last.name.clone())));
        let page: Vec<Answer<Schedule>> = client.get("/api/v1/schedules", &query).await?;
        if page.is_empty() {
            break;
        }
        all.extend(page);
    }
    print_list(out, &all, &["NAME", "ACTION", "WHEN", "NEXT", "LAST", "LAST EXECUTION"], |s| {
        vec![
            s.name.clone(),
            s.action_ref.clone(),
            when(s),
            if s.paused { "paused".into() } else { shown(&s.next_run) },
            shown(&s.last_run),
            shown(&s.last_execution),
        ]
    });
    Ok(0)
}

/// `attune schedule get NAME`
pub async fn get(client: &Client, out: Output, name: &str) -> anyhow::Result<i32> {
    let schedule: Answer<Schedule> = client.get(&path(name, ""), &[]).await?;
    print(out, &schedule, |s| told(s));
    Ok(0)
}

/// `attune schedule pause | resume NAME` (`what`: `/pause` or `/resume`)
pub async fn set_paused(client: &Client, out: Output, name: &str, what: &str) -> anyhow::Result<i32> {
    let schedule: Answer<Schedule> = client.request(Method::POST, &path(name, what), &[], None::<&()>).await?;
    print(out, &schedule, |s| told(s));
    Ok(0)
}

/// `attune schedule delete NAME`: what was deleted, said as a deletion (not the line a made
/// schedule gets).
pub async fn delete(client: &Client, out: Output, name: &str) -> anyhow::Result<i32> {
    let deleted: Answer<Schedule> = client.delete(&path(name, "")).await?;
    print(out, &deleted, |s| {
        format!("schedule {} deleted (it ran {}; its executions keep its id)", s.name, s.action_ref)
    });
    Ok(0)
}

/// A schedule in a line: what it runs, when, and its next run.
fn told(schedule: &Schedule) -> String {
    let next = if schedule.paused { "paused".to_string() } else { format!("next {}", shown(&schedule.next_run)) };
    format!("schedule {} runs {} {}: {next}", schedule.name, schedule.action_ref, when(schedule))
}

/// A schedule's timing, as a person reads it.
fn when(schedule: &Schedule) -> String {
    match &schedule.cron {
        Some(cron) => format!("'{cron}' ({})", schedule.timezone),
        None => format!("at {}", shown(&schedule.at)),
    }
}

/// The body of `POST /schedules` (and `PUT /schedules/{name}`) for `spec`, its parameters typed
/// by the action's declarations.
async fn body(client: &Client, spec: ScheduleSpec, reason: Option<String>) -> anyhow::Result<Value> {
    let ScheduleSpec { name, action_ref, params, cron, timezone, at, catch_up, paused } = spec;
    let action = action::get_action(client, &action_ref).await?;
    let parameters = action::parse_params(&action.parameters, &params)?;
    Ok(json!({"name": name, "action_ref": action_ref, "parameters": parameters, "cron": cron,
        "timezone": timezone, "at": at, "catch_up": catch_up, "paused": paused, "reason": reason}))
}
