//! Slow and greedy clients against a real `attune-api` (issue 32): clients that pipeline
//! requests and never read the answers, on every connection slot, with and without a token.
//! Each was a hole: the slots stayed held for as long as the clients wished, a fresh request (with
//! a token or without) waited for ever, and SIGTERM waited for the clients to leave.

use std::time::{Duration, Instant};

use attune_testkit::api::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// No cap on the requests of one connection, which would close a pinner's connection by itself.
const UNCAPPED: (&str, &str) = ("ATTUNE_API_MAX_REQUESTS_PER_CONNECTION", "1000000000");

/// A client that takes a slot (one request answered), then pipelines `GET /healthz` without
/// reading. With `token` its first request is an authenticated one. The task ends when a write
/// fails: the server closed the connection.
async fn pinner(addr: &str, token: Option<&str>) -> JoinHandle<std::io::Error> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let first = match token {
        Some(token) => {
            format!("GET /api/v1/executions?limit=1 HTTP/1.1\r\nHost: attune\r\nAuthorization: Bearer {token}\r\n\r\n")
        }
        None => "GET /healthz HTTP/1.1\r\nHost: attune\r\n\r\n".to_string(),
    };
    stream.write_all(first.as_bytes()).await.unwrap();
    let mut answer = [0u8; 12];
    stream.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200", "the pinner's first request is answered");
    tokio::spawn(async move {
        let burst = "GET /healthz HTTP/1.1\r\nHost: attune\r\n\r\n".repeat(1000);
        loop {
            if let Err(error) = stream.write_all(burst.as_bytes()).await {
                return error;
            }
        }
    })
}

/// A fresh `GET /healthz` (no token) answered within `within`.
async fn healthz(api: &Api, within: Duration) -> Result<u16, String> {
    let request = api.http.get(format!("{}/healthz", api.url)).timeout(within).send();
    request.await.map(|r| r.status().as_u16()).map_err(|e| e.to_string())
}

async fn closed_within(pinner: JoinHandle<std::io::Error>, within: Duration, what: &str) -> std::io::Error {
    tokio::time::timeout(within, pinner)
        .await
        .unwrap_or_else(|_| panic!("{what}: its connection still open after {within:?}"))
        .unwrap()
}

#[tokio::test]
async fn a_client_that_never_reads_its_answers_loses_its_connection() {
    let api = Api::start(&[("ATTUNE_API_WRITE_TIMEOUT_SECS", "2"), UNCAPPED], None).await;
    let started = Instant::now();
    let pinner = pinner(&api.addr, Some(&api.token)).await;
    // its socket buffers fill first (a few MB of answers), then the 2 s run
    let error = closed_within(pinner, Duration::from_secs(30), "a client that reads nothing").await;
    eprintln!("closed after {:?}: {error}", started.elapsed());
    assert_eq!(healthz(&api, Duration::from_secs(5)).await, Ok(200));
    api.stop().await;
}

#[tokio::test]
async fn connections_held_without_a_token_make_room_for_others_oldest_first() {
    let api =
        Api::start(&[("ATTUNE_API_MAX_CONNECTIONS", "8"), ("ATTUNE_API_WRITE_TIMEOUT_SECS", "600"), UNCAPPED], None)
            .await;
    // the oldest holds a token; the 7 after it do not
    let trusted = pinner(&api.addr, Some(&api.token)).await;
    let mut untrusted = Vec::new();
    for _ in 0..7 {
        untrusted.push(pinner(&api.addr, None).await);
    }
    // every slot is held: a fresh client (with a token or without) is answered, and the oldest
    // connection without a token is closed to make room; the fresh ones pin in turn
    let answered = api
        .http
        .get(format!("{}/api/v1/executions?limit=1", api.url))
        .bearer_auth(&api.token)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map(|r| r.status().as_u16());
    assert_eq!(answered.ok(), Some(200), "an authenticated request while every slot is held");
    closed_within(untrusted.remove(0), Duration::from_secs(10), "the oldest connection without a token").await;
    // that client's connection closed after its answer: its slot is free for the next
    untrusted.push(pinner(&api.addr, None).await);
    for _ in 0..10 {
        let fresh = tokio::time::timeout(Duration::from_secs(10), pinner(&api.addr, None))
            .await
            .expect("a fresh client (no token) is answered while every slot is held");
        untrusted.push(fresh);
        closed_within(untrusted.remove(0), Duration::from_secs(10), "the next oldest connection without a token").await;
    }
    // the connection that carried a token was never closed for another
    assert!(!trusted.is_finished(), "the connection with a token was closed");
    trusted.abort();
    api.stop().await;
}

#[tokio::test]
async fn sigterm_ends_the_api_within_its_shutdown_timeout_while_a_request_waits_on_the_database() {
    let mut api = Api::start(
        &[
            ("ATTUNE_API_WRITE_TIMEOUT_SECS", "600"),
            ("ATTUNE_API_REQUEST_TIMEOUT_SECS", "600"),
            ("ATTUNE_DB_LOCK_TIMEOUT_SECS", "600"),
            ("ATTUNE_API_SHUTDOWN_TIMEOUT_SECS", "2"),
            UNCAPPED,
        ],
        None,
    )
    .await;
    let pinners = [pinner(&api.addr, None).await, pinner(&api.addr, Some(&api.token)).await];
    // a submission whose insert waits on a lock held by someone else, for as long as it is held
    let mut holder = api.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE execution IN EXCLUSIVE MODE").execute(&mut *holder).await.unwrap();
    let submission = api
        .http
        .post(format!("{}/api/v1/executions", api.url))
        .bearer_auth(&api.token)
        .json(&serde_json::json!({"action_ref": "core.noop"}))
        .send();
    let submission = tokio::spawn(submission);
    attune_testkit::wait_for("the submission's insert to wait on the lock", Duration::from_secs(30), || async {
        let waiting: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'execution'::regclass")
                .fetch_one(&api.db.pool)
                .await
                .unwrap();
        (waiting > 0).then_some(())
    })
    .await;
    let pid = api.child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let started = Instant::now();
    let exited = tokio::time::timeout(Duration::from_secs(8), api.child.wait()).await;
    holder.rollback().await.unwrap();
    assert!(exited.is_ok(), "the API still runs 8 s after SIGTERM with 2 s to shut down");
    eprintln!("exited {:?} after SIGTERM", started.elapsed());
    assert!(submission.await.unwrap().is_err(), "the waiting submission's connection was closed, unanswered");
    for pinner in pinners {
        closed_within(pinner, Duration::from_secs(5), "a client of the API that exited").await;
    }
    api.stop().await;
}

#[tokio::test]
async fn a_connection_answers_at_most_its_share_of_pipelined_requests_then_closes() {
    let api = Api::start(&[("ATTUNE_API_MAX_REQUESTS_PER_CONNECTION", "20")], None).await;
    let mut stream = TcpStream::connect(&api.addr).await.unwrap();
    // 100 requests in one write (3.9 kB: read by the server at once, so its close sends no reset)
    stream.write_all("GET /healthz HTTP/1.1\r\nHost: attune\r\n\r\n".repeat(100).as_bytes()).await.unwrap();
    let mut answers = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answers)).await;
    let answers = String::from_utf8_lossy(&answers);
    let count = answers.matches("HTTP/1.1 200").count();
    assert!(read.is_ok(), "the connection was not closed after its share ({count} answers read)");
    assert_eq!(count, 20, "answers on one connection");
    assert!(answers.to_ascii_lowercase().contains("connection: close"), "the last answer says it closes");
    api.stop().await;
}

/// A token of `role` made in `api`'s database.
async fn token_of(api: &Api, role: attune_common::db::token::Role) -> String {
    attune_common::db::token::create_with(&api.db.pool, &format!("{role}-streams"), role, None).await.unwrap().1
}

/// An execution that stays unfinished: nothing runs beside this API.
async fn unfinished(api: &Api) -> i64 {
    let (status, execution) =
        api.post("/api/v1/executions", &serde_json::json!({"action_ref": "core.noop"}), None).await;
    assert_eq!(status, 201, "{execution}");
    execution["id"].as_i64().unwrap()
}

/// `GET /api/v1/executions/{id}/output` with `token`, its answer's head within 10 s (the body
/// is left to stream).
async fn open_stream(api: &Api, id: i64, token: &str) -> Result<reqwest::Response, String> {
    let request = api.http.get(format!("{}/api/v1/executions/{id}/output", api.url)).bearer_auth(token);
    tokio::time::timeout(Duration::from_secs(10), request.send())
        .await
        .map_err(|_| "no answer within 10 s".to_string())?
        .map_err(|e| e.to_string())
}

/// The review's repro (issue 47): with 4 connection slots, 4 live output streams of a read token
/// held every slot, and the admin's requests and `/healthz` waited for ever. Streams have a
/// budget of their own now, apart from the request slots: the probes and other clients are
/// answered, and a stream over the token's budget is refused with a 429 naming the setting.
#[tokio::test]
async fn live_output_streams_of_a_read_token_do_not_starve_healthz_or_other_clients() {
    use attune_common::db::token::Role;
    let api =
        Api::start(&[("ATTUNE_API_MAX_CONNECTIONS", "4"), ("ATTUNE_API_OUTPUT_STREAMS_PER_TOKEN", "4")], None).await;
    let read = token_of(&api, Role::Read).await;
    let execution = unfinished(&api).await;
    let mut streams = Vec::new();
    for n in 0..4 {
        let stream = open_stream(&api, execution, &read).await.unwrap_or_else(|e| panic!("stream {n}: {e}"));
        assert_eq!(stream.status(), 200, "stream {n}");
        // the connection closes when the stream ends, and the answer says so: a client that
        // kept it for its next request (opening the stream again) would race that close
        assert_eq!(stream.headers().get("connection").map(|v| v.as_bytes()), Some(&b"close"[..]), "stream {n}");
        streams.push(stream);
    }
    assert_eq!(healthz(&api, Duration::from_secs(5)).await, Ok(200), "GET /healthz while 4 streams are open");
    let ready = api.http.get(format!("{}/readyz", api.url)).timeout(Duration::from_secs(5)).send().await;
    assert_eq!(ready.map(|r| r.status().as_u16()).ok(), Some(200), "GET /readyz while 4 streams are open");
    let whoami = api
        .http
        .get(format!("{}/api/v1/whoami", api.url))
        .bearer_auth(&api.token)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map(|r| r.status().as_u16());
    assert_eq!(whoami.ok(), Some(200), "the admin's GET /whoami while 4 streams are open");
    // one stream more of the same token: refused, naming the limit; another token's: served
    let refused = open_stream(&api, execution, &read).await.unwrap();
    assert_eq!(refused.status(), 429);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_streams", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("ATTUNE_API_OUTPUT_STREAMS_PER_TOKEN"), "{body}");
    let admin = open_stream(&api, execution, &api.token).await.unwrap();
    assert_eq!(admin.status(), 200, "another token's stream");
    drop((streams, admin));
    api.stop().await;
}

/// A stream nothing is sent on for `ATTUNE_API_OUTPUT_STREAM_IDLE_SECS` ends with `closed`
/// naming the setting, and gives its place in the budget back.
#[tokio::test]
async fn an_idle_live_output_stream_is_closed_and_its_budget_given_back() {
    let api =
        Api::start(&[("ATTUNE_API_OUTPUT_STREAM_IDLE_SECS", "2"), ("ATTUNE_API_OUTPUT_STREAMS_PER_TOKEN", "1")], None)
            .await;
    let execution = unfinished(&api).await;
    let stream = open_stream(&api, execution, &api.token).await.unwrap();
    assert_eq!(stream.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(30), stream.text())
        .await
        .expect("an idle stream is closed (within 30 s)")
        .unwrap();
    assert!(body.contains("event: closed") && body.contains("ATTUNE_API_OUTPUT_STREAM_IDLE_SECS"), "{body}");
    let again = open_stream(&api, execution, &api.token).await.unwrap();
    assert_eq!(again.status(), 200, "the closed stream's place in the token's budget is free again");
    drop(again);
    api.stop().await;
}
