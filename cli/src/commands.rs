//! The commands. Each prints JSON only with `--output json`; exit status 0 means the command
//! (and, with `--wait`, the execution) succeeded. `dispatch` calls the function of each: those
//! that talk to the API are in `cmd`, one file per thing they act on; those that talk to the
//! database directly have modules of their own (`tokens`, `worker_logins`, `reseal`, `up`).

use std::time::Duration;

use crate::client::Client;
use crate::cmd::{action, audit, chain, event, execution, pack, pause, run, schedule, secret, worker, workflow};
use crate::{
    ActionCommand, AuditCommand, Cli, Command, EventCommand, ExecutionCommand, Output, PackCommand, RuleCommand,
    ScheduleCommand, SecretCommand, WebhookCommand, WorkerCommand, WorkflowCommand,
};

pub async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let config = crate::ConfigFile::load()?;
    let api_url = match cli.api_url.clone().or(config.api_url) {
        Some(url) => url,
        None => attune_common::settings::get("ATTUNE_API_URL")?,
    };
    let token = cli.token.clone().or(config.token);
    let client = &Client::new(&api_url, token).with_reason(cli.reason.clone());
    let (out, reason) = (cli.output, cli.reason);
    match cli.command {
        Command::Migrate => crate::up::migrate(out).await.map(|()| 0),
        Command::Up { workers } => crate::up::run(workers).await.map(|()| 0),
        Command::Token(command) => crate::tokens::run(command, out, reason.as_deref()).await,
        Command::WorkerLogin(command) => crate::worker_logins::run(command, out).await,
        Command::Secret(SecretCommand::Reseal) => crate::reseal::run(out, reason.as_deref()).await,

        Command::Run { action_ref, params, wait, wait_timeout, idempotency_key } => {
            run::run(client, out, &action_ref, &params, wait, wait_timeout, idempotency_key).await
        }
        Command::Execution(command) => match command {
            ExecutionCommand::Get { id } => execution::get(client, out, id).await,
            ExecutionCommand::Retry { id, params, wait, wait_timeout } => {
                execution::retry(client, out, id, &params, wait, wait_timeout).await
            }
            ExecutionCommand::Cancel { id } => execution::cancel(client, out, id).await,
            ExecutionCommand::Fail { id, reason } => execution::fail(client, out, id, &reason).await,
            ExecutionCommand::Watch { id, wait_timeout } => {
                chain::watch(client, out, id, Duration::from_secs(wait_timeout)).await
            }
            ExecutionCommand::Chain { id } => chain::chain(client, out, id).await,
            ExecutionCommand::Tail { id, raw } => attune_cli::tail::tail(client, id, out == Output::Json, raw).await,
            ExecutionCommand::Explain { id } => execution::explain(client, out, id).await,
            ExecutionCommand::List { status, action, limit, offset } => {
                execution::list(client, out, status, action, limit, offset).await
            }
            ExecutionCommand::Bulk(args) => execution::bulk(client, out, args, reason).await,
        },
        Command::Workflow(WorkflowCommand::Get { id }) => workflow::get(client, out, id).await,
        Command::Workflow(WorkflowCommand::Tree { id, step, all }) => workflow::tree(client, out, id, step, all).await,
        Command::Schedule(command) => match command {
            ScheduleCommand::Create(spec) => schedule::create(client, out, spec, reason).await,
            ScheduleCommand::Edit(spec) => schedule::edit(client, out, spec, reason).await,
            ScheduleCommand::Run { name, wait, wait_timeout } => {
                schedule::run(client, out, &name, wait, wait_timeout).await
            }
            ScheduleCommand::List => schedule::list(client, out).await,
            ScheduleCommand::Get { name } => schedule::get(client, out, &name).await,
            ScheduleCommand::Pause { name } => schedule::set_paused(client, out, &name, "/pause").await,
            ScheduleCommand::Resume { name } => schedule::set_paused(client, out, &name, "/resume").await,
            ScheduleCommand::Delete { name } => schedule::delete(client, out, &name).await,
        },

        Command::Pack(PackCommand::List) => pack::list(client, out).await,
        Command::Pack(PackCommand::Register { path, force }) => pack::register(client, out, &path, force).await,
        Command::Action(ActionCommand::List { pack }) => action::list(client, out, pack).await,
        Command::Action(ActionCommand::Get { action_ref }) => action::get(client, out, &action_ref).await,
        Command::Concurrency { action_ref, limit, key, no_limit, clear } => {
            let policy = action::Policy::asked(limit, key, no_limit, clear, reason)?;
            action::concurrency(client, out, &action_ref, policy).await
        }
        Command::Secret(SecretCommand::Set { name, users }) => secret::set(client, out, &name, users).await,
        Command::Secret(SecretCommand::List) => secret::list(client, out).await,
        Command::Secret(SecretCommand::Delete { name }) => secret::delete(client, out, &name).await,

        Command::Worker(WorkerCommand::List) => worker::list(client, out).await,
        Command::Worker(WorkerCommand::Drain { name }) => worker::drain(client, out, &name).await,
        Command::Worker(WorkerCommand::Undrain { name }) => worker::undrain(client, out, &name).await,
        Command::Config => worker::config(client, out).await,
        Command::Pause { kind, name } => pause::pause(client, out, &kind, &name, reason).await,
        Command::Resume { kind, name } => pause::resume(client, out, &kind, &name).await,
        Command::Pauses => pause::list(client, out).await,
        Command::Audit(AuditCommand::List { actor, route, target, since, limit }) => {
            audit::list(client, out, audit::Filter { actor, route, target, since, limit }).await
        }

        Command::Webhook(WebhookCommand::List) => event::list_webhooks(client, out).await,
        Command::Webhook(WebhookCommand::Credential { name, value_stdin }) => {
            event::set_credential(client, out, &name, value_stdin).await
        }
        Command::Rule(RuleCommand::List) => event::list_rules(client, out).await,
        Command::Rule(RuleCommand::Create { file }) => event::create_rule(client, out, &file).await,
        Command::Rule(RuleCommand::Enable { rule }) => event::set_rule_enabled(client, out, &rule, true).await,
        Command::Rule(RuleCommand::Disable { rule }) => event::set_rule_enabled(client, out, &rule, false).await,
        Command::Rule(RuleCommand::Delete { rule }) => event::delete_rule(client, out, &rule).await,
        Command::Event(EventCommand::List { trigger, limit }) => event::list(client, out, trigger, limit).await,
        Command::Event(EventCommand::Get { id }) => event::get(client, out, id).await,
        Command::Event(EventCommand::Replay { id }) => event::replay(client, out, id).await,
    }
}
