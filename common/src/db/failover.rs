//! A `DATABASE_URL` that names several PostgreSQL servers, in libpq's multi-host form
//! (`postgres://user:pw@host1:5432,host2:5432/attune?target_session_attrs=read-write`), and pools
//! that follow the one that takes writes through a switchover, without a restart. sqlx takes one
//! host per URL; this module splits the list and moves a pool from one host to another.
//!
//! - At start the hosts are tried in the order given, and the first that answers and is what
//!   `target_session_attrs` asks for (`any`, the default; `read-write`; `primary`) becomes the
//!   pool's.
//! - Every new connection of the pool is checked with one round trip (is the server in recovery,
//!   are its sessions read-only by default?), and one to a server that is not what is asked for is
//!   refused (sqlx logs "error returned from after_connect" and opens another).
//! - A watcher per pool, on one connection of its own, checks its host once a second (one round
//!   trip). When the host is gone or no longer what is asked for, it tries the others (the next
//!   one first, the one that failed last) until one is, and points the pool at it
//!   (`Pool::set_connect_options`): connections opened from then on go there, and those opened
//!   before are closed rather than handed out again. Statements in flight when the host went fail
//!   as when the database is lost, and their callers wait that out (`db::is_transient`).
//!
//! A URL with one host and no `target_session_attrs` is none of this: its pool is sqlx's, with
//! no check and no watcher, exactly as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::{ConnectOptions, Connection};

/// How often a watcher checks its pool's host.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How long a host may take to accept a connection, or to answer a check, before the next is
/// tried.
pub const PATIENCE: Duration = Duration::from_secs(5);
/// The longest a watcher waits between two rounds of the hosts when none is what is asked for.
const ROUND_EVERY_AT_MOST: Duration = Duration::from_secs(1);
/// How often a watcher that finds no host says so again.
const SAY_AGAIN_AFTER: Duration = Duration::from_secs(10);

/// What a session must be for attune to use it: libpq's `target_session_attrs`, those of its
/// values that can take writes (attune writes; `read-only`, `standby` and `prefer-standby` are
/// refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetSessionAttrs {
    /// Any server that accepts the connection (the default).
    Any,
    /// A server whose sessions take writes by default: not in recovery, and
    /// `default_transaction_read_only` off.
    ReadWrite,
    /// A server not in recovery (a primary, even one whose sessions start read-only).
    Primary,
}

impl TargetSessionAttrs {
    fn parse(value: &str) -> Result<Self, String> {
        match value {
            "any" => Ok(Self::Any),
            "read-write" => Ok(Self::ReadWrite),
            "primary" => Ok(Self::Primary),
            "read-only" | "standby" | "prefer-standby" => Err(format!(
                "DATABASE_URL's target_session_attrs={value} is not supported: attune writes, so its sessions \
                 must be read-write or primary (or any)"
            )),
            other => Err(format!(
                "invalid value {other:?} for DATABASE_URL's target_session_attrs: one of any, read-write, primary"
            )),
        }
    }

    /// Whether a server in this state is what is asked for.
    pub fn accepts(self, server: Server) -> bool {
        match self {
            Self::Any => true,
            Self::ReadWrite => !server.in_recovery && !server.read_only,
            Self::Primary => !server.in_recovery,
        }
    }
}

impl std::fmt::Display for TargetSessionAttrs {
    /// As written in the URL.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Any => "any",
            Self::ReadWrite => "read-write",
            Self::Primary => "primary",
        })
    }
}

/// What a server said of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Server {
    /// `pg_is_in_recovery()`: a standby, or one being promoted.
    pub in_recovery: bool,
    /// `transaction_read_only` at the session's start (`default_transaction_read_only`, or a
    /// standby's).
    pub read_only: bool,
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.in_recovery, self.read_only) {
            (true, _) => write!(f, "in recovery (a standby)"),
            (false, true) => write!(f, "read-only (default_transaction_read_only)"),
            (false, false) => write!(f, "read-write"),
        }
    }
}

/// DATABASE_URL split into one URL per host, each as sqlx reads one (`target_session_attrs`
/// taken out of their query, everything else kept), and the `target_session_attrs` it named.
#[derive(Debug, PartialEq, Eq)]
struct Split {
    urls: Vec<String>,
    target: Option<TargetSessionAttrs>,
}

/// Splits libpq's multi-host form. A URL with one host and no `target_session_attrs` comes back
/// unchanged (sqlx reads it, and says what is wrong with it, as it always did).
fn split(database_url: &str) -> Result<Split, String> {
    let unchanged = || Split { urls: vec![database_url.to_string()], target: None };
    let Some((scheme, rest)) = database_url.split_once("://") else {
        return Ok(unchanged());
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    // (the hosts come after the last `@`: a password may hold a comma)
    let (userinfo, host_list) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), authority),
    };
    let tail = tail.split_once('#').map_or(tail, |(before, _)| before);
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let mut target = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("target_session_attrs", value)) => target = Some(TargetSessionAttrs::parse(&percent_decoded(value))?),
            None if pair == "target_session_attrs" => return Err(TargetSessionAttrs::parse("").unwrap_err()),
            _ => kept.push(pair),
        }
    }
    let hosts: Vec<&str> = host_list.split(',').collect();
    if hosts.len() == 1 && target.is_none() {
        return Ok(unchanged());
    }
    if let Some(empty) = hosts.iter().position(|host| host.is_empty()) {
        return Err(format!(
            "DATABASE_URL's host list ({host_list}) has an empty entry at position {}: write host or host:port, \
             separated by commas",
            empty + 1
        ));
    }
    let query = if kept.is_empty() { String::new() } else { format!("?{}", kept.join("&")) };
    let urls = hosts.iter().map(|host| format!("{scheme}://{userinfo}{host}{path}{query}")).collect();
    Ok(Split { urls, target })
}

/// `%XX` sequences decoded (a value written percent-encoded, as a URL allows).
fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| bytes.get(at).and_then(|b| (*b as char).to_digit(16));
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// DATABASE_URL's hosts, each as the connect options of a URL of its own, and what a session must
/// be.
#[derive(Debug, Clone)]
pub struct Hosts {
    options: Vec<PgConnectOptions>,
    target: TargetSessionAttrs,
    /// Whether the URL has several hosts or names `target_session_attrs`: new connections are
    /// checked, and a watcher follows the hosts.
    followed: bool,
}

impl Hosts {
    /// Parses `database_url`, making each host's options with `options` (a single-host URL in,
    /// its connect options out).
    pub fn parse(
        database_url: &str,
        options: impl Fn(&str) -> Result<PgConnectOptions, sqlx::Error>,
    ) -> Result<Hosts, sqlx::Error> {
        let split = split(database_url).map_err(|reason| sqlx::Error::Configuration(reason.into()))?;
        let count = split.urls.len();
        let options = split
            .urls
            .iter()
            .enumerate()
            .map(|(n, url)| {
                let parsed = options(url).map_err(|e| match count {
                    1 => e,
                    _ => sqlx::Error::Configuration(
                        format!("DATABASE_URL's host {} of {count} ({}): {e}", n + 1, host_of(url)).into(),
                    ),
                })?;
                // an IPv6 address comes out of the URL in its brackets, which sqlx would look up
                // as a name (and fail)
                let host = parsed.get_host();
                Ok::<_, sqlx::Error>(match host.strip_prefix('[').and_then(|host| host.strip_suffix(']')) {
                    Some(address) => {
                        let address = address.to_string();
                        parsed.host(&address)
                    }
                    None => parsed,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let target = split.target.unwrap_or(TargetSessionAttrs::Any);
        Ok(Hosts { followed: count > 1 || split.target.is_some(), options, target })
    }

    /// The first host's options (the only host's, for a URL of one).
    pub fn first(&self) -> &PgConnectOptions {
        &self.options[0]
    }

    /// Whether pools of this URL check new connections and follow the hosts (several hosts, or
    /// `target_session_attrs` named).
    pub fn followed(&self) -> bool {
        self.followed
    }

    pub fn target(&self) -> TargetSessionAttrs {
        self.target
    }

    pub fn len(&self) -> usize {
        self.options.len()
    }

    pub fn is_empty(&self) -> bool {
        self.options.is_empty()
    }

    pub fn options(&self, index: usize) -> &PgConnectOptions {
        &self.options[index]
    }

    /// Host `index` as `host:port`, for the logs.
    pub fn name(&self, index: usize) -> String {
        name(&self.options[index])
    }

    /// Tries the hosts in turn from `from` on (wrapping round), each given `patience` to connect
    /// and answer, and returns the first that is what is asked for, with the connection it was
    /// checked on. None is: an I/O error (transient, as a lost database is) naming what each
    /// host was, or, where a host refused TLS (its certificate, an unreadable `sslrootcert`),
    /// that refusal, which waiting does not mend (`db::connect` reports it at once).
    pub async fn pick(&self, from: usize, patience: Duration) -> Result<(usize, PgConnection), sqlx::Error> {
        let mut answers = Vec::with_capacity(self.options.len());
        let mut tls_refused = None;
        for step in 0..self.options.len() {
            let index = (from + step) % self.options.len();
            let trying = async {
                let mut connection = self.options[index].connect().await?;
                let server = check(&mut connection, self.target).await?;
                Ok::<_, sqlx::Error>((connection, server))
            };
            match tokio::time::timeout(patience, trying).await {
                Ok(Ok((connection, server))) if self.target.accepts(server) => return Ok((index, connection)),
                Ok(Ok((connection, server))) => {
                    let _ = connection.close().await;
                    answers.push(format!("{}: {server}", self.name(index)));
                }
                Ok(Err(e)) => {
                    answers.push(format!("{}: {e}", self.name(index)));
                    let unreadable_root =
                        matches!(&e, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound);
                    if matches!(e, sqlx::Error::Tls(_)) || crate::tls::tls_error(&e).is_some() || unreadable_root {
                        tls_refused.get_or_insert(e);
                    }
                }
                Err(_) => answers.push(format!("{}: no answer within {patience:?}", self.name(index))),
            }
        }
        if let Some(refused) = tls_refused {
            return Err(refused);
        }
        let wanted = match self.target {
            TargetSessionAttrs::Any => "answers",
            TargetSessionAttrs::ReadWrite => "takes writes (target_session_attrs=read-write)",
            TargetSessionAttrs::Primary => "is a primary (target_session_attrs=primary)",
        };
        let message = format!("no host of DATABASE_URL {wanted}: {}", answers.join("; "));
        Err(sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::NotConnected, message)))
    }
}

fn name(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(socket) => format!("{}:{}", socket.display(), options.get_port()),
        None if options.get_host().contains(':') => format!("[{}]:{}", options.get_host(), options.get_port()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

/// A single-host URL's `host:port` as written (for an error about it: never its password).
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    authority.rsplit_once('@').map_or(authority, |(_, host)| host)
}

/// What the server of `connection` is, as far as `target` needs to know: nothing for `any` (no
/// round trip), else one round trip.
pub async fn check(connection: impl sqlx::PgExecutor<'_>, target: TargetSessionAttrs) -> Result<Server, sqlx::Error> {
    if target == TargetSessionAttrs::Any {
        return Ok(Server { in_recovery: false, read_only: false });
    }
    let (in_recovery, read_only): (bool, bool) =
        sqlx::query_as("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')::boolean")
            .fetch_one(connection)
            .await?;
    Ok(Server { in_recovery, read_only })
}

/// What a followed pool's callbacks and its watcher share.
pub struct Follower {
    hosts: Hosts,
    /// The host the pool connects to now.
    current: AtomicUsize,
    /// When the pool last moved, in nanoseconds after `epoch` (0: it never did).
    moved_at: AtomicU64,
    epoch: Instant,
    /// Wakes the watcher early (a new connection was refused).
    wake: tokio::sync::Notify,
}

impl Follower {
    pub fn new(hosts: Hosts, current: usize) -> Follower {
        Follower {
            hosts,
            current: AtomicUsize::new(current),
            moved_at: AtomicU64::new(0),
            epoch: Instant::now(),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// Whether a connection `age` old was opened before the pool last moved (to the host it left,
    /// or to one that failed): it is closed rather than handed out.
    pub fn predates_move(&self, age: Duration) -> bool {
        let moved_at = self.moved_at.load(Ordering::Relaxed);
        moved_at != 0 && self.epoch.elapsed().saturating_sub(age).as_nanos() < moved_at as u128
    }

    /// Checks a connection the pool just opened (its `after_connect`): one round trip, unless the
    /// target is `any`. A server that is not what is asked for is refused, and the watcher woken.
    pub async fn admit(&self, connection: &mut PgConnection) -> Result<(), sqlx::Error> {
        let server = check(&mut *connection, self.hosts.target).await?;
        if self.hosts.target.accepts(server) {
            return Ok(());
        }
        self.wake.notify_one();
        let host = self.hosts.name(self.current.load(Ordering::Relaxed));
        Err(sqlx::Error::Configuration(
            format!(
                "refused a connection to the database host {host}: it is {server}, and DATABASE_URL asks for \
                 target_session_attrs={}",
                self.hosts.target
            )
            .into(),
        ))
    }

    fn mark_moved(&self) {
        // (at least 1: 0 means never)
        self.moved_at.store((self.epoch.elapsed().as_nanos() as u64).max(1), Ordering::Relaxed);
    }
}

/// Opens a followed pool: picks the host (waiting up to `PATIENCE` on each), opens the pool there
/// with `options` (given the follower for its callbacks), and starts the pool's watcher.
pub async fn open(
    hosts: &Hosts,
    options: impl FnOnce(Arc<Follower>) -> sqlx::postgres::PgPoolOptions,
) -> Result<PgPool, sqlx::Error> {
    let (index, watching) = hosts.pick(0, PATIENCE).await?;
    let follower = Arc::new(Follower::new(hosts.clone(), index));
    let pool = options(follower.clone()).connect_with(hosts.options[index].clone()).await?;
    tracing::info!(host = %hosts.name(index), target_session_attrs = %hosts.target, "connected to the database");
    tokio::spawn(watch(pool.clone(), follower, watching));
    Ok(pool)
}

/// A pool's watcher, until the pool is closed: checks the pool's host on `watching` every
/// `WATCH_EVERY` (or at once when a new connection was refused), and moves the pool when the
/// host is gone or no longer what is asked for.
async fn watch(pool: PgPool, follower: Arc<Follower>, mut watching: PgConnection) {
    let closed = pool.close_event();
    tokio::pin!(closed);
    let target = follower.hosts.target;
    loop {
        tokio::select! {
            _ = &mut closed => return,
            _ = follower.wake.notified() => {}
            _ = tokio::time::sleep(WATCH_EVERY) => {}
        }
        let checking = async {
            if target == TargetSessionAttrs::Any {
                watching.ping().await.map(|_| Server { in_recovery: false, read_only: false })
            } else {
                check(&mut watching, target).await
            }
        };
        let failure = match tokio::time::timeout(PATIENCE, checking).await {
            Ok(Ok(server)) if target.accepts(server) => continue,
            Ok(Ok(server)) => format!("it is {server}"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("it did not answer within {PATIENCE:?}"),
        };
        let left = follower.current.load(Ordering::Relaxed);
        tracing::warn!(host = %follower.hosts.name(left), reason = %failure, "the database host is lost or no longer takes what DATABASE_URL asks for: looking for another");
        let mut delay = Duration::from_millis(100);
        let mut said = Instant::now();
        let (index, connection) = loop {
            let picking = follower.hosts.pick(left + 1, PATIENCE);
            let picked = tokio::select! {
                _ = &mut closed => return,
                picked = picking => picked,
            };
            match picked {
                Ok(picked) => break picked,
                Err(e) if said.elapsed() >= SAY_AGAIN_AFTER => {
                    tracing::warn!(error = %e, "still no database host to move to");
                    said = Instant::now();
                }
                Err(e) => {
                    tracing::debug!(error = %e, retry_in_ms = delay.as_millis() as u64, "no database host to move to yet")
                }
            }
            tokio::select! {
                _ = &mut closed => return,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(ROUND_EVERY_AT_MOST);
        };
        pool.set_connect_options(follower.hosts.options[index].clone());
        follower.current.store(index, Ordering::Relaxed);
        // connections opened before now went to a host that failed: none is handed out again
        follower.mark_moved();
        watching = connection;
        let (from, to) = (follower.hosts.name(left), follower.hosts.name(index));
        if index == left {
            tracing::info!(host = %to, "the database host is back");
        } else {
            crate::metrics::increment(&crate::metrics::DATABASE_HOST_MOVES, &[("host", &to)], 1);
            tracing::warn!(from = %from, to = %to, "moved to another database host");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(url: &str) -> Vec<String> {
        split(url).unwrap().urls
    }

    fn parsed(url: &str) -> Hosts {
        Hosts::parse(url, |one| one.parse()).unwrap()
    }

    #[test]
    fn one_host_without_target_is_left_as_written() {
        for url in [
            "postgres://attune:pw@127.0.0.1:5432/attune",
            "postgres://attune:pw@127.0.0.1/attune?sslmode=require",
            "postgresql://u@[::1]:5433/db#fragment",
            "not a url",
        ] {
            assert_eq!(split(url).unwrap(), Split { urls: vec![url.to_string()], target: None }, "{url}");
        }
        assert!(!parsed("postgres://attune:pw@127.0.0.1:5432/attune").followed());
    }

    #[test]
    fn hosts_are_split_with_their_ports_and_the_rest_kept() {
        let url = "postgres://attune:pw@db1:5432,db2:5433,db3/attune?sslmode=disable&target_session_attrs=read-write&application_name=x";
        assert_eq!(
            split(url).unwrap(),
            Split {
                urls: vec![
                    "postgres://attune:pw@db1:5432/attune?sslmode=disable&application_name=x".into(),
                    "postgres://attune:pw@db2:5433/attune?sslmode=disable&application_name=x".into(),
                    "postgres://attune:pw@db3/attune?sslmode=disable&application_name=x".into(),
                ],
                target: Some(TargetSessionAttrs::ReadWrite),
            }
        );
        let hosts = parsed(url);
        assert!(hosts.followed());
        assert_eq!(hosts.len(), 3);
        let ports: Vec<u16> = (0..3).map(|n| hosts.options(n).get_port()).collect();
        // a host without a port has the default, as a single-host URL without one
        let default: u16 = "postgres://db3/attune".parse::<PgConnectOptions>().unwrap().get_port();
        assert_eq!(ports, [5432, 5433, default]);
        assert_eq!(hosts.options(2).get_host(), "db3");
        assert_eq!(hosts.options(1).get_database(), Some("attune"));
        assert_eq!(hosts.options(1).get_application_name(), Some("x"));
        assert_eq!(hosts.name(1), "db2:5433");
    }

    #[test]
    fn ipv6_hosts_in_brackets() {
        let hosts = parsed("postgres://u:pw@[::1]:5695,[fe80::1]/db?target_session_attrs=primary");
        assert_eq!(hosts.target(), TargetSessionAttrs::Primary);
        // (without the brackets, which sqlx would look up as a name)
        assert_eq!(hosts.options(0).get_host(), "::1");
        assert_eq!(hosts.options(0).get_port(), 5695);
        assert_eq!(hosts.options(1).get_host(), "fe80::1");
        assert_eq!(hosts.name(0), "[::1]:5695");
        assert_eq!(parsed("postgres://u@[::1]:5432/db").first().get_host(), "::1");
        assert_eq!(urls("postgres://u:pw@[::1]:5695,[fe80::1]/db")[1], "postgres://u:pw@[fe80::1]/db");
    }

    #[test]
    fn passwords_stay_as_written_and_may_hold_commas() {
        // percent-encoded (an `@` and a `,`), and a raw comma before the `@`
        let encoded = urls("postgres://attune:p%40ss%2Cw@h1:1,h2:2/db");
        assert_eq!(encoded, ["postgres://attune:p%40ss%2Cw@h1:1/db", "postgres://attune:p%40ss%2Cw@h2:2/db"]);
        let raw = urls("postgres://attune:a,b@h1,h2/db");
        assert_eq!(raw, ["postgres://attune:a,b@h1/db", "postgres://attune:a,b@h2/db"]);
        let hosts = parsed("postgres://attune:p%40ss%2Cw@h1:1,h2:2/db");
        assert_eq!(hosts.options(1).get_username(), "attune");
        assert_eq!(hosts.options(1).get_host(), "h2");
        // no user at all
        assert_eq!(urls("postgres://h1,h2/db"), ["postgres://h1/db", "postgres://h2/db"]);
    }

    #[test]
    fn target_session_attrs_alone_makes_a_single_host_followed() {
        let split = split("postgres://u@h:5432/db?target_session_attrs=read-write").unwrap();
        assert_eq!(split.urls, ["postgres://u@h:5432/db"]);
        assert_eq!(split.target, Some(TargetSessionAttrs::ReadWrite));
        assert!(parsed("postgres://u@h:5432/db?target_session_attrs=any").followed());
        assert_eq!(split_target("read%2Dwrite"), Ok(Some(TargetSessionAttrs::ReadWrite)));
        assert_eq!(split_target("any"), Ok(Some(TargetSessionAttrs::Any)));
    }

    fn split_target(value: &str) -> Result<Option<TargetSessionAttrs>, String> {
        split(&format!("postgres://h1,h2/db?target_session_attrs={value}")).map(|split| split.target)
    }

    #[test]
    fn unknown_or_read_only_targets_are_refused_naming_the_parameter() {
        for value in ["readwrite", "", "Read-Write"] {
            let error = split_target(value).unwrap_err();
            assert!(error.contains("target_session_attrs") && error.contains("read-write, primary"), "{error}");
        }
        for value in ["read-only", "standby", "prefer-standby"] {
            let error = split_target(value).unwrap_err();
            assert!(error.contains(&format!("target_session_attrs={value} is not supported")), "{error}");
        }
        let error = split("postgres://h1/db?target_session_attrs").unwrap_err();
        assert!(error.contains("target_session_attrs"), "{error}");
    }

    #[test]
    fn bad_host_lists_say_which_host() {
        let error = split("postgres://u@h1,,h3/db").unwrap_err();
        assert!(error.contains("empty entry at position 2"), "{error}");
        let error = Hosts::parse("postgres://u:secret@h1:5432,h2:port/db", |one| one.parse()).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("host 2 of 2 (h2:port)") && !text.contains("secret"), "{text}");
    }

    #[test]
    fn targets_accept_servers() {
        let server = |in_recovery, read_only| Server { in_recovery, read_only };
        use TargetSessionAttrs::*;
        assert!(Any.accepts(server(true, true)));
        assert!(ReadWrite.accepts(server(false, false)));
        assert!(!ReadWrite.accepts(server(false, true)));
        assert!(!ReadWrite.accepts(server(true, true)));
        assert!(Primary.accepts(server(false, true)));
        assert!(!Primary.accepts(server(true, true)));
    }

    #[test]
    fn connections_from_before_a_move_are_told() {
        let follower = Follower::new(parsed("postgres://h1,h2/db"), 0);
        assert!(!follower.predates_move(Duration::from_secs(3600)), "never moved");
        follower.mark_moved();
        assert!(follower.predates_move(Duration::from_millis(5)));
        assert!(!follower.predates_move(Duration::ZERO));
    }
}
