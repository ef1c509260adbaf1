//! Publish-to-consume latency through one queue with a lapin consumer (diagnostic).
use futures_util::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use std::time::Instant;

#[tokio::main]
async fn main() {
    let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
    let publisher = attune_common::mq::connect(url, "diag-pub").await.unwrap();
    let consumer_conn = attune_common::mq::connect(url, "diag-sub").await.unwrap();
    let pch = publisher.create_channel().await.unwrap();
    pch.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let cch = consumer_conn.create_channel().await.unwrap();
    cch.basic_qos(64, BasicQosOptions::default()).await.unwrap();
    for (name, quorum) in [("diag.quorum", true), ("diag.classic", false)] {
        let mut args = FieldTable::default();
        if quorum {
            args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
            args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(5));
            args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("diag.dlx".into()));
        }
        pch.queue_declare(name.into(), QueueDeclareOptions { durable: true, ..Default::default() }, args)
            .await
            .unwrap();
        let mut consumer = cch
            .basic_consume(name.into(), name.into(), BasicConsumeOptions::default(), FieldTable::default())
            .await
            .unwrap();
        let mut samples = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            pch.basic_publish(
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
            let confirmed = t.elapsed().as_secs_f64() * 1000.0;
            let delivery = consumer.next().await.unwrap().unwrap();
            let got = t.elapsed().as_secs_f64() * 1000.0;
            delivery.acker.ack(BasicAckOptions::default()).await.unwrap();
            samples.push((confirmed, got));
        }
        let mut c: Vec<f64> = samples.iter().map(|s| s.0).collect();
        let mut g: Vec<f64> = samples.iter().map(|s| s.1).collect();
        c.sort_by(|a, b| a.partial_cmp(b).unwrap());
        g.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "{name}: confirm p50 {:.2} p99 {:.2} ms; delivered p50 {:.2} p90 {:.2} p99 {:.2} ms",
            c[100], c[198], g[100], g[180], g[198]
        );
        pch.queue_delete(name.into(), QueueDeleteOptions::default()).await.unwrap();
    }
}
