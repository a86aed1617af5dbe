//! The headline scenario of broker targets: N schedules each publishing a message every
//! `--every` (40,000 every 5 s is 8,000 messages a second) to RabbitMQ, NATS JetStream or Redis
//! Streams, whichever `--broker-url` names. The server publishes them itself and waits for
//! each broker's confirm (an AMQP publisher confirm, a JetStream ack, an `XADD` entry id); a
//! consumer in this process reads them back from the benchmark's own queue, stream or key.
//!
//! The schedules' anchors are spread evenly over the period, so N/period instants fall due
//! each second, as in the seed's figure; `--aligned` gives them all one anchor instead, the
//! worst case, where every instant of a period falls due at once.
//!
//! It reports messages confirmed per second; the publish lag, from each instant (the message's
//! `sked-scheduled-for`) to the message reaching the consumer, which is when the broker routed
//! it and so when it confirms it, give or take the consumer's own wakeup; the time from each
//! instant to its run recorded as succeeded (after the confirm, and after the outcome's ledger
//! write, so it bounds the publish lag from above); the count check — every run due in the window that succeeded has exactly one message, and no
//! message arrived twice — and the process's peak resident memory (server and consumer). The
//! lag is also given minute by minute, since a tail that grows with the ledger is a trend that
//! one percentile of the whole window hides. The first instants fall due a lead after the jobs
//! are written, so the window opens on the steady state rather than on a catch-up burst.

use crate::harness::{ms, percentiles_of, period_us, start_with, store_with_jobs};
use anyhow::{Context, Result};
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
use sked_core::publish::{BrokerConnection, BrokerKind, HEADER_RUN_ID, HEADER_SCHEDULED_FOR};
use sked_core::run::RunState;
use sked_core::stats::percentiles;
use std::sync::{Arc, Mutex};

/// Messages received, by run id.
type Received = Arc<Mutex<Receipts>>;

/// What reached the consumer for one run.
#[derive(Clone, Copy, Default)]
struct Receipt {
    /// Messages received: above one is a duplicate.
    count: u32,
    /// From the run's instant to the first message's arrival, in milliseconds.
    lag_ms: Option<f64>,
}

/// Receipts indexed by run id. A fresh store numbers runs from 1 upwards, so a dense vector
/// holds them: a hash map of millions of entries made the consumer itself slower as the run
/// went on (each insert a cache miss, each growth a pause of the consumer while it rehashed),
/// and the consumer shares the cores with the server it measures.
#[derive(Default)]
struct Receipts {
    by_id: Vec<Receipt>,
}

impl Receipts {
    /// Run ids past this are not tracked (and so show as missing): far more runs than any
    /// window of this benchmark records.
    const MAX_ID: i64 = 1 << 28;

    /// Room for the first `runs` run ids, made (and its pages touched) before the window
    /// opens, so that growing it never pauses the consumer mid-window.
    fn with_room_for(runs: usize) -> Receipts {
        let runs = runs.min(Self::MAX_ID as usize);
        Receipts {
            by_id: vec![Receipt::default(); runs + 1],
        }
    }

    fn record(&mut self, id: i64, lag_ms: Option<f64>) {
        if !(0..Self::MAX_ID).contains(&id) {
            return;
        }
        let index = id as usize;
        if index >= self.by_id.len() {
            self.by_id.resize(index + 1, Receipt::default());
        }
        let receipt = &mut self.by_id[index];
        receipt.count += 1;
        receipt.lag_ms = receipt.lag_ms.or(lag_ms);
    }

    /// What arrived for run `id`, if anything did.
    fn get(&self, id: i64) -> Option<&Receipt> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.by_id.get(i))
            .filter(|r| r.count > 0)
    }

    /// Runs whose message arrived more than once.
    fn duplicated(&self) -> usize {
        self.by_id.iter().filter(|r| r.count > 1).count()
    }
}

/// `XREAD`'s answer: per stream, its entries, each an id and its fields.
type StreamEntries = Vec<(String, Vec<(String, Vec<(String, String)>)>)>;

/// Counts one message of run `run_id` whose header `sked-scheduled-for` reads `scheduled_for`.
fn count(received: &Received, run_id: Option<i64>, scheduled_for: Option<&str>) {
    let arrived = Utc::now();
    let Some(id) = run_id else { return };
    let lag_ms = scheduled_for
        .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
        .map(|at| ms(arrived - at.with_timezone(&Utc)));
    received
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .record(id, lag_ms);
}

pub struct Options<'a> {
    pub database_url: Option<&'a str>,
    pub broker_url: &'a str,
    pub schedules: usize,
    pub every: &'a str,
    pub seconds: u64,
    pub nodes: usize,
    pub aligned: bool,
    /// Seconds from the jobs' creation to their first instants, when not the default.
    pub lead: Option<u64>,
}

/// The benchmark's own destination on the broker and the consumer counting what reaches it.
struct Destination {
    /// The `target` of every benchmark job.
    target: Value,
    consuming: tokio::task::JoinHandle<()>,
    cleanup: Cleanup,
}

enum Cleanup {
    Amqp(lapin::Channel, String),
    Nats(async_nats::jetstream::Context, String),
    Redis(redis::aio::MultiplexedConnection, String),
}

impl Cleanup {
    async fn run(self) -> Result<()> {
        match self {
            Cleanup::Amqp(channel, name) => {
                channel
                    .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                    .await?;
                channel
                    .exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
                    .await?;
            }
            Cleanup::Nats(js, name) => {
                js.delete_stream(&name).await?;
            }
            Cleanup::Redis(mut redis, key) => {
                let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut redis).await?;
            }
        }
        Ok(())
    }
}

/// An exchange with a queue bound to it, and a consumer on the queue.
async fn amqp(url: &str, name: &str, received: Received) -> Result<Destination> {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .context("cannot reach RabbitMQ")?;
    let channel = connection.create_channel().await?;
    channel
        .exchange_declare(
            name.into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_bind(
            name.into(),
            name.into(),
            "tick".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut consumer = channel
        .basic_consume(
            name.into(),
            "sked-bench".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    let consuming = tokio::spawn(async move {
        // The connection lives as long as the consumer.
        let _connection = connection;
        while let Some(Ok(delivery)) = consumer.next().await {
            let header = |name: &str| {
                delivery
                    .properties
                    .headers()
                    .as_ref()
                    .and_then(|h| h.inner().get(name).cloned())
                    .and_then(|v| match v {
                        AMQPValue::LongString(text) => Some(text.to_string()),
                        _ => None,
                    })
            };
            let run_id = header(HEADER_RUN_ID).and_then(|v| v.parse::<i64>().ok());
            count(&received, run_id, header(HEADER_SCHEDULED_FOR).as_deref());
        }
    });
    Ok(Destination {
        target: json!({"amqp": {
            "connection": "bench", "exchange": name, "routing_key": "tick",
            "payload": {"job": "{{job}}", "at": "{{scheduled_for}}"}, "persistent": false
        }}),
        consuming,
        cleanup: Cleanup::Amqp(channel, name.to_string()),
    })
}

/// A stream (file storage) on the subject `<name>.tick`, and an ordered consumer of it.
async fn nats(url: &str, name: &str, received: Received) -> Result<Destination> {
    use async_nats::jetstream::{consumer, stream};
    let client = async_nats::connect(url)
        .await
        .context("cannot reach NATS")?;
    let js = async_nats::jetstream::new(client);
    let stream_name = name.to_uppercase().replace('-', "_");
    let created = js
        .create_stream(stream::Config {
            name: stream_name.clone(),
            subjects: vec![format!("{name}.>")],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("cannot create stream {stream_name}: {e}"))?;
    let consumer = created
        .create_consumer(consumer::pull::OrderedConfig::default())
        .await
        .map_err(|e| anyhow::anyhow!("cannot create a consumer: {e}"))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| anyhow::anyhow!("cannot consume: {e}"))?;
    let consuming = tokio::spawn(async move {
        while let Some(Ok(message)) = messages.next().await {
            let header = |name: &str| message.headers.as_ref().and_then(|h| h.get(name));
            let run_id = header(HEADER_RUN_ID).and_then(|v| v.as_str().parse::<i64>().ok());
            count(
                &received,
                run_id,
                header(HEADER_SCHEDULED_FOR).map(|v| v.as_str()),
            );
        }
    });
    Ok(Destination {
        target: json!({"nats": {
            "connection": "bench", "subject": format!("{name}.tick"),
            "payload": {"job": "{{job}}", "at": "{{scheduled_for}}"}
        }}),
        consuming,
        cleanup: Cleanup::Nats(js, stream_name),
    })
}

/// A stream key, read with `XREAD BLOCK` as entries arrive.
async fn redis_stream(url: &str, name: &str, received: Received) -> Result<Destination> {
    let client = redis::Client::open(url).context("a bad Redis URL")?;
    let redis = client
        .get_multiplexed_async_connection()
        .await
        .context("cannot reach Redis")?;
    let key = format!("{name}:tick");
    let mut reader = client.get_multiplexed_async_connection().await?;
    let read_key = key.clone();
    let consuming = tokio::spawn(async move {
        let mut last = "0-0".to_string();
        loop {
            // A block shorter than the client's response timeout (500 ms), so an empty wait
            // is an empty answer rather than an error.
            let reply: redis::RedisResult<Option<StreamEntries>> = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(10_000)
                .arg("BLOCK")
                .arg(200)
                .arg("STREAMS")
                .arg(&read_key)
                .arg(&last)
                .query_async(&mut reader)
                .await;
            let entries = match reply {
                Ok(reply) => reply.unwrap_or_default(),
                Err(e) => {
                    eprintln!("XREAD failed, reading on: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            for (_, entries) in entries {
                for (id, fields) in entries {
                    let field = |wanted: &str| {
                        fields
                            .iter()
                            .find(|(name, _)| name == wanted)
                            .map(|(_, v)| v.as_str())
                    };
                    let run_id = field(HEADER_RUN_ID).and_then(|v| v.parse::<i64>().ok());
                    count(&received, run_id, field(HEADER_SCHEDULED_FOR));
                    last = id;
                }
            }
        }
    });
    Ok(Destination {
        target: json!({"redis_stream": {
            "connection": "bench", "stream": key, "fields": {"job": "{{job}}"}
        }}),
        consuming,
        cleanup: Cleanup::Redis(redis, key),
    })
}

pub async fn run(options: Options<'_>) -> Result<Value> {
    let Options {
        database_url,
        broker_url,
        schedules,
        every,
        seconds,
        nodes,
        aligned,
        lead,
    } = options;
    let connection: BrokerConnection = format!("bench={broker_url}")
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    // One name for the exchange and its queue, the stream, or the key.
    let name = format!("sked-bench-{:08x}", rand::random::<u32>());
    let period_us = period_us(every, schedules)?;
    // Every instant of the window and a margin on either side (runs are numbered from 1).
    let instants_per_schedule = ((seconds + 30) * 1_000_000).div_ceil(period_us as u64);
    let received: Received = Arc::new(Mutex::new(Receipts::with_room_for(
        (instants_per_schedule as usize).saturating_mul(schedules),
    )));
    let destination = match connection.kind {
        BrokerKind::Amqp => amqp(broker_url, &name, received.clone()).await?,
        BrokerKind::Nats => nats(broker_url, &name, received.clone()).await?,
        BrokerKind::Redis => redis_stream(broker_url, &name, received.clone()).await?,
    };

    let step_us = if aligned {
        0
    } else {
        period_us / schedules as i64
    };
    // The first instants fall due a lead after the jobs are written, once the server is up:
    // instants already overdue when it starts would be a catch-up burst, and this measures
    // the steady state. Creating and starting take seconds on SQLite, longer on PostgreSQL,
    // and longer with more nodes.
    let lead = Duration::seconds(match (lead, database_url) {
        (Some(lead), _) => lead.min(3_600) as i64,
        (None, Some(_)) => 30 + 20 * nodes as i64,
        (None, None) => 15,
    });
    let base = Utc::now() + lead;
    let target = destination.target.clone();
    let jobs = (0..schedules).map(move |i| {
        let anchor = base + Duration::microseconds(step_us * i as i64);
        let spec: JobSpec = serde_json::from_value(json!({
            "schedule": {"every": every, "anchor": anchor.to_rfc3339()},
            "target": target,
        }))
        .expect("a valid benchmark job");
        (format!("publish-{i:07}"), spec)
    });
    let creating = std::time::Instant::now();
    let (store, place) = store_with_jobs(database_url, jobs).await?;
    let created_in = creating.elapsed();
    let starting = std::time::Instant::now();
    let mut server = start_with(store.clone(), place, nodes, vec![connection.clone()]).await?;
    let started_in = starting.elapsed();
    let store_name = server.store_name();
    let ready = Utc::now();
    let from = base.max(ready + Duration::seconds(2));
    let to = from + Duration::seconds(seconds as i64);
    tokio::time::sleep((from - Utc::now()).to_std().unwrap_or_default()).await;
    let probe = crate::probe::start(
        seconds.div_ceil(60),
        match connection.kind {
            BrokerKind::Amqp => "beam.smp",
            BrokerKind::Nats => "nats-server",
            BrokerKind::Redis => "redis-server",
        },
    );
    let published_at_start = server
        .metric_sum("sked_messages_published_total")
        .await?
        .unwrap_or(0.0);
    tokio::time::sleep(std::time::Duration::from_secs(seconds)).await;
    let published_at_end = server
        .metric_sum("sked_messages_published_total")
        .await?
        .unwrap_or(0.0);
    let machine_by_minute = probe.finish();
    let failed = server
        .metric_sum("sked_messages_failed_total")
        .await?
        .unwrap_or(0.0);
    // Runs due at the end of the window get the time their publish may take.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    server.stop().await;
    let window = server.finish_with_runs(store.as_ref(), from, to).await?;
    // Messages still on their way to the consumer arrive within a moment.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    destination.consuming.abort();
    destination.cleanup.run().await?;

    let received = std::mem::take(&mut *received.lock().unwrap_or_else(|p| p.into_inner()));
    let succeeded: Vec<_> = window
        .iter()
        .filter(|r| r.state == RunState::Succeeded)
        .collect();
    let once = succeeded
        .iter()
        .filter(|r| received.get(r.id).map(|m| m.count) == Some(1))
        .count();
    let missing = succeeded
        .iter()
        .filter(|r| received.get(r.id).is_none())
        .count();
    let duplicated = received.duplicated();
    let publish = percentiles_of(succeeded.iter().copied(), |r| {
        received.get(r.id).and_then(|m| m.lag_ms)
    });
    let by_minute = lag_by_minute(&succeeded, &received, from);
    let recorded = percentiles_of(succeeded.iter().copied(), |r| {
        r.finished_at.map(|f| ms(f - r.scheduled_for))
    });
    let expected = window.len();
    Ok(json!({
        "scenario": "publish",
        "broker": connection.kind.target_name(),
        "store": store_name,
        "nodes": nodes,
        "schedules": schedules,
        "every": every,
        "anchors": if aligned { "aligned" } else { "spread" },
        "window_seconds": seconds,
        "jobs_created_seconds": created_in.as_secs_f64(),
        "nodes_ready_seconds": started_in.as_secs_f64(),
        // The lead was too short: the window opened on a backlog of overdue instants.
        "ready_after_first_instant": ready > base,
        "messages_expected": expected,
        "succeeded_in_window": succeeded.len(),
        "messages_per_second": (published_at_end - published_at_start) / seconds as f64,
        "messages_failed": failed,
        "instants_published_once": once,
        "instants_missed": expected.saturating_sub(once),
        "succeeded_without_message": missing,
        "instants_duplicated": duplicated,
        // `lag_ms` is what bench/peers/compare.py compares with the peers' receipt lag.
        "lag_ms": {"p50": publish.p50, "p99": publish.p99, "max": publish.max},
        "lag_measures": "instant to the message reaching the consumer",
        "lag_by_minute": by_minute,
        "machine_by_minute": machine_by_minute,
        "recorded_lag_ms": {"p50": recorded.p50, "p99": recorded.p99, "max": recorded.max},
        "recorded_lag_measures": "instant to the run recorded succeeded, after the broker's confirm",
        "peak_rss_mb": peak_rss_mb(),
    }))
}

/// The publish lag of the instants in each minute of the window, so a tail that grows with the
/// ledger shows as a trend rather than hiding in one percentile of the whole window; and the
/// p99 of each stage of it, from the run's own record: `fire` (instant to run recorded),
/// `start` (recorded to attempt started) and `publish` (started to the consumer's receipt).
/// A stage's p99 is over its own values, so the three do not add up to the lag's.
fn lag_by_minute(
    succeeded: &[&sked_core::records::RunRecord],
    received: &Receipts,
    from: chrono::DateTime<Utc>,
) -> Vec<Value> {
    #[derive(Default)]
    struct Minute {
        lag: Vec<f64>,
        fire: Vec<f64>,
        start: Vec<f64>,
        publish: Vec<f64>,
    }
    let mut minutes: std::collections::BTreeMap<i64, Minute> = Default::default();
    for run in succeeded {
        let Some(lag) = received.get(run.id).and_then(|m| m.lag_ms) else {
            continue;
        };
        let minute = minutes
            .entry((run.scheduled_for - from).num_minutes())
            .or_default();
        minute.lag.push(lag);
        minute.fire.push(ms(run.created_at - run.scheduled_for));
        if let Some(started) = run.started_at {
            minute.start.push(ms(started - run.created_at));
            minute.publish.push(lag - ms(started - run.scheduled_for));
        }
    }
    minutes
        .into_iter()
        .map(|(minute, mut m)| {
            let p = percentiles(&mut m.lag);
            json!({
                "minute": minute, "p50": p.p50, "p99": p.p99, "max": p.max,
                "stage_p99": {
                    "fire": percentiles(&mut m.fire).p99,
                    "start": percentiles(&mut m.start).p99,
                    "publish": percentiles(&mut m.publish).p99,
                },
            })
        })
        .collect()
}

/// This process's peak resident memory (`VmHWM`), in MB.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
