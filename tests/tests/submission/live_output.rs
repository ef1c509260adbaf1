//! Live output against the real binaries: `attune execution tail` shows the lines of a
//! 10-second action while it runs, and ends when the execution ends; the route answers a
//! finished execution with its stored output at once, and an unknown one with a 404; the
//! request timeout does not cut a stream.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use attune_testkit::system::{repo_root, workspace_binary};
use attune_testkit::{System, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

async fn status(system: &System, id: i64) -> String {
    sqlx::query_scalar("SELECT status::text FROM execution WHERE id = $1")
        .bind(id)
        .fetch_one(&system.db.pool)
        .await
        .unwrap()
}

/// Reads an SSE body to its end (a finished execution's stream ends by itself).
async fn events_of(system: &System, path: &str) -> (u16, String, String) {
    let response =
        system.http.get(format!("{}{path}", system.api_url)).bearer_auth(&system.token).send().await.unwrap();
    let status = response.status().as_u16();
    let kind = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    let body = tokio::time::timeout(DEADLINE, response.text()).await.expect("the stream ends").unwrap();
    (status, kind, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_shows_lines_of_a_10_second_action_while_it_runs() {
    // a request timeout shorter than the run: it bounds a handler, not a stream it answers with
    let system = System::builder()
        .pack(repo_root().join("testkit/packs/e2e"))
        .env("ATTUNE_API_REQUEST_TIMEOUT_SECS", "3")
        .worker("w1", &[])
        .start()
        .await;
    let execution = system.submit("e2e.ticks", json!({"seconds": 10})).await;
    let execution_id = id(&execution);

    // `attune execution tail`, read line by line as it prints, each line with when it came
    let mut tail = Command::new(workspace_binary("attune"))
        .args(["execution", "tail", &execution_id.to_string()])
        .env("ATTUNE_API_URL", &system.api_url)
        .env("ATTUNE_TOKEN", &system.token)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_sender, mut lines) = tokio::sync::mpsc::unbounded_channel::<(Instant, String)>();
    let stdout = tail.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_sender.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    let stderr = tail.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());

    // each line as it comes: the first ones while the execution is still running
    let mut seen = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    while let Ok(Some((at, line))) = tokio::time::timeout_at(deadline.into(), lines.recv()).await {
        let status_then = status(&system, execution_id).await;
        seen.push((at, line, status_then));
    }
    let exit = wait_for("attune execution tail to exit", DEADLINE, || {
        let exited = tail.try_wait().unwrap();
        async move { exited }
    })
    .await;
    let stderr = stderr.join().unwrap();
    let texts: Vec<&str> = seen.iter().map(|(_, line, _)| line.as_str()).collect();
    let expected: Vec<String> = (1..=10).map(|n| format!("tick {n}")).collect();
    assert_eq!(texts, expected, "every line once, in order\nstderr: {stderr}");
    let running: Vec<&str> = seen.iter().filter(|(_, _, s)| s == "running").map(|(_, l, _)| l.as_str()).collect();
    assert!(running.len() >= 5, "lines arrive while the execution runs, not at its end: {seen:?}");
    assert_eq!(running[0], "tick 1", "the first line came while it ran: {seen:?}");
    let spread = seen.last().unwrap().0 - seen[0].0;
    assert!(spread >= Duration::from_secs(6), "the lines came spread over the run, not at once: {spread:?} {seen:?}");
    assert!(stderr.contains("halfway"), "stderr lines go to stderr: {stderr}");
    assert!(stderr.contains("completed"), "{stderr}");
    // the stream ended with the execution, and the exit status says how it ended
    assert_eq!(status(&system, execution_id).await, "completed");
    assert_eq!(exit.code(), Some(0), "stderr: {stderr}");

    // a finished execution: its stored output and `end`, at once
    let (code, kind, body) = events_of(&system, &format!("/api/v1/executions/{execution_id}/output")).await;
    assert_eq!((code, kind.as_str()), (200, "text/event-stream"), "{body}");
    assert!(body.contains("event: stdout") && body.contains("tick 10") && body.contains("event: end"), "{body}");
    assert!(body.contains(r#""status":"completed""#), "{body}");
    // an unknown one, or no id: a 404 or 400 in the API's error shape, at once
    let (code, body) = system.get("/api/v1/executions/999999/output").await;
    assert_eq!((code, body["error"]["code"].as_str()), (404, Some("execution_not_found")), "{body}");
    let (code, body) = system.get("/api/v1/executions/x/output").await;
    assert_eq!(code, 400, "{body}");
    // nothing left to follow: the worker streams to no one
    let out = system.cli_output(&["execution", "tail", "999999"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_action_tails_to_its_end_with_exit_status_2() {
    let system = System::builder().worker("w1", &[]).start().await;
    let execution = system.submit("core.fail", json!({"exit_code": 4})).await;
    let out = system.cli_output(&["execution", "tail", &id(&execution).to_string()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("failed"), "{stderr}");
    system.stop().await;
}

/// What an action prints cannot drive the operator's terminal (issue 47): `tail` shows its
/// control characters escaped, and `--raw` gives the bytes as they came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_shows_an_action_s_control_characters_escaped() {
    let system = System::builder().worker("w1", &[]).start().await;
    let message = "title\u{1b}]0;owned\u{7}\u{1b}[2J done";
    let execution = system.submit("core.echo", json!({"message": message})).await;
    let execution = id(&execution).to_string();
    let out = system.cli_output(&["execution", "tail", &execution]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(r"title\x1b]0;owned\x07\x1b[2J done"), "{stdout:?}");
    assert!(!stdout.contains('\u{1b}') && !stdout.contains('\u{7}'), "{stdout:?}");
    let raw = system.cli_output(&["execution", "tail", "--raw", &execution]);
    assert!(String::from_utf8_lossy(&raw.stdout).contains(message), "{raw:?}");
    system.stop().await;
}

/// `attune execution tail` follows a run that outlasts one stream to its end (issue 47's streams
/// end at `ATTUNE_API_OUTPUT_STREAM_MAX_SECS`, 900 s by default, 1 s here): the API's `closed`
/// says the stream may be opened again, the CLI opens it again from where each stream was, and
/// every line shows exactly once. Before, `tail` stopped at the first `closed` with exit status 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follows_a_run_longer_than_one_stream_and_shows_each_line_once() {
    const TICK: &str = "name: tick\nruntime: shell\nentrypoint: actions/tick.sh\nmax_retries: 0\n";
    const TICK_SH: &str =
        "#!/bin/sh\nfor i in 1 2 3 4 5 6 7 8 9 10; do echo \"line $i\"; echo \"err $i\" >&2; sleep 0.35; done\n";
    let pack = attune_testkit::TempPack::new("clock", &[("tick.yaml", TICK), ("tick.sh", TICK_SH)]);
    let system = System::builder()
        .env("ATTUNE_API_OUTPUT_STREAM_MAX_SECS", "1")
        .pack(pack.path())
        .worker("w1", &[])
        .start()
        .await;
    let execution = system.submit("clock.tick", json!({})).await;
    let out = system.cli_output(&["execution", "tail", &id(&execution).to_string()]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    let expected: Vec<String> = (1..=10).map(|i| format!("line {i}")).collect();
    assert_eq!(lines, expected, "each line once, in order; stderr: {stderr}");
    for i in 1..=10 {
        assert_eq!(stderr.matches(&format!("err {i}\n")).count(), 1, "err {i} once: {stderr}");
    }
    assert!(stderr.contains("following again"), "the run outlasted a stream: {stderr}");
    system.stop().await;
}
