//! The HTTP server around the router: what a slow or greedy client meets before and around a
//! handler. Each bound is a setting (`HttpSettings`), and each refusal a client can read is in
//! the API's error shape.
//!
//! - Headers: a connection that has not sent a whole request head within
//!   `ATTUNE_API_HEADER_TIMEOUT_SECS` is closed (hyper's header-read timeout; it also closes a
//!   keep-alive connection idle that long, and bounds a TLS handshake).
//! - Answers: a connection whose client takes none of the bytes of its answers for
//!   `ATTUNE_API_WRITE_TIMEOUT_SECS` is closed (`WriteDeadline`). Requests on one connection are
//!   answered one after the other, and at most `ATTUNE_API_MAX_REQUESTS_PER_CONNECTION` of them:
//!   the last is answered with `Connection: close`. So a client that pipelines requests and never
//!   reads the answers holds its connection for the write timeout, not for ever.
//! - Connections: at most `ATTUNE_API_MAX_CONNECTIONS` are served at once. The accept loop takes
//!   a permit before it accepts, so further connections wait in the kernel's listen backlog
//!   (1024) until one closes; past the backlog the kernel refuses them. When every slot is taken
//!   and a client is waiting, the oldest connection that has never carried a valid token is
//!   closed to make room (`Registry`): connections without a token cannot keep out one with a
//!   token, nor newer ones of their own kind. Connections that carried a token are never closed
//!   for another: when they take every slot, the next client waits in turn. A connection that
//!   starts a long-lived stream (live output) gives its slot back (`ConnectionSlot`) and closes
//!   once the stream ends: streams have a budget of their own (`crate::streams`), and never keep
//!   a client, `/healthz` or `/readyz` out.
//! - Bodies: a body over `ATTUNE_API_MAX_BODY_BYTES` is answered 413 `payload_too_large`: at once
//!   when its `Content-Length` says so (before authentication, nothing read), or when reading it
//!   passes the limit (a chunked body). Below it, the routes' own limits (the parameters') apply.
//! - Time: a request not answered within `ATTUNE_API_REQUEST_TIMEOUT_SECS` (its body read and its
//!   handler run; a handler's work is dropped, so its transaction rolls back) is answered 503
//!   `request_timeout`: true, since nothing it asked for was written. A change other than a
//!   submission begins its write as it starts (`audit::record`): it is never answered so, but
//!   with its outcome. Except once a write that
//!   cannot be called back has begun for it (`Withdrawal`: a submission taken into a batch, an
//!   insert that commits by itself): then the request is answered with that write's outcome
//!   (the execution's id), however late: as late as the database answers (a lock held on the
//!   table holds the answer back too), unless the client gives up first.
//! - TLS: with `ATTUNE_API_TLS_CERT_FILE` and `ATTUNE_API_TLS_KEY_FILE` (both or neither) every
//!   connection is TLS (rustls with ring; TLS 1.2 and 1.3): there is no plain-HTTP port.
//! - Shutdown: when the token fires the listener closes, each connection finishes the request it
//!   is serving (then closes, keep-alive or not), and `serve` returns once all have, or after
//!   `ATTUNE_API_SHUTDOWN_TIMEOUT_SECS`, closing the connections still open (a client that does
//!   not read, a request still waiting on the database).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use attune_common::config::{ConfigError, FromEnv, Source, read, read_optional};
use axum::Router;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::http::header::{CONNECTION, CONTENT_LENGTH};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::ApiError;

/// How the server bounds its clients (see the module's documentation).
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// `ATTUNE_API_HEADER_TIMEOUT_SECS` (10).
    pub header_timeout: Duration,
    /// `ATTUNE_API_REQUEST_TIMEOUT_SECS` (30).
    pub request_timeout: Duration,
    /// `ATTUNE_API_WRITE_TIMEOUT_SECS` (10).
    pub write_timeout: Duration,
    /// `ATTUNE_API_MAX_REQUESTS_PER_CONNECTION` (1000).
    pub max_requests_per_connection: u64,
    /// `ATTUNE_API_SHUTDOWN_TIMEOUT_SECS` (35).
    pub shutdown_timeout: Duration,
    /// `ATTUNE_API_MAX_CONNECTIONS` (1024).
    pub max_connections: usize,
    /// `ATTUNE_API_MAX_BODY_BYTES` (1 MiB).
    pub max_body_bytes: usize,
    /// `ATTUNE_API_LIST_BUDGET_BYTES` (4 MiB): about the most bytes of rows in one list page.
    pub list_budget_bytes: usize,
    /// `ATTUNE_API_TLS_CERT_FILE` and `ATTUNE_API_TLS_KEY_FILE`, read and checked at start.
    pub tls: Option<Tls>,
}

impl Default for HttpSettings {
    /// The table's defaults (plain HTTP).
    fn default() -> Self {
        HttpSettings::from_source(&attune_common::config::Defaults).expect("the defaults are valid")
    }
}

impl FromEnv for HttpSettings {
    fn from_source(source: &dyn Source) -> Result<Self, ConfigError> {
        Ok(HttpSettings {
            header_timeout: Duration::from_secs(at_least_one(source, "ATTUNE_API_HEADER_TIMEOUT_SECS")?),
            request_timeout: Duration::from_secs(at_least_one(source, "ATTUNE_API_REQUEST_TIMEOUT_SECS")?),
            write_timeout: Duration::from_secs(at_least_one(source, "ATTUNE_API_WRITE_TIMEOUT_SECS")?),
            max_requests_per_connection: at_least_one(source, "ATTUNE_API_MAX_REQUESTS_PER_CONNECTION")?,
            shutdown_timeout: Duration::from_secs(at_least_one(source, "ATTUNE_API_SHUTDOWN_TIMEOUT_SECS")?),
            max_connections: at_least_one(source, "ATTUNE_API_MAX_CONNECTIONS")? as usize,
            max_body_bytes: at_least_one(source, "ATTUNE_API_MAX_BODY_BYTES")? as usize,
            list_budget_bytes: at_least_one(source, "ATTUNE_API_LIST_BUDGET_BYTES")? as usize,
            tls: Tls::from_source(source)?,
        })
    }
}

fn at_least_one(source: &dyn Source, name: &str) -> Result<u64, ConfigError> {
    let value: u64 = read(source, name)?;
    if value == 0 {
        return Err(ConfigError { name: name.into(), value: "0".into(), reason: "must be at least 1".into() });
    }
    Ok(value)
}

const CERT_FILE: &str = "ATTUNE_API_TLS_CERT_FILE";
const KEY_FILE: &str = "ATTUNE_API_TLS_KEY_FILE";

/// The API's certificate and key, loaded into a rustls server configuration.
#[derive(Clone)]
pub struct Tls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("cert_file", &self.cert_file).field("key_file", &self.key_file).finish()
    }
}

impl Tls {
    /// Both files, or neither (`None`); one without the other is an error naming both.
    pub fn from_source(source: &dyn Source) -> Result<Option<Tls>, ConfigError> {
        match (read_optional(source, CERT_FILE), read_optional(source, KEY_FILE)) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => Tls::load(Path::new(cert.trim()), Path::new(key.trim())).map(Some),
            (cert, key) => {
                let (name, value) = match (cert, key) {
                    (Some(cert), _) => (CERT_FILE, cert),
                    (_, key) => (KEY_FILE, key.unwrap_or_default()),
                };
                Err(ConfigError {
                    name: name.into(),
                    value,
                    reason: format!("{CERT_FILE} and {KEY_FILE} go together: set both (HTTPS) or neither (HTTP)"),
                })
            }
        }
    }

    /// Reads the certificate chain and the key (PEM) and checks that they make a server
    /// configuration; errors name the setting and the file.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Tls, ConfigError> {
        let error = |name: &str, path: &Path, reason: String| ConfigError {
            name: name.into(),
            value: path.display().to_string(),
            reason,
        };
        let pem = std::fs::read(cert_file).map_err(|e| error(CERT_FILE, cert_file, format!("cannot read it: {e}")))?;
        let chain = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| error(CERT_FILE, cert_file, format!("not a PEM certificate file: {e}")))?;
        if chain.is_empty() {
            return Err(error(CERT_FILE, cert_file, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into()));
        }
        let pem = std::fs::read(key_file).map_err(|e| error(KEY_FILE, key_file, format!("cannot read it: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(&pem)
            .map_err(|e| error(KEY_FILE, key_file, format!("holds no PEM private key: {e}")))?;
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
                .map_err(|e| error(KEY_FILE, key_file, format!("unusable with {}: {e}", cert_file.display())))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls { cert_file: cert_file.to_path_buf(), key_file: key_file.to_path_buf(), config: Arc::new(config) })
    }
}

/// `app` with the limits every request meets: the request timeout outermost, then the body
/// limit (a declared length, then the extractors' cap for a body without one).
pub fn with_limits(app: Router, settings: &HttpSettings) -> Router {
    let (max_body, timeout) = (settings.max_body_bytes, settings.request_timeout);
    app.layer(axum::extract::DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn(move |request: Request, next: Next| body_limit(max_body, request, next)))
        .layer(axum::middleware::from_fn(move |request: Request, next: Next| request_timeout(timeout, request, next)))
}

async fn body_limit(limit: usize, request: Request, next: Next) -> Response {
    let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if let Some(length) = declared
        && length > limit as u64
    {
        return closing(ApiError::body_too_large(limit, Some(length)).into_response());
    }
    let response = next.run(request).await;
    // an extractor stopped reading at the limit (a body without a declared length): say which
    if response.extensions().get::<crate::error::ErrorCode>() == Some(&crate::error::ErrorCode("payload_too_large")) {
        return closing(ApiError::body_too_large(limit, None).into_response());
    }
    response
}

/// `response`, closing its connection: the rest of a refused body is not read, so the
/// connection cannot carry another request.
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

async fn request_timeout(limit: Duration, mut request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let withdrawal = Withdrawal::default();
    request.extensions_mut().insert(withdrawal.clone());
    let mut handler = std::pin::pin!(next.run(request));
    match tokio::time::timeout(limit, handler.as_mut()).await {
        Ok(response) => response,
        Err(_) if withdrawal.withdraw() => {
            tracing::warn!(%method, %path, timeout_secs = limit.as_secs(), "request not answered in time");
            ApiError::request_timeout(limit).into_response()
        }
        Err(_) => {
            tracing::warn!(
                %method,
                %path,
                timeout_secs = limit.as_secs(),
                "request not answered in time, but its write has begun: answered with its outcome"
            );
            handler.await
        }
    }
}

/// A request's standing with the request timeout, shared by the timeout (which puts it in the
/// request's extensions) and whatever writes for the request. Until a write begins the timeout
/// may withdraw the request: its handler is dropped, and its 503 is true because nothing was or
/// will be written for it. Once a write has begun (`begin_write`) it cannot: the handler is
/// awaited past the timeout and answers with what was written. Exactly one of the two wins, even
/// when the write begins on another task (the submissions' batch writer).
#[derive(Debug, Clone, Default)]
pub struct Withdrawal(Arc<AtomicU8>);

const OPEN: u8 = 0;
const WITHDRAWN: u8 = 1;
const WRITING: u8 = 2;

impl Withdrawal {
    /// The writer's side: `true` if it may write for the request (which will then be answered
    /// with the outcome, however late), `false` if the request was withdrawn: write nothing for it.
    pub fn begin_write(&self) -> bool {
        matches!(self.0.compare_exchange(OPEN, WRITING, Ordering::AcqRel, Ordering::Acquire), Ok(_) | Err(WRITING))
    }

    /// The timeout's side: `true` if the request is withdrawn (nothing is written for it), `false`
    /// if a write for it has begun.
    fn withdraw(&self) -> bool {
        matches!(self.0.compare_exchange(OPEN, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire), Ok(_) | Err(WITHDRAWN))
    }
}

/// Serves `app` (already `with_limits`) on `listener` until `shutdown` fires, then lets each
/// connection finish its request and returns once all have (or the shutdown timeout passed).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    settings: &HttpSettings,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(settings.header_timeout);
    let tls = settings.tls.as_ref().map(|tls| tokio_rustls::TlsAcceptor::from(tls.config.clone()));
    let permits = Arc::new(Semaphore::new(settings.max_connections));
    let registry = Arc::new(Registry::default());
    let abort = CancellationToken::new();
    let connections = TaskTracker::new();
    loop {
        let (permit, stream) = tokio::select! {
            _ = shutdown.cancelled() => break,
            taken = take_slot(&listener, &permits, &registry) => match taken {
                Ok(taken) => taken,
                Err(e) => {
                    accept_failed(e, &shutdown).await;
                    continue;
                }
            },
        };
        let entry = registry.open(&abort);
        let slot = ConnectionSlot::new(permit);
        let connection = Connection {
            http: http.clone(),
            app: app.clone(),
            tls: tls.clone(),
            handshake_timeout: settings.header_timeout,
            write_timeout: settings.write_timeout,
            max_requests: settings.max_requests_per_connection,
            shutdown: shutdown.clone(),
            entry,
            slot,
        };
        connections.spawn(connection.run(stream));
    }
    drop(listener);
    connections.close();
    if tokio::time::timeout(settings.shutdown_timeout, connections.wait()).await.is_err() {
        tracing::warn!(
            connections = connections.len(),
            timeout_secs = settings.shutdown_timeout.as_secs(),
            "connections still open at the shutdown timeout: closing them"
        );
        abort.cancel();
        connections.wait().await;
    }
    Ok(())
}

/// A slot and the connection to serve in it. A free slot is taken before accepting, so that
/// waiting clients wait in the backlog. With none free, the next client is accepted and the
/// oldest connection that never carried a token is closed to make room for it; with none such,
/// it waits for a slot like the rest.
async fn take_slot(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
    registry: &Registry,
) -> std::io::Result<(OwnedSemaphorePermit, TcpStream)> {
    if let Ok(permit) = permits.clone().try_acquire_owned() {
        return Ok((permit, listener.accept().await?.0));
    }
    let stream = tokio::select! {
        permit = permits.clone().acquire_owned() => {
            let permit = permit.expect("the semaphore is never closed");
            return Ok((permit, listener.accept().await?.0));
        }
        accepted = listener.accept() => accepted?.0,
    };
    // a slot may have come free meanwhile: then nobody is closed
    if let Ok(permit) = permits.clone().try_acquire_owned() {
        return Ok((permit, stream));
    }
    if registry.close_oldest_untrusted() {
        tracing::debug!("every connection slot taken: closed the oldest connection without a token");
    }
    let permit = permits.clone().acquire_owned().await.expect("the semaphore is never closed");
    Ok((permit, stream))
}

/// A failed accept: the peer's own trouble (reset, aborted) passes; running out of file
/// descriptors or memory is logged and the loop pauses a little rather than spin.
async fn accept_failed(error: std::io::Error, shutdown: &CancellationToken) {
    use std::io::ErrorKind::*;
    if matches!(error.kind(), ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted) {
        return;
    }
    tracing::warn!(%error, "cannot accept a connection");
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
    }
}

/// Whether a connection has carried a request with a valid token: put in each request's
/// extensions by the server, vouched for by `auth` once it has verified the request's token.
#[derive(Debug, Clone, Default)]
pub struct ConnectionTrust(Arc<AtomicBool>);

impl ConnectionTrust {
    pub fn vouch(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn vouched(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The open connections, oldest first, each with its trust and the token that closes it.
#[derive(Default)]
struct Registry {
    open: Mutex<Open>,
}

/// The last id given, and the open connections by id.
#[derive(Default)]
struct Open(u64, BTreeMap<u64, (ConnectionTrust, CancellationToken)>);

impl Registry {
    fn open(self: &Arc<Self>, abort: &CancellationToken) -> Entry {
        let (trust, close) = (ConnectionTrust::default(), abort.child_token());
        let mut open = self.open.lock().expect("registry poisoned");
        open.0 += 1;
        let id = open.0;
        open.1.insert(id, (trust.clone(), close.clone()));
        Entry { registry: self.clone(), id, trust, close }
    }

    /// Closes the oldest connection that never carried a valid token; `false` if there is none.
    fn close_oldest_untrusted(&self) -> bool {
        let mut open = self.open.lock().expect("registry poisoned");
        let oldest = open.1.iter().find(|(_, (trust, _))| !trust.vouched()).map(|(id, _)| *id);
        match oldest.and_then(|id| open.1.remove(&id)) {
            Some((_, close)) => {
                close.cancel();
                true
            }
            None => false,
        }
    }
}

/// A connection's place in the registry, left when the connection ends.
struct Entry {
    registry: Arc<Registry>,
    id: u64,
    trust: ConnectionTrust,
    close: CancellationToken,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.registry.open.lock().expect("registry poisoned").1.remove(&self.id);
    }
}

/// A connection's hold on one of the `ATTUNE_API_MAX_CONNECTIONS` slots, in each of its
/// requests' extensions. A handler that answers with a long-lived stream gives the slot back
/// (`release`): the next client takes it, and the connection closes once its answer (the
/// stream) is sent, so it never holds a slot again. Otherwise the slot is given back when the
/// connection ends.
#[derive(Clone)]
pub struct ConnectionSlot(Arc<SlotHold>);

struct SlotHold {
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    released: CancellationToken,
}

impl ConnectionSlot {
    fn new(permit: OwnedSemaphorePermit) -> Self {
        ConnectionSlot(Arc::new(SlotHold { permit: Mutex::new(Some(permit)), released: CancellationToken::new() }))
    }

    /// Gives the slot back for another client; the connection closes after the answer in
    /// progress.
    pub fn release(&self) {
        self.0.permit.lock().expect("slot poisoned").take();
        self.0.released.cancel();
    }
}

/// One accepted connection and what serving it needs; its slot is given back when it ends (or
/// before: `ConnectionSlot`).
struct Connection {
    http: http1::Builder,
    app: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handshake_timeout: Duration,
    write_timeout: Duration,
    max_requests: u64,
    shutdown: CancellationToken,
    entry: Entry,
    slot: ConnectionSlot,
}

impl Connection {
    async fn run(self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let stream = WriteDeadline::new(stream, self.write_timeout);
        let Some(acceptor) = self.tls.clone() else {
            return self.serve(stream).await;
        };
        let handshake = tokio::select! {
            _ = self.shutdown.cancelled() => return,
            _ = self.entry.close.cancelled() => return,
            handshake = tokio::time::timeout(self.handshake_timeout, acceptor.accept(stream)) => handshake,
        };
        match handshake {
            Ok(Ok(stream)) => self.serve(stream).await,
            Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
            Err(_) => tracing::debug!("TLS handshake not finished within the header timeout"),
        }
    }

    async fn serve<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(self, stream: I) {
        let released = self.slot.0.released.clone();
        let service = PerConnection {
            app: self.app,
            trust: self.entry.trust.clone(),
            slot: self.slot.clone(),
            served: Arc::new(AtomicU64::new(0)),
            max_requests: self.max_requests,
        };
        let connection = self.http.serve_connection(TokioIo::new(stream), service);
        let mut connection = std::pin::pin!(connection);
        let close = self.entry.close.clone();
        // stopping, or the slot given back: the answer in progress is finished, then the
        // connection closes
        let mut closing = false;
        let result = loop {
            tokio::select! {
                result = connection.as_mut() => break result,
                _ = close.cancelled() => return,
                _ = self.shutdown.cancelled(), if !closing => closing = true,
                _ = released.cancelled(), if !closing => closing = true,
            }
            connection.as_mut().graceful_shutdown();
        };
        if let Err(error) = result {
            // a header or write timeout, a client gone, a malformed request: the client's business
            tracing::debug!(%error, "connection ended with an error");
        }
    }
}

/// The router as one connection serves it: each request carries the connection's trust, and
/// the connection's last allowed request is answered with `Connection: close`.
struct PerConnection {
    app: Router,
    trust: ConnectionTrust,
    slot: ConnectionSlot,
    served: Arc<AtomicU64>,
    max_requests: u64,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for PerConnection {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Self::Error>> + Send>>;

    fn call(&self, mut request: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.trust.clone());
        request.extensions_mut().insert(self.slot.clone());
        let last = self.served.fetch_add(1, Ordering::Relaxed) + 1 >= self.max_requests;
        let answer = tower_service::Service::call(&mut self.app.clone(), request.map(axum::body::Body::new));
        Box::pin(async move {
            let response = answer.await?;
            Ok(if last { closing(response) } else { response })
        })
    }
}

/// `I` whose writes fail (`TimedOut`) once one has waited `limit` for the client to take any
/// byte: a client that stops reading its answers loses its connection. Progress, however slow,
/// starts the wait again.
struct WriteDeadline<I> {
    inner: I,
    limit: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<I> WriteDeadline<I> {
    fn new(inner: I, limit: Duration) -> Self {
        WriteDeadline { inner, limit, stalled: None }
    }

    /// What a write that made progress (`Ready`) or none (`Pending`) comes to.
    fn judge<T>(&mut self, cx: &mut Context<'_>, poll: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let limit = self.limit;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client took none of its answer for {} s", limit.as_secs()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WriteDeadline<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.judge(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.judge(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.judge(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.judge(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attune_common::settings::Vars;

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let settings = HttpSettings::default();
        assert_eq!(
            (settings.header_timeout, settings.request_timeout),
            (Duration::from_secs(10), Duration::from_secs(30))
        );
        assert_eq!(
            (settings.max_connections, settings.max_body_bytes, settings.list_budget_bytes),
            (1024, 1024 * 1024, 4 * 1024 * 1024)
        );
        assert_eq!(
            (settings.write_timeout, settings.max_requests_per_connection, settings.shutdown_timeout),
            (Duration::from_secs(10), 1000, Duration::from_secs(35))
        );
        assert!(settings.tls.is_none());
    }

    #[test]
    fn a_request_is_either_withdrawn_or_written_never_both() {
        let withdrawn = Withdrawal::default();
        assert!(withdrawn.withdraw());
        assert!(withdrawn.withdraw(), "withdrawn it stays");
        assert!(!withdrawn.clone().begin_write(), "a withdrawn request is not written");
        let written = Withdrawal::default();
        assert!(written.clone().begin_write());
        assert!(written.begin_write(), "a request may write more than once");
        assert!(!written.withdraw(), "a request being written is not withdrawn");
    }

    #[test]
    fn zero_is_refused_naming_the_setting() {
        let error = HttpSettings::from_source(&Vars(&[("ATTUNE_API_MAX_CONNECTIONS", "0")])).unwrap_err();
        assert_eq!(error.name, "ATTUNE_API_MAX_CONNECTIONS");
    }

    #[test]
    fn one_tls_file_without_the_other_names_both() {
        for vars in [&[(CERT_FILE, "/tmp/cert.pem")], &[(KEY_FILE, "/tmp/key.pem")]] {
            let error = Tls::from_source(&Vars(vars)).unwrap_err().to_string();
            assert!(error.contains(CERT_FILE) && error.contains(KEY_FILE), "{error}");
        }
    }

    #[test]
    fn unreadable_tls_files_are_named() {
        let error = Tls::load(Path::new("/nonexistent/cert.pem"), Path::new("/nonexistent/key.pem")).unwrap_err();
        assert_eq!((error.name.as_str(), error.value.as_str()), (CERT_FILE, "/nonexistent/cert.pem"));
    }
}
