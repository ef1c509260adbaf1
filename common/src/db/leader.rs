//! Singleton work across processes (the executors' monitor and history job) that a stalled holder
//! cannot keep to itself.
//!
//! The work is done by whoever holds a session-level advisory lock. A session keeps such a lock
//! until it ends, and a holder that stalls (`SIGSTOP`, a stalled VM, a connection partitioned
//! without a reset) leaves its session open and idle: the lock would be held, and the work left
//! undone everywhere, for as long as the server believes in the connection (hours of TCP
//! keepalive). So the lock's session is given an `idle_session_timeout` of `lease`, and kept busy
//! with a round trip every third of it while the work runs: a holder that stops for longer loses
//! its session, and with it the lock, to the server, and another process takes over. A holder
//! that comes back finds its session gone at its next round trip and stops; the work it may do
//! in between is guarded like all of it (every change a guarded transition), so two holders for a
//! moment change nothing twice.

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::pool::PoolConnection;

/// The lock `key`, held on a session of its own.
pub struct Leadership {
    /// (`None` once `run` took it)
    connection: Option<PoolConnection<sqlx::Postgres>>,
    key: i64,
    lease: Duration,
}

impl Drop for Leadership {
    /// A lock taken and never run with goes with its session (the connection is closed, not
    /// returned to the pool holding it).
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            drop(connection.detach());
        }
    }
}

impl Leadership {
    /// Takes the lock `key` if no session holds it; `None` if one does.
    pub async fn try_take(db: &PgPool, key: i64, lease: Duration) -> Result<Option<Leadership>, sqlx::Error> {
        let mut connection = db.acquire().await?;
        let millis = lease.as_millis().clamp(1, i32::MAX as u128).to_string();
        match sqlx::query("SELECT set_config('idle_session_timeout', $1, false)")
            .bind(&millis)
            .execute(&mut *connection)
            .await
        {
            Ok(_) => {}
            // undefined_object: PostgreSQL before 14 has no idle_session_timeout; the lock is
            // then held as before, for as long as the session lasts
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42704") => {
                tracing::warn!("PostgreSQL before 14: a stalled leader keeps its lock until its connection ends");
            }
            Err(e) => return Err(e),
        }
        match super::try_advisory_lock(&mut connection, key).await {
            Ok(true) => {}
            Ok(false) => {
                release_session(connection).await;
                return Ok(None);
            }
            // (not back to the pool with the session's timeout, or perhaps the lock)
            Err(e) => {
                drop(connection.detach());
                return Err(e);
            }
        }
        Ok(Some(Leadership { connection: Some(connection), key, lease }))
    }

    /// Runs `work` as the holder, keeping the lock's session busy meanwhile, then releases the
    /// lock. Fails, dropping `work` where it stands, if the session was lost (the lock may be
    /// someone else's now).
    pub async fn run<F: Future>(mut self, work: F) -> Result<F::Output, sqlx::Error> {
        let (key, lease) = (self.key, self.lease);
        // (if this future is dropped before the end, the connection is closed, not returned to
        // the pool holding the lock)
        let mut held = Session(self.connection.take());
        let connection = held.0.as_mut().expect("a leadership is run once");
        let every = (lease / 3).max(Duration::from_millis(10));
        // a ping may take up to two thirds of the lease: the server ends the session only once
        // it has been idle for the whole lease
        let patience = lease * 2 / 3;
        // a holder that stalled since it took the lock may have lost it: no work without it
        if let Err(e) = sqlx::query("SELECT 1").execute(&mut **connection).await {
            held.close();
            return Err(e);
        }
        let lost = {
            let keep = async {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let ping = sqlx::query("SELECT 1").execute(&mut **connection);
                    match tokio::time::timeout(patience, ping).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return e,
                        Err(_) => return sqlx::Error::PoolTimedOut,
                    }
                }
            };
            tokio::select! {
                output = work => Ok(output),
                lost = keep => Err(lost),
            }
        };
        match lost {
            Ok(output) => {
                let mut connection = held.0.take().expect("held until released");
                match super::advisory_unlock(&mut connection, key).await {
                    Ok(()) => release_session(connection).await,
                    // (closing the session releases the lock)
                    Err(_) => drop(connection.detach()),
                }
                Ok(output)
            }
            Err(e) => {
                tracing::warn!(error = %e, lock = key, "lost the session holding a singleton lock: stopping its work");
                held.close();
                Err(e)
            }
        }
    }
}

/// The lock's session while the work runs: closed when dropped, unless released.
struct Session(Option<PoolConnection<sqlx::Postgres>>);

impl Session {
    fn close(&mut self) {
        if let Some(connection) = self.0.take() {
            drop(connection.detach());
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.close();
    }
}

/// Returns the connection to the pool as it came (or closes it if that fails).
async fn release_session(mut connection: PoolConnection<sqlx::Postgres>) {
    if sqlx::query("RESET idle_session_timeout").execute(&mut *connection).await.is_err() {
        drop(connection.detach());
    }
}
