//! The API against slow and greedy clients, served by the real `attune-api` binary (no executor
//! or worker: these are the HTTP server's own cases): the header-read timeout, the request
//! timeout, the connection limit, the body limit (413 before anything is read or stored), list
//! pages within their byte budget, HTTPS with `ATTUNE_API_TLS_CERT_FILE` and
//! `ATTUNE_API_TLS_KEY_FILE`, and graceful shutdown.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use attune_testkit::api::{Api, client};
use attune_testkit::{wait_for, workspace_binary};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads from `stream` until the server closes it (end of stream or a reset) or `deadline`
/// passes; returns what was read and when it closed, or `None` if it stayed open.
async fn read_until_closed(stream: &mut TcpStream, deadline: Duration) -> Option<(Vec<u8>, Instant)> {
    let mut received = Vec::new();
    let mut buffer = [0u8; 8192];
    let until = tokio::time::Instant::now() + deadline;
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buffer)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some((received, Instant::now())),
            Ok(Ok(n)) => received.extend_from_slice(&buffer[..n]),
        }
    }
}

/// Reads one HTTP/1.1 response with a `Content-Length` (status and body) within `deadline`.
async fn read_response(stream: &mut TcpStream, deadline: Duration) -> Option<(u16, Vec<u8>)> {
    let mut received = Vec::new();
    let mut buffer = [0u8; 8192];
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&received[..end]).to_string();
            let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
            if status == 100 {
                received.drain(..end + 4);
                continue;
            }
            let length: usize = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if received.len() >= end + 4 + length {
                return Some((status, received[end + 4..end + 4 + length].to_vec()));
            }
        }
        match tokio::time::timeout_at(until, stream.read(&mut buffer)).await {
            Ok(Ok(n)) if n > 0 => received.extend_from_slice(&buffer[..n]),
            _ => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_disconnected_within_the_header_timeout() {
    let api = Api::start(&[("ATTUNE_API_HEADER_TIMEOUT_SECS", "1")], None).await;

    // half a request line, then nothing
    let mut slow = TcpStream::connect(&api.addr).await.unwrap();
    slow.write_all(b"GET /hea").await.unwrap();
    let sent = Instant::now();
    // and a connection that sends nothing at all (an idle keep-alive connection is the same case)
    let mut silent = TcpStream::connect(&api.addr).await.unwrap();
    let opened = Instant::now();

    let (_, closed) = read_until_closed(&mut slow, Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("a client that never finished its headers was still connected after 5 s"));
    let waited = closed - sent;
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(3), "disconnected after {waited:?}");
    let (_, closed) = read_until_closed(&mut silent, Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("a connection that sent nothing was still open after 5 s"));
    assert!(closed - opened < Duration::from_secs(3), "idle connection closed after {:?}", closed - opened);

    // a client that sends its request at once is served as before
    let (status, _) = api.get("/healthz").await;
    assert_eq!(status, 200);
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_takes_longer_than_the_request_timeout_is_answered_503_in_the_error_shape() {
    let api = Api::start(&[("ATTUNE_API_REQUEST_TIMEOUT_SECS", "1")], None).await;
    // the list's query waits for this lock: the handler takes as long as the test holds it
    let mut lock = api.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE execution IN ACCESS EXCLUSIVE MODE").execute(&mut *lock).await.unwrap();
    let started = Instant::now();
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        api.http.get(format!("{}/api/v1/executions", api.url)).bearer_auth(&api.token).send(),
    )
    .await
    .expect("no answer within 10 s while the handler was stuck")
    .unwrap();
    let took = started.elapsed();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    lock.rollback().await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "request_timeout", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("ATTUNE_API_REQUEST_TIMEOUT_SECS"), "{body}");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(5), "answered after {took:?}");
    // the handler's connection was given back: the API answers again once the lock is gone
    let (status, _) = api.get("/api/v1/executions").await;
    assert_eq!(status, 200);
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_wait_until_one_closes() {
    let api = Api::start(&[("ATTUNE_API_MAX_CONNECTIONS", "2")], None).await;
    let request = b"GET /healthz HTTP/1.1\r\nHost: attune\r\n\r\n";
    // connections that carried a token (one without makes room: tests/tests/submission/slow_clients.rs)
    let authenticated = format!(
        "GET /api/v1/executions?limit=1 HTTP/1.1\r\nHost: attune\r\nAuthorization: Bearer {}\r\n\r\n",
        api.token
    );
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(&api.addr).await.unwrap();
        stream.write_all(authenticated.as_bytes()).await.unwrap();
        let (status, _) =
            read_response(&mut stream, Duration::from_secs(5)).await.expect("a held connection is served");
        assert_eq!(status, 200);
        held.push(stream); // kept alive, idle
    }
    // the third waits in the listen backlog: connected, but not served
    let mut third = TcpStream::connect(&api.addr).await.unwrap();
    third.write_all(request).await.unwrap();
    assert!(
        read_response(&mut third, Duration::from_millis(500)).await.is_none(),
        "a connection beyond ATTUNE_API_MAX_CONNECTIONS was served"
    );
    // one closes: the third is served
    drop(held.remove(0));
    let (status, _) = read_response(&mut third, Duration::from_secs(5))
        .await
        .expect("the waiting connection is served once one closes");
    assert_eq!(status, 200);
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_refused_with_413_naming_the_limit_and_nothing_is_stored() {
    let api = Api::start(&[("ATTUNE_API_MAX_BODY_BYTES", "1048576")], None).await;
    let url = format!("{}/api/v1/executions", api.url);
    let big = json!({"action_ref": "core.echo", "parameters": {"message": "x".repeat(1_100_000)}});

    // declared in Content-Length: refused before it is read, with or without a token
    for token in [Some(api.token.as_str()), None] {
        let mut request = api.http.post(&url).json(&big);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 413, "{body}");
        assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("1048576") && message.contains("ATTUNE_API_MAX_BODY_BYTES"), "{body}");
    }

    // sent in chunks with no length: cut at the limit, the same answer
    let mut stream = TcpStream::connect(&api.addr).await.unwrap();
    let head = format!(
        "POST /api/v1/executions HTTP/1.1\r\nHost: attune\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        api.token
    );
    let body = big.to_string();
    let mut chunked = head.into_bytes();
    for chunk in body.as_bytes().chunks(64 * 1024) {
        chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend_from_slice(chunk);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (mut reader, mut writer) = stream.split();
    let send = async {
        // the server may stop reading once it has answered
        let _ = writer.write_all(&chunked).await;
    };
    let mut answer = Vec::new();
    let receive = async { tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut answer)).await };
    let (_, closed) = tokio::join!(send, receive);
    let answer = String::from_utf8_lossy(&answer).to_string();
    // the rest of the body is not read: the server closes the connection after its answer
    assert!(closed.is_ok(), "the connection stayed open after a refused body: {answer}");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("\"payload_too_large\"") && answer.contains("1048576 bytes (ATTUNE_API_MAX_BODY_BYTES)"),
        "{answer}"
    );

    // below the body limit, the parameter limits still answer, naming the parameter
    let response = api
        .http
        .post(&url)
        .bearer_auth(&api.token)
        .json(&json!({"action_ref": "core.echo", "parameters": {"message": "x".repeat(100_000)}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        (body["error"]["code"].as_str(), body["error"]["parameter"].as_str()),
        (Some("too_large"), Some("parameters.message")),
        "{body}"
    );

    assert_eq!(api.executions().await, 0, "nothing is stored");
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_pages_through_history_once_while_executions_arrive_and_the_total_stops_at_ten_thousand() {
    let api = Api::start(&[], None).await;
    let insert = |count: i64| {
        let pool = api.db.pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO execution (action_ref, status, finished) \
                 SELECT 'history.row', 'completed', now() FROM generate_series(1, $1)",
            )
            .bind(count)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    insert(10_050).await;
    let (status, page) = api.get_json("/api/v1/executions?limit=1000").await;
    assert_eq!(status, 200);
    assert_eq!(
        (page["total"].as_i64(), page["total_exact"].as_bool()),
        (Some(10_000), Some(false)),
        "{}",
        page["total"]
    );
    let (_, narrow) = api.get_json("/api/v1/executions?limit=10&action_ref=nothing.here").await;
    assert_eq!((narrow["total"].as_i64(), narrow["total_exact"].as_bool()), (Some(0), Some(true)));
    assert!(narrow["next_cursor"].is_null());

    // newest first, each row once, though newer executions arrive between the pages
    let mut seen: Vec<i64> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(cursor) => format!("/api/v1/executions?limit=1000&cursor={cursor}"),
            None => "/api/v1/executions?limit=1000".to_string(),
        };
        let (status, page) = api.get_json(&path).await;
        assert_eq!(status, 200, "{page}");
        if cursor.is_some() {
            assert!(page["next_offset"].is_null(), "a page reached by cursor gives a cursor, not an offset");
        }
        seen.extend(page["items"].as_array().unwrap().iter().map(|item| item["id"].as_i64().unwrap()));
        insert(7).await;
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    let mut expected = seen.clone();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    expected.dedup();
    assert_eq!(seen, expected, "newest first, none twice");
    assert_eq!(seen.len(), 10_050, "every row of the first page's history, none that arrived after");

    // an offset with a cursor skips that many rows past it
    let (status, page) = api.get_json(&format!("/api/v1/executions?limit=2&cursor={}&offset=3", seen[100])).await;
    assert_eq!(status, 200, "{page}");
    let ids: Vec<i64> = page["items"].as_array().unwrap().iter().map(|item| item["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, seen[104..106], "the 4th and 5th rows past the cursor");
    // a cursor past every id there can be starts from the newest row
    let (status, page) = api.get_json("/api/v1/executions?limit=1&cursor=9999999999999999999").await;
    assert_eq!(status, 200, "{page}");
    assert!(page["items"][0]["id"].as_i64().unwrap() > seen[0], "{page}");

    for (path, parameter) in [
        ("/api/v1/executions?cursor=abc", "cursor"),
        ("/api/v1/executions?cursor=0", "cursor"),
        ("/api/v1/executions?cursor=-5", "cursor"),
        ("/api/v1/executions?cursor=10000000000000000000", "cursor"),
        ("/api/v1/executions?offset=10001", "offset"),
    ] {
        let (status, body) = api.get_json(path).await;
        assert_eq!((status, body["error"]["parameter"].as_str()), (422, Some(parameter)), "{path}: {body}");
    }
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_are_light_by_default_and_full_ones_stay_within_their_byte_budget() {
    const BUDGET: usize = 4 * 1024 * 1024;
    let api = Api::start(&[("ATTUNE_API_LIST_BUDGET_BYTES", &BUDGET.to_string())], None).await;
    // twelve finished executions with a megabyte of parameters and some output each
    sqlx::query(
        "INSERT INTO execution (action_ref, parameters, status, stdout, stderr, result, finished)
         SELECT 'blob.big', jsonb_build_object('blob', repeat('x', 1000000)), 'completed',
                repeat('o', 1000), repeat('e', 1000), '{\"ok\": true}', now()
         FROM generate_series(1, 12)",
    )
    .execute(&api.db.pool)
    .await
    .unwrap();

    // light: every row, none of the heavy fields
    let (status, body) = api.get("/api/v1/executions?limit=1000").await;
    assert_eq!(status, 200);
    assert!(body.len() < 64 * 1024, "a light page of 12 rows took {} bytes", body.len());
    let page: Value = serde_json::from_slice(&body).unwrap();
    let items = page["items"].as_array().unwrap();
    assert_eq!((items.len(), page["total"].as_i64(), page["truncated"].as_bool()), (12, Some(12), Some(false)));
    assert!(page["next_offset"].is_null(), "{}", page["next_offset"]);
    for item in items {
        for heavy in ["parameters", "config", "result", "stdout", "stderr", "retry_decision"] {
            assert!(item.get(heavy).is_none(), "a light row carries {heavy}");
        }
        for kept in ["id", "action_ref", "status", "created", "finished", "retry_count"] {
            assert!(item.get(kept).is_some(), "a light row lacks {kept}");
        }
    }

    // full: the rows whole, as many as the budget holds, and where the next page starts
    let mut offset = 0;
    let mut seen = Vec::new();
    loop {
        let (status, body) = api.get(&format!("/api/v1/executions?limit=1000&fields=full&offset={offset}")).await;
        assert_eq!(status, 200);
        assert!(body.len() <= BUDGET, "a full page took {} bytes, more than its budget of {BUDGET}", body.len());
        let page: Value = serde_json::from_slice(&body).unwrap();
        let items = page["items"].as_array().unwrap();
        assert!(!items.is_empty(), "an empty page before the end: {}", page["next_offset"]);
        for item in items {
            assert_eq!(item["parameters"]["blob"].as_str().map(str::len), Some(1_000_000));
            assert_eq!(item["result"], json!({"ok": true}));
            seen.push(item["id"].as_i64().unwrap());
        }
        match page["next_offset"].as_i64() {
            Some(next) => {
                assert_eq!(page["truncated"], true, "a page short of its limit says so");
                assert_eq!(next, offset + items.len() as i64);
                offset = next;
            }
            None => break,
        }
    }
    let mut expected = seen.clone();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    expected.dedup();
    assert_eq!((seen.len(), &seen), (12, &expected), "every row once, newest first");
    assert!(offset > 0, "12 MB of rows came in one page of a 4 MiB budget");

    // one execution stays whole
    let (status, one) = api.get_json(&format!("/api/v1/executions/{}", seen[0])).await;
    assert_eq!((status, one["parameters"]["blob"].as_str().map(str::len)), (200, Some(1_000_000)));
    api.stop().await;
}

/// A self-signed certificate for `localhost` and `127.0.0.1` (not a CA: rustls refuses a CA
/// certificate as a server's) and its key, in `dir`.
fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("run openssl");
    assert!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
    (cert, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_certificate_the_api_serves_https_only() {
    let dir = std::env::temp_dir().join(format!("attune-api-tls-{}-{:x}", std::process::id(), rand::random::<u32>()));
    let (cert, key) = self_signed(&dir);
    let (cert_file, key_file) = (cert.display().to_string(), key.display().to_string());
    let env = [
        ("ATTUNE_API_TLS_CERT_FILE", cert_file.as_str()),
        ("ATTUNE_API_TLS_KEY_FILE", key_file.as_str()),
        ("ATTUNE_API_HEADER_TIMEOUT_SECS", "1"),
    ];
    let api = Api::start(&env, Some(&cert)).await;

    let (status, body) = api.get_json("/healthz").await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = api.get_json("/api/v1/executions").await;
    assert_eq!(status, 200);
    let by_name =
        api.http.get(format!("https://localhost:{}/healthz", api.addr.rsplit(':').next().unwrap())).send().await;
    assert_eq!(by_name.map(|r| r.status().as_u16()).ok(), Some(200));

    // a client that does not trust the certificate refuses it
    let untrusting = client(None).get(format!("{}/healthz", api.url)).send().await.unwrap_err();
    assert!(attune_common::tls::tls_error(&untrusting).is_some(), "{untrusting:?}");
    // plain HTTP gets no HTTP answer
    let plain = client(None).get(format!("http://{}/healthz", api.addr)).send().await;
    assert!(plain.is_err(), "plain HTTP was answered: {:?}", plain.map(|r| r.status()));
    // a client that never starts its handshake is disconnected within the header timeout
    let mut silent = TcpStream::connect(&api.addr).await.unwrap();
    let opened = Instant::now();
    let (_, closed) = read_until_closed(&mut silent, Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("a TLS client that never said hello was still connected after 5 s"));
    assert!(closed - opened < Duration::from_secs(3), "closed after {:?}", closed - opened);

    api.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tls_setting_without_the_other_is_a_startup_error_naming_both() {
    let dir = std::env::temp_dir().join(format!("attune-api-tls1-{}-{:x}", std::process::id(), rand::random::<u32>()));
    let (cert, key) = self_signed(&dir);
    for (given, path) in [("ATTUNE_API_TLS_CERT_FILE", &cert), ("ATTUNE_API_TLS_KEY_FILE", &key)] {
        let child = tokio::process::Command::new(workspace_binary("attune-api"))
            .kill_on_drop(true)
            .env("ATTUNE_API_ADDR", "127.0.0.1:0")
            .env(given, path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let output = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("attune-api with only {given} was still running after 10 s"))
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(
            stderr.contains("ATTUNE_API_TLS_CERT_FILE") && stderr.contains("ATTUNE_API_TLS_KEY_FILE"),
            "only {given}: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sigterm_a_request_in_flight_is_answered_then_the_server_exits() {
    let mut api = Api::start(&[], None).await;
    let body = json!({"action_ref": "core.echo", "parameters": {"message": "in flight"}}).to_string();
    let mut stream = TcpStream::connect(&api.addr).await.unwrap();
    let head = format!(
        "POST /api/v1/executions HTTP/1.1\r\nHost: attune\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        api.token,
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // the handler asks for the body: the request is in flight
    let mut continued = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut continued))
        .await
        .expect("100 Continue within 10 s")
        .unwrap();
    assert!(continued.starts_with(b"HTTP/1.1 100 Continue\r\n\r\n"), "{}", String::from_utf8_lossy(&continued));

    let pid = api.child.id().expect("the API is running");
    let status = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().unwrap();
    assert!(status.success());
    // new connections are refused once the server stops accepting
    wait_for("the listener to close", Duration::from_secs(10), || {
        let addr = api.addr.clone();
        async move { TcpStream::connect(&addr).await.is_err().then_some(()) }
    })
    .await;

    stream.write_all(body.as_bytes()).await.unwrap();
    let (status, answer) =
        read_response(&mut stream, Duration::from_secs(10)).await.expect("the request in flight is answered");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&answer));
    let exit = match tokio::time::timeout(Duration::from_secs(10), api.child.wait()).await {
        Ok(exit) => exit.unwrap(),
        Err(_) => panic!("the API did not exit after its last request:\n{}", api.log()),
    };
    assert!(exit.success(), "{exit}:\n{}", api.log());
    assert_eq!(api.executions().await, 1);
    api.stop().await;
}
