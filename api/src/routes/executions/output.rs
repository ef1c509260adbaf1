//! `GET /executions/{id}/output`: an execution's stdout and stderr as Server-Sent Events, live
//! while it runs, ending when it ends.
//!
//! A finished execution is answered at once with its stored output and `end`. An unfinished one
//! gets an exclusive, auto-deleted queue of its own (`ns.output.<hex>`, bound to `ns.output`
//! under its name; `Followers`), and, once the execution runs, a follow request on the control
//! exchange, repeated every `FOLLOW_RENEW` (every second until the worker's first message, for
//! the run's first seconds): the
//! worker streams only while a request is fresher than `FOLLOW_LEASE`, so a client that left costs
//! nothing soon after. Chunks carry their byte offset: what was already forwarded is dropped, a
//! gap (a follower that came late to a long output, or a full queue) is said (`skipped`). The row
//! is read every second as the backstop (the worker may die): the stream ends with `end` when
//! the database has the execution finished, after the stored output of each stream nothing
//! was streamed of (a run shorter than the first follow). Nothing is written per line. A stream
//! lasts at most `ATTUNE_API_OUTPUT_STREAM_MAX_SECS` (then `closed`), and ends (`closed`) when
//! the API shuts down; the request timeout does not cut it (it bounds the handler, which answers
//! at once).

use std::convert::Infallible;
use std::time::{Duration, Instant};

use attune_common::db;
use attune_common::mq::{
    ControlMessage, FOLLOW_RENEW, FollowRequest, LiveOutput, MqError, OutputStream, Topology, connect,
};
use attune_core::ExecutionStatus;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::{Stream, StreamExt};
use lapin::options::{BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ExchangeKind};
use serde_json::json;
use tokio::sync::mpsc;

use crate::ApiError;

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
    #[schema(pattern = "^(stdout|stderr|skipped|capped|end|closed)$")]
    pub event: String,
    /// A JSON object: `{"offset", "text"}` (stdout, stderr), `{"stream", "bytes"}` (skipped),
    /// `{"stream", "limit_bytes"}` (capped), `{"status", "exit_code", "failure_kind"}` (end),
    /// `{"reason"}` (closed).
    pub data: String,
}

#[utoipa::path(get, path = "/executions/{id}/output", operation_id = "follow_execution_output", tag = "executions",
    params(("id" = i64, Path, description = "Execution id")),
    responses(
        (status = 200, content_type = "text/event-stream", body = OutputEvent,
            description = "Server-Sent Events: `stdout` and `stderr` (`{\"offset\", \"text\"}`: the bytes from `offset` of that stream, redacted as the stored output is), `skipped` (`{\"stream\", \"bytes\"}` not shown), `capped` (`{\"stream\", \"limit_bytes\"}`: no more of that stream live), then `end` (`{\"status\", \"exit_code\", \"failure_kind\"}`) when the execution has ended, or `closed` (`{\"reason\"}`) when the stream ends first (`ATTUNE_API_OUTPUT_STREAM_MAX_SECS`, or the API stopping). A finished execution: its stored output and `end` at once"),
        (status = 400, description = "The id is not an integer; `parameter` names it", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such execution", body = crate::openapi::ErrorBody),
    ))]
pub async fn output(
    State(state): State<crate::State>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let Path(id) = id?;
    let execution = db::execution::get(&state.db, id)
        .await?
        .ok_or_else(|| ApiError::not_found("execution", format!("execution {id} does not exist")))?;
    let (sender, receiver) = mpsc::channel::<Event>(16);
    tokio::spawn(follow(state, execution, sender));
    let events = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|event| (Ok(event), receiver))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
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
        events.push((name.to_string(), json!({"offset": offset, "text": text})));
        self.next[i] = end;
        self.streamed[i] = true;
        events
    }
}

async fn follow(state: crate::State, execution: db::execution::Execution, sender: mpsc::Sender<Event>) {
    let id = execution.id;
    if execution.status.is_terminal() {
        finish(&sender, execution, &Forwarded::default()).await;
        return;
    }
    let deadline = Instant::now() + state.settings.output_stream_max;
    let mut follower = match state.followers.open().await {
        Ok(follower) => Some(follower),
        Err(e) => {
            tracing::warn!(execution_id = id, error = %e, "live output unavailable (the broker): the stream shows the stored output when the execution ends");
            None
        }
    };
    let mut forwarded = Forwarded::default();
    let mut heard_from_worker = false;
    // the worker's `End` (after its last chunk), and when the row was first seen finished: a
    // stream the worker was sending ends after its `End`, or `END_GRACE` after the row finished
    let mut worker_ended = false;
    let mut finished_at: Option<Instant> = None;
    let mut last_follow: Option<Instant> = None;
    let mut first_follow: Option<Instant> = None;
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
            _ = sender.closed() => return,
            _ = stop.cancelled() => {
                let _ = sender.send(data("closed", json!({"reason": "the API is stopping"}))).await;
                return;
            }
            _ = tokio::time::sleep_until(deadline.into()) => {
                let reason = "the stream lasted ATTUNE_API_OUTPUT_STREAM_MAX_SECS: open it again to go on following";
                let _ = sender.send(data("closed", json!({"reason": reason}))).await;
                return;
            }
            delivery = delivery => match delivery {
                Some(Ok(delivery)) => {
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
                        if sender.send(data(&name, value)).await.is_err() {
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
                    match db::execution::status_of(&state.db, id).await {
                        Ok(status) => status,
                        Err(e) => {
                            tracing::debug!(execution_id = id, error = %e, "could not read a followed execution");
                            continue;
                        }
                    };
                match status {
                    None => {
                        let _ = sender.send(data("closed", json!({"reason": "the execution was deleted"}))).await;
                        return;
                    }
                    Some(status) if status.is_terminal() => {
                        // the row can say finished before the last chunks the worker sent arrive
                        let since = *finished_at.get_or_insert_with(Instant::now);
                        if follower.is_none() || !heard_from_worker || worker_ended || since.elapsed() >= END_GRACE {
                            break;
                        }
                    }
                    Some(ExecutionStatus::Running) => {
                        let first = *first_follow.get_or_insert_with(Instant::now);
                        let every = if heard_from_worker || first.elapsed() >= FIRST_FOLLOW_WINDOW {
                            FOLLOW_RENEW
                        } else {
                            FIRST_FOLLOW_RETRY
                        };
                        if let Some(follower) = &follower
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
                    Some(_) => {} // not running yet: wait
                }
            }
        }
    }
    drop(follower);
    match db::execution::get(&state.db, id).await {
        Ok(Some(execution)) => finish(&sender, execution, &forwarded).await,
        _ => {
            let _ = sender.send(data("closed", json!({"reason": "the execution could not be read"}))).await;
        }
    }
}

/// The stored output of each stream nothing was streamed of, then `end`.
async fn finish(sender: &mpsc::Sender<Event>, execution: db::execution::Execution, forwarded: &Forwarded) {
    for (stream, stored) in [(OutputStream::Stdout, &execution.stdout), (OutputStream::Stderr, &execution.stderr)] {
        if let Some(text) = stored.as_deref().filter(|text| !text.is_empty())
            && !forwarded.streamed[stream_index(stream)]
        {
            let _ = sender.send(data(stream.as_str(), json!({"offset": 0, "text": text}))).await;
        }
    }
    let end =
        json!({"status": execution.status, "exit_code": execution.exit_code, "failure_kind": execution.failure_kind});
    let _ = sender.send(data("end", end)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_forwarded_is_not_again_and_a_gap_is_said() {
        let mut forwarded = Forwarded::default();
        let events = forwarded.chunk(OutputStream::Stdout, 0, 4, "one\n");
        assert_eq!(events, vec![("stdout".to_string(), json!({"offset": 0, "text": "one\n"}))]);
        assert!(forwarded.chunk(OutputStream::Stdout, 0, 4, "one\n").is_empty(), "a repeat");
        let events = forwarded.chunk(OutputStream::Stdout, 0, 8, "one\ntwo\n");
        assert_eq!(events, vec![("stdout".to_string(), json!({"offset": 4, "text": "two\n"}))], "an overlap");
        let events = forwarded.chunk(OutputStream::Stdout, 10, 2, "x\n");
        assert_eq!(events[0], ("skipped".to_string(), json!({"stream": "stdout", "bytes": 2})));
        assert_eq!(forwarded.chunk(OutputStream::Stderr, 0, 2, "e\n").len(), 1, "each stream on its own");
        assert!(forwarded.streamed[0] && forwarded.streamed[1]);
    }
}
