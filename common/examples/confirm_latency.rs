//! Sequential publish-with-confirm latency on a quorum and a classic durable queue (diagnostic).
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use std::time::Instant;

#[tokio::main]
async fn main() {
    let conn = attune_common::mq::connect("amqp://guest:guest@127.0.0.1:5672/%2f", "confirm-latency").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    for (name, quorum) in [("diag.quorum", true), ("diag.classic", false)] {
        let mut args = FieldTable::default();
        if quorum {
            args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
        }
        ch.queue_declare(name.into(), QueueDeclareOptions { durable: true, ..Default::default() }, args).await.unwrap();
        let mut samples = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            ch.basic_publish(
                "".into(),
                name.into(),
                BasicPublishOptions::default(),
                b"x",
                lapin::BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
            samples.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("{name}: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms", samples[100], samples[180], samples[198]);
        ch.queue_delete(name.into(), QueueDeleteOptions::default()).await.unwrap();
    }
}
