//! Long-lived streams (`GET /executions/{id}/output`): their budget and bounds, apart from the
//! request slots (issue 47).
//!
//! A stream holds its client's connection for as long as the execution runs, so streams are not
//! counted among the `ATTUNE_API_MAX_CONNECTIONS` request slots: a connection that starts one
//! gives its slot back (`server::ConnectionSlot`) and closes once the stream ends. They have a
//! budget of their own instead: at most `ATTUNE_API_OUTPUT_STREAMS_PER_TOKEN` (8) open at once
//! per token and `ATTUNE_API_OUTPUT_STREAMS` (256) in all; one more is refused with
//! `429 too_many_streams` naming the limit. So streams can hold at most that many connections
//! (and file descriptors) beside the request slots, one token at most its share, and neither
//! `/healthz`, `/readyz` nor any other client waits behind them. A stream ends (`closed`) when
//! nothing was sent on it for `ATTUNE_API_OUTPUT_STREAM_IDLE_SECS` (300) or its client takes no
//! event that long, and at the latest after `ATTUNE_API_OUTPUT_STREAM_MAX_SECS` (900).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use attune_common::config::{ConfigError, FromEnv, Source, read};
use axum::http::StatusCode;
use serde_json::json;

use crate::ApiError;

pub const PER_TOKEN: &str = "ATTUNE_API_OUTPUT_STREAMS_PER_TOKEN";
pub const TOTAL: &str = "ATTUNE_API_OUTPUT_STREAMS";
pub const IDLE: &str = "ATTUNE_API_OUTPUT_STREAM_IDLE_SECS";
pub const MAX: &str = "ATTUNE_API_OUTPUT_STREAM_MAX_SECS";

/// How many streams may be open, and how long one may last (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSettings {
    /// `ATTUNE_API_OUTPUT_STREAMS_PER_TOKEN` (8).
    pub per_token: usize,
    /// `ATTUNE_API_OUTPUT_STREAMS` (256).
    pub total: usize,
    /// `ATTUNE_API_OUTPUT_STREAM_IDLE_SECS` (300).
    pub idle: Duration,
    /// `ATTUNE_API_OUTPUT_STREAM_MAX_SECS` (900).
    pub max: Duration,
}

impl FromEnv for StreamSettings {
    fn from_source(source: &dyn Source) -> Result<Self, ConfigError> {
        let settings = StreamSettings {
            per_token: at_least_one(source, PER_TOKEN)? as usize,
            total: at_least_one(source, TOTAL)? as usize,
            idle: Duration::from_secs(at_least_one(source, IDLE)?),
            max: Duration::from_secs(at_least_one(source, MAX)?),
        };
        if settings.per_token > settings.total {
            return Err(ConfigError {
                name: PER_TOKEN.into(),
                value: settings.per_token.to_string(),
                reason: format!("must not be more than {TOTAL} ({}), the streams of all tokens", settings.total),
            });
        }
        Ok(settings)
    }
}

fn at_least_one(source: &dyn Source, name: &str) -> Result<u64, ConfigError> {
    let value: u64 = read(source, name)?;
    if value == 0 {
        return Err(ConfigError { name: name.into(), value: "0".into(), reason: "must be at least 1".into() });
    }
    Ok(value)
}

/// Why a stream was refused: the limit that is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The token has `ATTUNE_API_OUTPUT_STREAMS_PER_TOKEN` streams open.
    Token(usize),
    /// `ATTUNE_API_OUTPUT_STREAMS` streams are open in all.
    Total(usize),
}

/// Whether one more stream of a token that has `of_token` open, with `total` open in all, fits
/// `settings` (pure): the token's own limit is said first, being the one its holder can act on.
pub fn admit(settings: &StreamSettings, of_token: usize, total: usize) -> Result<(), Refusal> {
    if of_token >= settings.per_token {
        return Err(Refusal::Token(settings.per_token));
    }
    if total >= settings.total {
        return Err(Refusal::Total(settings.total));
    }
    Ok(())
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        let (message, limit) = match refusal {
            Refusal::Token(limit) => (
                format!(
                    "this token has {limit} live output streams open, its limit ({PER_TOKEN}): close one, or wait \
                     for one to end"
                ),
                limit,
            ),
            Refusal::Total(limit) => {
                (format!("{limit} live output streams are open, the API's limit ({TOTAL}): try again later"), limit)
            }
        };
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_streams", message).with_extra(json!({"limit": limit}))
    }
}

/// The streams open now, by token.
pub struct StreamBudget {
    settings: StreamSettings,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_token: HashMap<i64, usize>,
}

impl StreamBudget {
    pub fn new(settings: StreamSettings) -> Arc<StreamBudget> {
        Arc::new(StreamBudget { settings, open: Mutex::default() })
    }

    /// A place for one more stream of `token_id`, given back when the permit is dropped.
    pub fn take(self: &Arc<Self>, token_id: i64) -> Result<StreamPermit, Refusal> {
        let mut open = self.open.lock().expect("stream budget poisoned");
        let of_token = open.by_token.get(&token_id).copied().unwrap_or(0);
        admit(&self.settings, of_token, open.total)?;
        open.total += 1;
        *open.by_token.entry(token_id).or_default() += 1;
        Ok(StreamPermit { budget: self.clone(), token_id })
    }

    /// How many streams are open.
    pub fn open(&self) -> usize {
        self.open.lock().expect("stream budget poisoned").total
    }
}

/// One open stream's place in the budget.
pub struct StreamPermit {
    budget: Arc<StreamBudget>,
    token_id: i64,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.budget.open.lock().expect("stream budget poisoned");
        open.total -= 1;
        if let Some(count) = open.by_token.get_mut(&self.token_id) {
            *count -= 1;
            if *count == 0 {
                open.by_token.remove(&self.token_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attune_common::config::Defaults;
    use attune_common::settings::Vars;

    fn settings(per_token: usize, total: usize) -> StreamSettings {
        StreamSettings { per_token, total, idle: Duration::from_secs(300), max: Duration::from_secs(900) }
    }

    #[test]
    fn the_defaults_are_the_documented_ones() {
        assert_eq!(StreamSettings::from_source(&Defaults).unwrap(), settings(8, 256));
    }

    #[test]
    fn bad_values_are_refused_naming_the_setting() {
        const ZEROS: [&[(&str, &str)]; 4] = [&[(PER_TOKEN, "0")], &[(TOTAL, "0")], &[(IDLE, "0")], &[(MAX, "0")]];
        for vars in ZEROS {
            assert_eq!(StreamSettings::from_source(&Vars(vars)).unwrap_err().name, vars[0].0);
        }
        assert_eq!(StreamSettings::from_source(&Vars(&[(TOTAL, "x")])).unwrap_err().name, TOTAL);
        let error = StreamSettings::from_source(&Vars(&[(PER_TOKEN, "9"), (TOTAL, "8")])).unwrap_err();
        assert_eq!(error.name, PER_TOKEN, "{error}");
        assert!(error.to_string().contains(TOTAL), "{error}");
    }

    #[test]
    fn a_token_has_at_most_its_share_and_all_at_most_the_total() {
        let limits = settings(8, 20);
        assert_eq!(admit(&limits, 7, 19), Ok(()), "the 8th of a token, the 20th in all");
        assert_eq!(admit(&limits, 8, 8), Err(Refusal::Token(8)), "the 9th of a token");
        assert_eq!(admit(&limits, 0, 20), Err(Refusal::Total(20)), "the 21st in all");
        assert_eq!(admit(&limits, 8, 20), Err(Refusal::Token(8)), "both: the token's limit is said");
    }

    #[test]
    fn a_stream_that_ends_gives_its_place_back() {
        let budget = StreamBudget::new(settings(2, 3));
        let (a1, _a2) = (budget.take(1).unwrap(), budget.take(1).unwrap());
        assert_eq!(budget.take(1).err(), Some(Refusal::Token(2)));
        let _b1 = budget.take(2).unwrap();
        assert_eq!(budget.take(3).err(), Some(Refusal::Total(3)));
        drop(a1);
        assert_eq!(budget.open(), 2);
        let _a3 = budget.take(1).expect("a place of token 1 came free");
    }

    #[test]
    fn a_refusal_is_a_429_naming_its_setting() {
        let error = ApiError::from(Refusal::Token(8));
        assert_eq!((error.status, error.code), (StatusCode::TOO_MANY_REQUESTS, "too_many_streams"));
        assert!(error.message.contains(PER_TOKEN), "{}", error.message);
        assert!(ApiError::from(Refusal::Total(256)).message.contains(TOTAL));
    }
}
