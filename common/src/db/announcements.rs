//! New waiting requests, as PostgreSQL announces them: every statement that inserts `requested`
//! executions notifies the channel [`CHANNEL`] when its transaction commits (the trigger
//! `execution_requests_announced`, migration `20261126000000_announce_requests.sql`) with the
//! runtimes of those rows. An executor listens on its own connection and looks at those runtimes
//! at once: nothing stands between a submission's commit and the scheduler's look.
//!
//! Notifications are not stored: those sent while the connection is down are lost. A listener
//! that loses its connection says so ([`Announced::Missed`]) so that its owner looks at every
//! runtime, and the schedulers' sweep of waiting rows covers whatever is left.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};

/// The channel the trigger notifies.
pub const CHANNEL: &str = "attune_requests";

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
}

/// A listening connection of its own (not one of a pool's: it stays subscribed).
pub struct Announcements {
    listener: PgListener,
}

impl Announcements {
    /// Opens the connection and subscribes. Fails if the database cannot be reached now.
    pub async fn listen(database_url: &str) -> Result<Self, sqlx::Error> {
        crate::tls::install_default_provider();
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(super::connect_options(database_url)?)
            .await?;
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.ignore_pool_close_event(true);
        listener.listen(CHANNEL).await?;
        Ok(Announcements { listener })
    }

    /// Waits for the next announcement. An error means the connection is gone and could not be
    /// opened again: the caller waits and listens anew.
    pub async fn next(&mut self) -> Result<Announced, sqlx::Error> {
        Ok(match self.listener.try_recv().await? {
            Some(notification) => parse(notification.payload()),
            None => Announced::Missed,
        })
    }
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
