//! What the API says without a token says nothing an outsider should not learn (issue 32):
//! `/readyz` names which dependency is away, never its address or its error; the reason goes to
//! the log.

use std::process::Stdio;
use std::time::Duration;

use attune_testkit::system::repo_root;
use attune_testkit::{TestDb, wait_for, workspace_binary};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_the_dependency_that_is_away_and_nothing_of_it() {
    let db = TestDb::new().await;
    let dir = repo_root().join("target/test-logs").join(format!("probes-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(dir.join("packs")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // a broker that is not there: a port nothing listens on, with credentials in its URL
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log = std::fs::File::create(dir.join("api.log")).unwrap();
    let mut api = tokio::process::Command::new(workspace_binary("attune-api"))
        .kill_on_drop(true)
        .env("DATABASE_URL", &db.url)
        .env("AMQP_URL", format!("amqp://secretuser:secretpass@127.0.0.1:{closed}/%2f"))
        .env("ATTUNE_API_ADDR", format!("127.0.0.1:{port}"))
        .env("ATTUNE_PACKS_DIR", dir.join("packs"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let readyz = format!("http://127.0.0.1:{port}/readyz");
    let (status, body) = wait_for("the API to answer /readyz", Duration::from_secs(60), || {
        let (http, readyz) = (http.clone(), readyz.clone());
        async move {
            let response = http.get(&readyz).send().await.ok()?;
            let status = response.status().as_u16();
            Some((status, response.json::<Value>().await.ok()?))
        }
    })
    .await;
    assert_eq!(status, 503);
    assert_eq!(body, json!({"ready": false, "database": "ok", "broker": "unavailable"}));
    let text = body.to_string();
    for secret in ["secretuser", "secretpass", &closed.to_string(), "refused", "127.0.0.1"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    // the operator still learns why, from the log
    let logged = std::fs::read_to_string(dir.join("api.log")).unwrap();
    assert!(logged.contains("not ready"), "{logged}");
    let _ = api.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
    db.drop_database().await;
}
