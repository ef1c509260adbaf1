//! `GET /executions/{id}/output`: an execution's stdout and stderr as Server-Sent Events, live
//! while it runs, ending when it ends.
//!
//! A finished execution is answered at once with its stored output and `end`. While one waits
//! to run, a `waiting` event says what holds it (as `GET /executions/{id}`'s `waiting`), again
//! whenever that changes. An unfinished one
//! gets an exclusive, auto-deleted queue of its own (`ns.output.<hex>`, bound to `ns.output`
//! under its name; `Followers`), and, once the execution runs, a follow request on the control
//! exchange, repeated every `FOLLOW_RENEW` (every second until the worker's first message, for
//! the run's first seconds): the
//! worker streams only while a request is fresher than `FOLLOW_LEASE`, so a client that left costs
//! nothing soon after. Chunks carry their byte offset: what was already forwarded is dropped, a
//! gap (a follower that came late to a long output, or a full queue) is said (`skipped`). The row
//! is read every second as the backstop (the worker may die): the stream ends with `end` when
//! the database has the execution finished, after the stored output of each stream nothing
//! was streamed of (a run shorter than the first follow). Nothing is written per line.
//!
//! Only the executing worker's live output is shown: a message whose `user_id` (which RabbitMQ
//! checks against the publishing connection's user) is not the broker user recorded on the row
//! of the worker the execution runs on is dropped, counted
//! (`attune_api_live_output_dropped_total`) and logged once per stream; an execution whose
//! worker recorded none is not followed live (its stored output is shown at its end).
//!
//! An unfinished execution's stream takes a place in the streams' budget (`crate::streams`: per
//! token and in all, else `429 too_many_streams`) and gives its connection's request slot back
//! (`server::ConnectionSlot`). It ends (`closed`) when nothing was sent on it for
//! `ATTUNE_API_OUTPUT_STREAM_IDLE_SECS` or its client takes no event that long, after
//! `ATTUNE_API_OUTPUT_STREAM_MAX_SECS`, and when the API shuts down; the request timeout does not
//! cut it (it bounds the handler, which answers at once).
//!
//! A client that opens the stream again goes on where it was: each chunk says where it ends
//! (`next`, a byte offset of its stream), and `?stdout_from=&stderr_from=` (the last `next` of
//! each) leave out what it has; a stream it had any of is not answered again from the stored
//! output at the end (`attune execution tail` does this when a stream is `closed`).

use std::convert::Infallible;
use std::time::{Duration, Instant};

use attune_common::db;
use attune_common::mq::{
    ControlMessage, FOLLOW_RENEW, FollowRequest, LiveOutput, MqError, OutputStream, Topology, connect,
};
use attune_core::ExecutionStatus;
use axum::Extension;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderValue;
use axum::http::header::CONNECTION;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ExchangeKind};
use serde_json::json;
use tokio::sync::mpsc;

use crate::ApiError;
use crate::auth::Caller;
use crate::server::ConnectionSlot;
use crate::streams::{IDLE, MAX, StreamPermit};

/// How often the row is read while the stream is open.
const POLL: Duration = Duration::from_secs(1);
/// How long a stream the worker was sending waits for its `End` once the row says finished.
const END_GRACE: Duration = Duration::from_secs(2);
/// How often a follow request is repeated until the worker's first message, for the first
/// `FIRST_FOLLOW_WINDOW` of the run (a request that came before the worker had the run
/// registered is lost; a quiet action sends nothing, and is then asked every `FOLLOW_RENEW`).
const FIRST_FOLLOW_RETRY: Duration = Duration::from_secs(1);
const FIRST_FOLLOW_WINDOW: Duration = Duration::from_secs(5);
/// The most messages a follower's queue holds (the oldest go first; the gap is said).
const FOLLOWER_QUEUE_LENGTH: i64 = 256;

/// One event of a live output stream (`text/event-stream`: each is `event: <event>` and
/// `data: <data>` lines).
#[derive(utoipa::ToSchema)]
pub struct OutputEvent {
    #[schema(pattern = "^(waiting|stdout|stderr|skipped|capped|end|closed)$")]
    pub event: String,
    /// A JSON object: `{"reason", "message", ...}` (waiting: why it has not started, as
    /// `GET /executions/{id}`'s `waiting`), `{"offset", "text"}` (stdout, stderr),
    /// `{"stream", "bytes"}` (skipped), `{"stream", "limit_bytes"}` (capped),
    /// `{"status", "exit_code", "failure_kind"}` (end), `{"reason", "open_again"}` (closed).
    pub data: String,
}

/// Where a client opening the stream again goes on from (the last `next` it had of each stream).
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct Resume {
    /// Leave out stdout before this byte offset.
    #[param(minimum = 0)]
    pub stdout_from: Option<i64>,
    /// Leave out stderr before this byte offset.
    #[param(minimum = 0)]
    pub stderr_from: Option<i64>,
}

#[utoipa::path(get, path = "/executions/{id}/output", operation_id = "follow_execution_output", tag = "executions",
    params(("id" = i64, Path, description = "Execution id"), Resume),
    responses(
        (status = 200, content_type = "text/event-stream", body = OutputEvent,
            description = "Server-Sent Events: `waiting` (`{\"reason\", \"message\", ...}`: why it has not started, whenever that changes), `stdout` and `stderr` (`{\"offset\", \"next\", \"text\"}`: the bytes from `offset` to `next` of that stream, redacted as the stored output is; `next` is absent from stored output), `skipped` (`{\"stream\", \"bytes\"}` not shown), `capped` (`{\"stream\", \"limit_bytes\"}`: no more of that stream live), then `end` (`{\"status\", \"exit_code\", \"failure_kind\"}`) when the execution has ended, or `closed` (`{\"reason\", \"open_again\"}`) when the stream ends first (`ATTUNE_API_OUTPUT_STREAM_IDLE_SECS` with nothing sent or taken, `ATTUNE_API_OUTPUT_STREAM_MAX_SECS`: `open_again`, with `stdout_from` and `stderr_from` set to the last `next` of each stream; or the API stopping). Only the executing worker's live output is shown. A finished execution: its stored output and `end` at once"),
        (status = 400, description = "The id, `stdout_from` or `stderr_from` is not a non-negative integer; `parameter` names it", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such execution", body = crate::openapi::ErrorBody),
        (status = 429, description = "`too_many_streams`: the token has `ATTUNE_API_OUTPUT_STREAMS_PER_TOKEN` streams open, or the API `ATTUNE_API_OUTPUT_STREAMS` in all; the message names the limit, `limit` its value", body = crate::openapi::ErrorBody),
    ))]
pub async fn output(
    State(state): State<crate::State>,
    Extension(caller): Extension<Caller>,
    slot: Option<Extension<ConnectionSlot>>,
    id: Result<Path<i64>, PathRejection>,
    resume: Result<Query<Resume>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id?;
    let Query(resume) = resume?;
    // (read as signed, as the document states them: an offset past the largest is refused, not
    // taken in an unsigned reading the document does not promise)
    for (name, from) in [("stdout_from", resume.stdout_from), ("stderr_from", resume.stderr_from)] {
        if from.is_some_and(|from| from < 0) {
            return Err(ApiError::bad_request(Some(name), format!("'{name}' must be a non-negative integer")));
        }
    }
    let execution = db::execution::get(&state.db, id)
        .await?
        .ok_or_else(|| ApiError::not_found("execution", format!("execution {id} does not exist")))?;
    // a finished execution is answered at once; an unfinished one streams on, apart from the
    // request slots
    let permit = match execution.status.is_terminal() {
        true => None,
        false => {
            let permit = state.streams.take(caller.token_id)?;
            if let Some(Extension(slot)) = slot {
                slot.release();
            }
            Some(permit)
        }
    };
    let outlet_released = permit.is_some();
    let (sender, receiver) = mpsc::channel::<Event>(16);
    let outlet = Outlet { sender, idle: state.settings.streams.idle, last_sent: Instant::now(), _permit: permit };
    tokio::spawn(follow(state, execution, outlet, Forwarded::from(&resume)));
    let events = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|event| (Ok::<_, Infallible>(event), receiver))
    });
    let mut response = Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response();
    // the connection closes once a stream that gave its slot back ends: said in the headers, so
    // that no client keeps the connection to send its next request on (opening the stream again
    // would race the close and fail)
    if outlet_released {
        response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(response)
}

/// The broker connection the API's streams open their queues on (one, opened on first use).
pub struct Followers {
    url: String,
    topology: Topology,
    connection: tokio::sync::Mutex<Option<Connection>>,
}

/// One stream's queue; dropped, its channel closes and the queue goes with it.
struct Follower {
    queue: String,
    channel: Channel,
    consumer: lapin::Consumer,
}

impl Drop for Follower {
    fn drop(&mut self) {
        let channel = self.channel.clone();
        tokio::spawn(async move {
            let _ = channel.close(200, "stream ended".into()).await;
        });
    }
}

impl Followers {
    pub fn new(url: &str, topology: Topology) -> Followers {
        Followers { url: url.to_string(), topology, connection: Default::default() }
    }

    async fn channel(&self) -> Result<Channel, MqError> {
        let mut connection = self.connection.lock().await;
        if let Some(open) = connection.as_ref()
            && open.status().connected()
        {
            return Ok(open.create_channel().await?);
        }
        let opened = connect(&self.url, "attune-api-follow").await?;
        let channel = opened.create_channel().await?;
        *connection = Some(opened);
        Ok(channel)
    }

    async fn open(&self) -> Result<Follower, MqError> {
        let channel = self.channel().await?;
        let exchange = self.topology.output_exchange();
        let durable = ExchangeDeclareOptions { durable: true, ..Default::default() };
        channel
            .exchange_declare(exchange.as_str().into(), ExchangeKind::Direct, durable, FieldTable::default())
            .await?;
        let queue = self.topology.follower_queue();
        let mut args = FieldTable::default();
        args.insert("x-max-length".into(), AMQPValue::LongLongInt(FOLLOWER_QUEUE_LENGTH));
        let exclusive = QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() };
        channel.queue_declare(queue.as_str().into(), exclusive, args).await?;
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                queue.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let no_ack = BasicConsumeOptions { no_ack: true, ..Default::default() };
        let consumer = channel.basic_consume(queue.as_str().into(), "".into(), no_ack, FieldTable::default()).await?;
        Ok(Follower { queue, channel, consumer })
    }
}

fn stream_index(stream: OutputStream) -> usize {
    match stream {
        OutputStream::Stdout => 0,
        OutputStream::Stderr => 1,
    }
}

fn data(event: &str, data: serde_json::Value) -> Event {
    Event::default().event(event).data(data.to_string())
}

/// What has been forwarded of each stream, and the events a worker's message makes.
#[derive(Debug, Default)]
pub struct Forwarded {
    next: [u64; 2],
    streamed: [bool; 2],
}

impl From<&Resume> for Forwarded {
    /// What a client opening the stream again has already: nothing before its offsets, and no
    /// stored output at the end of a stream it had any of.
    fn from(resume: &Resume) -> Forwarded {
        let next = [resume.stdout_from.unwrap_or(0) as u64, resume.stderr_from.unwrap_or(0) as u64];
        Forwarded { next, streamed: next.map(|from| from > 0) }
    }
}

impl Forwarded {
    /// The events a chunk makes: nothing for what was forwarded already, `skipped` before a gap.
    pub fn chunk(
        &mut self,
        stream: OutputStream,
        offset: u64,
        length: u64,
        text: &str,
    ) -> Vec<(String, serde_json::Value)> {
        let i = stream_index(stream);
        let name = stream.as_str();
        let end = offset.saturating_add(length);
        if end <= self.next[i] {
            return Vec::new();
        }
        let mut events = Vec::new();
        let (offset, text) = if offset < self.next[i] {
            // an overlap (a renewed lease started over): the part not forwarded, when the text is
            // the bytes (not redacted) and cut on a character
            let skip = (self.next[i] - offset) as usize;
            match text.get(skip..).filter(|_| text.len() as u64 == length) {
                Some(rest) => (self.next[i], rest),
                None => (offset, text),
            }
        } else {
            if offset > self.next[i] {
                events.push(("skipped".to_string(), json!({"stream": name, "bytes": offset - self.next[i]})));
            }
            (offset, text)
        };
        events.push((name.to_string(), json!({"offset": offset, "next": end, "text": text})));
        self.next[i] = end;
        self.streamed[i] = true;
        events
    }
}

/// Where a stream's events go: the client's body, within the idle bound (`ATTUNE_API_OUTPUT_STREAM_IDLE_SECS`),
/// holding the stream's place in the budget until the stream ends.
struct Outlet {
    sender: mpsc::Sender<Event>,
    idle: Duration,
    last_sent: Instant,
    _permit: Option<StreamPermit>,
}

impl Outlet {
    /// Sends `event`; `false` when the client is gone or took no event for the idle bound (the
    /// stream ends).
    async fn send(&mut self, event: Event) -> bool {
        match tokio::time::timeout(self.idle, self.sender.send(event)).await {
            Ok(Ok(())) => {
                self.last_sent = Instant::now();
                true
            }
            Ok(Err(_)) => false,
            Err(_) => {
                tracing::debug!(idle_secs = self.idle.as_secs(), "a live output stream's client took no event: closed");
                false
            }
        }
    }

    /// Ends the stream with `closed` and why.
    async fn close(mut self, reason: &str) {
        self.send(data("closed", json!({"reason": reason, "open_again": false}))).await;
    }

    /// Ends the stream at one of its bounds, with `closed`, why, and `open_again`: the client
    /// may open it again (with `Resume`) to go on following.
    async fn close_for_now(mut self, reason: &str) {
        self.send(data("closed", json!({"reason": reason, "open_again": true}))).await;
    }

    /// When the stream is idle: nothing was sent on it for the idle bound.
    fn idle_at(&self) -> Instant {
        self.last_sent + self.idle
    }
}

/// Whether a live output message comes from the executing worker: its `user_id` is the broker
/// user recorded for that worker (none recorded, or not read yet: nothing is believed).
fn from_executing_worker(user_id: Option<&str>, worker_user: Option<&str>) -> bool {
    worker_user.is_some() && user_id == worker_user
}

async fn follow(
    state: crate::State,
    execution: db::execution::Execution,
    mut outlet: Outlet,
    mut forwarded: Forwarded,
) {
    let id = execution.id;
    if execution.status.is_terminal() {
        finish(&mut outlet, execution, &forwarded).await;
        return;
    }
    let deadline = Instant::now() + state.settings.streams.max;
    let mut follower = match state.followers.open().await {
        Ok(follower) => Some(follower),
        Err(e) => {
            tracing::warn!(execution_id = id, error = %e, "live output unavailable (the broker): the stream shows the stored output when the execution ends");
            None
        }
    };
    let mut heard_from_worker = false;
    // the broker user of the worker the execution runs on (read once it runs): live output is
    // believed only from it; how many messages from anyone else were dropped
    let mut worker_user: Option<String> = None;
    let mut no_worker_user_said = false;
    let mut dropped: u64 = 0;
    // the worker's `End` (after its last chunk), and when the row was first seen finished: a
    // stream the worker was sending ends after its `End`, or `END_GRACE` after the row finished
    let mut worker_ended = false;
    let mut finished_at: Option<Instant> = None;
    let mut last_follow: Option<Instant> = None;
    let mut first_follow: Option<Instant> = None;
    // the reason it waits that was told last (a `waiting` event)
    let mut told_waiting = serde_json::Value::Null;
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = state.streams_stop.clone();
    loop {
        let delivery = async {
            match follower.as_mut() {
                Some(follower) => follower.consumer.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = outlet.sender.closed() => return,
            _ = stop.cancelled() => return outlet.close("the API is stopping").await,
            _ = tokio::time::sleep_until(deadline.into()) => {
                let reason = format!("the stream lasted {MAX}: open it again to go on following");
                return outlet.close_for_now(&reason).await;
            }
            _ = tokio::time::sleep_until(outlet.idle_at().into()) => {
                let reason = format!("nothing was sent for {IDLE}: open it again to go on following");
                return outlet.close_for_now(&reason).await;
            }
            delivery = delivery => match delivery {
                Some(Ok(delivery)) => {
                    let user_id = delivery.properties.user_id().as_ref().map(|user| user.as_str());
                    if !from_executing_worker(user_id, worker_user.as_deref()) {
                        dropped += 1;
                        attune_common::metrics::increment(&attune_common::metrics::LIVE_OUTPUT_DROPPED, &[], 1);
                        if dropped == 1 {
                            tracing::warn!(
                                execution_id = id,
                                user_id = user_id.unwrap_or("(none)"),
                                worker_user = worker_user.as_deref().unwrap_or("(not known)"),
                                "live output dropped: not from the executing worker's broker user"
                            );
                        }
                        continue;
                    }
                    heard_from_worker = true;
                    let events = match serde_json::from_slice::<LiveOutput>(&delivery.data) {
                        Ok(LiveOutput::Chunk { execution_id, stream, offset, length, text }) if execution_id == id => {
                            forwarded.chunk(stream, offset, length, &text)
                        }
                        Ok(LiveOutput::Capped { execution_id, stream, limit }) if execution_id == id => {
                            vec![("capped".to_string(), json!({"stream": stream.as_str(), "limit_bytes": limit}))]
                        }
                        Ok(LiveOutput::End { execution_id }) if execution_id == id => {
                            worker_ended = true;
                            if finished_at.is_some() {
                                break;
                            }
                            Vec::new()
                        }
                        // the run ended: the row says how, within a poll or two
                        _ => Vec::new(),
                    };
                    for (name, value) in events {
                        if !outlet.send(data(&name, value)).await {
                            return;
                        }
                    }
                }
                _ => {
                    tracing::debug!(execution_id = id, "live output's queue lost: following the row alone");
                    follower = None;
                }
            },
            _ = poll.tick() => {
                let status: Option<ExecutionStatus> =
                    match db::execution::api::status_of(&state.db, id).await {
                        Ok(status) => status,
                        Err(e) => {
                            tracing::debug!(execution_id = id, error = %e, "could not read a followed execution");
                            continue;
                        }
                    };
                match status {
                    None => return outlet.close("the execution was deleted").await,
                    Some(status) if status.is_terminal() => {
                        // the row can say finished before the last chunks the worker sent arrive
                        let since = *finished_at.get_or_insert_with(Instant::now);
                        if follower.is_none() || !heard_from_worker || worker_ended || since.elapsed() >= END_GRACE {
                            break;
                        }
                    }
                    Some(ExecutionStatus::Running) => {
                        if worker_user.is_none() && follower.is_some() {
                            match db::worker::broker_user_running(&state.db, id).await {
                                Ok(Some(user)) => worker_user = Some(user),
                                Ok(None) if !no_worker_user_said => {
                                    no_worker_user_said = true;
                                    tracing::warn!(execution_id = id, "the execution's worker recorded no broker user (an earlier version): not followed live, its stored output is shown at its end");
                                }
                                Ok(None) => {}
                                Err(e) => tracing::debug!(execution_id = id, error = %e, "could not read the executing worker's broker user"),
                            }
                        }
                        let first = *first_follow.get_or_insert_with(Instant::now);
                        let every = if heard_from_worker || first.elapsed() >= FIRST_FOLLOW_WINDOW {
                            FOLLOW_RENEW
                        } else {
                            FIRST_FOLLOW_RETRY
                        };
                        if let Some(follower) = &follower
                            && worker_user.is_some()
                            && last_follow.is_none_or(|last| last.elapsed() >= every)
                        {
                            last_follow = Some(Instant::now());
                            let request = ControlMessage::Follow(FollowRequest { execution_id: id, follower: follower.queue.clone() });
                            let exchange = state.publisher.topology().control_exchange();
                            if let Err(e) = state.publisher.publish_bytes(&exchange, "", &request.to_vec()).await {
                                tracing::debug!(execution_id = id, error = %e, "follow request not sent");
                            }
                        }
                    }
                    Some(_) => {
                        // not running yet: what holds it is said, each time that changes
                        match db::execution::api::waiting(&state.db, id).await {
                            Ok(Some(why)) if why["reason"] != told_waiting => {
                                told_waiting = why["reason"].clone();
                                if !outlet.send(data("waiting", why)).await {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => tracing::debug!(execution_id = id, error = %e, "could not read why a followed execution waits"),
                        }
                    }
                }
            }
        }
    }
    drop(follower);
    match db::execution::get(&state.db, id).await {
        Ok(Some(execution)) => finish(&mut outlet, execution, &forwarded).await,
        _ => outlet.close("the execution could not be read").await,
    }
}

/// The stored output of each stream nothing was streamed of, then `end`.
async fn finish(outlet: &mut Outlet, execution: db::execution::Execution, forwarded: &Forwarded) {
    for (stream, stored) in [(OutputStream::Stdout, &execution.stdout), (OutputStream::Stderr, &execution.stderr)] {
        if let Some(text) = stored.as_deref().filter(|text| !text.is_empty())
            && !forwarded.streamed[stream_index(stream)]
            && !outlet.send(data(stream.as_str(), json!({"offset": 0, "text": text}))).await
        {
            return;
        }
    }
    let end =
        json!({"status": execution.status, "exit_code": execution.exit_code, "failure_kind": execution.failure_kind});
    outlet.send(data("end", end)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_output_is_believed_only_from_the_executing_worker_s_broker_user() {
        assert!(from_executing_worker(Some("attune-worker-a"), Some("attune-worker-a")));
        assert!(!from_executing_worker(Some("attune-worker-b"), Some("attune-worker-a")), "another worker's user");
        assert!(!from_executing_worker(None, Some("attune-worker-a")), "no user_id");
        assert!(!from_executing_worker(Some("attune-worker-a"), None), "the worker recorded none");
        assert!(!from_executing_worker(None, None));
    }

    #[test]
    fn what_was_forwarded_is_not_again_and_a_gap_is_said() {
        let mut forwarded = Forwarded::default();
        let events = forwarded.chunk(OutputStream::Stdout, 0, 4, "one\n");
        assert_eq!(events, vec![("stdout".to_string(), json!({"offset": 0, "next": 4, "text": "one\n"}))]);
        assert!(forwarded.chunk(OutputStream::Stdout, 0, 4, "one\n").is_empty(), "a repeat");
        let events = forwarded.chunk(OutputStream::Stdout, 0, 8, "one\ntwo\n");
        assert_eq!(
            events,
            vec![("stdout".to_string(), json!({"offset": 4, "next": 8, "text": "two\n"}))],
            "an overlap"
        );
        let events = forwarded.chunk(OutputStream::Stdout, 10, 2, "x\n");
        assert_eq!(events[0], ("skipped".to_string(), json!({"stream": "stdout", "bytes": 2})));
        assert_eq!(forwarded.chunk(OutputStream::Stderr, 0, 2, "e\n").len(), 1, "each stream on its own");
        assert!(forwarded.streamed[0] && forwarded.streamed[1]);
    }

    #[test]
    fn a_stream_opened_again_goes_on_where_its_client_was() {
        let mut forwarded = Forwarded::from(&Resume { stdout_from: Some(4), stderr_from: None });
        assert!(forwarded.chunk(OutputStream::Stdout, 0, 4, "one\n").is_empty(), "what it has");
        let events = forwarded.chunk(OutputStream::Stdout, 0, 8, "one\ntwo\n");
        assert_eq!(events, vec![("stdout".to_string(), json!({"offset": 4, "next": 8, "text": "two\n"}))]);
        assert!(forwarded.streamed[0], "no stored stdout again at the end");
        assert!(!Forwarded::from(&Resume::default()).streamed[1], "nothing of stderr: its stored output at the end");
    }
}
