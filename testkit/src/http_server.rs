//! A tiny HTTP/1.1 server for tests of http actions: it answers each path with a scripted
//! sequence of replies (the last one repeats once the script is used up; a path without a script
//! gets 404) and records every request it got, so a test can count calls and read their headers
//! and bodies, and whether a client hung up before its (delayed) reply. One connection per
//! request (`Connection: close`); bodies by `Content-Length` or chunked.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::wait_for;

/// One scripted reply.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// How long the server waits before answering (to test timeouts and cancels).
    pub delay: Duration,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply { status, headers: Vec::new(), body: Vec::new(), delay: Duration::ZERO }
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Reply {
        self.body = body.into();
        self
    }

    /// A JSON body with its content type.
    pub fn json(self, body: &serde_json::Value) -> Reply {
        self.header("Content-Type", "application/json").body(body.to_string())
    }

    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

/// A request the server got.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// The request target as sent: the path and the query, still percent-encoded.
    pub target: String,
    /// Names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When the request had been read.
    pub received: Instant,
}

impl Recorded {
    /// The target's path (before `?`).
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The target's query (after `?`), if any.
    pub fn query(&self) -> Option<&str> {
        self.target.split_once('?').map(|(_, query)| query)
    }

    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Default)]
struct State {
    scripts: HashMap<String, VecDeque<Reply>>,
    requests: Vec<Recorded>,
    /// Targets of requests whose client closed the connection before the reply, and when.
    hung_up: Vec<(String, Instant)>,
}

/// The server, listening on 127.0.0.1 at a port of its own until dropped.
pub struct HttpServer {
    port: u16,
    state: Arc<Mutex<State>>,
    accept: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    pub async fn start() -> HttpServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the test HTTP server");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State::default()));
        let accept = tokio::spawn({
            let state = state.clone();
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(serve(stream, state.clone()));
                }
            }
        });
        HttpServer { port, state, accept }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Answers requests to `path` (as sent, percent-encoded, without the query) with `replies`
    /// in order, the last one again and again after that.
    pub fn script(&self, path: &str, replies: impl IntoIterator<Item = Reply>) {
        let replies: VecDeque<Reply> = replies.into_iter().collect();
        assert!(!replies.is_empty(), "a script needs at least one reply");
        self.state.lock().unwrap().scripts.insert(path.to_string(), replies);
    }

    /// Every request so far, in the order they came.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The requests so far to `path`.
    pub fn requests_to(&self, path: &str) -> Vec<Recorded> {
        self.requests().into_iter().filter(|r| r.path() == path).collect()
    }

    /// How many clients of `path` closed their connection before their reply was sent.
    pub fn hung_up(&self, path: &str) -> usize {
        self.hung_up_at(path).len()
    }

    /// When each client of `path` that closed its connection before its reply did.
    pub fn hung_up_at(&self, path: &str) -> Vec<Instant> {
        let state = self.state.lock().unwrap();
        state.hung_up.iter().filter(|(t, _)| t.split('?').next() == Some(path)).map(|(_, at)| *at).collect()
    }

    /// Waits until `path` got at least `count` requests; returns them.
    pub async fn wait_requests(&self, path: &str, count: usize, deadline: Duration) -> Vec<Recorded> {
        wait_for(&format!("{count} requests to {path}"), deadline, || async move {
            let got = self.requests_to(path);
            (got.len() >= count).then_some(got)
        })
        .await
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn serve(mut stream: TcpStream, state: Arc<Mutex<State>>) {
    let Some(request) = read_request(&mut stream).await else { return };
    let target = request.target.clone();
    let reply = {
        let mut state = state.lock().unwrap();
        let reply = match state.scripts.get_mut(request.path()) {
            Some(replies) if replies.len() > 1 => replies.pop_front(),
            Some(replies) => replies.front().cloned(),
            None => None,
        };
        state.requests.push(request);
        reply.unwrap_or_else(|| Reply::status(404).body("no reply scripted for this path"))
    };
    if !reply.delay.is_zero() {
        // a client that sent its request sends nothing more: a read ends only when it hangs up
        let mut probe = [0u8; 1];
        tokio::select! {
            _ = tokio::time::sleep(reply.delay) => {}
            _ = stream.read(&mut probe) => {
                state.lock().unwrap().hung_up.push((target, Instant::now()));
                return;
            }
        }
    }
    let reason = reqwest::StatusCode::from_u16(reply.status).ok().and_then(|s| s.canonical_reason()).unwrap_or("");
    let mut head =
        format!("HTTP/1.1 {} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n", reply.status, reply.body.len());
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(&reply.body).await;
    let _ = stream.shutdown().await;
}

/// Reads one request; `None` if the connection closed early or the request is not HTTP/1.1.
async fn read_request(stream: &mut TcpStream) -> Option<Recorded> {
    let mut buffer = Vec::new();
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        if buffer.len() > 64 * 1024 || read_more(stream, &mut buffer).await == 0 {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut rest = buffer[head_end + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let (method, target) = (request_line.next()?.to_string(), request_line.next()?.to_string());
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    let body = if header("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        read_chunked(stream, &mut rest).await?
    } else {
        let length: usize = header("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
        while rest.len() < length {
            if read_more(stream, &mut rest).await == 0 {
                return None;
            }
        }
        rest.truncate(length);
        rest
    };
    Some(Recorded { method, target, headers, body, received: Instant::now() })
}

async fn read_chunked(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(end) = buffer.windows(2).position(|w| w == b"\r\n") {
                break end;
            }
            if read_more(stream, buffer).await == 0 {
                return None;
            }
        };
        let size_text = String::from_utf8_lossy(&buffer[..line_end]).into_owned();
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        buffer.drain(..line_end + 2);
        while buffer.len() < size + 2 {
            if read_more(stream, buffer).await == 0 {
                return None;
            }
        }
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(&buffer[..size]);
        buffer.drain(..size + 2);
    }
}

async fn read_more(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> usize {
    let mut chunk = [0u8; 8192];
    let n = stream.read(&mut chunk).await.unwrap_or(0);
    buffer.extend_from_slice(&chunk[..n]);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn it_answers_scripts_in_order_and_records_requests() {
        let server = HttpServer::start().await;
        server.script("/a", [Reply::status(503), Reply::status(200).json(&serde_json::json!({"ok": true}))]);
        attune_common::tls::install_default_provider();
        let client = reqwest::Client::new();
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let response =
                client.post(server.url("/a?x=1")).header("X-Test", "yes").body("hello").send().await.unwrap();
            statuses.push(response.status().as_u16());
        }
        assert_eq!(statuses, [503, 200, 200], "the last reply repeats");
        let missing = client.get(server.url("/nothing")).send().await.unwrap();
        assert_eq!(missing.status().as_u16(), 404);
        let got = server.requests_to("/a");
        assert_eq!(got.len(), 3);
        assert_eq!(
            (got[0].method.as_str(), got[0].query(), got[0].header("x-test")),
            ("POST", Some("x=1"), Some("yes"))
        );
        assert_eq!(got[0].body_text(), "hello");
        assert_eq!(server.requests().len(), 4);
    }
}
