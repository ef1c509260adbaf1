//! Workflows (issue 48): several actions as one durable run, each step an ordinary execution.

use std::collections::BTreeMap;
use std::time::Duration;

use attune_testkit::{System, TempPack, wait_for};
use serde_json::{Value, json};

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap_or_else(|| panic!("no id in {v}"))
}

const CHECK: &str = "name: check\nruntime: shell\nentrypoint: actions/check.sh\nmax_retries: 0\nparameters:\n  hosts: {type: array, required: true}\n  bad: {type: array, default: []}\n";
const CHECK_SH: &str =
    "#!/bin/sh\nprintf '{\"checked\": %s, \"unhealthy\": %s}\\n' \"$ATTUNE_PARAM_HOSTS\" \"$ATTUNE_PARAM_BAD\"\n";
const RESTART: &str = "name: restart\nruntime: shell\nentrypoint: actions/restart.sh\nmax_retries: 2\nparameters:\n  host: {type: string, required: true}\n  pause: {type: number, default: 0.3}\n";
const RESTART_SH: &str =
    "#!/bin/sh\nsleep \"$ATTUNE_PARAM_PAUSE\"\nprintf '{\"restarted\": \"%s\"}\\n' \"$ATTUNE_PARAM_HOST\"\n";
const FLAKY: &str = "name: flaky\nruntime: shell\nentrypoint: actions/flaky.sh\nmax_retries: 0\nparameters:\n  marker: {type: string, required: true}\n";
const FLAKY_SH: &str = "#!/bin/sh\ntest -f \"$ATTUNE_PARAM_MARKER\" || { echo 'the marker is not there yet' >&2; exit 3; }\necho '{\"shipped\": true}'\n";

const COUNTED: &str = "name: counted\nruntime: shell\nentrypoint: actions/counted.sh\nmax_retries: 0\nparameters:\n  counter: {type: string, required: true}\n  succeed_at: {type: integer, required: true}\n";
const COUNTED_SH: &str = "#!/bin/sh\necho x >> \"$ATTUNE_PARAM_COUNTER\"\nn=$(wc -l < \"$ATTUNE_PARAM_COUNTER\")\n[ \"$n\" -ge \"$ATTUNE_PARAM_SUCCEED_AT\" ] || { echo \"attempt $n: not yet\" >&2; exit 75; }\necho \"{\\\"attempts\\\": $n}\"\n";

const REMEDIATE: &str = r#"name: remediate
input:
  hosts: {type: array, required: true}
  bad: {type: array, default: []}
steps:
  - name: check
    action: ops.check
    parameters: {hosts: "{{ input.hosts }}", bad: "{{ input.bad }}"}
  - name: restart
    action: ops.restart
    when: "{{ steps.check.result.unhealthy }} != []"
    with-items: "{{ steps.check.result.unhealthy }}"
    concurrency: 2
    parameters: {host: "{{ item }}"}
  - name: verify
    action: core.echo
    parameters: {message: '{"restarts": "{{ steps.restart.status }}"}'}
result:
  checked: "{{ steps.check.result.checked }}"
  restarted: "{{ steps.restart.result }}"
  verified: "{{ steps.verify.result.restarts }}"
"#;

const DELIVER: &str = r#"name: deliver
input:
  marker: {type: string, required: true}
steps:
  - name: prepare
    action: core.echo
    parameters: {message: prepared}
  - name: ship
    action: ops.flaky
    parameters: {marker: "{{ input.marker }}"}
on-failure:
  - name: page
    action: core.echo
    parameters: {message: "failed at {{ failure.step }}: {{ failure.error }}"}
"#;

fn ops_pack() -> TempPack {
    TempPack::new(
        "ops",
        &[
            ("check.yaml", CHECK),
            ("check.sh", CHECK_SH),
            ("restart.yaml", RESTART),
            ("restart.sh", RESTART_SH),
            ("flaky.yaml", FLAKY),
            ("flaky.sh", FLAKY_SH),
            ("counted.yaml", COUNTED),
            ("counted.sh", COUNTED_SH),
        ],
    )
    .workflow("remediate.yaml", REMEDIATE)
    .workflow("deliver.yaml", DELIVER)
}

/// Run `run`'s graph with every execution of each step (the largest page).
async fn graph_of(system: &System, run: i64) -> Value {
    let (status, body) = system.get(&format!("/api/v1/workflows/{run}?limit=10000")).await;
    assert_eq!(status, 200, "{body}");
    body
}

fn step<'a>(graph: &'a Value, name: &str) -> &'a Value {
    graph["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no step {name}: {graph}"))
}

fn at(value: &Value) -> chrono::DateTime<chrono::FixedOffset> {
    chrono::DateTime::parse_from_rfc3339(value.as_str().unwrap_or_else(|| panic!("not a time: {value}"))).unwrap()
}

fn times(execution: &Value) -> (chrono::DateTime<chrono::FixedOffset>, chrono::DateTime<chrono::FixedOffset>) {
    (at(&execution["started"]), at(&execution["finished"]))
}

/// The worked example: check, restart each unhealthy host (at most 2 at once), verify; the
/// run's result is its own. Every step is an ordinary execution linked to its run, and the API
/// and the CLI show the run as a graph.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_runs_its_steps_in_order_fans_out_within_its_cap_and_joins() {
    let pack = ops_pack();
    let system = System::builder().pack(pack.path()).worker("w1", &[("ATTUNE_WORKER_CONCURRENCY", "8")]).start().await;
    let hosts = json!(["h1", "h2", "h3", "h4", "h5"]);
    let bad = json!(["h2", "h3", "h4", "h5"]);
    let run = system.submit("ops.remediate", json!({"hosts": hosts, "bad": bad})).await;
    let run_id = id(&run);
    assert_eq!(run["runtime"], "workflow", "{run}");
    let ended = system.wait_terminal(run_id, Duration::from_secs(60)).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    let restarted: Vec<Value> = ["h2", "h3", "h4", "h5"].iter().map(|h| json!({"restarted": h})).collect();
    assert_eq!(ended["result"], json!({"checked": hosts, "restarted": restarted, "verified": "succeeded"}));

    let graph = graph_of(&system, run_id).await;
    for name in ["check", "restart", "verify"] {
        assert_eq!(step(&graph, name)["state"], "succeeded", "{name}: {graph}");
    }
    let restart = step(&graph, "restart");
    assert_eq!(restart["items"], json!({"total": 4, "not_started": 0, "in_flight": 0, "succeeded": 4, "failed": 0}));
    let executions = restart["executions"].as_array().unwrap();
    assert_eq!(executions.iter().map(|e| e["item"].as_i64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    // at most two items at once: no moment is inside three runs
    let spans: Vec<_> = executions.iter().map(times).collect();
    for (start, _) in &spans {
        let inside = spans.iter().filter(|(s, f)| s <= start && start < f).count();
        assert!(inside <= 2, "{inside} items ran at once at {start}: {spans:?}");
    }
    // the join: verify started after the last item finished (a row's times are its
    // transaction's start; the claim of verify began after the commit that made it, which came
    // after the commit of the last item)
    let last_item = spans.iter().map(|(_, f)| *f).max().unwrap();
    let verify = &step(&graph, "verify")["executions"][0];
    assert!(at(&verify["started"]) > last_item, "{verify} before {last_item}");
    // each step is an ordinary execution, linked to its run
    let (status, item) = system.get(&format!("/api/v1/executions/{}", executions[1]["id"])).await;
    assert_eq!(status, 200);
    assert_eq!((item["workflow_run"].as_i64(), item["workflow_step"].as_str()), (Some(run_id), Some("restart")));
    assert_eq!(item["parameters"], json!({"host": "h3", "pause": 0.3}), "the action's default filled in");

    let tree = system.cli(&["workflow", "tree", &run_id.to_string()]);
    for needle in ["ops.remediate", "restart: ops.restart [succeeded]", "item 3 execution", "verify: core.echo"] {
        assert!(tree.contains(needle), "{needle:?} not in:\n{tree}");
    }
    let table = system.cli(&["workflow", "get", &run_id.to_string()]);
    assert!(table.contains("4/4 (0 running, 0 failed)"), "{table}");

    // a step's executions come a page at a time, by id, with where the next page starts
    let ids: Vec<i64> = executions.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    let (status, first) = system.get(&format!("/api/v1/workflows/{run_id}?limit=3")).await;
    assert_eq!(status, 200, "{first}");
    let shown = step(&first, "restart");
    assert_eq!(shown["attempts"], 4, "the counts are the whole step's: {shown}");
    let page: Vec<i64> = shown["executions"].as_array().unwrap().iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert_eq!((page.as_slice(), shown["next_after"].as_i64()), (&ids[..3], Some(ids[2])), "{shown}");
    assert_eq!(step(&first, "check")["next_after"], Value::Null, "a step shown whole has no next page");
    let (status, rest) = system.get(&format!("/api/v1/workflows/{run_id}?step=restart&after={}&limit=3", ids[2])).await;
    assert_eq!(status, 200, "{rest}");
    let steps = rest["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "only the step asked for: {rest}");
    assert_eq!(steps[0]["executions"].as_array().unwrap().len(), 1, "{rest}");
    assert_eq!((steps[0]["executions"][0]["id"].as_i64(), &steps[0]["next_after"]), (Some(ids[3]), &Value::Null));
    let tree = system.cli(&["workflow", "tree", &run_id.to_string(), "--step", "restart"]);
    assert!(tree.contains("item 3 execution") && !tree.contains("check:"), "{tree}");
    for (query, parameter, code) in
        [("limit=0", "limit", 422), ("limit=10001", "limit", 422), ("step=nope", "step", 404)]
    {
        let (status, body) = system.get(&format!("/api/v1/workflows/{run_id}?{query}")).await;
        assert_eq!(status, code, "{query}: {body}");
        let named = body["error"]["parameter"].as_str().or(body["error"]["resource"].as_str());
        assert!(
            named == Some(parameter) || body["error"]["message"].as_str().unwrap().contains(parameter),
            "{query}: {body}"
        );
    }

    // nothing unhealthy: the fan-out is skipped, and what needs it runs on
    let quiet = system.submit("ops.remediate", json!({"hosts": ["h1"]})).await;
    let ended = system.wait_terminal(id(&quiet), Duration::from_secs(30)).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    assert_eq!(ended["result"], json!({"checked": ["h1"], "restarted": null, "verified": "skipped"}));
    let graph = graph_of(&system, id(&quiet)).await;
    assert_eq!(step(&graph, "restart")["state"], "skipped");
    assert!(step(&graph, "restart")["reason"].as_str().unwrap().contains("'when' is false"), "{graph}");
    system.stop().await;
}

/// A step that fails runs the on-failure path, and the run fails naming the step. Retried by
/// hand (the run, or its failed step), the run starts again from the failed step: what completed
/// is not run again. A step is never retried alone: a retry submitted as a new execution naming
/// its action, and a step of a run that completed, are refused (409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_step_runs_the_on_failure_path_and_a_retry_of_the_run_starts_from_it() {
    let pack = ops_pack();
    let system = System::builder().pack(pack.path()).worker("w1", &[]).start().await;
    let marker = system.packs_dir().join("shipping-marker");
    let run = system.submit("ops.deliver", json!({"marker": marker.display().to_string()})).await;
    let first = id(&run);
    let ended = system.wait_terminal(first, Duration::from_secs(30)).await;
    assert_eq!(ended["status"], "failed", "{ended}");
    assert_eq!(ended["failure_kind"], "action_failed");
    let error = ended["error"].as_str().unwrap();
    assert!(error.starts_with("step 'ship' failed"), "{error}");
    let graph1 = graph_of(&system, first).await;
    assert_eq!(step(&graph1, "ship")["state"], "failed");
    let page = step(&graph1, "page");
    assert_eq!(page["state"], "succeeded", "{graph1}");
    let ship_execution = step(&graph1, "ship")["executions"][0]["id"].as_i64().unwrap();
    // the book's query for "which step failed, and why", as written there
    let book = std::fs::read_to_string(attune_testkit::system::repo_root().join("book/src/workflows.md")).unwrap();
    let query = book
        .split("-- the failed steps of run 42, with their error and attempts\n")
        .nth(1)
        .and_then(|rest| rest.split(";\n").next())
        .expect("the book's query");
    let failed: Vec<(String, i32, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(
        format!("SELECT workflow_step, workflow_item, id, error FROM ({query}) q").replace("42", &first.to_string()),
    ))
    .fetch_all(&system.db.pool)
    .await
    .unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!((failed[0].0.as_str(), failed[0].1, failed[0].2), ("ship", 0, ship_execution));
    assert!(failed[0].3.contains("exit"), "{failed:?}");

    // a retry submitted as a new execution names the step's action: a step is not retried alone
    let (status, refused) = system
        .post("/api/v1/executions", &json!({"action_ref": "ops.flaky", "config": {"retry_of": ship_execution}}))
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "workflow_step");
    assert!(refused["error"]["message"].as_str().unwrap().contains(&format!("/executions/{first}/retry")), "{refused}");

    // a bulk retry that selects the step skips it, naming its run (a run selected is retried whole)
    let (status, bulk) = system
        .post(
            "/api/v1/executions/bulk",
            &json!({"action": "retry", "filter": {"action_ref": "ops.flaky", "status": "failed"}, "reason": "retry"}),
        )
        .await;
    assert_eq!(status, 200, "{bulk}");
    assert_eq!(bulk["done"].as_array().map(Vec::len), Some(0), "{bulk}");
    assert_eq!(bulk["skipped"][0]["id"].as_i64(), Some(ship_execution), "{bulk}");
    assert_eq!(bulk["skipped"][0]["code"], "workflow_step", "{bulk}");

    // retried from the failed step while the marker is still missing: the retry is the run's, it
    // fails again, and pages again (a retry takes over what its parent's main steps completed,
    // never its on-failure steps)
    let (status, retry) = system.post(&format!("/api/v1/executions/{ship_execution}/retry"), &json!({})).await;
    assert_eq!(status, 201, "{retry}");
    assert_eq!(
        (retry["action_ref"].as_str(), retry["original_execution"].as_i64()),
        (Some("ops.deliver"), Some(first))
    );
    let again = id(&retry);
    // ... once: the run is retried already
    let (status, refused) = system.post(&format!("/api/v1/executions/{first}/retry"), &json!({})).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (409, Some("already_retried")), "{refused}");
    assert_eq!(system.wait_terminal(again, Duration::from_secs(30)).await["status"], "failed");
    let graph_again = graph_of(&system, again).await;
    assert_eq!(step(&graph_again, "page")["attempts"], 1, "the second failure pages too: {graph_again}");
    assert_eq!(step(&graph_again, "prepare")["attempts"], 0);
    // a run is retried with its own input
    let (status, body) =
        system.post(&format!("/api/v1/executions/{again}/retry"), &json!({"parameters": {"marker": "/x"}})).await;
    assert_eq!((status, body["error"]["parameter"].as_str()), (422, Some("parameters")), "{body}");

    std::fs::write(&marker, "").unwrap();
    let (status, retry) = system.post(&format!("/api/v1/executions/{again}/retry"), &json!({})).await;
    assert_eq!(status, 201, "{retry}");
    let second = id(&retry);
    let ended = system.wait_terminal(second, Duration::from_secs(30)).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    let graph2 = graph_of(&system, second).await;
    assert_eq!(graph2["resumes"], again);
    let prepare = step(&graph2, "prepare");
    assert_eq!(prepare["state"], "succeeded");
    assert_eq!(prepare["attempts"], 0, "prepare completed in the first run and is not run again: {graph2}");
    assert_eq!(step(&graph2, "ship")["attempts"], 1);
    assert_eq!(step(&graph2, "page")["state"], "not_run");
    // a step of a run that completed is not retried
    let shipped = step(&graph2, "ship")["executions"][0]["id"].as_i64().unwrap();
    let (status, refused) = system.post(&format!("/api/v1/executions/{shipped}/retry"), &json!({})).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (409, Some("workflow_step")), "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("the run completed"), "{refused}");
    system.stop().await;
}

/// `concurrency` and `pause` are filled in (`fan`).
const FAN: &str = r#"name: fan
input:
  hosts: {type: array, required: true}
steps:
  - name: each
    action: ops.restart
    with-items: "{{ input.hosts }}"
    concurrency: CONCURRENCY
    parameters: {host: "{{ item }}", pause: PAUSE}
  - name: join
    action: core.echo
    parameters: {message: '{"count": {{ steps.each.result }}}'}
"#;

/// The executor and the worker are SIGKILLed in the middle of a fan-out: every item runs (its
/// first attempt made once; a run cut off with its worker is retried as itself), and the join
/// runs once, after the last item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_survives_its_executor_and_its_worker_being_killed() {
    // (30 items, 6 at once, here; issue 48's target, 1,000 at 50 at once: ATTUNE_TEST_FAN_ITEMS=1000)
    let items: usize = std::env::var("ATTUNE_TEST_FAN_ITEMS").ok().and_then(|n| n.parse().ok()).unwrap_or(30);
    let (concurrency, pause, slots) = if items > 100 { ("50", "0.05", "50") } else { ("6", "0.4", "8") };
    let fan = FAN.replace("CONCURRENCY", concurrency).replace("PAUSE", pause);
    let pack = ops_pack().workflow("fan.yaml", &fan);
    let mut system = System::builder()
        .pack(pack.path())
        .env("ATTUNE_HEARTBEAT_MAX_AGE_SECS", "3")
        .env("ATTUNE_MONITOR_INTERVAL_SECS", "1")
        .env("ATTUNE_RETRY_BASE_BACKOFF_SECS", "1")
        .worker("w1", &[("ATTUNE_WORKER_CONCURRENCY", slots)])
        .start()
        .await;
    let hosts: Vec<String> = (0..items).map(|n| format!("h{n}")).collect();
    let run = id(&system.submit("ops.fan", json!({"hosts": hosts})).await);
    items_done(&system, run, items as i64 / 5).await;
    system.signal("executor", 9);
    system.restart("executor");
    items_done(&system, run, items as i64 / 2).await;
    system.signal("w1", 9);
    system.restart("w1");
    let ended = system.wait_terminal(run, Duration::from_secs(600)).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    let graph = graph_of(&system, run).await;
    let each = step(&graph, "each");
    let mut first_attempts: BTreeMap<i64, usize> = BTreeMap::new();
    let mut completed: BTreeMap<i64, usize> = BTreeMap::new();
    let executions = each["executions"].as_array().unwrap();
    for execution in executions {
        let item = execution["item"].as_i64().unwrap();
        if execution["original_execution"].is_null() {
            *first_attempts.entry(item).or_default() += 1;
        }
        if execution["status"] == "completed" {
            *completed.entry(item).or_default() += 1;
        }
    }
    assert_eq!(first_attempts.len(), items, "every item started: {first_attempts:?}");
    assert!(first_attempts.values().all(|n| *n == 1), "an item started twice: {first_attempts:?}");
    assert_eq!(completed.len(), items, "every item completed");
    assert!(completed.values().all(|n| *n == 1), "an item completed twice: {completed:?}");
    eprintln!("{items} items: {} executions (retries of runs cut off with their worker included)", executions.len());
    let join = step(&graph, "join");
    assert_eq!(join["attempts"], 1, "{join}");
    let results = ended["result"]["join"]["count"].as_array().unwrap_or_else(|| panic!("{ended}"));
    assert_eq!(results.len(), items);
    assert!(results.iter().all(|r| r["restarted"].is_string()), "{results:?}");
    system.stop().await;
}

async fn items_done(system: &System, run: i64, n: i64) {
    wait_for(&format!("{n} items done"), Duration::from_secs(300), || async move {
        let graph = graph_of(system, run).await;
        (step(&graph, "each")["items"]["succeeded"].as_i64() >= Some(n)).then_some(())
    })
    .await
}

/// Registering the pack again changes no run that exists: a run follows the definition it
/// pinned when it was made, a new run the new one. A canceled run cancels the steps it had in
/// flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_keeps_the_definition_it_started_with_and_a_cancel_stops_its_steps() {
    const V1: &str = "name: pinned\nsteps:\n  - {name: wait, action: core.sleep, parameters: {seconds: 2}}\n  - {name: say, action: core.echo, parameters: {message: '{\"version\": 1}'}}\nresult: '{{ steps.say.result.version }}'\n";
    let pack = ops_pack().workflow("pinned.yaml", V1);
    let dir_name = pack.path().file_name().unwrap().to_string_lossy().into_owned();
    let system = System::builder().pack(pack.path()).worker("w1", &[]).start().await;
    let old = id(&system.submit("ops.pinned", json!({})).await);
    wait_for("the first step to run", Duration::from_secs(20), || async {
        (step(&graph_of(&system, old).await, "wait")["state"] == "running").then_some(())
    })
    .await;
    let v2 = V1.replace("\"version\": 1", "\"version\": 2");
    assert_ne!(v2, V1);
    std::fs::write(system.packs_dir().join(&dir_name).join("workflows/pinned.yaml"), &v2).unwrap();
    let (status, body) = system.post("/api/v1/packs", &json!({"path": dir_name})).await;
    assert_eq!(status, 201, "{body}");
    let new = id(&system.submit("ops.pinned", json!({})).await);
    assert_eq!(system.wait_terminal(old, Duration::from_secs(30)).await["result"], 1);
    assert_eq!(system.wait_terminal(new, Duration::from_secs(30)).await["result"], 2);

    let canceled = id(&system.submit("ops.pinned", json!({})).await);
    let sleeping = wait_for("the first step to run", Duration::from_secs(20), || async {
        let graph = graph_of(&system, canceled).await;
        let wait = step(&graph, "wait");
        (wait["state"] == "running" && wait["executions"][0]["status"] == "running")
            .then(|| wait["executions"][0]["id"].as_i64().unwrap())
    })
    .await;
    let (status, body) = system.post(&format!("/api/v1/executions/{canceled}/cancel"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let step_ended = system.wait_terminal(sleeping, Duration::from_secs(20)).await;
    assert_eq!(step_ended["status"], "canceled", "{step_ended}");
    assert!(step_ended["error"].as_str().unwrap().contains(&format!("workflow run {canceled} ended")), "{step_ended}");
    let graph = graph_of(&system, canceled).await;
    assert_eq!(step(&graph, "say")["state"], "not_run", "{graph}");
    system.stop().await;
}

/// A workflow file's mistakes are named by file and field when the pack is registered, and a
/// step naming an action that does not exist is refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_workflow_is_refused_at_registration_naming_its_file_and_field() {
    let system = System::builder().start().await;
    let dir = system.packs_dir().join("broken");
    std::fs::create_dir_all(dir.join("workflows")).unwrap();
    std::fs::write(dir.join("pack.yaml"), "ref: broken\nversion: 1.0.0\n").unwrap();
    let cases = [
        (
            "name: w\nsteps:\n  - {name: a, action: core.echo, parameters: {message: '{{ steps.b.result }}'}}\n",
            "steps.a.parameters.message",
            "there is no step 'b'",
        ),
        (
            "name: w\nsteps:\n  - {name: a, action: core.nothing}\n",
            "steps.a.action",
            "no action 'core.nothing' is registered",
        ),
        (
            "name: w\ninput:\n  token: {type: string, secret: true}\nsteps:\n  - {name: a, action: core.echo}\n",
            "input.token.secret",
            "stored secret's reference",
        ),
    ];
    // an action that becomes a workflow naming itself as its step
    std::fs::create_dir_all(dir.join("actions")).unwrap();
    std::fs::write(dir.join("actions/w.yaml"), "name: w\nruntime: builtin\nentrypoint: noop\n").unwrap();
    let (status, body) = system.post("/api/v1/packs", &json!({"path": "broken"})).await;
    assert_eq!(status, 201, "{body}");
    std::fs::remove_file(dir.join("actions/w.yaml")).unwrap();
    let cases = [("name: w\nsteps:\n  - {name: a, action: broken.w}\n", "steps.a.action", "is a workflow")]
        .into_iter()
        .chain(cases);
    for (text, field, reason) in cases {
        std::fs::write(dir.join("workflows/w.yaml"), text).unwrap();
        let (status, body) = system.post("/api/v1/packs", &json!({"path": "broken"})).await;
        assert_eq!(status, 422, "{text}: {body}");
        assert_eq!(body["error"]["code"], "invalid_pack");
        assert_eq!(body["error"]["field"], field, "{body}");
        assert!(body["error"]["reason"].as_str().unwrap().contains(reason), "{body}");
        assert!(body["error"]["file"].as_str().unwrap().ends_with("workflows/w.yaml"), "{body}");
    }
    system.stop().await;
}

const PERSIST: &str = r#"name: persist
input:
  counter: {type: string, required: true}
steps:
  - name: tasker
    action: ops.counted
    retry: {max_attempts: 3, base_delay_secs: 0.1}
    parameters: {counter: "{{ input.counter }}-a", succeed_at: 3}
  - name: argyll
    action: ops.counted
    work_config: {max_retries: 2, init_backoff: 100, backoff_type: fixed}
    parameters: {counter: "{{ input.counter }}-b", succeed_at: 3}
result:
  tasker: "{{ steps.tasker.result.attempts }}"
  argyll: "{{ steps.argyll.result.attempts }}"
"#;

/// A step's own retries (Tasker's `max_attempts` in `retry:`, Argyll's `work_config`) lie over
/// its action's (`max_retries: 0` here): each step's executions are a retry chain of the
/// RetryManager's, and the step is done when its last attempt completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_s_own_retry_forms_lie_over_its_action_s() {
    let pack = ops_pack().workflow("persist.yaml", PERSIST);
    let system = System::builder().pack(pack.path()).worker("w1", &[]).start().await;
    let counter = system.packs_dir().join("attempts");
    let run = id(&system.submit("ops.persist", json!({"counter": counter.display().to_string()})).await);
    let ended = system.wait_terminal(run, Duration::from_secs(60)).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    assert_eq!(ended["result"], json!({"tasker": 3, "argyll": 3}));
    let graph = graph_of(&system, run).await;
    for name in ["tasker", "argyll"] {
        let executions = step(&graph, name)["executions"].as_array().unwrap().clone();
        let statuses: Vec<&str> = executions.iter().map(|e| e["status"].as_str().unwrap()).collect();
        assert_eq!(statuses, ["failed", "failed", "completed"], "{name}: {executions:?}");
        assert_eq!(executions[2]["retry_count"], 2);
        assert_eq!(executions[2]["original_execution"], executions[1]["id"]);
    }
    system.stop().await;
}

/// A run paused alone (`PUT /pauses/run/{id}`) starts no new step: its step in flight runs to
/// its end, the engine looks again and makes nothing; resumed, the run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_run_starts_no_new_step_until_it_is_resumed() {
    const TWO: &str = "name: two\nsteps:\n  - {name: first, action: core.sleep, parameters: {seconds: 1}}\n  - {name: second, action: core.echo, parameters: {message: done}}\n";
    let pack = ops_pack().workflow("two.yaml", TWO);
    let system = System::builder().pack(pack.path()).worker("w1", &[]).start().await;
    let run = id(&system.submit("ops.two", json!({})).await);
    wait_for("the first step to run", Duration::from_secs(20), || async {
        (step(&graph_of(&system, run).await, "first")["state"] == "running").then_some(())
    })
    .await;
    let pause = json!({"reason": "looking at it"});
    let (status, body) = system
        .request(reqwest::Method::PUT, &format!("/api/v1/pauses/run/{run}"), Some(&pause), Some(&system.token))
        .await;
    assert_eq!(status, 201, "{body}");
    // the first step ends, and the engine has looked since
    let looked = wait_for("an advance after the first step ended", Duration::from_secs(20), || async {
        let graph = graph_of(&system, run).await;
        let time = |v: &Value| v.as_str().and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
        let finished = time(&step(&graph, "first")["finished"])?;
        (time(&graph["advanced"])? > finished).then_some(graph)
    })
    .await;
    assert_eq!(step(&looked, "second")["attempts"], 0, "a paused run made a step: {looked}");
    assert_eq!(looked["run"]["status"], "running");
    // the executors' login makes steps only as the definition says (issue 47's narrowing holds)
    let executor = sqlx::PgPool::connect(&system.db.url_as("attune_test_executor")).await.unwrap();
    for (item, parameters, refused) in [
        (0, json!({"message": {"$sealed": "00"}}), "no sealed value"),
        (0, json!({"message": {"$secret": "not-in-the-input"}}), "neither its input nor its definition"),
        (10_000, json!({"message": "x"}), "has no item"),
    ] {
        let made = sqlx::query("SELECT workflow_step_start($1, 'second', $2, $3, NULL, 30)")
            .bind(run)
            .bind(item)
            .bind(&parameters)
            .execute(&executor)
            .await;
        let error = made.expect_err("refused").to_string();
        assert!(error.contains(refused), "{parameters}: {error}");
    }
    executor.close().await;
    let (status, body) =
        system.request(reqwest::Method::DELETE, &format!("/api/v1/pauses/run/{run}"), None, Some(&system.token)).await;
    assert_eq!(status, 200, "{body}");
    let ended = system.wait_terminal(run, Duration::from_secs(30)).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    let (status, body) =
        system.request(reqwest::Method::PUT, "/api/v1/pauses/run/nope", Some(&pause), Some(&system.token)).await;
    assert_eq!((status, body["error"]["parameter"].as_str()), (422, Some("name")), "{body}");
    system.stop().await;
}

/// The book's worked example, `examples.remediate`, as the book runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_books_worked_example_runs() {
    let examples = attune_testkit::system::repo_root().join("packs/examples");
    let system = System::builder().pack(&examples).worker("w1", &[]).start().await;
    let hosts = json!(["web-1", "web-2", "web-3"]);
    let run = id(&system.submit("examples.remediate", json!({"hosts": hosts, "unhealthy": ["web-2"]})).await);
    let ended = system.wait_terminal(run, Duration::from_secs(60)).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    assert_eq!(
        ended["result"],
        json!({"restarted": [{"host": "web-2", "service": "nginx", "restarted": true}], "unhealthy_after": []})
    );
    let graph = graph_of(&system, run).await;
    let states: Vec<(&str, &str)> = graph["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [
            ("check", "succeeded"),
            ("restart", "succeeded"),
            ("verify", "succeeded"),
            ("notify", "succeeded"),
            ("page", "not_run")
        ]
    );
    system.stop().await;
}
