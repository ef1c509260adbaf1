//! The broker adapter (`mq`) against the real RabbitMQ, each test in a namespace of its own:
//! confirmed publishing, at-least-once consumption with ack after the handler, the delivery limit,
//! dead-lettering of what cannot be parsed, and expiry from a worker queue into the dead-letter
//! queue with its reason.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use attune_common::mq::{
    self, ConsumerSpec, DELIVERY_LIMIT, Disposition, ExecutionRequest, Incoming, Publisher, REQUEST_KEY, Topology,
};
use attune_testkit::{Namespace, amqp_url, wait_for};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(30);

struct Broker {
    namespace: Namespace,
    topology: Topology,
    publisher: Publisher,
    shutdown: CancellationToken,
}

impl Broker {
    fn new(worker_queue_ttl: Duration) -> Broker {
        let namespace = Namespace::new();
        let topology = Topology::new(&namespace.name, worker_queue_ttl);
        let publisher = Publisher::new(&amqp_url(), "attune-mq-test", topology.clone());
        Broker { namespace, topology, publisher, shutdown: CancellationToken::new() }
    }

    /// Consumes `queue` with `handler` until the test ends (or `stopped` is cancelled).
    fn consume<F, Fut>(&self, queue: String, handler: F) -> tokio::task::JoinHandle<()>
    where
        F: Fn(Incoming) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Disposition> + Send + 'static,
    {
        let spec = ConsumerSpec {
            url: amqp_url(),
            name: format!("attune-mq-test-{queue}"),
            queue,
            prefetch: 4,
            topology: self.topology.clone(),
            worker_queue: None,
            fanout: None,
            drain: Duration::from_secs(1),
            consuming: None,
        };
        tokio::spawn(mq::run_consumer(spec, self.shutdown.clone(), handler))
    }

    async fn queue_length(&self, queue: &str) -> u32 {
        self.publisher.queue_length(queue).await.unwrap_or(0)
    }

    async fn stop(self, worker_queues: &[String]) {
        self.shutdown.cancel();
        self.namespace.delete(worker_queues).await;
    }
}

#[tokio::test]
async fn a_confirmed_request_is_delivered_once_and_acked() {
    let broker = Broker::new(Duration::from_secs(300));
    broker.publisher.ping().await.expect("broker reachable");
    let (sent, mut received) = mpsc::unbounded_channel();
    let consumer = broker.consume(broker.topology.requests_queue(), move |incoming: Incoming| {
        let sent = sent.clone();
        async move {
            let request: ExecutionRequest = match incoming.parse("request") {
                Ok(request) => request,
                Err(disposition) => return disposition,
            };
            sent.send((request, incoming.redelivered)).unwrap();
            Disposition::Ack
        }
    });
    let request = ExecutionRequest { execution_id: 42, action_id: Some(7) };
    broker.publisher.publish(REQUEST_KEY, &request).await.expect("publish confirmed");
    let (got, redelivered) = tokio::time::timeout(DEADLINE, received.recv()).await.expect("delivered").unwrap();
    assert_eq!((got, redelivered), (request, false));
    // stop the consumer: a delivery it had not acked would go back to the queue as it closes
    broker.shutdown.cancel();
    tokio::time::timeout(DEADLINE, consumer).await.expect("the consumer stops").unwrap();
    let queue = broker.topology.requests_queue();
    assert_eq!(broker.publisher.queue_length(&queue).await.unwrap(), 0, "acked: nothing came back to the queue");
    assert!(received.try_recv().is_err(), "delivered once");
    broker.stop(&[]).await;
}

#[tokio::test]
async fn a_message_that_keeps_failing_is_dead_lettered_at_the_delivery_limit() {
    let broker = Broker::new(Duration::from_secs(300));
    let deliveries = Arc::new(AtomicUsize::new(0));
    let counted = deliveries.clone();
    broker.consume(broker.topology.requests_queue(), move |_incoming: Incoming| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Disposition::Retry
        }
    });
    broker.publisher.publish(REQUEST_KEY, &ExecutionRequest { execution_id: 1, action_id: None }).await.unwrap();
    let dead_letters = broker.topology.dead_letter_queue();
    wait_for("the message in the dead-letter queue", DEADLINE, || async {
        (broker.queue_length(&dead_letters).await == 1).then_some(())
    })
    .await;
    let delivered = deliveries.load(Ordering::SeqCst) as i64;
    assert!(
        (DELIVERY_LIMIT..=DELIVERY_LIMIT + 1).contains(&delivered),
        "delivered {delivered} times against a limit of {DELIVERY_LIMIT}"
    );
    broker.stop(&[]).await;
}

#[tokio::test]
async fn an_unparseable_message_is_dead_lettered_on_its_first_delivery() {
    let broker = Broker::new(Duration::from_secs(300));
    let deliveries = Arc::new(AtomicUsize::new(0));
    let counted = deliveries.clone();
    broker.consume(broker.topology.requests_queue(), move |incoming: Incoming| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            match incoming.parse::<ExecutionRequest>("request") {
                Ok(_) => Disposition::Ack,
                Err(disposition) => disposition,
            }
        }
    });
    broker.publisher.publish_bytes(&broker.topology.exchange(), REQUEST_KEY, b"{not json").await.unwrap();
    let dead_letters = broker.topology.dead_letter_queue();
    wait_for("the unparseable message in the dead-letter queue", DEADLINE, || async {
        (broker.queue_length(&dead_letters).await == 1).then_some(())
    })
    .await;
    assert_eq!(deliveries.load(Ordering::SeqCst), 1, "dead-lettered at once, not redelivered");
    broker.stop(&[]).await;
}

#[tokio::test]
async fn a_dispatch_nobody_consumes_expires_into_the_dead_letter_queue_saying_so() {
    let broker = Broker::new(Duration::from_secs(1));
    let worker_id = 9_001;
    broker.publisher.declare_worker_queue(worker_id).await.unwrap();
    let (sent, mut received) = mpsc::unbounded_channel();
    broker.consume(broker.topology.dead_letter_queue(), move |incoming: Incoming| {
        let sent = sent.clone();
        async move {
            sent.send((mq::death(&incoming.headers), incoming.routing_key.clone(), incoming.data)).unwrap();
            Disposition::Ack
        }
    });
    let payload = br#"{"execution_id": 5}"#;
    broker
        .publisher
        .publish_bytes(&broker.topology.exchange(), &Topology::worker_key(worker_id), payload)
        .await
        .unwrap();
    let (death, routing_key, data) =
        tokio::time::timeout(DEADLINE, received.recv()).await.expect("dead-lettered").unwrap();
    let death = death.expect("an x-death header");
    let worker_queue = broker.topology.worker_queue(worker_id);
    assert_eq!((death.reason.as_str(), death.queue.as_str()), ("expired", worker_queue.as_str()));
    assert_eq!(Topology::worker_of_key(&routing_key), Some(worker_id), "{routing_key}");
    assert_eq!(data, payload, "the dead letter keeps its content");
    broker.stop(&[worker_queue]).await;
}

#[tokio::test]
async fn a_list_of_nodes_connects_to_one_that_answers_and_names_each_that_did_not() {
    // a cluster of three nodes, two of them down (nothing listens on those ports)
    let down = |port: u16| format!("amqp://guest:secret@127.0.0.1:{port}/%2f");
    let live = attune_testkit::amqp_url();
    let cluster = format!("{}, {live},{}", down(1), down(2));
    assert_eq!(attune_common::mq::nodes(&cluster).len(), 3);
    // whichever node each connection starts with, each reaches the live one
    for _ in 0..4 {
        let connection = attune_common::mq::connect(&cluster, "test-cluster").await.expect("a node answers");
        assert!(connection.status().connected());
        connection.close(200, "done".into()).await.unwrap();
    }
    // none answers: the error names every node, never a password
    let error = attune_common::mq::connect(&format!("{},{}", down(1), down(2)), "test-cluster").await.unwrap_err();
    let told = error.to_string();
    assert!(told.contains("127.0.0.1:1/") && told.contains("127.0.0.1:2/") && !told.contains("secret"), "{told}");
}
