//! The `attune` command as scripts use it: token creation, `run --wait` exit codes, JSON output.

use std::process::Command;

use attune_testkit::System;
use serde_json::Value;

fn attune(system: &System, args: &[&str]) -> std::process::Output {
    Command::new(attune_testkit::workspace_binary("attune"))
        .args(args)
        .env("ATTUNE_API_URL", &system.api_url)
        .env("ATTUNE_TOKEN", &system.token)
        .env("DATABASE_URL", &system.db.url)
        .output()
        .expect("run attune")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_can_rely_on_token_run_and_exit_codes() {
    let system = System::builder().worker("w1", &[]).start().await;

    // `attune token create` has no default role: it asks for one
    let out = attune(&system, &["token", "create", "--name", "ci"]);
    let told = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(2) && told.contains("--role"), "{out:?}");
    // it prints the token alone, and it works against the API.
    let out = attune(&system, &["token", "create", "--name", "ci", "--role", "read"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let token = stdout.strip_suffix('\n').expect("one line");
    assert!(token.starts_with("attune_") && !token.contains(char::is_whitespace), "{stdout:?}");
    let (status, _) = system.request(reqwest::Method::GET, "/api/v1/workers", None, Some(token)).await;
    assert_eq!(status, 200);

    // run --wait --output json: only JSON on stdout, exit 0 for completed, 2 for failed.
    let out =
        attune(&system, &["run", "core.echo", "message=42", "--wait", "--output", "json", "--reason", "nightly check"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let execution: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!((execution["status"].as_str(), execution["stdout"].as_str()), (Some("completed"), Some("42\n")));

    // the audit trail has who asked and why: the submission through the API, the token made
    // past it (by the user running the command)
    let target = format!("execution:{}", execution["id"]);
    let out = attune(&system, &["audit", "list", "--target", &target, "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let page: Value = serde_json::from_slice(&out.stdout).unwrap();
    let submitted = &page["events"][0];
    assert_eq!(
        (submitted["route"].as_str(), submitted["reason"].as_str()),
        (Some("/api/v1/executions"), Some("nightly check"))
    );
    assert_eq!(submitted["status"], 201);
    let out = attune(&system, &["token", "revoke", "ci", "--reason", "rotated"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = attune(&system, &["audit", "list", "--route", "token revoke", "--output", "json"]);
    let page: Value = serde_json::from_slice(&out.stdout).unwrap();
    let revoked = &page["events"][0];
    assert!(revoked["actor"].as_str().is_some_and(|actor| actor.starts_with("cli:")), "{revoked}");
    assert_eq!((revoked["reason"].as_str(), revoked["status"].as_i64()), (Some("rotated"), Some(0)));
    let out = attune(&system, &["audit", "list", "--route", "token create"]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.starts_with("ID") && table.contains("cli:") && table.contains("token:"), "{table}");

    let out = attune(&system, &["run", "core.fail", "exit_code=4", "--wait", "--output", "json"]);
    assert_eq!(out.status.code(), Some(2));
    let execution: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(execution["exit_code"], 4);

    // A bad parameter is an error naming it, exit 1.
    let out = attune(&system, &["run", "core.echo", "colour=red", "--wait"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("colour"), "{}", String::from_utf8_lossy(&out.stderr));

    // Tables for people.
    let out = attune(&system, &["worker", "list"]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.starts_with("ID") && table.contains("w1") && table.contains("healthy"), "{table}");
    let out = attune(&system, &["execution", "list", "--status", "failed", "--output", "json"]);
    let page: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(page["total"], 1);

    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_a_retry_chain_and_the_config_file_supplies_address_and_token() {
    let system = System::builder()
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.3")
        .worker("w1", &[])
        .pack(attune_testkit::system::repo_root().join("testkit/packs/e2e"))
        .start()
        .await;
    let dir = std::env::temp_dir().join(format!("attune-cli-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.json");
    std::fs::write(&config, serde_json::json!({"api_url": system.api_url, "token": system.token}).to_string()).unwrap();
    let attune_with_config = |args: &[&str]| {
        Command::new(attune_testkit::workspace_binary("attune"))
            .args(args)
            .env_remove("ATTUNE_API_URL")
            .env_remove("ATTUNE_TOKEN")
            .env("ATTUNE_CONFIG", &config)
            .output()
            .unwrap()
    };

    let first = system.submit("e2e.flaky", serde_json::json!({"fail_times": 2})).await;
    let id = first["id"].as_i64().unwrap().to_string();
    let out = attune_with_config(&["execution", "watch", &id]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}{}", String::from_utf8_lossy(&out.stderr));
    for expected in ["attempt 0", "attempt 1", "attempt 2", "completed", "(transient_error)"] {
        assert!(shown.contains(expected), "{expected:?} missing from:\n{shown}");
    }
    let out = attune_with_config(&["execution", "chain", &id, "--output", "json"]);
    let chain: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(chain["attempts"].as_array().unwrap().len(), 3);

    // a broken config file is an error naming the file
    std::fs::write(&config, "{\"api_url\": 5}").unwrap();
    let out = attune_with_config(&["worker", "list"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("config.json"));
    std::fs::remove_dir_all(&dir).unwrap();
    system.stop().await;
}

#[test]
fn every_binary_s_help_lists_its_settings_from_the_one_table() {
    use attune_common::settings::{Process, SETTINGS};
    for (binary, process) in [
        ("attune-api", Process::Api),
        ("attune-executor", Process::Executor),
        ("attune-worker", Process::Worker),
        ("attune", Process::Cli),
        ("attune-bench", Process::Bench),
    ] {
        let out = Command::new(attune_testkit::workspace_binary(binary)).arg("--help").output().unwrap();
        assert!(out.status.success(), "{binary} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        for setting in SETTINGS {
            assert_eq!(
                help.contains(&format!("  {} [default: ", setting.name)),
                setting.read_by.contains(&process),
                "{binary} --help and {}: {help}",
                setting.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_says_why_an_execution_was_or_was_not_retried() {
    let system = System::builder().env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "0.2").worker("w1", &[]).start().await;
    let flaky = system.submit("core.flaky", serde_json::json!({"fail_times": 1})).await;
    let first = flaky["id"].as_i64().unwrap();
    let chain = system.wait_chain(first, std::time::Duration::from_secs(60)).await;
    assert_eq!(chain.len(), 2, "{chain:#?}");
    // the chain API carries each attempt's recorded decision
    assert_eq!(chain[0]["retry_decision"]["rule"], "retried", "{chain:#?}");
    assert_eq!(chain[0]["retry_decision"]["policy"]["retry_on"][3], "transient_error", "{chain:#?}");
    assert_eq!(chain[1]["retry_decision"], Value::Null, "the completed retry needed no decision");

    let out = attune(&system, &["execution", "explain", &first.to_string()]);
    let told = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(told.contains("failed (transient_error)") && told.contains("decision: retried (rule: retried)"), "{told}");
    assert!(told.contains(&format!("retried by: execution {}", chain[1]["id"])), "{told}");

    let failed = system.submit("core.fail", serde_json::json!({})).await;
    let id = failed["id"].as_i64().unwrap();
    system.wait_chain(id, std::time::Duration::from_secs(60)).await;
    let out = attune(&system, &["execution", "explain", &id.to_string(), "--output", "json"]);
    let view: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(view["retry_decision"]["rule"], "kind_not_retried", "{view}");
    let out = attune(&system, &["execution", "explain", &id.to_string()]);
    let told = String::from_utf8_lossy(&out.stdout);
    assert!(told.contains("not retried (rule: kind_not_retried)") && told.contains("'action_failed'"), "{told}");
    system.stop().await;
}

/// Issue 46 (review R12): `attune run` whose answer is lost on the way (the API wrote the
/// execution; the connection broke before its answer came back) sends the submission again with
/// the same idempotency key, which it makes itself when none is given: the execution it reports
/// is the one that was written, and no second one is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sends_again_with_its_own_idempotency_key_when_the_answer_is_lost() {
    let system = System::builder().worker("w1", &[]).start().await;
    let proxy = attune_testkit::tcpcut::TcpCut::start(system.api_url.trim_start_matches("http://")).await;
    proxy.lose_answer_to(b"POST /api/v1/executions");
    let out = Command::new(attune_testkit::workspace_binary("attune"))
        .args(["run", "core.echo", "message=once", "--wait", "--output", "json"])
        .env("ATTUNE_API_URL", proxy.url(&system.api_url))
        .env("ATTUNE_TOKEN", &system.token)
        .output()
        .expect("run attune");
    assert!(proxy.answer_lost(), "the first answer was lost");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let told: Value = serde_json::from_slice(&out.stdout).unwrap();
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM execution").fetch_one(&system.db.pool).await.unwrap();
    assert_eq!(count, 1, "one submission, one execution");
    let id: i64 = sqlx::query_scalar("SELECT id FROM execution").fetch_one(&system.db.pool).await.unwrap();
    assert_eq!(told["id"].as_i64(), Some(id), "{told}");
    assert_eq!(told["status"], "completed", "{told}");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_goes_away_ends_the_output_quietly() {
    let system = System::builder().start().await;
    for n in 0..3 {
        system.post("/api/v1/executions", &serde_json::json!({"action_ref": "core.noop", "parameters": {}})).await;
        let _ = n;
    }
    // `attune execution list | head -0`: the reader is gone before anything is written
    let mut child = Command::new(attune_testkit::workspace_binary("attune"))
        .args(["execution", "list"])
        .env("ATTUNE_API_URL", &system.api_url)
        .env("ATTUNE_TOKEN", &system.token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(!said.contains("panicked"), "{said}");

    // what is registered, listed
    let packs = attune(&system, &["pack", "list"]);
    let packs = String::from_utf8_lossy(&packs.stdout);
    assert!(packs.starts_with("PACK") && packs.lines().any(|l| l.starts_with("core ")), "{packs}");
    let actions = attune(&system, &["action", "list", "--pack", "core"]);
    let actions = String::from_utf8_lossy(&actions.stdout);
    assert!(actions.lines().any(|l| l.starts_with("core.echo ") && l.contains("shell")), "{actions}");
    assert!(actions.lines().skip(1).all(|l| l.starts_with("core.")), "{actions}");
    let echo = attune(&system, &["action", "get", "core.echo"]);
    let echo: Value = serde_json::from_slice(&echo.stdout).unwrap();
    assert_eq!(echo["ref"], "core.echo", "{echo}");
    system.stop().await;
}

const GREET: &str = "name: greet\nruntime: shell\nentrypoint: actions/greet.sh\nparameters:\n  host:\n    type: string\n    required: true\n  greeting:\n    type: string\n    default: hello\n  token:\n    type: string\n    secret: true\n";
const GREET_SH: &str = "#!/bin/sh\n[ \"$ATTUNE_PARAM_HOST\" = bad ] && exit 3\necho \"{\\\"said\\\": \\\"$ATTUNE_PARAM_GREETING $ATTUNE_PARAM_HOST\\\", \\\"token_length\\\": ${#ATTUNE_PARAM_TOKEN}}\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_key_value_changes_only_those_parameters() {
    let pack = attune_testkit::TempPack::new("cli_retry", &[("greet.yaml", GREET), ("greet.sh", GREET_SH)]);
    let system = System::builder().pack(pack.path()).secrets_key().worker("w1", &[]).start().await;
    let made = system
        .submit("cli_retry.greet", serde_json::json!({"host": "bad", "greeting": "hi", "token": "s3cret-value"}))
        .await;
    let failed = system.wait_terminal(made["id"].as_i64().unwrap(), std::time::Duration::from_secs(30)).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let out =
        attune(&system, &["--output", "json", "execution", "retry", &failed["id"].to_string(), "host=good", "--wait"]);
    assert!(out.status.success(), "{} {}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let retry: Value = serde_json::from_slice(&out.stdout).unwrap();
    // the greeting stays "hi" (not its default), the sealed token stays sealed and reaches the run
    assert_eq!(retry["result"], serde_json::json!({"said": "hi good", "token_length": 12}), "{retry}");
    assert_eq!(retry["parameters"]["token"], "[redacted]", "{retry}");
    // a failure that was retried is told from an open one in lists
    let (_, page) = system.get("/api/v1/executions?status=failed").await;
    let listed = page["items"].as_array().unwrap().iter().find(|e| e["id"] == failed["id"]).cloned().unwrap();
    assert_eq!(listed["retried_by"], retry["id"], "{listed}");
    let out = attune(&system, &["execution", "list", "--status", "failed"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains(&format!("failed → {}", retry["id"])), "{table}");
    system.stop().await;
}

const TALK: &str = "name: talk\nruntime: shell\nentrypoint: actions/talk.sh\ntimeout_seconds: 120\nparameters:\n  mark:\n    type: string\n    required: true\n";
const TALK_SH: &str =
    "#!/bin/sh\necho \"started on $ATTUNE_PARAM_MARK\"\necho 'a warning' >&2\ntouch \"$ATTUNE_PARAM_MARK\"\nsleep 60\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_canceled_or_failed_by_hand_keeps_its_output_and_the_reason() {
    let pack = attune_testkit::TempPack::new("cli_talk", &[("talk.yaml", TALK), ("talk.sh", TALK_SH)]);
    let system = System::builder().pack(pack.path()).worker("w1", &[]).start().await;
    for (verb, reason) in [("cancel", "wrong host"), ("fail", "stuck on a lock")] {
        let mark = std::env::temp_dir().join(format!("attune-talk-{verb}-{:x}", rand::random::<u64>()));
        let made = system.submit("cli_talk.talk", serde_json::json!({"mark": mark.to_str().unwrap()})).await;
        let id = made["id"].as_i64().unwrap().to_string();
        attune_testkit::wait_for("the run to have printed", std::time::Duration::from_secs(30), || async {
            mark.exists().then_some(())
        })
        .await;
        let args: Vec<&str> = match verb {
            "cancel" => vec!["--reason", reason, "execution", "cancel", &id],
            _ => vec!["execution", "fail", &id, "--reason", reason],
        };
        let out = attune(&system, &args);
        assert!(out.status.success(), "{verb}: {}", String::from_utf8_lossy(&out.stderr));
        let kept =
            attune_testkit::wait_for("the stopped run's output kept", std::time::Duration::from_secs(30), || {
                let id = id.clone();
                let system = &system;
                async move {
                    let (_, execution) = system.get(&format!("/api/v1/executions/{id}")).await;
                    execution["stdout"].is_string().then_some(execution)
                }
            })
            .await;
        assert_eq!(kept["stdout"].as_str().unwrap().trim(), format!("started on {}", mark.display()), "{kept}");
        assert_eq!(kept["stderr"].as_str().unwrap().trim(), "a warning", "{kept}");
        assert!(kept["error"].as_str().unwrap().contains(reason), "{verb}: {kept}");
        assert_eq!(kept["status"], if verb == "cancel" { "canceled" } else { "failed" }, "{kept}");
        let _ = std::fs::remove_file(&mark);
    }
    system.stop().await;
}
