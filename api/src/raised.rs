//! The events attune raises itself (`attune.execution.exhausted`, `attune.worker.unhealthy`, …;
//! migration `20261208000000_own_events.sql`, ADR 0014) are answered here, as a webhook's
//! delivery is answered in `routes::events`: by every enabled rule of their trigger, recorded
//! with the executions the rules made.
//!
//! The database raises an event in the transaction of the change it tells of and puts it on a
//! waiting list (`event_pending`), announcing it on `attune_events`. Each API listens there and,
//! on an announcement or once a second whatever it heard, claims the waiting events one by one
//! (`FOR UPDATE SKIP LOCKED`: several APIs share them). A claim, the rules' answers and their
//! executions commit together, so an event is answered exactly once, and an API that dies
//! mid-answer leaves the claim to the next look. A database error puts the event back.

use std::time::Duration;

use attune_common::db::{
    self,
    announcements::{Announced, Announcements},
};
use attune_common::metrics::{self, EVENTS_RECEIVED};
use tokio_util::sync::CancellationToken;

use crate::ApiError;
use crate::routes::events::{carry_out_rules, plan_rules};

/// How often the waiting list is looked at whatever was announced: announcements are lost while
/// the listening connection is down.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Answers raised events until `shutdown` fires.
pub async fn answer(state: crate::State, shutdown: CancellationToken) {
    let mut listening: Option<Announcements> = None;
    let mut failing = false;
    loop {
        loop {
            match answer_one(&state).await {
                Ok(Some(_)) => failing = false,
                Ok(None) => break,
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(error = %e.message, "raised events not answered now; looking again in a second");
                    }
                    break;
                }
            }
            if shutdown.is_cancelled() {
                return;
            }
        }
        if listening.is_none() {
            listening = match Announcements::listen_for_events(&state.settings.common.database_url).await {
                Ok(listening) => Some(listening),
                Err(e) => {
                    tracing::debug!(error = %e, "not listening for raised events; looking once a second");
                    None
                }
            };
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(LOOK_EVERY) => {}
            heard = announced(&mut listening) => {
                if heard.is_err() {
                    listening = None;
                }
            }
        }
    }
}

async fn announced(listening: &mut Option<Announcements>) -> Result<Announced, sqlx::Error> {
    match listening {
        Some(listening) => listening.next().await,
        None => std::future::pending().await,
    }
}

/// Claims the oldest waiting event and answers it; `None` when none waits.
async fn answer_one(state: &crate::AppState) -> Result<Option<i64>, ApiError> {
    let mut tx = state.db.begin().await?;
    let Some(raised) = db::events::claim_raised(&mut tx).await? else {
        return Ok(None);
    };
    // (one answer at a time holds one connection while planning reads from the pool: no burst
    // of claims can starve it)
    let answers = plan_rules(state, raised.id, &raised.trigger, &raised.payload).await?;
    let matches = carry_out_rules(&mut tx, raised.id, answers).await?;
    tx.commit().await?;
    metrics::increment(&EVENTS_RECEIVED, &[], 1);
    tracing::debug!(event = raised.id, trigger = %raised.trigger, rules = matches.len(), "raised event answered");
    Ok(Some(raised.id))
}
