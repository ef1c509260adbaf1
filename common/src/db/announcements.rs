//! New waiting requests, as PostgreSQL announces them: every statement that inserts `requested`
//! executions notifies the channel [`CHANNEL`] when its transaction commits (the trigger
//! `execution_requests_announced`, migration `20261126000000_announce_requests.sql`) with the
//! runtimes of those rows. An executor listens on its own connection and looks at those runtimes
//! at once: nothing stands between a submission's commit and the scheduler's look.
//!
//! Notifications are not stored: those sent while the connection is down are lost. A listener
//! that loses its connection says so ([`Announced::Missed`]) so that its owner looks at every
//! runtime, and the schedulers' sweep of waiting rows covers whatever is left.
//!
//! With a `DATABASE_URL` of several hosts (or with `target_session_attrs`: `db::failover`), each
//! subscription is made on the host that is what the URL asks for, found afresh each time: a
//! lost connection is an error (the owner subscribes again, on whichever host that is then),
//! where with one host the listener opens its connection again to the same server itself. The
//! check after a silence also asks whether the host still is what is asked for, so a listener
//! left on one that no longer takes writes (where nothing is inserted any more) notices within
//! that silence.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};

use super::failover::{self, TargetSessionAttrs};

/// The channel the trigger notifies.
pub const CHANNEL: &str = "attune_requests";
/// The channel a workflow run's progress is announced on (a step or the run ended; the payload
/// is the run's id), by `execution_workflow_progress` (migration `20261206000000_workflows.sql`).
pub const WORKFLOW_CHANNEL: &str = "attune_workflows";
/// The channel an event attune raised is announced on (the payload is the event's id), by
/// `raise_event` (migration `20261208000000_own_events.sql`); the API listens to it alone.
pub const EVENTS_CHANNEL: &str = "attune_events";
/// What the executors listen to.
const EXECUTOR_CHANNELS: &[&str] = &[CHANNEL, WORKFLOW_CHANNEL];

/// What one wait on the listener brought.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Announced {
    /// Requests were committed for these runtimes.
    Runtimes(Vec<String>),
    /// Requests were committed for some runtime not named (a row whose action was unknown, too
    /// many runtimes for one notification, or a payload this version does not read).
    Some,
    /// The connection was lost (and is open again): announcements may have been missed.
    Missed,
    /// A step of this workflow run ended, or the run did.
    Workflow(i64),
    /// attune raised this event: it waits for its rules' answers.
    Event(i64),
}

/// How long a listener waits in silence before it checks its connection with a round trip. A
/// connection that only listens sends nothing, so one dropped without a reset (a firewall or NAT
/// that forgot it, a partition) would otherwise never be noticed, and the executor would be left
/// to its once-a-second sweep without a word.
const CHECK_AFTER_SILENCE: Duration = Duration::from_secs(30);
/// How long that check, or the subscription itself, may take.
const PATIENCE: Duration = Duration::from_secs(10);

/// A listening connection of its own (not one of a pool's: it stays subscribed).
pub struct Announcements {
    listener: PgListener,
    check_after_silence: Duration,
    patience: Duration,
    /// What the host must still be at each check (`None`: a URL of one host without
    /// `target_session_attrs`, whose check is a round trip and nothing more).
    target: Option<TargetSessionAttrs>,
}

impl Announcements {
    /// Opens the connection and subscribes. Fails if the database cannot be reached now.
    pub async fn listen(database_url: &str) -> Result<Self, sqlx::Error> {
        Self::listen_checking(database_url, CHECK_AFTER_SILENCE, PATIENCE).await
    }

    /// `listen` to the events attune raises ([`EVENTS_CHANNEL`]) alone: the API's.
    pub async fn listen_for_events(database_url: &str) -> Result<Self, sqlx::Error> {
        Self::listen_to(database_url, &[EVENTS_CHANNEL], CHECK_AFTER_SILENCE, PATIENCE).await
    }

    /// `listen`, checking the connection after `check_after_silence` without a notification and
    /// giving up on a check (or on subscribing) after `patience`.
    pub async fn listen_checking(
        database_url: &str,
        check_after_silence: Duration,
        patience: Duration,
    ) -> Result<Self, sqlx::Error> {
        Self::listen_to(database_url, EXECUTOR_CHANNELS, check_after_silence, patience).await
    }

    async fn listen_to(
        database_url: &str,
        channels: &'static [&'static str],
        check_after_silence: Duration,
        patience: Duration,
    ) -> Result<Self, sqlx::Error> {
        crate::tls::install_default_provider();
        let hosts = super::database_hosts(database_url)?;
        let target = hosts.followed().then(|| hosts.target());
        let options = match target {
            None => hosts.first().clone(),
            // (the host's own patience, then the subscription's)
            Some(_) => {
                let (index, checked) = hosts.pick(0, patience).await?;
                let _ = sqlx::Connection::close(checked).await;
                hosts.options(index).clone()
            }
        };
        let subscribing = Self::subscribe(options, target.is_none(), channels);
        let listener = tokio::time::timeout(patience, subscribing).await.map_err(|_| unanswered("LISTEN"))??;
        Ok(Announcements { listener, check_after_silence, patience, target })
    }

    /// Subscribes on a connection to `options`; `reconnect`: the listener opens a lost connection
    /// again by itself, to the same server.
    async fn subscribe(
        options: sqlx::postgres::PgConnectOptions,
        reconnect: bool,
        channels: &[&str],
    ) -> Result<PgListener, sqlx::Error> {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.ignore_pool_close_event(true);
        listener.eager_reconnect(reconnect);
        listener.listen_all(channels.iter().copied()).await?;
        Ok(listener)
    }

    /// Waits for the next announcement. An error means the connection is gone (or stopped
    /// answering) and could not be opened again: the caller waits and listens anew.
    pub async fn next(&mut self) -> Result<Announced, sqlx::Error> {
        loop {
            // (`try_recv` is cancel-safe: a message half read stays in the connection's buffer)
            match tokio::time::timeout(self.check_after_silence, self.listener.try_recv()).await {
                Ok(received) => {
                    return match received? {
                        Some(notification) if notification.channel() == WORKFLOW_CHANNEL => {
                            match notification.payload().parse() {
                                Ok(run) => Ok(Announced::Workflow(run)),
                                Err(_) => continue,
                            }
                        }
                        Some(notification) if notification.channel() == EVENTS_CHANNEL => {
                            match notification.payload().parse() {
                                Ok(event) => Ok(Announced::Event(event)),
                                Err(_) => continue,
                            }
                        }
                        Some(notification) => Ok(parse(notification.payload())),
                        None if self.target.is_none() => Ok(Announced::Missed),
                        // (not opened again here: to the server it was on)
                        None => Err(sqlx::Error::Io(std::io::Error::new(
                            std::io::ErrorKind::ConnectionAborted,
                            "the listening connection was lost",
                        ))),
                    };
                }
                Err(_) => self.check().await?,
            }
        }
    }

    /// One round trip on the listening connection (notifications that arrive meanwhile are kept
    /// for `next`); where the URL asks for a kind of host, an error if this one no longer is.
    async fn check(&mut self) -> Result<(), sqlx::Error> {
        let Some(target) = self.target else {
            let checking = sqlx::query("SELECT 1").execute(&mut self.listener);
            return tokio::time::timeout(self.patience, checking).await.map_err(|_| unanswered("a check"))?.map(|_| ());
        };
        let checking = failover::check(&mut self.listener, target);
        let server = tokio::time::timeout(self.patience, checking).await.map_err(|_| unanswered("a check"))??;
        if target.accepts(server) {
            return Ok(());
        }
        let message = format!("the listening connection's host is {server} now: listening on another");
        Err(sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::NotConnected, message)))
    }
}

fn unanswered(what: &str) -> sqlx::Error {
    let message = format!("the listening connection did not answer {what}");
    sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, message))
}

/// A notification's payload: a JSON array of runtime names, `null` for one not known.
fn parse(payload: &str) -> Announced {
    match serde_json::from_str::<Vec<Option<String>>>(payload) {
        Ok(runtimes) if !runtimes.is_empty() => {
            runtimes.into_iter().collect::<Option<Vec<String>>>().map_or(Announced::Some, Announced::Runtimes)
        }
        _ => Announced::Some,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_name_runtimes_or_stand_for_all() {
        let runtimes = |names: &[&str]| Announced::Runtimes(names.iter().map(|name| name.to_string()).collect());
        assert_eq!(parse(r#"["shell"]"#), runtimes(&["shell"]));
        assert_eq!(parse(r#"["python", "shell"]"#), runtimes(&["python", "shell"]));
        assert_eq!(parse(r#"[null]"#), Announced::Some);
        assert_eq!(parse(r#"["shell", null]"#), Announced::Some);
        assert_eq!(parse("[]"), Announced::Some);
        assert_eq!(parse("not json"), Announced::Some);
    }
}
