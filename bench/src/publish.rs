//! The headline scenario of broker targets: N schedules each publishing a message to RabbitMQ
//! every `--every` (40,000 every 5 s is 8,000 messages a second). The server publishes them
//! itself with publisher confirms; a consumer in this process reads them back from a queue
//! bound to the benchmark's own exchange.
//!
//! It reports messages confirmed per second, the time from each instant to its run recorded as
//! succeeded (which comes after the broker's confirm, so it bounds the publish lag from above),
//! the count check — every run due in the window that succeeded has exactly one message, and no
//! message arrived twice — and the process's peak resident memory (server and consumer).

use crate::harness::{ms, start_with, store_with_jobs};
use anyhow::{bail, Context, Result};
use chrono::{Duration, Utc};
use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::publish::{BrokerConnection, BrokerKind};
use sked_core::run::RunState;
use sked_core::stats::percentiles;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub async fn run(
    database_url: Option<&str>,
    broker_url: &str,
    schedules: usize,
    every: &str,
    seconds: u64,
) -> Result<Value> {
    let connection: BrokerConnection = format!("bench={broker_url}")
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    if connection.kind != BrokerKind::Amqp {
        bail!("the publish scenario measures RabbitMQ: give an amqp:// --broker-url");
    }
    // One name for the exchange and the queue bound to it.
    let exchange = format!("sked-bench-{:08x}", rand::random::<u32>());
    let queue = exchange.clone();
    let consumer_connection = Connection::connect(broker_url, ConnectionProperties::default())
        .await
        .context("cannot reach RabbitMQ")?;
    let channel = consumer_connection.create_channel().await?;
    channel
        .exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "tick".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;

    let jobs = (0..schedules).map(|i| {
        let spec: JobSpec = serde_json::from_value(json!({
            "schedule": {"every": every},
            "target": {"amqp": {
                "connection": "bench", "exchange": exchange, "routing_key": "tick",
                "payload": {"job": "{{job}}", "at": "{{scheduled_for}}"}, "persistent": false
            }},
        }))
        .expect("a valid benchmark job");
        (format!("publish-{i:07}"), spec)
    });
    let (store, place) = store_with_jobs(database_url, jobs).await?;

    // Messages received, by run id: a count above one is a duplicate.
    let received: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "sked-bench".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    let counting = received.clone();
    let consuming = tokio::spawn(async move {
        while let Some(Ok(delivery)) = consumer.next().await {
            let run_id = delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("sked-run-id").cloned())
                .and_then(|v| match v {
                    AMQPValue::LongString(text) => text.to_string().parse::<i64>().ok(),
                    _ => None,
                });
            if let Some(id) = run_id {
                *counting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(id)
                    .or_default() += 1;
            }
        }
    });

    let mut server = start_with(store.clone(), place, 1, vec![connection]).await?;
    let store_name = server.store_name();
    let from = Utc::now() + Duration::seconds(2);
    let to = from + Duration::seconds(seconds as i64);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let published_at_start = server
        .metric_sum("sked_messages_published_total")
        .await?
        .unwrap_or(0.0);
    tokio::time::sleep(std::time::Duration::from_secs(seconds)).await;
    let published_at_end = server
        .metric_sum("sked_messages_published_total")
        .await?
        .unwrap_or(0.0);
    let failed = server
        .metric_sum("sked_messages_failed_total")
        .await?
        .unwrap_or(0.0);
    // Runs due at the end of the window get the time their publish may take.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    server.stop().await;
    let window = server.finish_with_runs(store.as_ref(), from, to).await?;
    // Messages still on their way to the consumer arrive within a moment.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    consuming.abort();
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    channel
        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await?;

    let received = received.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let succeeded: Vec<_> = window
        .iter()
        .filter(|r| r.state == RunState::Succeeded)
        .collect();
    let once = succeeded
        .iter()
        .filter(|r| received.get(&r.id) == Some(&1))
        .count();
    let missing = succeeded
        .iter()
        .filter(|r| !received.contains_key(&r.id))
        .count();
    let duplicated = received.values().filter(|n| **n > 1).count();
    let mut lag: Vec<f64> = succeeded
        .iter()
        .filter_map(|r| r.finished_at.map(|f| ms(f - r.scheduled_for)))
        .collect();
    let p = percentiles(&mut lag);
    let expected = window.len();
    Ok(json!({
        "scenario": "publish",
        "broker": "rabbitmq",
        "store": store_name,
        "schedules": schedules,
        "every": every,
        "window_seconds": seconds,
        "messages_expected": expected,
        "succeeded_in_window": succeeded.len(),
        "messages_per_second": (published_at_end - published_at_start) / seconds as f64,
        "messages_failed": failed,
        "instants_published_once": once,
        "instants_missed": expected.saturating_sub(once),
        "succeeded_without_message": missing,
        "instants_duplicated": duplicated,
        "lag_ms": {"p50": p.p50, "p99": p.p99, "max": p.max},
        "lag_measures": "instant to run recorded succeeded, after the broker's confirm",
        "peak_rss_mb": peak_rss_mb(),
    }))
}

/// This process's peak resident memory (`VmHWM`), in MB.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
