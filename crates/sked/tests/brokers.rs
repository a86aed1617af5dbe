//! Broker targets, black-box, against the real RabbitMQ, NATS JetStream and Redis: a `sked
//! server` with `--broker` connections and no worker publishes each instant of a job itself;
//! every message carries the envelope, and there is exactly one confirmed message per
//! succeeded run; a job routed to labels is published by a worker carrying them and the
//! connection. An unroutable message fails its attempt and the retry policy applies; an
//! unreachable broker fails attempts without holding up firing; a definition that names a URL,
//! an unknown connection, or a destination outside its namespace's allowance is refused.
//!
//! Each test uses its own exchange and queue, stream, or key, named at random. The brokers are
//! found through `SKED_TEST_AMQP_URL`, `SKED_TEST_NATS_URL` and `SKED_TEST_REDIS_URL`; without
//! them these tests are reported as ignored (under CI they run, and fail loudly).

mod common;
#[path = "common/brokers.rs"]
mod private_brokers;

use common::{free_port, report_completion as report, Sked};
use private_brokers::redis_messages;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

fn service(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: the broker tests need the real service (see .ci/run)")
    })
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{:08x}", rand::random::<u32>())
}

/// Runs of `job` once at least `n` have finished, waiting up to 20 s.
async fn finished_runs(sked: &Sked, job: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let runs: Vec<Value> = sked
            .runs(job)
            .await
            .into_iter()
            .filter(|r| r["finished_at"].is_string())
            .collect();
        if runs.len() >= n || Instant::now() > deadline {
            return runs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every envelope header with its value, as text.
fn envelope_of(headers: &BTreeMap<String, String>) -> (String, String, String) {
    let get = |name: &str| {
        headers
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} header in {headers:?}"))
    };
    assert_eq!(get("sked-namespace"), "default");
    let key = get("sked-idempotency-key");
    assert_eq!(
        key,
        format!("default/{}/{}", get("sked-job"), get("sked-scheduled-for")),
        "{headers:?}"
    );
    assert!(get("sked-attempt").parse::<u32>().is_ok(), "{headers:?}");
    (get("sked-run-id"), get("sked-scheduled-for"), key)
}

/// Exactly one message per succeeded run, each naming its run and instant.
fn one_message_per_succeeded_run(runs: &[Value], messages: &[BTreeMap<String, String>]) {
    let succeeded: HashSet<(String, String)> = runs
        .iter()
        .filter(|r| r["state"] == "succeeded")
        .map(|r| {
            let at = r["scheduled_for"].as_str().unwrap_or_default();
            let at = chrono::DateTime::parse_from_rfc3339(at)
                .map(|t| {
                    t.with_timezone(&chrono::Utc)
                        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                })
                .unwrap_or_default();
            (r["id"].to_string(), at)
        })
        .collect();
    assert!(succeeded.len() >= 2, "{runs:?}");
    let mut keys = HashSet::new();
    let mut published = HashSet::new();
    for headers in messages {
        let (run_id, at, key) = envelope_of(headers);
        assert!(keys.insert(key.clone()), "a second message for {key}");
        published.insert((run_id, at));
    }
    assert!(
        succeeded.is_subset(&published),
        "succeeded runs without a message: {:?}",
        succeeded.difference(&published).collect::<Vec<_>>()
    );
}

async fn put(sked: &Sked, name: &str, job: Value) -> (u16, Value) {
    sked.put_job(name, job).await
}

mod amqp {
    use super::*;
    use lapin::options::{
        BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

    async fn channel() -> (Connection, Channel) {
        let url = service("SKED_TEST_AMQP_URL");
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .expect("RabbitMQ");
        let channel = connection.create_channel().await.expect("channel");
        (connection, channel)
    }

    /// A direct exchange with one queue bound by `routing_key`.
    async fn topology(channel: &Channel, exchange: &str, queue: &str, routing_key: &str) {
        channel
            .exchange_declare(
                exchange.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("exchange");
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("queue");
        channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                routing_key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind");
    }

    async fn remove(channel: &Channel, exchange: &str, queue: &str) {
        channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .expect("queue delete");
        channel
            .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
            .await
            .expect("exchange delete");
    }

    async fn drain(channel: &Channel, queue: &str) -> Vec<(BTreeMap<String, String>, Vec<u8>)> {
        let mut messages = Vec::new();
        let options = BasicGetOptions { no_ack: true };
        while let Some(message) = channel
            .basic_get(queue.into(), options)
            .await
            .expect("basic_get")
        {
            let delivery = &message.delivery;
            let mut headers = BTreeMap::new();
            if let Some(table) = delivery.properties.headers() {
                for (name, value) in table.inner() {
                    if let AMQPValue::LongString(text) = value {
                        headers.insert(name.to_string(), text.to_string());
                    }
                }
            }
            messages.push((headers, delivery.data.clone()));
        }
        messages
    }

    #[cfg_attr(
        not(sked_broker_tests),
        ignore = "needs SKED_TEST_AMQP_URL and the other brokers"
    )]
    #[tokio::test]
    async fn each_instant_is_published_once_with_its_envelope_and_confirmed() {
        let (_connection, channel) = channel().await;
        let (exchange, queue) = (unique("sked-test-x-"), unique("sked-test-q-"));
        topology(&channel, &exchange, &queue, "jobs").await;
        let mut sked = Sked::new();
        let broker = format!("main={}", service("SKED_TEST_AMQP_URL"));
        sked.start_server(&["--broker", &broker]).await;

        let job = json!({
            "schedule": {"every": "1s"},
            "target": {"amqp": {
                "connection": "main", "exchange": exchange, "routing_key": "jobs",
                "payload": {"run": "{{run_id}}", "at": "{{scheduled_for}}"},
                "headers": {"team": "billing"}
            }}
        });
        let (status, answer) = put(&sked, "tick", job).await;
        assert_eq!(status, 201, "{answer}");
        let runs = finished_runs(&sked, "tick", 3).await;
        let (_, paused) = sked.post("/jobs/tick/pause", json!(null)).await;
        assert_eq!(paused["state"], "paused", "{paused}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let runs: Vec<Value> = sked
            .runs("tick")
            .await
            .into_iter()
            .filter(|r| runs.iter().any(|f| f["id"] == r["id"]) || r["finished_at"].is_string())
            .collect();

        let messages = drain(&channel, &queue).await;
        for (headers, body) in &messages {
            assert_eq!(headers.get("team").map(String::as_str), Some("billing"));
            let body: Value = serde_json::from_slice(body).expect("a JSON payload");
            assert_eq!(
                body["run"].as_str(),
                headers.get("sked-run-id").map(String::as_str)
            );
            assert_eq!(
                body["at"].as_str(),
                headers.get("sked-scheduled-for").map(String::as_str)
            );
        }
        let headers: Vec<BTreeMap<String, String>> = messages.into_iter().map(|(h, _)| h).collect();
        one_message_per_succeeded_run(&runs, &headers);
        let metrics = sked.metrics().await;
        assert!(
            common::metric(&metrics, "sked_messages_published_total") >= 2,
            "{metrics}"
        );

        remove(&channel, &exchange, &queue).await;
    }

    #[cfg_attr(
        not(sked_broker_tests),
        ignore = "needs SKED_TEST_AMQP_URL and the other brokers"
    )]
    #[tokio::test]
    async fn a_run_an_event_started_publishes_the_events_payload() {
        let (_connection, channel) = channel().await;
        let (exchange, queue) = (unique("sked-test-x-"), unique("sked-test-q-"));
        topology(&channel, &exchange, &queue, "jobs").await;
        let mut sked = Sked::new();
        let broker = format!("main={}", service("SKED_TEST_AMQP_URL"));
        sked.start_server(&["--broker", &broker]).await;
        // No payload of its own: each event's goes out.
        let job = json!({
            "schedule": {"event": "orders.ready"},
            "target": {"amqp": {"connection": "main", "exchange": exchange, "routing_key": "jobs"}}
        });
        let (status, answer) = put(&sked, "forward", job).await;
        assert_eq!(status, 201, "{answer}");
        let event = json!({"key": "orders.ready", "id": "batch-7", "payload": {"orders": 12}});
        let (status, posted) = sked.post("/events", event).await;
        assert_eq!(status, 201, "{posted}");
        let runs = finished_runs(&sked, "forward", 1).await;
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!(runs[0]["state"], "succeeded", "{runs:?}");
        let messages = drain(&channel, &queue).await;
        assert_eq!(messages.len(), 1);
        let (headers, body) = &messages[0];
        let body: Value = serde_json::from_slice(body).expect("a JSON payload");
        assert_eq!(body, json!({"orders": 12}));
        assert_eq!(
            headers.get("sked-event-key").map(String::as_str),
            Some("orders.ready")
        );
        assert_eq!(
            headers.get("sked-event-id").map(String::as_str),
            Some("batch-7")
        );
        remove(&channel, &exchange, &queue).await;
    }

    #[cfg_attr(
        not(sked_broker_tests),
        ignore = "needs SKED_TEST_AMQP_URL and the other brokers"
    )]
    #[tokio::test]
    async fn an_unroutable_message_fails_its_attempt_and_the_retry_policy_applies() {
        let (_connection, channel) = channel().await;
        let (exchange, queue) = (unique("sked-test-x-"), unique("sked-test-q-"));
        topology(&channel, &exchange, &queue, "bound").await;
        let mut sked = Sked::new();
        let broker = format!("main={}", service("SKED_TEST_AMQP_URL"));
        sked.start_server(&["--broker", &broker]).await;
        let job = json!({
            "retry": {"max_attempts": 2, "backoff": {"initial": "100ms"}},
            "target": {"amqp": {"connection": "main", "exchange": exchange, "routing_key": "nobody-listens"}}
        });
        assert_eq!(put(&sked, "lost", job).await.0, 201);
        let (_, run) = sked.post("/jobs/lost/trigger", json!(null)).await;
        let run = sked
            .wait_finished(run["id"].as_i64().expect("run id"), Duration::from_secs(20))
            .await;
        assert_eq!(run["state"], "failed", "{run}");
        assert_eq!(run["attempts"], 2, "{run}");
        let error = run["error"].as_str().unwrap_or_default();
        assert!(error.contains("could not route"), "{run}");
        assert!(drain(&channel, &queue).await.is_empty());
        remove(&channel, &exchange, &queue).await;
    }

    #[cfg_attr(
        not(sked_broker_tests),
        ignore = "needs SKED_TEST_AMQP_URL and the other brokers"
    )]
    #[tokio::test]
    async fn a_job_routed_to_labels_is_published_by_a_worker_with_them_and_the_connection() {
        let (_connection, channel) = channel().await;
        let (exchange, queue) = (unique("sked-test-x-"), unique("sked-test-q-"));
        topology(&channel, &exchange, &queue, "jobs").await;
        let url = service("SKED_TEST_AMQP_URL");
        let main = format!("main={url}");
        let mut sked = Sked::new();
        sked.start_server(&["--broker", &main]).await;

        // A connection the server lacks is refused unless the job is routed to workers.
        let target = |connection: &str| json!({"amqp": {"connection": connection, "exchange": exchange, "routing_key": "jobs"}});
        let (status, answer) = put(&sked, "unrouted", json!({"target": target("edge")})).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(
            answer["error"]["field"], "target.amqp.connection",
            "{answer}"
        );
        let routed_edge =
            json!({"target": target("edge"), "routing": {"labels": {"zone": "edge"}}});
        assert_eq!(put(&sked, "routed-edge", routed_edge).await.0, 201);

        // Routed to labels, a run waits for a worker that carries them and has the
        // connection: not the server's publisher (which has it), not a worker without them.
        let routed = json!({"target": target("main"), "routing": {"labels": {"zone": "edge"}}});
        assert_eq!(put(&sked, "routed", routed).await.0, 201);
        sked.start_worker_with("plain", 2, &["--broker", &main]);
        sked.start_worker_with("edge-without", 2, &["--labels", "zone=edge"]);
        let (_, run) = sked.post("/jobs/routed/trigger", json!(null)).await;
        let id = run["id"].as_i64().expect("run id");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(sked.run(id).await["state"], "queued");
        assert!(drain(&channel, &queue).await.is_empty());

        sked.start_worker_with("edge", 2, &["--labels", "zone=edge", "--broker", &main]);
        let run = sked.wait_finished(id, Duration::from_secs(20)).await;
        assert_eq!(run["state"], "succeeded", "{run}");
        let log = sked.run_log(id).await;
        assert!(log.contains("published through connection main"), "{log}");
        let messages = drain(&channel, &queue).await;
        assert_eq!(messages.len(), 1, "{messages:?}");
        let (run_id, _, key) = envelope_of(&messages[0].0);
        assert_eq!(run_id, id.to_string());
        assert!(key.starts_with("default/routed/"), "{key}");

        // A connection no worker with the labels has: the run stays queued, never dropped.
        let (_, run) = sked.post("/jobs/routed-edge/trigger", json!(null)).await;
        let id = run["id"].as_i64().expect("run id");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(sked.run(id).await["state"], "queued");
        remove(&channel, &exchange, &queue).await;
    }
}

mod nats {
    use super::*;
    use async_nats::jetstream::{self, stream};
    use futures_util::StreamExt;

    #[cfg_attr(
        not(sked_broker_tests),
        ignore = "needs SKED_TEST_NATS_URL and the other brokers"
    )]
    #[tokio::test]
    async fn each_instant_is_acked_by_the_stream_once_with_its_message_id() {
        let client = async_nats::connect(service("SKED_TEST_NATS_URL"))
            .await
            .expect("NATS");
        let js = jetstream::new(client);
        let name = unique("SKEDTEST");
        let subject = format!("{}.jobs", name.to_lowercase());
        let stream = js
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{}.>", name.to_lowercase())],
                ..Default::default()
            })
            .await
            .expect("stream");
        let mut sked = Sked::new();
        let broker = format!("events={}", service("SKED_TEST_NATS_URL"));
        sked.start_server(&["--broker", &broker]).await;
        let job = json!({
            "schedule": {"every": "1s"},
            "target": {"nats": {"connection": "events", "subject": subject, "payload": "tick {{run_id}}"}}
        });
        assert_eq!(put(&sked, "tick", job).await.0, 201);
        finished_runs(&sked, "tick", 3).await;
        sked.post("/jobs/tick/pause", json!(null)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let runs: Vec<Value> = sked.runs("tick").await;

        let consumer = stream
            .create_consumer(jetstream::consumer::pull::Config::default())
            .await
            .expect("consumer");
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .expect("fetch");
        let mut messages = Vec::new();
        while let Some(Ok(message)) = batch.next().await {
            let mut headers = BTreeMap::new();
            if let Some(map) = &message.headers {
                for (name, values) in map.iter() {
                    if let Some(value) = values.first() {
                        headers.insert(name.to_string(), value.to_string());
                    }
                }
            }
            assert_eq!(
                headers.get("Nats-Msg-Id"),
                headers.get("sked-idempotency-key"),
                "{headers:?}"
            );
            let body = String::from_utf8_lossy(&message.payload).into_owned();
            assert_eq!(
                Some(body.as_str()),
                headers
                    .get("sked-run-id")
                    .map(|id| format!("tick {id}"))
                    .as_deref()
            );
            messages.push(headers);
        }
        one_message_per_succeeded_run(&runs, &messages);
        js.delete_stream(&name).await.expect("delete stream");
    }
}

mod redis_stream {
    use super::*;

    #[cfg_attr(
        not(sked_broker_tests),
        ignore = "needs SKED_TEST_REDIS_URL and the other brokers"
    )]
    #[tokio::test]
    async fn each_instant_is_one_stream_entry_with_the_envelope_as_fields() {
        let (url, key) = (service("SKED_TEST_REDIS_URL"), unique("skedtest:"));
        let mut sked = Sked::new();
        let broker = format!("cache={url}");
        sked.start_server(&["--broker", &broker]).await;
        let job = json!({
            "schedule": {"every": "1s"},
            "target": {"redis_stream": {"connection": "cache", "stream": key, "maxlen": 1000, "fields": {"kind": "report"}}}
        });
        assert_eq!(put(&sked, "tick", job).await.0, 201);
        finished_runs(&sked, "tick", 3).await;
        sked.post("/jobs/tick/pause", json!(null)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let runs: Vec<Value> = sked.runs("tick").await;

        let messages = redis_messages(&url, &key).await;
        for fields in &messages {
            assert_eq!(fields.get("kind").map(String::as_str), Some("report"));
        }
        one_message_per_succeeded_run(&runs, &messages);
        delete(&url, &key).await;
    }

    /// Removes the test's stream.
    async fn delete(url: &str, key: &str) {
        let client = redis::Client::open(url).expect("Redis URL");
        let mut redis = client
            .get_multiplexed_async_connection()
            .await
            .expect("Redis");
        let _: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut redis)
            .await
            .expect("DEL");
    }

    /// The stream entry of run `run_id`, once there is one.
    async fn entry_of(url: &str, key: &str, run_id: i64) -> BTreeMap<String, String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let found = redis_messages(url, key)
                .await
                .into_iter()
                .find(|f| f.get("sked-run-id") == Some(&run_id.to_string()));
            if let Some(fields) = found {
                return fields;
            }
            assert!(Instant::now() < deadline, "no entry for run {run_id}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[cfg_attr(
        not(sked_broker_tests),
        ignore = "needs SKED_TEST_REDIS_URL and the other brokers"
    )]
    #[tokio::test]
    async fn a_run_that_awaits_completion_ends_with_its_consumers_report_or_its_timeout() {
        let (url, key) = (service("SKED_TEST_REDIS_URL"), unique("skedtest:"));
        let mut sked = Sked::new();
        sked.start_server(&["--broker", &format!("cache={url}")])
            .await;
        let job = json!({
            "timeout": "3s",
            "target": {"redis_stream": {"connection": "cache", "stream": key, "await_completion": true}}
        });
        assert_eq!(put(&sked, "handoff", job).await.0, 201);
        let trigger = || async {
            let (status, run) = sked.post("/jobs/handoff/trigger", json!(null)).await;
            assert_eq!(status, 201, "{run}");
            run["id"].as_i64().expect("a run id")
        };

        // Confirmed by the broker, the run waits for its consumer.
        let a = trigger().await;
        let fields = entry_of(&url, &key, a).await;
        let complete_url = fields.get("sked-complete-url").cloned().unwrap_or_default();
        let token = fields
            .get("sked-complete-token")
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            complete_url,
            format!("{}/api/v1/runs/{a}/complete", sked.base())
        );
        assert!(token.len() >= 40, "{fields:?}");
        assert_eq!(sked.run(a).await["state"], "running");

        // A wrong token, a forged one, a bad outcome: refused, nothing changes.
        let (status, body) = report(
            &complete_url,
            json!({"token": "c1.forged", "outcome": "succeeded"}),
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (403, Some("bad_completion_token")),
            "{body}"
        );
        let (status, _) = report(
            &complete_url,
            json!({"token": token, "outcome": "cancelled"}),
        )
        .await;
        assert_eq!(status, 400);
        let (status, _) = report(
            &complete_url,
            json!({"token": token, "outcome": "succeeded", "extra": 1}),
        )
        .await;
        assert_eq!(status, 400);
        let (status, _) = report(
            &format!("{}/api/v1/runs/999999/complete", sked.base()),
            json!({"token": token, "outcome": "succeeded"}),
        )
        .await;
        assert_eq!(status, 404);
        assert_eq!(sked.run(a).await["state"], "running");

        // Another run's token opens nothing here.
        let b = trigger().await;
        let b_fields = entry_of(&url, &key, b).await;
        let b_token = b_fields
            .get("sked-complete-token")
            .cloned()
            .unwrap_or_default();
        assert_ne!(b_token, token);
        let (status, _) = report(
            &complete_url,
            json!({"token": b_token, "outcome": "succeeded"}),
        )
        .await;
        assert_eq!(status, 403);

        // The right token records the outcome once; its message is the attempt's output.
        let (status, run) = report(
            &complete_url,
            json!({"token": token, "outcome": "succeeded", "message": "loaded 42 rows"}),
        )
        .await;
        assert_eq!(
            (status, run["state"].as_str()),
            (200, Some("succeeded")),
            "{run}"
        );
        let (status, body) =
            report(&complete_url, json!({"token": token, "outcome": "failed"})).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (409, Some("already_completed")),
            "{body}"
        );
        assert_eq!(sked.run(a).await["state"], "succeeded");
        let log = sked.run_log(a).await;
        assert!(log.contains("loaded 42 rows"), "{log}");

        // Nobody reports run b: its timeout ends it, and its token is spent.
        let b_run = sked.wait_finished(b, Duration::from_secs(20)).await;
        assert_eq!(b_run["state"], "timed_out", "{b_run}");
        let error = b_run["error"].as_str().unwrap_or_default();
        assert!(error.contains("no consumer reported"), "{error}");
        let b_url = b_fields
            .get("sked-complete-url")
            .cloned()
            .unwrap_or_default();
        let (status, _) = report(&b_url, json!({"token": b_token, "outcome": "succeeded"})).await;
        assert_eq!(status, 409);

        // A consumer's failure fails the run with its message.
        let c = trigger().await;
        let c_fields = entry_of(&url, &key, c).await;
        let c_url = c_fields
            .get("sked-complete-url")
            .cloned()
            .unwrap_or_default();
        let c_token = c_fields
            .get("sked-complete-token")
            .cloned()
            .unwrap_or_default();
        let (status, run) = report(
            &c_url,
            json!({"token": c_token, "outcome": "failed", "message": "the file was empty"}),
        )
        .await;
        assert_eq!(
            (status, run["state"].as_str()),
            (200, Some("failed")),
            "{run}"
        );
        assert_eq!(run["error"], "the file was empty");

        // The token appears in no log line of the server.
        let logs: String = std::fs::read_dir(sked.dir.path())
            .expect("test dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect();
        assert!(!logs.contains(&token) && !logs.contains(&c_token));
        delete(&url, &key).await;
    }
}

/// Needs no broker: nothing listens on the port.
#[tokio::test]
async fn an_unreachable_broker_fails_attempts_and_never_holds_up_firing() {
    let mut sked = Sked::new();
    let broker = format!("down=amqp://guest:guest@127.0.0.1:{}/%2f", free_port());
    sked.start_server(&["--broker", &broker]).await;
    let job = json!({
        "schedule": {"every": "200ms"},
        "timeout": "2s",
        "target": {"amqp": {"connection": "down", "exchange": "x", "routing_key": "k"}}
    });
    assert_eq!(put(&sked, "blocked", job).await.0, 201);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let runs = sked.runs("blocked").await;
    assert!(
        runs.len() >= 10,
        "instants keep being recorded: {}",
        runs.len()
    );
    let failed: Vec<&Value> = runs.iter().filter(|r| r["state"] == "failed").collect();
    assert!(!failed.is_empty(), "{runs:?}");
    let error = failed[0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("connection down") && error.contains("cannot connect"),
        "{error}"
    );
    assert!(
        !runs.iter().any(|r| r["state"] == "succeeded"),
        "nothing is recorded as published that no broker confirmed"
    );
}

/// Needs no broker: refused before anything is published.
#[tokio::test]
async fn definitions_name_known_connections_within_their_allowance() {
    let mut sked = Sked::new();
    sked.start_server(&[
        "--broker",
        "main=amqp://guest:guest@127.0.0.1:5672/%2f",
        "--broker",
        "events=nats://127.0.0.1:4222",
        "--broker-allow",
        "billing=main:billing.",
    ])
    .await;
    let amqp = |connection: &str, exchange: &str| json!({"target": {"amqp": {"connection": connection, "exchange": exchange}}});
    let cases = [
        (
            "default",
            amqp("amqp://guest:secret@rabbit/", "x"),
            "target.amqp.connection",
            "not a URL",
        ),
        (
            "default",
            amqp("nowhere", "x"),
            "target.amqp.connection",
            "no broker connection named",
        ),
        (
            "default",
            amqp("events", "x"),
            "target.amqp.connection",
            "is a nats connection",
        ),
        (
            "default",
            amqp("main", "billing.jobs"),
            "target.amqp.exchange",
            "may not publish",
        ),
        (
            "billing",
            amqp("main", "ops.jobs"),
            "target.amqp.exchange",
            "beginning with",
        ),
    ];
    for (namespace, job, field, says) in cases {
        let url = sked.url(&format!("/jobs/j?namespace={namespace}"));
        let response = sked.http.put(url).json(&job).send().await.expect("PUT");
        let status = response.status().as_u16();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 400, "{job}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{message}");
        assert!(
            !message.contains("secret"),
            "a URL's password in an answer: {message}"
        );
    }
    let url = sked.url("/jobs/j?namespace=billing");
    let ok = sked
        .http
        .put(url)
        .json(&amqp("main", "billing.jobs"))
        .send()
        .await
        .expect("PUT");
    assert_eq!(ok.status().as_u16(), 201);
    let (status, _) = put(
        &sked,
        "k",
        json!({"target": {"nats": {"connection": "events", "subject": "a.b"}}}),
    )
    .await;
    assert_eq!(status, 201, "a connection no allowance names is open");
}

/// Needs no broker. A job routed to worker labels may name a connection the server lacks (its
/// workers bring their own), and a run no such worker may publish names the missing connection
/// in its waiting reason. A job written while the server had a connection is warned of at a
/// start without it.
#[tokio::test]
async fn a_missing_connection_is_named_where_runs_wait_and_at_start() {
    let mut sked = Sked::new();
    let broker = format!("main=amqp://guest:guest@127.0.0.1:{}/%2f", free_port());
    sked.start_server(&["--broker", &broker]).await;
    let target = |connection: &str| json!({"amqp": {"connection": connection, "exchange": "x", "routing_key": "k"}});
    let routed = json!({"target": target("edge"), "routing": {"labels": {"zone": "edge"}}});
    assert_eq!(put(&sked, "routed-edge", routed).await.0, 201);
    let (status, answer) = put(&sked, "unrouted-edge", json!({"target": target("edge")})).await;
    assert_eq!(status, 400, "refused at write time: {answer}");
    assert_eq!(
        put(&sked, "orders", json!({"target": target("main")}))
            .await
            .0,
        201
    );

    sked.start_worker_with("edge-without", 2, &["--labels", "zone=edge"]);
    let (_, run) = sked.post("/jobs/routed-edge/trigger", json!(null)).await;
    let id = run["id"].as_i64().expect("run id");
    let deadline = Instant::now() + Duration::from_secs(10);
    let reason = loop {
        let view = sked.run(id).await;
        assert_eq!(view["state"], "queued", "{view}");
        if let Some(reason) = view["waiting_for_workers"].as_str() {
            break reason.to_string();
        }
        assert!(Instant::now() < deadline, "no waiting reason: {view}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        reason.contains("broker connection \"edge\"") && reason.contains("--broker edge=URL"),
        "{reason}"
    );

    // Started again without `main`: the job that names it is warned of.
    if let Some(mut server) = sked.server.take() {
        server.stop(Duration::from_secs(10));
    }
    sked.start_server(&[]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let logs: String = std::fs::read_dir(sked.dir.path())
            .expect("logs")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("server-"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .collect();
        let warned = logs
            .lines()
            .find(|l| l.contains("which this server does not have"));
        if let Some(line) = warned {
            assert!(
                line.contains("\"main\"") && line.contains("default/orders"),
                "{line}"
            );
            assert!(!line.contains("routed-edge"), "{line}");
            break;
        }
        assert!(Instant::now() < deadline, "no warning: {logs}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
