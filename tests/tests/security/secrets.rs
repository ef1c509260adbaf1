//! The secret store and secret parameters against the real binaries (issue 32): two planted
//! values, one stored secret (referred to by name, and sent as an HTTP header) and one secret
//! parameter, reach the actions that need them, and then appear nowhere: not in any table, not
//! in any log, not in any API answer, for any role.

use std::time::Duration;

use attune_testkit::http_server::{HttpServer, Reply};
use attune_testkit::{System, TempPack};
use reqwest::Method;
use serde_json::{Value, json};

const STORED: &str = "planted-STORED-secret-4f2a9c";
const PARAMETER: &str = "planted-PARAMETER-secret-9c1d7e";

const SHOW: &str = "name: show
runtime: shell
entrypoint: actions/show.sh
max_retries: 0
parameters:
  token: {type: string, secret: true, required: true}
  api_key: {type: string, default: {$secret: shop}}
";
// what it was given, plainly (to be redacted) and transformed (to show it got the values: every
// letter changed, so that no piece of eight characters is the secret's, which would be redacted)
const SHOW_SH: &str = r#"#!/bin/sh
echo "token=$ATTUNE_PARAM_TOKEN api_key=$ATTUNE_PARAM_API_KEY"
echo "to stderr: $ATTUNE_PARAM_TOKEN" >&2
printf 'rot13=%s/%s\n' "$(printf %s "$ATTUNE_PARAM_TOKEN" | tr a-zA-Z n-za-mN-ZA-M)" "$(printf %s "$ATTUNE_PARAM_API_KEY" | tr a-zA-Z n-za-mN-ZA-M)"
printf '{"echo": "%s"}\n' "$ATTUNE_PARAM_API_KEY"
"#;
const CALL: &str = r#"name: call
runtime: http
max_retries: 0
http:
  method: GET
  url: "http://127.0.0.1:{{ port }}/echo"
  headers:
    Authorization: "Bearer {{ api_key }}"
parameters:
  port: {type: integer, required: true}
  api_key: {type: string, default: {$secret: shop}}
"#;

fn rot13(text: &str) -> String {
    let turn = |c: char, base: u8| char::from((c as u8 - base + 13) % 26 + base);
    text.chars()
        .map(|c| match c {
            'a'..='z' => turn(c, b'a'),
            'A'..='Z' => turn(c, b'A'),
            _ => c,
        })
        .collect()
}

fn assert_absent(what: &str, text: &str) {
    for planted in [STORED, PARAMETER] {
        assert!(!text.contains(planted), "{what} holds a planted secret ({planted}):\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_reach_the_actions_that_need_them_and_nothing_else() {
    let pack = TempPack::new("vault", &[("show.yaml", SHOW), ("show.sh", SHOW_SH), ("call.yaml", CALL)]);
    let system =
        System::builder().secrets_key().allow_http_to_loopback().pack(pack.path()).worker("w1", &[]).start().await;
    let server = HttpServer::start().await;
    server.script("/echo", [Reply::status(200).json(&json!({"you_sent": format!("Bearer {STORED}")}))]);

    // an admin sets the secret; the answer holds no value
    let (status, set) = system
        .request(
            Method::PUT,
            "/api/v1/secrets/shop",
            Some(&json!({"value": STORED, "users": ["vault"]})),
            Some(&system.token),
        )
        .await;
    assert_eq!(status, 200, "{set}");
    assert_eq!(set["name"], "shop");
    let mut answers = vec![set.to_string()];
    // an operator lists names; a read token may not
    let operator = system.cli(&["token", "create", "--name", "ops", "--role", "operator"]).trim().to_string();
    let reader = system.cli(&["token", "create", "--name", "viewer", "--role", "read"]).trim().to_string();
    let (status, listed) = system.request(Method::GET, "/api/v1/secrets", None, Some(&operator)).await;
    assert_eq!((status, listed[0]["name"].as_str()), (200, Some("shop")), "{listed}");
    answers.push(listed.to_string());
    let (status, _) = system.request(Method::GET, "/api/v1/secrets", None, Some(&reader)).await;
    assert_eq!(status, 403);
    let (status, _) =
        system.request(Method::PUT, "/api/v1/secrets/x", Some(&json!({"value": "v"})), Some(&operator)).await;
    assert_eq!(status, 403, "an operator sets no secret");

    // a secret parameter and a reference, to a script
    let (status, submitted) = system
        .request(
            Method::POST,
            "/api/v1/executions",
            Some(&json!({"action_ref": "vault.show", "parameters": {"token": PARAMETER}})),
            Some(&operator),
        )
        .await;
    assert_eq!(status, 201, "{submitted}");
    answers.push(submitted.to_string());
    assert_eq!(submitted["parameters"]["token"], "[redacted]", "{submitted}");
    assert_eq!(submitted["parameters"]["api_key"], json!({"$secret": "shop"}), "{submitted}");
    let shown = system.wait_terminal(submitted["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(shown["status"], "completed", "{shown}");
    let stdout = shown["stdout"].as_str().unwrap();
    assert!(stdout.contains("token=[redacted] api_key=[redacted]"), "{stdout}");
    assert!(
        stdout.contains(&format!("rot13={}/{}", rot13(PARAMETER), rot13(STORED))),
        "the script got the values: {stdout}"
    );
    assert_eq!(shown["result"], json!({"echo": "[redacted]"}));
    assert!(shown["stderr"].as_str().unwrap().contains("to stderr: [redacted]"), "{shown}");

    // a reference as an HTTP header: the server gets the value, the record does not
    let (status, called) = system
        .request(
            Method::POST,
            "/api/v1/executions",
            Some(&json!({"action_ref": "vault.call", "parameters": {"port": server.port()}})),
            Some(&operator),
        )
        .await;
    assert_eq!(status, 201, "{called}");
    let called = system.wait_terminal(called["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(called["status"], "completed", "{called}");
    let received = server.requests_to("/echo");
    assert_eq!(received[0].header("authorization"), Some(format!("Bearer {STORED}").as_str()));
    assert_eq!(called["result"]["body"]["you_sent"], "Bearer [redacted]", "{called}");

    // a manual retry runs with the same secrets, sealed as they were
    let id = shown["id"].as_i64().unwrap();
    let (status, retried) =
        system.request(Method::POST, &format!("/api/v1/executions/{id}/retry"), None, Some(&operator)).await;
    assert_eq!(status, 201, "{retried}");
    let retried = system.wait_terminal(retried["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(retried["status"], "completed", "{retried}");
    assert!(retried["stdout"].as_str().unwrap().contains(&rot13(PARAMETER)), "{retried}");

    // every answer, for every role
    for token in [&system.token, &operator, &reader] {
        for path in [
            format!("/api/v1/executions/{id}"),
            "/api/v1/executions?fields=full&limit=100".to_string(),
            format!("/api/v1/executions/{id}/chain"),
            format!("/api/v1/executions/{}", called["id"]),
        ] {
            let (status, answer) = system.request(Method::GET, &path, None, Some(token)).await;
            assert_eq!(status, 200, "{path}: {answer}");
            answers.push(answer.to_string());
        }
    }
    // and what anyone may read without a token
    for path in ["/metrics", "/readyz", "/healthz"] {
        let answer = reqwest::get(format!("{}{path}", system.api_url)).await.unwrap().text().await.unwrap();
        answers.push(answer);
    }
    for answer in &answers {
        assert_absent("an API answer", answer);
    }
    // every table
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
            .fetch_all(&system.db.pool)
            .await
            .unwrap();
    assert!(tables.contains(&"secret".to_string()) && tables.len() > 10, "{tables:?}");
    for table in &tables {
        let text: Option<String> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT string_agg(t::text, ' ') FROM \"{table}\" t")))
                .fetch_one(&system.db.pool)
                .await
                .unwrap();
        assert_absent(&format!("table {table}"), &text.unwrap_or_default());
    }
    // every log
    let logs = system.packs_dir().parent().unwrap().to_path_buf();
    let mut read = 0;
    for entry in std::fs::read_dir(&logs).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            assert_absent(&path.display().to_string(), &std::fs::read_to_string(&path).unwrap());
            read += 1;
        }
    }
    assert!(read >= 3, "the api, executor and worker logs were read ({read})");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_secrets_are_refused_at_the_door_and_a_missing_secret_fails_the_run() {
    let pack = TempPack::new("vault", &[("show.yaml", SHOW), ("show.sh", SHOW_SH)]);
    let system =
        System::builder().env("ATTUNE_WORKER_WAIT_SECS", "2").pack(pack.path()).worker("w1", &[]).start().await;
    let (status, refused) = system
        .request(
            Method::PUT,
            "/api/v1/secrets/shop",
            Some(&json!({"value": "v", "users": ["vault"]})),
            Some(&system.token),
        )
        .await;
    assert_eq!((status, refused["error"]["parameter"].as_str()), (422, Some("value")), "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("ATTUNE_SECRETS_KEY_FILE"), "{refused}");
    let (status, refused) = system
        .request(
            Method::POST,
            "/api/v1/executions",
            Some(&json!({"action_ref": "vault.show", "parameters": {"token": PARAMETER}})),
            Some(&system.token),
        )
        .await;
    assert_eq!((status, refused["error"]["parameter"].as_str()), (422, Some("parameters.token")), "{refused}");
    // a reference (here to a secret that is not set) with no key on any worker: no worker is given
    // the run, which fails as the platform's fault once it waited ATTUNE_WORKER_WAIT_SECS, naming
    // the key
    let (status, submitted) = system
        .request(
            Method::POST,
            "/api/v1/executions",
            Some(&json!({"action_ref": "vault.show", "parameters": {"token": {"$secret": "nowhere"}}})),
            Some(&system.token),
        )
        .await;
    assert_eq!(status, 201, "{submitted}");
    let done = system.wait_terminal(submitted["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!((done["status"].as_str(), done["failure_kind"].as_str()), (Some("failed"), Some("worker_unavailable")));
    assert!(done["error"].as_str().unwrap().contains("ATTUNE_SECRETS_KEY_FILE"), "{done}");
    assert_eq!(done["worker"], Value::Null, "no worker was given it: {done}");
    system.stop().await;
}

/// Issue 46: a database error that passes (here the answer to the worker's read of the secret
/// store lost on the way, as in a failover) is tried again, and the run goes on; it never ends
/// `invalid_parameters` (final, and nothing was wrong with them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_from_the_secret_store_is_read_again_and_the_run_goes_on() {
    use attune_testkit::pgcut::PgCut;
    let pack = TempPack::new("vault", &[("show.yaml", SHOW), ("show.sh", SHOW_SH)]);
    let mut system = System::builder().secrets_key().pack(pack.path()).start().await;
    let cut = PgCut::start("127.0.0.1:5432").await;
    system.restart_with("w1", &[("DATABASE_URL", &cut.url(&system.db.url))]);
    system.wait_consuming("w1").await;
    let (status, _) = system
        .request(
            Method::PUT,
            "/api/v1/secrets/shop",
            Some(&json!({"value": STORED, "users": ["vault.show"]})),
            Some(&system.token),
        )
        .await;
    assert_eq!(status, 200);
    cut.arm("run_secrets");
    let submitted = system.submit("vault.show", json!({"token": "plain"})).await;
    let done = system.wait_terminal(submitted["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(cut.sprung(), 1, "the worker's read of the store lost its answer");
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done["stdout"].as_str().unwrap().contains("rot13=cynva/"), "{done}");
    system.stop().await;
}

/// The output a run keeps is its tail, cut before redaction could see a whole value (issue 47):
/// a secret that straddles the cut, and one of which the action prints only a part, leave no
/// piece of eight characters or more in the record (the live stream's pieces: `worker::live`'s
/// tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_piece_of_a_secret_survives_the_cut_of_the_output_or_a_part_printed() {
    const CUT: &str = "name: cut
runtime: shell
entrypoint: actions/cut.sh
max_retries: 0
limits: {output_kb: 1}
parameters:
  token: {type: string, secret: true, required: true}
";
    // the token, then as much filler as leaves 28 of its 32 characters in the last KiB; on
    // stderr its middle alone (characters 5 to 24)
    const CUT_SH: &str = r#"#!/bin/sh
printf '%s' "$ATTUNE_PARAM_TOKEN"
head -c 996 /dev/zero | tr '\0' 'x'
echo
printf 'part: %s\n' "$(printf %s "$ATTUNE_PARAM_TOKEN" | cut -c5-24)" >&2
"#;
    const TOKEN: &str = "planted-CUT-secret-0123456789abc";
    assert_eq!(TOKEN.len(), 32);
    let pack = TempPack::new("cutting", &[("cut.yaml", CUT), ("cut.sh", CUT_SH)]);
    let system = System::builder().secrets_key().pack(pack.path()).worker("w1", &[]).start().await;
    let (status, submitted) = system
        .request(
            Method::POST,
            "/api/v1/executions",
            Some(&json!({"action_ref": "cutting.cut", "parameters": {"token": TOKEN}})),
            Some(&system.token),
        )
        .await;
    assert_eq!(status, 201, "{submitted}");
    let id = submitted["id"].as_i64().unwrap();
    let shown = system.wait_terminal(id, Duration::from_secs(60)).await;
    assert_eq!(shown["status"], "completed", "{shown}");
    let stdout = shown["stdout"].as_str().unwrap();
    assert!(stdout.contains("bytes truncated"), "the output was cut: {stdout}");
    let pieces: Vec<&str> = (0..=TOKEN.len() - 8).map(|at| &TOKEN[at..at + 8]).collect();
    let text = shown.to_string();
    for piece in &pieces {
        assert!(!text.contains(piece), "the record holds {piece:?}, a piece of the secret:\n{text}");
    }
    assert!(shown["stderr"].as_str().unwrap().contains("part: [redacted]"), "{shown}");
    system.stop().await;
}

/// A reference to a secret stands for a value the action declared (issue 47): a parameter's
/// `enum` holds for the value the secret opens to, checked at the worker before the action runs,
/// and a value outside it fails the run `invalid_parameters`, naming the parameter and not
/// showing the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_s_value_is_held_to_its_parameter_s_enum() {
    const DEPLOY: &str = "name: deploy
runtime: shell
entrypoint: actions/deploy.sh
max_retries: 0
parameters:
  strategy: {type: string, enum: [blue-green, rolling-update], default: {$secret: strategy}}
";
    const DEPLOY_SH: &str = "#!/bin/sh\necho \"ran with $ATTUNE_PARAM_STRATEGY\"\n";
    let pack = TempPack::new("ship", &[("deploy.yaml", DEPLOY), ("deploy.sh", DEPLOY_SH)]);
    let system = System::builder().secrets_key().pack(pack.path()).worker("w1", &[]).start().await;
    let set = |value: &'static str| {
        let system = &system;
        async move {
            let body = json!({"value": value, "users": ["ship"]});
            let (status, answer) =
                system.request(Method::PUT, "/api/v1/secrets/strategy", Some(&body), Some(&system.token)).await;
            assert_eq!(status, 200, "{answer}");
        }
    };
    set("everything-at-once; curl evil").await;
    let refused = system.submit("ship.deploy", json!({})).await;
    let refused = system.wait_terminal(refused["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(
        (refused["status"].as_str(), refused["failure_kind"].as_str()),
        (Some("failed"), Some("invalid_parameters")),
        "{refused:#}"
    );
    let error = refused["error"].as_str().unwrap_or_default();
    assert!(error.contains("parameter 'strategy'") && error.contains("not one of"), "{refused:#}");
    assert!(!refused.to_string().contains("curl evil"), "the value is not shown: {refused:#}");
    assert_eq!(refused["stdout"].as_str().unwrap_or_default(), "", "the action did not run: {refused:#}");
    // an explicit reference is held to it too
    let explicit = system.submit("ship.deploy", json!({"strategy": {"$secret": "strategy"}})).await;
    let explicit = system.wait_terminal(explicit["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(explicit["failure_kind"], "invalid_parameters", "{explicit:#}");

    set("rolling-update").await;
    let ran = system.submit("ship.deploy", json!({})).await;
    let ran = system.wait_terminal(ran["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(ran["status"], "completed", "{ran:#}");
    assert_eq!(ran["stdout"], "ran with [redacted]\n", "{ran:#}");
    system.stop().await;
}

/// A secret reaches only the actions it names as its users (issue 47): before, an operator
/// could pass any stored secret to any action, `core.echo` say, and read it in the output. A new
/// secret must name them; a reference in the parameters of another action is refused at the
/// door, naming the parameter, and a worker opens no such secret even for an execution written
/// past the API (`run_secrets`), which fails as `invalid_parameters`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_only_the_actions_it_names_as_its_users() {
    let pack = TempPack::new("vault", &[("show.yaml", SHOW), ("show.sh", SHOW_SH)]);
    let system = System::builder().secrets_key().pack(pack.path()).worker("w1", &[]).start().await;
    let put = |body: Value| {
        let system = &system;
        async move { system.request(Method::PUT, "/api/v1/secrets/shop", Some(&body), Some(&system.token)).await }
    };
    let (status, refused) = put(json!({"value": STORED})).await;
    assert_eq!((status, refused["error"]["parameter"].as_str()), (422, Some("users")), "{refused}");
    let (status, refused) = put(json!({"value": STORED, "users": ["not an action!"]})).await;
    assert_eq!((status, refused["error"]["parameter"].as_str()), (422, Some("users")), "{refused}");
    let (status, set) = put(json!({"value": STORED, "users": ["vault.show"]})).await;
    assert_eq!((status, &set["users"]), (200, &json!(["vault.show"])), "{set}");
    // `attune secret set` again without --users keeps them (the API is always told them)
    let mut cli = system.command("attune");
    cli.args(["secret", "set", "shop", "--output", "json"])
        .env("ATTUNE_API_URL", &system.api_url)
        .env("ATTUNE_TOKEN", &system.token)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cli.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), STORED.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let set: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(set["users"], json!(["vault.show"]), "{set}");

    // another action's reference: refused at the door, for a submission and a schedule alike
    let elsewhere = json!({"message": {"$secret": "shop"}});
    let (status, refused) = system
        .request(
            Method::POST,
            "/api/v1/executions",
            Some(&json!({"action_ref": "core.echo", "parameters": elsewhere})),
            Some(&system.token),
        )
        .await;
    assert_eq!((status, refused["error"]["parameter"].as_str()), (422, Some("parameters.message")), "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("not for core.echo"), "{refused}");
    let at = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let (status, refused) = system
        .request(
            Method::POST,
            "/api/v1/schedules",
            Some(&json!({"name": "leak", "action_ref": "core.echo", "parameters": elsewhere, "at": at})),
            Some(&system.token),
        )
        .await;
    assert_eq!((status, refused["error"]["parameter"].as_str()), (422, Some("parameters.message")), "{refused}");

    // written past the API, the worker opens nothing of it
    let echo = attune_common::db::action::get_by_ref(&system.db.pool, "core.echo").await.unwrap().unwrap();
    let new = attune_common::db::execution::NewExecution {
        parameters: elsewhere.clone(),
        ..attune_testkit::echo_execution(&echo)
    };
    let forged = attune_common::db::execution::insert(&system.db.pool, &new).await.unwrap().id;
    let failed = system.wait_terminal(forged, Duration::from_secs(60)).await;
    assert_eq!(
        (failed["status"].as_str(), failed["failure_kind"].as_str()),
        (Some("failed"), Some("invalid_parameters")),
        "{failed}"
    );
    assert!(failed["error"].as_str().unwrap().contains("not set, or not for core.echo"), "{failed}");
    assert_absent("the forged run", &failed.to_string());

    // its own user gets it
    let done = system.submit("vault.show", json!({"token": "plain"})).await;
    let done = system.wait_terminal(done["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done["stdout"].as_str().unwrap().contains(&format!("/{}", rot13(STORED))), "{done}");
    system.stop().await;
}

/// A secret reference is checked like the value it stands for (issue 47): a parameter's
/// `pattern` and length hold a plain value at the door and an opened secret at the worker, which
/// fails the run as `invalid_parameters` before the action starts, without showing the value.
/// Before, the pack format had no pattern or length, so a `{"$secret": …}` reached a command
/// word's parameter whatever it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_s_value_is_held_to_its_parameter_s_pattern_and_length() {
    const RESTART: &str = "name: restart
runtime: shell
entrypoint: actions/restart.sh
max_retries: 0
parameters:
  unit: {type: string, pattern: '[a-z][a-z0-9-]*', max_length: 16, required: true}
";
    const RESTART_SH: &str = "#!/bin/sh\necho \"restarting $ATTUNE_PARAM_UNIT\"\n";
    let pack = TempPack::new("svc", &[("restart.yaml", RESTART), ("restart.sh", RESTART_SH)]);
    let system = System::builder().secrets_key().pack(pack.path()).worker("w1", &[]).start().await;
    // a plain value: at the door
    let (status, refused) = system
        .request(
            Method::POST,
            "/api/v1/executions",
            Some(&json!({"action_ref": "svc.restart", "parameters": {"unit": "nginx; curl evil"}})),
            Some(&system.token),
        )
        .await;
    assert_eq!((status, refused["error"]["parameter"].as_str()), (422, Some("parameters.unit")), "{refused}");
    // an opened secret: at the worker
    for (value, rule) in [("nginx;curl-evil", "pattern"), ("a-unit-name-far-too-long", "at most 16")] {
        let body = json!({"value": value, "users": ["svc"]});
        let (status, _) = system.request(Method::PUT, "/api/v1/secrets/unit", Some(&body), Some(&system.token)).await;
        assert_eq!(status, 200);
        let run = system.submit("svc.restart", json!({"unit": {"$secret": "unit"}})).await;
        let run = system.wait_terminal(run["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
        assert_eq!(
            (run["status"].as_str(), run["failure_kind"].as_str()),
            (Some("failed"), Some("invalid_parameters")),
            "{run:#}"
        );
        let error = run["error"].as_str().unwrap_or_default();
        assert!(error.contains("parameter 'unit'") && error.contains(rule), "{run:#}");
        assert!(!run.to_string().contains(value), "the value is not shown: {run:#}");
        assert_eq!(run["stdout"].as_str().unwrap_or_default(), "", "the action did not run: {run:#}");
    }
    let body = json!({"value": "nginx-main", "users": ["svc"]});
    let (status, _) = system.request(Method::PUT, "/api/v1/secrets/unit", Some(&body), Some(&system.token)).await;
    assert_eq!(status, 200);
    let ran = system.submit("svc.restart", json!({"unit": {"$secret": "unit"}})).await;
    let ran = system.wait_terminal(ran["id"].as_i64().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(
        (ran["status"].as_str(), ran["stdout"].as_str()),
        (Some("completed"), Some("restarting [redacted]\n")),
        "{ran:#}"
    );
    system.stop().await;
}

fn key_file(tag: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("attune-{tag}-key-{:016x}", rand::random::<u64>()));
    let key: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    std::fs::write(&path, key).unwrap();
    path
}

/// The key rotates without downtime (issue 47): the services take the new key with the old one
/// as a previous key (`ATTUNE_SECRETS_PREVIOUS_KEY_FILES`), one at a time; `attune secret reseal`
/// seals the store and every schedule's and execution's sealed parameters again with the new
/// key; then the old key goes, and a run that waited through the rotation, a retry of one that
/// finished before it and a schedule's next run still get their values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_rotates_without_downtime_and_the_old_key_goes() {
    let (old, new) = (key_file("old"), key_file("new"));
    let (old, new) = (old.to_str().unwrap().to_string(), new.to_str().unwrap().to_string());
    let pack = TempPack::new("vault", &[("show.yaml", SHOW), ("show.sh", SHOW_SH)]);
    let mut system =
        System::builder().env("ATTUNE_SECRETS_KEY_FILE", &old).pack(pack.path()).worker("w1", &[]).start().await;
    let body = json!({"value": STORED, "users": ["vault"]});
    let (status, _) = system.request(Method::PUT, "/api/v1/secrets/shop", Some(&body), Some(&system.token)).await;
    assert_eq!(status, 200);
    let before = system.submit("vault.show", json!({"token": PARAMETER})).await["id"].as_i64().unwrap();
    assert_eq!(system.wait_terminal(before, Duration::from_secs(60)).await["status"], "completed");
    // one waits through the rotation, sealed with the old key
    system.cli(&["pause", "action", "vault.show", "--reason", "key rotation"]);
    let waiting = system.submit("vault.show", json!({"token": PARAMETER})).await["id"].as_i64().unwrap();
    // and a schedule, whose runs are given its sealed token
    let at = (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339();
    let schedule = json!({"name": "nightly", "action_ref": "vault.show", "parameters": {"token": PARAMETER}, "at": at});
    let (status, schedule) =
        system.request(Method::POST, "/api/v1/schedules", Some(&schedule), Some(&system.token)).await;
    assert_eq!(status, 201, "{schedule}");

    // one service at a time: the worker, then the API, each with the new key and the old one
    let rotating = [("ATTUNE_SECRETS_KEY_FILE", new.as_str()), ("ATTUNE_SECRETS_PREVIOUS_KEY_FILES", old.as_str())];
    system.restart_with("w1", &rotating);
    system.wait_consuming("w1").await;
    system.restart_with("api", &rotating);
    system.wait_ready().await;
    let reseal = |keys: &[(&str, &str)]| {
        let mut command = std::process::Command::new(attune_testkit::workspace_binary("attune"));
        command.args(["secret", "reseal", "--output", "json"]).env("DATABASE_URL", &system.db.url);
        command.env_remove("ATTUNE_SECRETS_PREVIOUS_KEY_FILES");
        for (name, value) in keys {
            command.env(name, value);
        }
        command.output().unwrap()
    };
    let out = reseal(&rotating);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((done["secrets"].as_u64(), done["unopenable"].as_array().map(Vec::len)), (Some(1), Some(0)), "{done}");
    assert_eq!(done["parameters"], 2, "the finished run's and the waiting one's sealed token: {done}");
    assert_eq!(done["schedule_parameters"], 1, "the schedule's sealed token: {done}");
    let again: Value = serde_json::from_slice(&reseal(&rotating).stdout).unwrap();
    assert_eq!(
        (again["secrets"].as_u64(), again["parameters"].as_u64(), again["schedule_parameters"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{again}"
    );
    // sealed with the old key alone, nothing opens any more
    let out = reseal(&[("ATTUNE_SECRETS_KEY_FILE", old.as_str())]);
    assert!(!out.status.success(), "the old key opens nothing now");

    // the old key goes everywhere
    let after = [("ATTUNE_SECRETS_KEY_FILE", new.as_str())];
    system.restart_with("w1", &after);
    system.wait_consuming("w1").await;
    system.restart_with("api", &after);
    system.wait_ready().await;
    std::fs::remove_file(&old).unwrap();
    system.cli(&["resume", "action", "vault.show"]);
    let (status, retry) =
        system.request(Method::POST, &format!("/api/v1/executions/{before}/retry"), None, Some(&system.token)).await;
    assert_eq!(status, 201, "{retry}");
    // the schedule's next run (made now, as its executor would when it is due)
    let fired: i64 = sqlx::query_scalar("SELECT schedule_fire($1, now(), 300)")
        .bind(schedule["id"].as_i64().unwrap())
        .fetch_one(&system.db.pool)
        .await
        .unwrap();
    for id in [waiting, retry["id"].as_i64().unwrap(), fired] {
        let done = system.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(done["status"], "completed", "{done:#}");
        let stdout = done["stdout"].as_str().unwrap();
        assert!(stdout.contains(&format!("rot13={}/{}", rot13(PARAMETER), rot13(STORED))), "{stdout}");
    }
    system.stop().await;
}

/// The secrets key is needed only by the workers that run secrets (issue 47): a worker without
/// `ATTUNE_SECRETS_KEY_FILE` says so (`opens_secrets: false`) and is given only runs whose
/// parameters need no key; one that needs it waits for a worker with the key, and fails as the
/// retriable `worker_unavailable`, naming the setting, when none offers its runtime for
/// `ATTUNE_WORKER_WAIT_SECS`. Before, such a run reached a keyless worker and failed as
/// `invalid_parameters`, the request's fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_workers_with_the_key_are_given_runs_that_need_it() {
    let pack = TempPack::new("vault", &[("show.yaml", SHOW), ("show.sh", SHOW_SH)]);
    let mut system = System::builder()
        .secrets_key()
        .env("ATTUNE_WORKER_WAIT_SECS", "3")
        .pack(pack.path())
        .worker("keyed", &[])
        .worker("keyless", &[("ATTUNE_SECRETS_KEY_FILE", "")])
        .start()
        .await;
    let body = json!({"value": STORED, "users": ["vault"]});
    let (status, _) = system.request(Method::PUT, "/api/v1/secrets/shop", Some(&body), Some(&system.token)).await;
    assert_eq!(status, 200);
    let workers: Vec<(String, i64, Option<Value>)> =
        sqlx::query_as("SELECT name, id, capabilities->'opens_secrets' FROM worker ORDER BY name")
            .fetch_all(&system.db.pool)
            .await
            .unwrap();
    let keyed = workers[0].1;

    // runs with secrets, all at once: every one on the worker with the key
    let mut ids = Vec::new();
    for _ in 0..8 {
        ids.push(system.submit("vault.show", json!({"token": PARAMETER})).await["id"].as_i64().unwrap());
    }
    for id in ids {
        let done = system.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!((done["status"].as_str(), done["worker"].as_i64()), (Some("completed"), Some(keyed)), "{done:#}");
    }
    assert_eq!(
        workers.iter().map(|(n, _, o)| (n.as_str(), o.clone())).collect::<Vec<_>>(),
        [("keyed", Some(json!(true))), ("keyless", Some(json!(false)))],
        "each worker says whether it holds the key"
    );

    // with the key on no worker: plain runs go on, one with secrets fails as the platform's fault
    system.restart_with("keyed", &[("ATTUNE_SECRETS_KEY_FILE", "")]);
    let pool = system.db.pool.clone();
    attune_testkit::wait_for("the restarted worker to say it has no key", Duration::from_secs(60), || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(
                "SELECT true FROM worker WHERE name = 'keyed' AND status = 'active' \
                 AND capabilities->>'opens_secrets' = 'false' AND capabilities->>'consuming' = 'true'",
            )
            .fetch_optional(&pool)
            .await
            .ok()
            .flatten()
        }
    })
    .await;
    let plain = system.submit("core.echo", json!({"message": "plain"})).await["id"].as_i64().unwrap();
    assert_eq!(system.wait_terminal(plain, Duration::from_secs(60)).await["status"], "completed");
    let stranded = system.submit("vault.show", json!({"token": PARAMETER})).await["id"].as_i64().unwrap();
    let stranded = system.wait_terminal(stranded, Duration::from_secs(60)).await;
    assert_eq!(
        (stranded["status"].as_str(), stranded["failure_kind"].as_str(), stranded["worker"].as_i64()),
        (Some("failed"), Some("worker_unavailable"), None),
        "{stranded:#}"
    );
    assert!(stranded["error"].as_str().unwrap().contains("ATTUNE_SECRETS_KEY_FILE"), "{stranded:#}");
    system.stop().await;
}
