//! Forged broker messages, with the real binaries: whoever can publish to the broker cannot run a
//! program, fail an execution or stop a run. A worker reads what to run from PostgreSQL when it
//! claims an execution, and runs an entrypoint only inside its pack directory; the executor
//! records a result only with the run token the worker drew at its claim; a worker stops a run
//! on a cancel notice only when the database says it is no longer running there.

use std::path::{Path, PathBuf};
use std::time::Duration;

use attune_testkit::system::repo_root;
use attune_testkit::{Started, System, wait_for};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);
const SIGKILL: i32 = 9;

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

fn with_e2e() -> attune_testkit::SystemBuilder {
    System::builder().pack(repo_root().join("testkit/packs/e2e"))
}

/// A directory of the test's own under the system temp directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("attune-{prefix}-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A script outside any pack that leaves `marker` behind if anything runs it.
fn evil_script(dir: &TempDir) -> (PathBuf, PathBuf) {
    let marker = dir.path().join("marker");
    let script = dir.path().join("evil.sh");
    std::fs::write(&script, format!("#!/bin/sh\ntouch '{}'\necho forged\n", marker.display())).unwrap();
    (script, marker)
}

/// A dispatch as an earlier version sent it, naming what to run: everything but the ids forged.
fn forged_dispatch(execution_id: i64, worker_id: i64, script: &Path) -> Vec<u8> {
    json!({
        "execution_id": execution_id,
        "worker_id": worker_id,
        "action_ref": "core.echo",
        "runtime": "shell",
        "entrypoint": script.file_name().unwrap().to_str().unwrap(),
        "pack_path": script.parent().unwrap(),
        "parameters": {"message": "forged"},
        "timeout_seconds": 30,
        "retry_count": 0,
        "transient_exit_codes": [],
        "idempotency_key": "forged",
    })
    .to_string()
    .into_bytes()
}

/// The row's status, worker, start and last change.
async fn row(system: &System, execution_id: i64) -> (String, Option<i64>, Option<DateTime<Utc>>, DateTime<Utc>) {
    sqlx::query_as("SELECT status::text, worker, started, updated FROM execution WHERE id = $1")
        .bind(execution_id)
        .fetch_one(&system.db.pool)
        .await
        .unwrap()
}

async fn wait_running(system: &System, execution_id: i64) {
    wait_for(&format!("execution {execution_id} to run"), DEADLINE, || async move {
        (row(system, execution_id).await.0 == "running").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_dispatch_for_a_waiting_execution_runs_nothing_and_writes_nothing() {
    let mut system = with_e2e().worker("w1", &[]).start().await;
    // nobody schedules: the execution stays requested
    system.signal("executor", SIGKILL);
    let w1 = system.worker_id("w1").await;
    let waiting = id(&system.submit("core.echo", json!({"message": "waits"})).await);
    let before = row(&system, waiting).await;
    assert_eq!((before.0.as_str(), before.1), ("requested", None));

    let outside = TempDir::new("forged-a");
    let (script, marker) = evil_script(&outside);
    system.publish_raw(&format!("worker.{w1}"), &forged_dispatch(waiting, w1, &script)).await;
    system.wait_log("w1", &format!("dispatch is stale or a duplicate execution_id={waiting}")).await;

    assert!(!marker.exists(), "the forged script ran");
    assert_eq!(row(&system, waiting).await, before, "the forged dispatch changed the execution");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_dispatch_runs_only_what_the_database_names() {
    let mut system = with_e2e().worker("w1", &[]).start().await;
    system.signal("executor", SIGKILL);
    let w1 = system.worker_id("w1").await;
    let scheduled = id(&system.submit("core.echo", json!({"message": "from the database"})).await);
    // scheduled on w1 as a scheduler would, with no dispatch sent: the forged one is the only one
    sqlx::query("UPDATE execution SET status = 'scheduled', worker = $2, updated = now() WHERE id = $1")
        .bind(scheduled)
        .bind(w1)
        .execute(&system.db.pool)
        .await
        .unwrap();

    let outside = TempDir::new("forged-b");
    let (script, marker) = evil_script(&outside);
    system.publish_raw(&format!("worker.{w1}"), &forged_dispatch(scheduled, w1, &script)).await;
    let done = system.wait_terminal(scheduled, DEADLINE).await;

    assert!(!marker.exists(), "the forged script ran");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "from the database\n", "the database's action and parameters ran: {done}");
    assert_eq!(done["worker"], w1);
    system.stop().await;
}

/// A failure result naming the execution and its worker, with `run_token` (none if `None`).
fn forged_failure(execution_id: i64, worker_id: i64, run_token: Option<&str>) -> Vec<u8> {
    let mut result = json!({
        "execution_id": execution_id, "worker_id": worker_id, "status": "failed", "result": null,
        "failure_kind": "transient_error", "error": "forged", "exit_code": 75,
        "stdout": "", "stderr": "", "duration_ms": 1
    });
    if let Some(token) = run_token {
        result["run_token"] = token.into();
    }
    result.to_string().into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_failure_result_changes_nothing() {
    let system = with_e2e().worker("w1", &[]).start().await;
    let w1 = system.worker_id("w1").await;
    let gate = TempDir::new("forged-c");
    let gate_file = gate.path().join("gate");
    let running = id(&system.submit("e2e.gate", json!({"gate": gate_file})).await);
    wait_running(&system, running).await;
    let before = row(&system, running).await;

    system.publish_raw("execution.result", &forged_failure(running, w1, None)).await;
    system.publish_raw("execution.result", &forged_failure(running, w1, Some(&"0".repeat(32)))).await;
    let dropped = format!("result dropped: its run token is not the execution's execution_id={running}");
    wait_for("the executor to have handled both forged results", DEADLINE, || async {
        let handled = system.log("executor").matches(&dropped).count() >= 2;
        (handled || row(&system, running).await.0 != "running").then_some(())
    })
    .await;
    assert_eq!(row(&system, running).await, before, "a forged result changed the execution");

    std::fs::write(&gate_file, "").unwrap();
    let done = system.wait_terminal(running, DEADLINE).await;
    assert_eq!((done["status"].as_str(), &done["error"]), (Some("completed"), &Value::Null), "{done}");
    assert_eq!(done["retried_by"], Value::Null);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_cancel_notice_does_not_stop_a_run() {
    let system = with_e2e().worker("w1", &[]).start().await;
    let gate = TempDir::new("forged-d");
    let gate_file = gate.path().join("gate");
    let running = id(&system.submit("e2e.gate", json!({"gate": gate_file})).await);
    wait_running(&system, running).await;
    let before = row(&system, running).await;

    let notice = json!({"execution_id": running}).to_string();
    system.publish_on(".control", "", notice.as_bytes()).await;
    let ignored = format!("cancel notice ignored: the execution still runs here execution_id={running}");
    let stopped = "stopped while running (canceled or failed by hand)";
    wait_for("the worker to have handled the forged notice", DEADLINE, || async {
        let log = system.log("w1");
        (log.contains(&ignored) || log.contains(stopped)).then_some(())
    })
    .await;
    assert!(!system.log("w1").contains(stopped), "a forged notice stopped the run");
    assert_eq!(row(&system, running).await, before);

    std::fs::write(&gate_file, "").unwrap();
    let done = system.wait_terminal(running, DEADLINE).await;
    assert_eq!(done["status"], "completed", "{done}");
    system.stop().await;
}

/// A pack of three shell actions (`link`, `up`, `absolute`), each running `actions/run.sh`.
fn fenced_pack(dir: &TempDir) -> PathBuf {
    let pack = dir.path().join("fenced");
    std::fs::create_dir_all(pack.join("actions")).unwrap();
    std::fs::write(pack.join("pack.yaml"), "ref: fenced\nversion: 1.0.0\n").unwrap();
    std::fs::write(pack.join("actions/run.sh"), "#!/bin/sh\necho inside\n").unwrap();
    for name in ["link", "up", "absolute"] {
        std::fs::write(
            pack.join(format!("actions/{name}.yaml")),
            format!("name: {name}\nruntime: shell\nentrypoint: actions/run.sh\nmax_retries: 0\n"),
        )
        .unwrap();
    }
    pack
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entrypoint_that_leads_outside_its_pack_is_refused() {
    let packs = TempDir::new("fenced-pack");
    let system = with_e2e().pack(fenced_pack(&packs)).worker("w1", &[]).start().await;
    let registered: String =
        sqlx::query_scalar("SELECT path FROM pack WHERE ref = 'fenced'").fetch_one(&system.db.pool).await.unwrap();
    let registered = PathBuf::from(registered);
    let outside = TempDir::new("fenced-outside");
    let (script, marker) = evil_script(&outside);

    // after registration: the entrypoint became a symbolic link to a script outside the pack, and
    // the record names paths outside it
    std::fs::remove_file(registered.join("actions/run.sh")).unwrap();
    std::os::unix::fs::symlink(&script, registered.join("actions/run.sh")).unwrap();
    let up =
        format!("{}{}", "../".repeat(registered.components().count()), script.strip_prefix("/").unwrap().display());
    for (action, entrypoint) in [("fenced.up", up.as_str()), ("fenced.absolute", script.to_str().unwrap())] {
        sqlx::query("UPDATE action SET entrypoint = $2 WHERE ref = $1")
            .bind(action)
            .bind(entrypoint)
            .execute(&system.db.pool)
            .await
            .unwrap();
    }
    let submitted: Vec<i64> = futures_util::future::join_all(
        ["fenced.link", "fenced.up", "fenced.absolute"].map(|action| system.submit(action, json!({}))),
    )
    .await
    .iter()
    .map(id)
    .collect();
    for execution in submitted {
        let done = system.wait_terminal(execution, DEADLINE).await;
        assert_eq!(
            (done["status"].as_str(), done["failure_kind"].as_str()),
            (Some("failed"), Some("action_not_found"))
        );
        let error = done["error"].as_str().unwrap();
        assert!(error.contains("outside its pack") || error.contains("not a path inside"), "{error}");
    }
    assert!(!marker.exists(), "a script outside the pack ran");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_runs_no_pack_the_record_places_outside_its_packs_directory() {
    let packs = TempDir::new("fenced-pack");
    let system = with_e2e().pack(fenced_pack(&packs)).worker("w1", &[]).start().await;
    // a copy of the pack outside the worker's ATTUNE_PACKS_DIR, its script replaced, and the
    // record edited to name it (someone who can write the database, or an old registration)
    let outside = TempDir::new("fenced-elsewhere");
    let (script, marker) = evil_script(&outside);
    let copy = outside.path().join("fenced");
    std::fs::create_dir_all(copy.join("actions")).unwrap();
    std::fs::copy(&script, copy.join("actions/run.sh")).unwrap();
    sqlx::query("UPDATE pack SET path = $1 WHERE ref = 'fenced'")
        .bind(copy.to_str().unwrap())
        .execute(&system.db.pool)
        .await
        .unwrap();
    let execution = id(&system.submit("fenced.link", json!({})).await);
    let done = system.wait_terminal(execution, DEADLINE).await;
    assert_eq!((done["status"].as_str(), done["failure_kind"].as_str()), (Some("failed"), Some("action_not_found")));
    let error = done["error"].as_str().unwrap();
    assert!(error.contains("not under this worker's ATTUNE_PACKS_DIR"), "{error}");
    assert!(!marker.exists(), "a script outside the worker's packs directory ran");
    system.stop().await;
}

/// Users of the test's own with the permissions `docs/security-broker.md` gives each service,
/// for this system's namespace; deleted when dropped.
struct BrokerUsers {
    namespace: String,
    vhost: String,
    url: reqwest::Url,
}

impl BrokerUsers {
    fn create(namespace: &str) -> BrokerUsers {
        let url = reqwest::Url::parse(&attune_testkit::amqp_url()).unwrap();
        let vhost = match url.path().trim_start_matches('/') {
            "" => "/".to_string(),
            path => path.replace("%2f", "/").replace("%2F", "/"),
        };
        let users = BrokerUsers { namespace: namespace.to_string(), vhost, url };
        // the script the quickstart and compose run, for this namespace and users of its own
        let status = std::process::Command::new(repo_root().join("scripts/broker-users.sh"))
            .env("ATTUNE_VHOST", &users.vhost)
            .env("ATTUNE_MQ_NAMESPACE", namespace)
            .env("ATTUNE_MQ_USER_PREFIX", namespace)
            // two workers' users, as compose makes one per worker service
            .env("ATTUNE_MQ_WORKERS", "worker worker-b")
            .envs(["API", "EXECUTOR", "WORKER", "WORKER_B"].map(|s| (format!("ATTUNE_MQ_{s}_PASSWORD"), "secret")))
            .status()
            .expect("run scripts/broker-users.sh");
        assert!(status.success(), "scripts/broker-users.sh failed");
        let permissions = |user: &str| {
            let out = std::process::Command::new("rabbitmqctl")
                .args(["-q", "list_user_permissions", user])
                .output()
                .expect("rabbitmqctl list_user_permissions");
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        let (first, second) = (permissions(&users.user("worker")), permissions(&users.user("worker-b")));
        assert!(
            first.contains(&users.vhost) && first == second,
            "each worker's user, the workers' rights: {first} / {second}"
        );
        users
    }

    fn user(&self, service: &str) -> String {
        format!("{}-{service}", self.namespace)
    }

    /// `AMQP_URL` for `service`'s user.
    fn url(&self, service: &str) -> String {
        let mut url = self.url.clone();
        url.set_username(&self.user(service)).unwrap();
        url.set_password(Some("secret")).unwrap();
        url.to_string()
    }
}

impl Drop for BrokerUsers {
    fn drop(&mut self) {
        for service in ["api", "executor", "worker", "worker-b"] {
            let _ = std::process::Command::new("rabbitmqctl").args(["-q", "delete_user", &self.user(service)]).output();
        }
    }
}

fn spawn(mut command: std::process::Command, log: &Path) -> std::process::Child {
    let file = std::fs::File::create(log).unwrap();
    command.stdin(std::process::Stdio::null()).stdout(file.try_clone().unwrap()).stderr(file).spawn().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_works_with_the_broker_permissions_the_docs_give_it() {
    let mut system = with_e2e().start().await;
    let users = BrokerUsers::create(&system.namespace.name);
    let logs = TempDir::new("broker-users");
    // the system's executor makes way for one with the executor's user; a worker and a second API
    // come with theirs
    system.signal("executor", SIGKILL);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut children: Vec<Started> = Vec::new();
    for (service, binary, extra) in [
        ("executor", "attune-executor", vec![]),
        ("worker", "attune-worker", vec![("ATTUNE_WORKER_NAME", "limited".to_string())]),
        ("api", "attune-api", vec![("ATTUNE_API_ADDR", format!("127.0.0.1:{port}"))]),
    ] {
        let mut command = system.command(binary);
        command.env("AMQP_URL", users.url(service));
        for (key, value) in extra {
            command.env(key, value);
        }
        children.push(Started(spawn(command, &logs.path().join(format!("{service}.log")))));
    }
    let logs_of =
        |service: &str| std::fs::read_to_string(logs.path().join(format!("{service}.log"))).unwrap_or_default();
    let pool = system.db.pool.clone();
    wait_for("the limited worker to consume", DEADLINE, || {
        let pool = pool.clone();
        async move {
            let consuming: bool = sqlx::query_scalar(
                "SELECT status = 'active' AND capabilities->>'consuming' = 'true' FROM worker WHERE name = 'limited'",
            )
            .fetch_optional(&pool)
            .await
            .ok()??;
            consuming.then_some(())
        }
    })
    .await;
    let api = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    wait_for("the limited API to be ready", DEADLINE, || async {
        http.get(format!("{api}/readyz")).send().await.ok().filter(|r| r.status().is_success()).map(|_| ())
    })
    .await;
    let post = |path: String, body: Value| {
        let request = http.post(format!("{api}{path}")).bearer_auth(&system.token).json(&body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };

    // a success (the worker records it), a failure (its result goes through the executor), a
    // cancel (the API's notice stops the run)
    let (status, echo) =
        post("/api/v1/executions".into(), json!({"action_ref": "core.echo", "parameters": {"message": "m"}})).await;
    assert_eq!(status, 201, "{echo}");
    let (_, fail) =
        post("/api/v1/executions".into(), json!({"action_ref": "core.fail", "parameters": {"exit_code": 3}})).await;
    let gate = TempDir::new("broker-users-gate");
    let (_, held) = post(
        "/api/v1/executions".into(),
        json!({"action_ref": "e2e.gate", "parameters": {"gate": gate.path().join("gate")}}),
    )
    .await;
    let done = system.wait_terminal(id(&echo), DEADLINE).await;
    assert_eq!(done["status"], "completed", "{done}\n{}", logs_of("worker"));
    let done = system.wait_terminal(id(&fail), DEADLINE).await;
    assert_eq!(
        (done["status"].as_str(), done["exit_code"].as_i64()),
        (Some("failed"), Some(3)),
        "{done}\n{}",
        logs_of("executor")
    );
    wait_running(&system, id(&held)).await;
    let (status, canceled) = post(format!("/api/v1/executions/{}/cancel", id(&held)), json!({})).await;
    assert_eq!(status, 200, "{canceled}");
    wait_for("the cancel notice to stop the run", DEADLINE, || async {
        logs_of("worker").contains("cancel notice: stopping the action").then_some(())
    })
    .await;

    // live output, from the worker's user to the API's (a follow request on the control exchange,
    // the API's own queue bound to ns.output): more than one chunk, so not the stored output
    let (status, ticks) =
        post("/api/v1/executions".into(), json!({"action_ref": "e2e.ticks", "parameters": {"seconds": 3}})).await;
    assert_eq!(status, 201, "{ticks}");
    let response = http
        .get(format!("{api}/api/v1/executions/{}/output", id(&ticks)))
        .bearer_auth(&system.token)
        .send()
        .await
        .unwrap();
    let body = tokio::time::timeout(DEADLINE, response.text()).await.expect("the stream ends").unwrap();
    assert!(
        body.matches("event: stdout").count() >= 2 && body.contains("tick 3"),
        "live output, in chunks:\n{body}\n{}",
        logs_of("api")
    );
    assert!(body.contains(r#""status":"completed""#), "{body}");

    // and not more than the docs say: the API's user cannot take dead letters, nor a worker queue
    let connection = attune_common::mq::connect(&users.url("api"), "attune-test-limited").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    let dlq = format!("{}.dlq", system.namespace.name);
    let refused =
        channel.basic_consume(dlq.as_str().into(), "thief".into(), Default::default(), Default::default()).await;
    assert!(refused.is_err(), "the API's user consumed the dead-letter queue");
    let channel = connection.create_channel().await.unwrap();
    let queue = format!("{}.worker.1.ttl300.q2", system.namespace.name);
    let refused = channel.queue_declare(queue.as_str().into(), Default::default(), Default::default()).await;
    assert!(refused.is_err(), "the API's user declared a worker queue");
    let _ = connection.close(200, "done".into()).await;
    for service in ["api", "executor", "worker"] {
        let log = logs_of(service);
        assert!(!log.contains("ACCESS_REFUSED"), "the {service} was refused something it needs:\n{log}");
    }
    drop(children);
    drop(users);
    system.stop().await;
}

/// Live output that another broker user than the executing worker's publishes into a follower's
/// queue is not shown (issue 47): a worker sets `user_id` on its live output (which RabbitMQ checks
/// against the publishing connection's user) and records its broker user on its worker row; the
/// API shows only chunks whose `user_id` is the broker user of the worker the execution runs on.
/// The forger here is another worker's broker user, which learns the follower's queue from the
/// follow request on the control exchange, as any worker does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_output_from_another_worker_s_broker_user_is_not_shown() {
    use futures_util::StreamExt;
    use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions};
    let system = with_e2e().worker("w1", &[]).start().await;
    let users = BrokerUsers::create(&system.namespace.name);
    let gate = TempDir::new("forged-live");
    let gate_file = gate.path().join("gate");
    let running = id(&system.submit("e2e.gate", json!({"gate": gate_file})).await);
    wait_running(&system, running).await;

    // a spy on the control exchange, as every worker's control queue is bound to it
    let spy = attune_common::mq::connect(&attune_testkit::amqp_url(), "attune-test-spy").await.unwrap();
    let channel = spy.create_channel().await.unwrap();
    let exclusive = QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() };
    let queue = channel.queue_declare("".into(), exclusive, Default::default()).await.unwrap();
    let control = format!("{}.control", system.namespace.name);
    channel
        .queue_bind(
            queue.name().clone(),
            control.as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            Default::default(),
        )
        .await
        .unwrap();
    let no_ack = BasicConsumeOptions { no_ack: true, ..Default::default() };
    let mut follows =
        channel.basic_consume(queue.name().clone(), "spy".into(), no_ack, Default::default()).await.unwrap();

    // a follower: the API's stream, and the follow request naming its queue
    let response = system
        .http
        .get(format!("{}/api/v1/executions/{running}/output", system.api_url))
        .bearer_auth(&system.token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let follower = tokio::time::timeout(DEADLINE, async {
        loop {
            let delivery = follows.next().await.expect("the spy's consumer ends").unwrap();
            if let Ok(attune_common::mq::ControlMessage::Follow(request)) =
                attune_common::mq::ControlMessage::parse(&delivery.data)
                && request.execution_id == running
            {
                return request.follower;
            }
        }
    })
    .await
    .expect("a follow request for the execution");

    // another worker's broker user publishes a chunk into the follower's queue
    let forged = json!({"kind": "chunk", "execution_id": running, "stream": "stdout", "offset": 0, "length": 24,
        "text": "FORGED by another worker\n"})
    .to_string();
    let forger = attune_common::mq::connect(&users.url("worker"), "attune-test-forger").await.unwrap();
    let output = format!("{}.output", system.namespace.name);
    let publish = |properties: lapin::BasicProperties| {
        let (forger, output, follower, forged) = (&forger, &output, &follower, &forged);
        async move {
            let channel = forger.create_channel().await.unwrap();
            channel.confirm_select(Default::default()).await.unwrap();
            let confirm = channel
                .basic_publish(
                    output.as_str().into(),
                    follower.as_str().into(),
                    BasicPublishOptions { mandatory: true, ..Default::default() },
                    forged.as_bytes(),
                    properties.with_delivery_mode(1),
                )
                .await?
                .await?;
            Ok::<_, lapin::Error>(confirm)
        }
    };
    let confirm = publish(lapin::BasicProperties::default()).await.expect("the forger may publish live output");
    assert!(matches!(confirm, lapin::Confirmation::Ack(None)), "the forged chunk was not routed: {confirm:?}");
    // and it cannot claim to be the executing worker's user: the broker refuses the message
    let worker_user = reqwest::Url::parse(&attune_testkit::amqp_url()).unwrap().username().to_string();
    let impersonated = publish(lapin::BasicProperties::default().with_user_id(worker_user.as_str().into())).await;
    assert!(impersonated.is_err(), "the broker took a message with another user's user_id: {impersonated:?}");

    std::fs::write(&gate_file, "").unwrap();
    let body = tokio::time::timeout(DEADLINE, response.text()).await.expect("the stream ends").unwrap();
    assert!(body.contains(r#""status":"completed""#), "{body}");
    assert!(!body.contains("FORGED"), "the follower was shown another worker's chunk:\n{body}");
    let dropped = format!("live output dropped: not from the executing worker's broker user execution_id={running}");
    assert!(system.log("api").contains(&dropped), "{}", system.log("api"));
    let _ = forger.close(200, "done".into()).await;
    let _ = spy.close(200, "done".into()).await;
    drop(users);
    system.stop().await;
}
