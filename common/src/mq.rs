//! RabbitMQ: the topology (declared here and nowhere else), the messages, a confirming
//! publisher and a reconnecting consumer loop.
//!
//! Topology, with `ns` the namespace (`ATTUNE_MQ_NAMESPACE`, default `attune`):
//! - `ns` (direct): `execution.request` → queue `ns.execution.requests` (hints from the API and
//!   from a worker's hand-back to executors), `execution.result` → `ns.execution.results` (workers to executors: failures
//!   and timeouts, for the RetryManager; workers record successes themselves),
//!   `worker.<id>` → `ns.worker.<id>` (executor to one worker).
//! - `ns.dlx` (topic) bound with `#` to `ns.dlq`: dead letters keep their original routing key,
//!   which a direct exchange could not match with `#`. The executors' DLQ handler consumes it;
//!   what it cannot act on goes to `ns.parked` (routing key `parked`) for an operator to read.
//! - `ns.control` (fanout): cancel notices and follow requests (`ControlMessage`), to an
//!   exclusive queue of every worker.
//! - `ns.output` (direct): live output (`LiveOutput`), from the worker running an execution to
//!   the exclusive, auto-deleted queue `ns.output.<hex>` of each API stream that follows it
//!   (bound with its own name as the routing key). Messages are transient: nothing is stored.
//!
//! Every queue is a durable quorum queue with `x-delivery-limit`, so a message that keeps failing
//! is dead-lettered instead of redelivered forever. Worker queues also carry a message TTL: work
//! stranded on a dead worker expires into the dead-letter queue. A worker queue also expires
//! itself (`x-expires`, twice the TTL plus a minute, so that every message in it has expired into
//! the dead-letter queue first) once nothing has consumed from it that long: restarted workers
//! under new names leak no queues. A worker that stops gracefully deletes its queue itself. A
//! worker queue's name carries its TTL (`ns.worker.<id>.ttl<secs>.q2`): RabbitMQ refuses to
//! redeclare a queue with other arguments, so a changed `ATTUNE_WORKER_QUEUE_TTL_SECS` (or an
//! earlier version's queue, without expiry) makes a new queue, and the worker unbinds the old one
//! (whose messages still expire into the dead-letter queue) and deletes it once empty.

use std::future::Future;
use std::time::Duration;

use lapin::Confirmation;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::tcp::OwnedTLSConfig;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a publish (connecting if needed, then waiting for the confirm) may take.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// How many deliveries a message gets before it is dead-lettered as poison.
pub const DELIVERY_LIMIT: i64 = 5;
/// The most executions one dispatch message names (`Dispatch::more`).
pub const MOST_PER_DISPATCH: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum MqError {
    #[error("broker error: {0}")]
    Broker(#[from] lapin::Error),
    #[error("broker refused message for '{0}' (nack)")]
    Nacked(String),
    #[error("no queue bound for routing key '{0}'")]
    Unroutable(String),
    #[error("consumer stream ended")]
    ConsumerEnded,
    #[error("broker did not answer within {0:?}")]
    Timeout(Duration),
}

#[derive(Debug, Clone)]
pub struct Topology {
    pub namespace: String,
    pub worker_queue_ttl: Duration,
}

pub const REQUEST_KEY: &str = "execution.request";
pub const RESULT_KEY: &str = "execution.result";
pub const PARKED_KEY: &str = "parked";

impl Topology {
    pub fn new(namespace: &str, worker_queue_ttl: Duration) -> Self {
        Topology { namespace: namespace.to_string(), worker_queue_ttl }
    }
    pub fn exchange(&self) -> String {
        self.namespace.clone()
    }
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.dlx", self.namespace)
    }
    pub fn requests_queue(&self) -> String {
        format!("{}.execution.requests", self.namespace)
    }
    pub fn results_queue(&self) -> String {
        format!("{}.execution.results", self.namespace)
    }
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dlq", self.namespace)
    }
    pub fn worker_queue(&self, worker_id: i64) -> String {
        format!("{}.worker.{worker_id}.ttl{}.q2", self.namespace, self.worker_queue_ttl.as_secs())
    }
    /// How long a worker queue nobody consumes from lives on: long enough for every message in it
    /// to have expired into the dead-letter queue (see the module's documentation).
    pub fn worker_queue_expiry(&self) -> Duration {
        self.worker_queue_ttl * 2 + Duration::from_secs(60)
    }
    pub fn parked_queue(&self) -> String {
        format!("{}.parked", self.namespace)
    }
    pub fn control_exchange(&self) -> String {
        format!("{}.control", self.namespace)
    }
    /// The exchange live output goes through (see the module's documentation).
    pub fn output_exchange(&self) -> String {
        format!("{}.output", self.namespace)
    }
    /// A new follower's queue name (`ns.output.<32 hex digits>`), also its routing key.
    pub fn follower_queue(&self) -> String {
        format!("{}.output.{:032x}", self.namespace, rand::random::<u128>())
    }
    /// Whether `name` is a follower queue of this namespace (a follow request naming anything
    /// else is ignored).
    pub fn is_follower_queue(&self, name: &str) -> bool {
        name.strip_prefix(&self.output_exchange())
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    }
    /// The worker id of a `worker.<id>` routing key.
    pub fn worker_of_key(routing_key: &str) -> Option<i64> {
        routing_key.strip_prefix("worker.")?.parse().ok()
    }
    pub fn worker_key(worker_id: i64) -> String {
        format!("worker.{worker_id}")
    }

    fn quorum_args(&self, ttl: Option<Duration>) -> FieldTable {
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
        args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(DELIVERY_LIMIT));
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(self.dead_letter_exchange().as_str().into()),
        );
        if let Some(ttl) = ttl {
            args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ttl.as_millis() as i64));
        }
        args
    }

    async fn declare_queue(&self, channel: &Channel, queue: &str, key: &str, args: FieldTable) -> Result<(), MqError> {
        let durable = QueueDeclareOptions { durable: true, ..Default::default() };
        channel.queue_declare(queue.into(), durable, args).await?;
        channel
            .queue_bind(
                queue.into(),
                self.exchange().as_str().into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    /// Declares the exchanges and the shared queues (idempotent; every service does it).
    pub async fn declare(&self, channel: &Channel) -> Result<(), MqError> {
        let durable = ExchangeDeclareOptions { durable: true, ..Default::default() };
        channel
            .exchange_declare(self.exchange().as_str().into(), ExchangeKind::Direct, durable, FieldTable::default())
            .await?;
        channel
            .exchange_declare(
                self.dead_letter_exchange().as_str().into(),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await?;
        let mut dlq_args = FieldTable::default();
        dlq_args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
        let queue_options = QueueDeclareOptions { durable: true, ..Default::default() };
        channel.queue_declare(self.dead_letter_queue().as_str().into(), queue_options, dlq_args).await?;
        channel
            .queue_bind(
                self.dead_letter_queue().as_str().into(),
                self.dead_letter_exchange().as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        channel
            .exchange_declare(
                self.control_exchange().as_str().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await?;
        channel
            .exchange_declare(
                self.output_exchange().as_str().into(),
                ExchangeKind::Direct,
                durable,
                FieldTable::default(),
            )
            .await?;
        let mut parked_args = FieldTable::default();
        parked_args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
        self.declare_queue(channel, &self.parked_queue(), PARKED_KEY, parked_args).await?;
        self.declare_queue(channel, &self.requests_queue(), REQUEST_KEY, self.quorum_args(None)).await?;
        self.declare_queue(channel, &self.results_queue(), RESULT_KEY, self.quorum_args(None)).await?;
        Ok(())
    }

    /// Removes a worker queue that is no longer the worker's (its TTL changed): unbinds it so no
    /// new work arrives, then deletes it if it is empty. Messages left in it expire into the
    /// dead-letter queue as usual.
    pub async fn retire_worker_queue(&self, channel: &Channel, queue: &str, worker_id: i64) -> Result<bool, MqError> {
        use lapin::options::QueueDeleteOptions;
        channel
            .queue_unbind(
                queue.into(),
                self.exchange().as_str().into(),
                Self::worker_key(worker_id).as_str().into(),
                FieldTable::default(),
            )
            .await?;
        // Quorum queues refuse `if-empty`: check the count instead (nothing new can arrive now).
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        let declared = channel.queue_declare(queue.into(), passive, FieldTable::default()).await?;
        if declared.message_count() > 0 {
            return Ok(false);
        }
        channel.queue_delete(queue.into(), QueueDeleteOptions::default()).await?;
        Ok(true)
    }

    /// Declares one worker's queue, with the message TTL and the queue's own expiry.
    pub async fn declare_worker_queue(&self, channel: &Channel, worker_id: i64) -> Result<(), MqError> {
        let mut args = self.quorum_args(Some(self.worker_queue_ttl));
        args.insert("x-expires".into(), AMQPValue::LongLongInt(self.worker_queue_expiry().as_millis() as i64));
        self.declare_queue(channel, &self.worker_queue(worker_id), &Self::worker_key(worker_id), args).await
    }
}

/// API → every worker (fanout): stop this execution if you are running it. A notice is not
/// believed by itself: a worker stops a run only when the database no longer has it running there
/// (the API changes the row before it sends the notice).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelNotice {
    pub execution_id: i64,
}

/// API → every worker (fanout): stream this execution's output to `follower` (a queue bound to
/// `ns.output` under its own name) for the next `FOLLOW_LEASE`, if you run it. Its JSON is
/// `{"follow": {"execution_id", "follower"}}`: it has no top-level `execution_id`, so a worker
/// of an earlier version fails to parse it as a `CancelNotice` and ignores it, and a cancel
/// notice is never read as a follow request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FollowRequest {
    pub execution_id: i64,
    pub follower: String,
}

/// How long a worker streams an execution to a follower after its last follow request; the API
/// repeats the request every `FOLLOW_RENEW` while its client is connected, so a follower that
/// vanished costs nothing after this.
pub const FOLLOW_LEASE: Duration = Duration::from_secs(15);
/// How often the API repeats a follow request while its client is connected.
pub const FOLLOW_RENEW: Duration = Duration::from_secs(5);

/// What comes on the control exchange.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlMessage {
    Cancel(CancelNotice),
    Follow(FollowRequest),
    /// Executor → every worker: how long it will take no worker for dead (`crate::fence`).
    Fence(crate::fence::FenceNotice),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FollowEnvelope {
    follow: FollowRequest,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FenceEnvelope {
    fence: crate::fence::FenceNotice,
}

impl ControlMessage {
    pub fn parse(data: &[u8]) -> Result<ControlMessage, serde_json::Error> {
        if let Ok(envelope) = serde_json::from_slice::<FenceEnvelope>(data) {
            return Ok(ControlMessage::Fence(envelope.fence));
        }
        match serde_json::from_slice::<FollowEnvelope>(data) {
            Ok(envelope) => Ok(ControlMessage::Follow(envelope.follow)),
            Err(_) => serde_json::from_slice::<CancelNotice>(data).map(ControlMessage::Cancel),
        }
    }

    pub fn to_vec(&self) -> Vec<u8> {
        match self {
            ControlMessage::Cancel(notice) => serde_json::to_vec(notice),
            ControlMessage::Follow(request) => serde_json::to_vec(&serde_json::json!({ "follow": request })),
            ControlMessage::Fence(notice) => serde_json::to_vec(&serde_json::json!({ "fence": notice })),
        }
        .expect("control messages serialize")
    }
}

/// Which of an action's output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

impl OutputStream {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// Worker → one follower (`ns.output`, routing key the follower's queue): an execution's live
/// output. Not believed beyond showing it: nothing is stored from it. Its `user_id` property is
/// the worker's broker user (`Publisher::publish_transient`; RabbitMQ refuses a message whose
/// `user_id` is not its connection's user), and a follower shows only what carries the broker
/// user recorded on the row of the worker the execution runs on (`db::worker::broker_user_running`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LiveOutput {
    /// Bytes `offset..offset + length` of a stream, as text (redacted as the stored output is).
    Chunk { execution_id: i64, stream: OutputStream, offset: u64, length: u64, text: String },
    /// The worker streams no more of this stream to this follower: `limit` bytes were streamed.
    Capped { execution_id: i64, stream: OutputStream, limit: u64 },
    /// The run ended (its result follows in the database).
    End { execution_id: i64 },
}

/// Why and from where a message was dead-lettered (the first `x-death` entry).
#[derive(Debug, Clone, PartialEq)]
pub struct Death {
    /// `expired`, `rejected`, `delivery_limit` or `maxlen`.
    pub reason: String,
    pub queue: String,
}

pub fn death(headers: &Option<FieldTable>) -> Option<Death> {
    let text = |value: &AMQPValue| match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    };
    let field =
        |table: &FieldTable, name: &str| table.inner().iter().find(|(k, _)| k.as_str() == name).map(|(_, v)| v.clone());
    let AMQPValue::FieldArray(deaths) = field(headers.as_ref()?, "x-death")? else { return None };
    let AMQPValue::FieldTable(first) = deaths.as_slice().first()? else { return None };
    Some(Death {
        reason: text(&field(first, "reason")?)?,
        queue: field(first, "queue").and_then(|q| text(&q)).unwrap_or_default(),
    })
}

/// API (or a worker handing work back) → executor: a hint that this execution waits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionRequest {
    pub execution_id: i64,
    /// The execution's action, when the sender knows it: the scheduler then picks a worker before
    /// touching the row, and claims and assigns it in one write. Absent in requests from earlier
    /// versions, which the scheduler claims first and reads the action from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_id: Option<i64>,
}

/// Executor → worker: claim and run these executions. It names only the executions and the
/// worker: the worker reads what to run (the action's runtime, entrypoint, pack directory, `http`
/// block and retry policy, the execution's parameters, timeout, retry count and idempotency key)
/// from PostgreSQL in its claim (`db::execution::worker::claim`), so whoever can publish to the broker
/// cannot choose what runs. The fields an earlier version also sent (`action_ref`, `runtime`,
/// `entrypoint`, `pack_path`, `parameters`, ...) are ignored when a message still in a queue
/// carries them.
///
/// One message carries every execution one scheduling claim placed on the worker: `execution_id`
/// and then `more` (absent when there is only one, which is the message earlier versions sent).
/// Each execution is claimed, run and recorded on its own; the message is acknowledged when all
/// of them are done with, and dead-lettered as a whole (the DLQ handler then looks at each
/// execution, `executor::dead_letters`). A worker of a version before `more` would
/// read only the first execution, so workers are upgraded before executors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dispatch {
    pub execution_id: i64,
    pub worker_id: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more: Vec<i64>,
    /// When traces are on: each execution's `dispatch` span, as a W3C `traceparent`, for the
    /// worker's `run` span to hang under (`crate::trace`). Nothing else follows from it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traces: Vec<(i64, String)>,
}

impl Dispatch {
    /// The dispatch of `executions` (at least one) to `worker_id`.
    pub fn of(worker_id: i64, executions: &[i64]) -> Option<Self> {
        let (&execution_id, more) = executions.split_first()?;
        Some(Dispatch { execution_id, worker_id, more: more.to_vec(), traces: Vec::new() })
    }

    /// The `traceparent` the message carries for `execution_id`, if it is a valid one.
    pub fn trace_of(&self, execution_id: i64) -> Option<String> {
        // (as many as a message dispatches: what a forged one names beyond is not looked at)
        let (_, traceparent) = self.traces.iter().take(MOST_PER_DISPATCH).find(|(id, _)| *id == execution_id)?;
        crate::trace::valid(traceparent)
    }

    /// Every execution it dispatches, the first first, each once; at most `MOST_PER_DISPATCH`
    /// (an executor splits what it sends at that size: what a message names beyond it is forged,
    /// and ignored).
    pub fn executions(&self) -> Vec<i64> {
        let mut executions = vec![self.execution_id];
        for &id in &self.more {
            if executions.len() == MOST_PER_DISPATCH {
                tracing::warn!(
                    execution_id = self.execution_id,
                    named = self.more.len() + 1,
                    "a dispatch names more executions than an executor sends; the rest are ignored"
                );
                break;
            }
            if !executions.contains(&id) {
                executions.push(id);
            }
        }
        executions
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultStatus {
    Completed,
    Failed,
    Timeout,
}

impl ResultStatus {
    /// `completed`, `failed` or `timeout`, as serialized and as metrics label it.
    pub fn as_str(self) -> &'static str {
        match self {
            ResultStatus::Completed => "completed",
            ResultStatus::Failed => "failed",
            ResultStatus::Timeout => "timeout",
        }
    }

    /// How a failure of `kind` is reported (`timeout` or `failed`, by `FailureKind::reported_status`).
    pub fn of_failure(kind: attune_core::FailureKind) -> Self {
        match kind.reported_status() {
            attune_core::ExecutionStatus::Timeout => ResultStatus::Timeout,
            _ => ResultStatus::Failed,
        }
    }

    /// The execution status this result records.
    pub fn recorded(self) -> attune_core::ExecutionStatus {
        match self {
            ResultStatus::Completed => attune_core::ExecutionStatus::Completed,
            ResultStatus::Failed => attune_core::ExecutionStatus::Failed,
            ResultStatus::Timeout => attune_core::ExecutionStatus::Timeout,
        }
    }
}

/// Worker → executor: how an execution ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutionResult {
    pub execution_id: i64,
    pub worker_id: i64,
    pub status: ResultStatus,
    pub result: Option<Value>,
    pub failure_kind: Option<attune_core::failure::FailureKind>,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub duration_ms: u64,
    /// The HTTP status an `http` action got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<i32>,
    /// The wait a `Retry-After` response header asked for, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The token the worker drew when it claimed this run (32 hex digits, stored on the row): an
    /// executor records the result only if it is the row's, so a result cannot be forged by
    /// whoever can publish to the broker. Absent from the results of an earlier version's
    /// workers, which match only runs claimed without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_token: Option<String>,
    /// When traces are on: the worker's `record` span, as a W3C `traceparent`, for the span of
    /// the executor that records the result (`crate::trace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

impl ExecutionResult {
    /// What recording this result writes alongside the new status.
    pub fn outcome(&self) -> crate::db::execution::Outcome {
        crate::db::execution::Outcome {
            result: self.result.clone(),
            failure_kind: self.failure_kind,
            error: self.error.clone(),
            exit_code: self.exit_code,
            stdout: Some(self.stdout.clone()),
            stderr: Some(self.stderr.clone()),
            http_status: self.http_status,
            retry_after: self.retry_after_ms.map(std::time::Duration::from_millis),
        }
    }

    /// Counts the run time in `attune_execution_duration_seconds`, once, where the result is
    /// recorded (by the worker for a success, by an executor otherwise).
    pub fn observe_duration(&self) {
        crate::metrics::observe(
            &crate::metrics::EXECUTION_DURATION,
            &[("status", self.status.as_str())],
            self.duration_ms as f64 / 1000.0,
        );
    }
}

/// Opens a connection named `name` (the broker shows it) to a node of `url` (`nodes`: one URL,
/// or a cluster's nodes separated by commas, tried in turn). An `amqps://` URL is verified
/// against the system's roots plus the CA file in `ATTUNE_AMQP_CA_CERT`, if set (see
/// `crate::tls`).
pub async fn connect(url: &str, name: &str) -> Result<Connection, MqError> {
    let nodes = nodes(url);
    // each connection starts with the node after the one the last started with: a service that
    // lost its node tries the others first, and a fleet spreads over the cluster
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let first = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut failures = Vec::new();
    for k in 0..nodes.len() {
        let node = nodes[(first + k) % nodes.len()];
        // of several nodes, one that does not answer (a host down: no reset comes) must not hold
        // the connection for the system's SYN timeout (about two minutes) before the next is tried
        let bounded;
        let node = if nodes.len() > 1 && !node.contains("connection_timeout=") {
            bounded = format!(
                "{node}{}connection_timeout={NODE_CONNECT_TIMEOUT_MS}",
                if node.contains('?') { '&' } else { '?' }
            );
            bounded.as_str()
        } else {
            node
        };
        match connect_node(node, name).await {
            Ok(connection) => return Ok(connection),
            Err(e) if nodes.len() == 1 => return Err(e),
            Err(e) => failures.push(format!("{}: {e}", shown(node))),
        }
    }
    Err(MqError::Broker(
        std::io::Error::other(format!("no node of AMQP_URL answered ({})", failures.join("; "))).into(),
    ))
}

/// How long a connection to one of several nodes may take before the next is tried, unless the
/// node's URL sets its own `connection_timeout` (milliseconds).
const NODE_CONNECT_TIMEOUT_MS: u64 = 5000;

/// The nodes `url` names: one URL, or several separated by commas (the nodes of a cluster; a
/// comma in a password is written `%2C`).
pub fn nodes(url: &str) -> Vec<&str> {
    let nodes: Vec<&str> = url.split(',').map(str::trim).filter(|node| !node.is_empty()).collect();
    if nodes.is_empty() { vec![url] } else { nodes }
}

/// The broker user `url` logs in as: its first node's (every node of a cluster's `AMQP_URL` is
/// expected to name the same user), percent-decoded, `guest` when the URL names none (AMQP's
/// default). Live output carries it as `user_id`, which RabbitMQ checks against the publishing
/// connection's user (`LiveOutput`).
pub fn broker_user(url: &str) -> String {
    let node = nodes(url)[0];
    node.parse::<lapin::uri::AMQPUri>().map(|uri| uri.authority.userinfo.username).unwrap_or_else(|_| "guest".into())
}

/// A node's URL without its password, for errors and logs.
fn shown(node: &str) -> String {
    match (node.find("://"), node.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}{}", &node[..scheme + 3], &node[at + 1..]),
        _ => node.to_string(),
    }
}

async fn connect_node(url: &str, name: &str) -> Result<Connection, MqError> {
    let amqps = url.trim_start().get(..8).is_some_and(|scheme| scheme.eq_ignore_ascii_case("amqps://"));
    let ca = if amqps {
        crate::tls::ca_from(&crate::settings::Environment, "ATTUNE_AMQP_CA_CERT")
            .map_err(|e| MqError::Broker(std::io::Error::other(e).into()))?
    } else {
        None
    };
    connect_trusting(url, name, ca).await
}

/// [`connect`], trusting the CA certificates `ca` (PEM text) besides the system's roots instead
/// of reading `ATTUNE_AMQP_CA_CERT`.
pub async fn connect_trusting(url: &str, name: &str, ca: Option<String>) -> Result<Connection, MqError> {
    crate::tls::install_default_provider();
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let tls = OwnedTLSConfig { identity: None, cert_chain: ca };
    let connected = Connection::connect_with_config(url, properties, tls, lapin::runtime::default_runtime()?).await;
    connected.map_err(|e| match crate::tls::tls_error(&e) {
        Some(refused @ rustls::Error::InvalidCertificate(_)) => MqError::Broker(
            std::io::Error::other(format!(
                "the broker's certificate was refused ({refused}): the CA that signed it must be in \
                 ATTUNE_AMQP_CA_CERT (a PEM file) or the system's roots, and it must name the URL's host"
            ))
            .into(),
        ),
        _ => e.into(),
    })
}

/// A publisher with confirms. Many publishes may be in flight on its channel at once (each
/// caller awaits only its own confirm); a nack or an unroutable message is an error. The channel
/// is re-opened on the next publish after the connection is lost.
pub struct Publisher {
    url: String,
    name: String,
    topology: Topology,
    channel: Mutex<Option<(Connection, Channel)>>,
}

impl Publisher {
    pub fn new(url: &str, name: &str, topology: Topology) -> Self {
        Publisher { url: url.to_string(), name: name.to_string(), topology, channel: Mutex::new(None) }
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The broker user this publisher logs in as (`broker_user`).
    pub fn broker_user(&self) -> String {
        broker_user(&self.url)
    }

    async fn channel(&self) -> Result<Channel, MqError> {
        let mut guard = self.channel.lock().await;
        if let Some((connection, channel)) = guard.as_ref()
            && connection.status().connected()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        let connection = connect(&self.url, &format!("{}-publisher", self.name)).await?;
        let channel = connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        self.topology.declare(&channel).await?;
        *guard = Some((connection, channel.clone()));
        Ok(channel)
    }

    /// Checks the broker connection (opening it if needed).
    pub async fn ping(&self) -> Result<(), MqError> {
        self.channel().await.map(|_| ())
    }

    /// Publishes `body` as persistent JSON and waits for the broker's confirm. Retries once on a
    /// fresh channel if the first attempt failed on a broken connection.
    pub async fn publish<T: Serialize>(&self, routing_key: &str, body: &T) -> Result<(), MqError> {
        let payload = serde_json::to_vec(body).expect("messages serialize");
        self.publish_bytes(&self.topology.exchange(), routing_key, &payload).await
    }

    /// Tells the workers to stop execution `id` if one runs it (a `CancelNotice` on the control
    /// exchange, fanned out to every worker; none listening is no error). A lost notice leaves
    /// the action running to its end, and its result is ignored: the record already says how it
    /// ended.
    pub async fn send_cancel_notice(&self, id: i64) {
        let notice = serde_json::to_vec(&CancelNotice { execution_id: id }).expect("notice serializes");
        match self.publish_bytes(&self.topology().control_exchange(), "", &notice).await {
            Ok(()) | Err(MqError::Unroutable(_)) => {}
            Err(e) => {
                tracing::warn!(execution_id = id, error = %e, "stop notice not sent; the action runs on, its result will be ignored")
            }
        }
    }

    /// Publishes raw bytes (a parked dead letter keeps its exact content).
    pub async fn publish_bytes(&self, exchange: &str, routing_key: &str, payload: &[u8]) -> Result<(), MqError> {
        match self.publish_once(exchange, routing_key, payload).await {
            Err(MqError::Broker(e)) => {
                tracing::warn!(error = %e, routing_key, "publish failed, reconnecting");
                // (a timeout is not retried here: the caller decides)
                self.channel.lock().await.take();
                self.publish_once(exchange, routing_key, payload).await
            }
            other => other,
        }
    }

    async fn publish_once(&self, exchange: &str, routing_key: &str, payload: &[u8]) -> Result<(), MqError> {
        // A blocked or hung broker (memory alarm, half-open connection) must not hang the caller.
        match tokio::time::timeout(PUBLISH_TIMEOUT, self.publish_unbounded(exchange, routing_key, payload)).await {
            Ok(result) => result,
            Err(_) => {
                self.channel.lock().await.take();
                Err(MqError::Timeout(PUBLISH_TIMEOUT))
            }
        }
    }

    async fn publish_unbounded(&self, exchange: &str, routing_key: &str, payload: &[u8]) -> Result<(), MqError> {
        self.publish_confirmed(exchange, routing_key, payload, 2).await?;
        crate::metrics::increment(&crate::metrics::BROKER_PUBLISHES, &[], 1);
        Ok(())
    }

    /// Publishes `payload` (JSON, `mandatory`, with `delivery_mode` 2: persistent, 1: transient)
    /// and waits for its confirm; unroutable is `MqError::Unroutable`.
    async fn publish_confirmed(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        delivery_mode: u8,
    ) -> Result<(), MqError> {
        let properties =
            BasicProperties::default().with_delivery_mode(delivery_mode).with_content_type("application/json".into());
        self.publish_with_properties(exchange, routing_key, payload, properties, true).await
    }

    /// Publishes `payload` to `exchange` as a transient message the broker drops undelivered once
    /// it is `expiry` old (a fence notice: late, it would say something no longer true).
    pub async fn publish_expiring(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        expiry: Duration,
    ) -> Result<(), MqError> {
        let properties = BasicProperties::default()
            .with_delivery_mode(1)
            .with_content_type("application/json".into())
            .with_expiration(expiry.as_millis().max(1).to_string().as_str().into());
        // (not mandatory: nobody listening is no error, and the broker returns nothing)
        let publish = self.publish_with_properties(exchange, routing_key, payload, properties, false);
        match tokio::time::timeout(expiry, publish).await {
            Ok(result) => result,
            Err(_) => Err(MqError::Timeout(expiry)),
        }
    }

    async fn publish_with_properties(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<(), MqError> {
        let channel = self.channel().await?;
        let confirm = channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions { mandatory, ..Default::default() },
                payload,
                properties,
            )
            .await?
            .await?;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(MqError::Unroutable(routing_key.to_string())),
            Confirmation::Nack(_) => Err(MqError::Nacked(routing_key.to_string())),
            Confirmation::NotRequested => {
                unreachable!("confirms are enabled on the publisher channel")
            }
        }
    }

    /// Publishes `payload` to `exchange` as a transient message (live output: lost with the
    /// broker, never written to disk) with this publisher's broker user as its `user_id` (which
    /// RabbitMQ checks, so a follower knows who sent it) and waits for the confirm; unroutable
    /// (nobody follows any more) is `MqError::Unroutable`.
    pub async fn publish_transient(&self, exchange: &str, routing_key: &str, payload: &[u8]) -> Result<(), MqError> {
        let properties = BasicProperties::default()
            .with_delivery_mode(1)
            .with_content_type("application/json".into())
            .with_user_id(self.broker_user().as_str().into());
        let publish = self.publish_with_properties(exchange, routing_key, payload, properties, true);
        match tokio::time::timeout(PUBLISH_TIMEOUT, publish).await {
            Ok(result) => result,
            Err(_) => Err(MqError::Timeout(PUBLISH_TIMEOUT)),
        }
    }

    /// Retires a worker's old queue (see `Topology`), on a channel of its own: a refused
    /// operation closes the channel it ran on.
    pub async fn retire_worker_queue(&self, queue: &str, worker_id: i64) -> Result<bool, MqError> {
        let connection = connect(&self.url, &format!("{}-retire", self.name)).await?;
        let channel = connection.create_channel().await?;
        let result = self.topology.retire_worker_queue(&channel, queue, worker_id).await;
        let _ = connection.close(200, "done".into()).await;
        result
    }

    /// Unbinds a worker's queue from the exchange: a dispatch published to the worker from now on
    /// is unroutable (its sender puts the execution back to waiting), while what the queue holds
    /// is still delivered. A stopping worker does this first.
    pub async fn unbind_worker_queue(&self, worker_id: i64) -> Result<(), MqError> {
        let channel = self.channel().await?;
        channel
            .queue_unbind(
                self.topology.worker_queue(worker_id).as_str().into(),
                self.topology.exchange().as_str().into(),
                Topology::worker_key(worker_id).as_str().into(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    /// How many messages wait in `queue` (not counting those delivered and unsettled).
    pub async fn queue_length(&self, queue: &str) -> Result<u32, MqError> {
        let connection = connect(&self.url, &format!("{}-inspect", self.name)).await?;
        let channel = connection.create_channel().await?;
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        let result = channel.queue_declare(queue.into(), passive, FieldTable::default()).await;
        let _ = connection.close(200, "done".into()).await;
        Ok(result?.message_count())
    }

    /// Declares a worker's queue through the publisher's channel.
    pub async fn declare_worker_queue(&self, worker_id: i64) -> Result<(), MqError> {
        let channel = self.channel().await?;
        self.topology.declare_worker_queue(&channel, worker_id).await
    }
}

/// What a handler decided about one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Done (including a duplicate or stale message): remove it.
    Ack,
    /// Could not be processed now (e.g. the database is down): deliver again. The queue's
    /// delivery limit dead-letters a message that keeps coming back.
    Retry,
    /// Cannot ever be processed (unparseable): dead-letter it at once.
    DeadLetter,
}

#[derive(Debug, Clone)]
pub struct Incoming {
    pub data: Vec<u8>,
    pub redelivered: bool,
    pub routing_key: String,
    pub headers: Option<FieldTable>,
    /// Fires when the channel this delivery came on is lost: it can no longer be settled, and the
    /// broker delivers it again on a new channel, so a handler that has not started the work
    /// stops.
    pub channel_lost: CancellationToken,
}

impl Incoming {
    /// The message as `T`; one that cannot be parsed is logged with its content and answered with
    /// `DeadLetter` (it would fail the same way on every delivery).
    pub fn parse<T: serde::de::DeserializeOwned>(&self, what: &str) -> Result<T, Disposition> {
        serde_json::from_slice(&self.data).map_err(|e| {
            tracing::error!(error = %e, body = %String::from_utf8_lossy(&self.data), "unparseable {what}, dead-lettering it");
            Disposition::DeadLetter
        })
    }
}

pub struct ConsumerSpec {
    pub url: String,
    pub name: String,
    pub queue: String,
    pub prefetch: u16,
    pub topology: Topology,
    /// Also declare this worker's queue before consuming.
    pub worker_queue: Option<i64>,
    /// Consume an exclusive, auto-deleted queue (named `queue`) bound to this fanout exchange
    /// instead of a shared durable one (cancel notices).
    pub fanout: Option<String>,
    /// How long in-flight handlers may run on after shutdown is requested.
    pub drain: Duration,
    /// Told whether the consumer is up (true once it consumes, false when its channel is lost).
    pub consuming: Option<tokio::sync::watch::Sender<bool>>,
}

/// Consumes `spec.queue` until `shutdown` fires, running `handler` for up to `prefetch`
/// deliveries concurrently and acking each only after its handler returned. Reconnects with
/// backoff whenever the connection or channel is lost.
pub async fn run_consumer<F, Fut>(spec: ConsumerSpec, shutdown: CancellationToken, handler: F)
where
    F: Fn(Incoming) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Disposition> + Send + 'static,
{
    let mut delay = Duration::from_millis(200);
    while !shutdown.is_cancelled() {
        match consume_once(&spec, &shutdown, handler.clone()).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(queue = %spec.queue, error = %e, retry_in_ms = delay.as_millis() as u64, "consumer lost its broker connection");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

async fn consume_once<F, Fut>(spec: &ConsumerSpec, shutdown: &CancellationToken, handler: F) -> Result<(), MqError>
where
    F: Fn(Incoming) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Disposition> + Send + 'static,
{
    use futures_util::StreamExt;
    let connection = connect(&spec.url, &format!("{}-consumer", spec.name)).await?;
    let channel = connection.create_channel().await?;
    channel.basic_qos(spec.prefetch, BasicQosOptions::default()).await?;
    spec.topology.declare(&channel).await?;
    if let Some(worker_id) = spec.worker_queue {
        spec.topology.declare_worker_queue(&channel, worker_id).await?;
    }
    if let Some(exchange) = &spec.fanout {
        let exclusive = QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() };
        channel.queue_declare(spec.queue.as_str().into(), exclusive, FieldTable::default()).await?;
        channel
            .queue_bind(
                spec.queue.as_str().into(),
                exchange.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    let mut consumer = channel
        .basic_consume(
            spec.queue.as_str().into(),
            spec.name.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    tracing::info!(queue = %spec.queue, "consuming");
    if let Some(consuming) = &spec.consuming {
        consuming.send_replace(true);
    }
    let channel_lost = CancellationToken::new();
    let tracker = TaskTracker::new();
    let outcome = loop {
        let delivery = tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            delivery = consumer.next() => delivery,
        };
        let delivery = match delivery {
            Some(Ok(delivery)) => delivery,
            Some(Err(e)) => break Err(MqError::Broker(e)),
            None => break Err(MqError::ConsumerEnded),
        };
        let handler = handler.clone();
        let channel_lost = channel_lost.clone();
        tracker.spawn(async move {
            let incoming = Incoming {
                data: delivery.data.clone(),
                redelivered: delivery.redelivered,
                routing_key: delivery.routing_key.to_string(),
                headers: delivery.properties.headers().clone(),
                channel_lost,
            };
            let result = match handler(incoming).await {
                Disposition::Ack => delivery.acker.ack(BasicAckOptions::default()).await,
                Disposition::Retry => {
                    delivery.acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await
                }
                Disposition::DeadLetter => delivery.acker.reject(BasicRejectOptions { requeue: false }).await,
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, "failed to settle delivery; the broker will redeliver it");
            }
            crate::metrics::increment(&crate::metrics::BROKER_DELIVERIES, &[], 1);
        });
    };
    // Stop taking work, then let in-flight handlers finish (and settle) before the channel closes.
    tracker.close();
    if let Some(consuming) = &spec.consuming {
        consuming.send_replace(false);
    }
    if outcome.is_err() {
        channel_lost.cancel();
    }
    if outcome.is_ok() {
        let _ = channel.basic_cancel(spec.name.as_str().into(), lapin::options::BasicCancelOptions::default()).await;
        if tokio::time::timeout(spec.drain, tracker.wait()).await.is_err() {
            tracing::warn!(queue = %spec.queue, "in-flight work did not finish within the drain deadline");
        }
        let _ = connection.close(200, "shutdown".into()).await;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_user_is_the_first_node_s_decoded_or_guest() {
        let cluster = "amqp://attune-worker-a:pw@h1:5672/attune, amqp://attune-worker-a:pw@h2/attune";
        assert_eq!(broker_user(cluster), "attune-worker-a");
        assert_eq!(broker_user("amqps://w%40host:p%2Cw@h/%2f"), "w@host");
        assert_eq!(broker_user("amqp://h:5672/%2f"), "guest", "AMQP's default user");
    }

    #[test]
    fn result_status_names_match_their_serialized_form() {
        for status in [ResultStatus::Completed, ResultStatus::Failed, ResultStatus::Timeout] {
            assert_eq!(serde_json::to_string(&status).unwrap(), format!("\"{}\"", status.as_str()));
        }
    }

    #[test]
    fn a_dispatch_names_only_the_execution_and_the_worker() {
        let sent = serde_json::to_value(Dispatch::of(3, &[7]).unwrap()).unwrap();
        assert_eq!(sent, serde_json::json!({"execution_id": 7, "worker_id": 3}));
        // one an earlier version sent, still in a queue during an upgrade: read, what it names
        // to run left out
        let earlier = r#"{"execution_id": 7, "worker_id": 3, "action_ref": "core.echo", "runtime": "shell",
            "entrypoint": "/tmp/evil.sh", "pack_path": "/", "parameters": {"message": "x"},
            "timeout_seconds": 30, "retry_count": 0, "transient_exit_codes": [3], "idempotency_key": "k"}"#;
        assert_eq!(serde_json::from_str::<Dispatch>(earlier).unwrap(), Dispatch::of(3, &[7]).unwrap());
    }

    #[test]
    fn one_dispatch_carries_every_execution_of_a_claim_on_one_worker() {
        let sent = serde_json::to_value(Dispatch::of(3, &[7, 8, 9]).unwrap()).unwrap();
        assert_eq!(sent, serde_json::json!({"execution_id": 7, "worker_id": 3, "more": [8, 9]}));
        let read: Dispatch = serde_json::from_value(sent).unwrap();
        assert_eq!(read.executions(), vec![7, 8, 9]);
        // a forged repeat names each execution once
        let repeated: Dispatch =
            serde_json::from_str(r#"{"execution_id": 7, "worker_id": 3, "more": [7, 8, 8]}"#).unwrap();
        assert_eq!(repeated.executions(), vec![7, 8]);
        assert_eq!(Dispatch::of(3, &[]), None);
    }

    #[test]
    fn a_follow_request_is_never_read_as_a_cancel_notice_nor_the_other_way() {
        let follow = ControlMessage::Follow(FollowRequest { execution_id: 7, follower: "attune.output.ab".into() });
        let sent = follow.to_vec();
        assert_eq!(ControlMessage::parse(&sent).unwrap(), follow);
        // a worker of an earlier version reads only cancel notices: it cannot parse this one
        assert!(serde_json::from_slice::<CancelNotice>(&sent).is_err());
        let cancel = ControlMessage::Cancel(CancelNotice { execution_id: 7 });
        assert_eq!(ControlMessage::parse(&cancel.to_vec()).unwrap(), cancel);
        assert!(ControlMessage::parse(br#"{"follow": {"execution_id": 7}}"#).is_err());
    }

    #[test]
    fn follower_queues_are_the_namespaces_own() {
        let topology = Topology::new("attune", Duration::from_secs(300));
        let queue = topology.follower_queue();
        assert!(topology.is_follower_queue(&queue), "{queue}");
        for other in [
            "attune.output",
            "attune.output.",
            "attune.execution.results",
            "other.output.0123456789abcdef0123456789abcdef",
        ] {
            assert!(!topology.is_follower_queue(other), "{other}");
        }
    }

    #[test]
    fn a_result_carries_its_run_token_and_one_without_is_still_read() {
        let without = r#"{"execution_id": 7, "worker_id": 3, "status": "failed", "result": null,
            "failure_kind": "transient_error", "error": "e", "exit_code": 75, "stdout": "", "stderr": "",
            "duration_ms": 1}"#;
        let mut result: ExecutionResult = serde_json::from_str(without).unwrap();
        assert_eq!(result.run_token, None);
        assert!(!serde_json::to_string(&result).unwrap().contains("run_token"));
        result.run_token = Some("0123456789abcdef0123456789abcdef".into());
        let sent = serde_json::to_value(&result).unwrap();
        assert_eq!(sent["run_token"], "0123456789abcdef0123456789abcdef");
    }
}
