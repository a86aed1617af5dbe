//! Brokers of a test's own: a RabbitMQ node, a NATS server with JetStream or a Redis server on
//! free loopback ports, in a temporary directory, that the test may kill and start again
//! without touching the shared services other tests use. Their data survives a kill (durable
//! queues, JetStream file storage, Redis' append-only file), so what a broker confirmed before
//! it died is still there to be counted.
//!
//! Also: reading back every message of a destination as its header map, and the ledger check
//! that ties messages to runs.
#![allow(dead_code)]

use crate::common::free_port;
use futures_util::StreamExt;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Rabbit,
    Nats,
    Redis,
}

/// The destination every outage test publishes to, declared durable on its broker.
pub const DESTINATION: &str = "sked-outage";

pub struct PrivateBroker {
    pub kind: Kind,
    pub port: u16,
    dir: tempfile::TempDir,
    /// The broker process: the NATS or Redis server itself, or RabbitMQ's launcher (the node's
    /// own process id is in its pid file).
    child: Option<Child>,
    /// RabbitMQ's distribution port, fixed so a restart finds the same node.
    dist_port: u16,
}

impl PrivateBroker {
    /// A broker of `kind`, not started yet.
    pub fn new(kind: Kind) -> PrivateBroker {
        let dir = tempfile::tempdir().expect("tempdir");
        if kind == Kind::Rabbit {
            let base = dir.path();
            std::fs::create_dir_all(base.join("mnesia")).expect("mnesia dir");
            std::fs::create_dir_all(base.join("log")).expect("log dir");
            std::fs::write(base.join("plugins"), "[].").expect("plugins file");
        }
        PrivateBroker {
            kind,
            port: free_port(),
            dir,
            child: None,
            dist_port: free_port(),
        }
    }

    pub fn url(&self) -> String {
        match self.kind {
            Kind::Rabbit => format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port),
            Kind::Nats => format!("nats://127.0.0.1:{}", self.port),
            Kind::Redis => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    fn log(&self) -> std::fs::File {
        let path = self.dir.path().join("broker.log");
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("broker log")
    }

    /// Starts the broker on its port and data, and waits until it takes connections.
    pub async fn start(&mut self) {
        let data = self.dir.path();
        let port = self.port.to_string();
        let mut command = match self.kind {
            Kind::Nats => {
                let mut c = Command::new("nats-server");
                c.args(["-a", "127.0.0.1", "-p", &port, "-js", "-sd"])
                    .arg(data.join("jetstream"));
                c
            }
            Kind::Redis => {
                let mut c = Command::new("redis-server");
                c.args(["--bind", "127.0.0.1", "--port", &port, "--save", ""])
                    .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
                    .arg(data);
                c
            }
            Kind::Rabbit => self.rabbit_command(data),
        };
        let out = self.log();
        let err = out.try_clone().expect("broker log");
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", self.kind));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(90);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "{:?} did not start; see {:?}",
                self.kind,
                data.join("broker.log")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A RabbitMQ node of its own: its name, ports, data, logs and plugins here. Run as root,
    /// the launcher switches to the `rabbitmq` user, which must own the directory.
    fn rabbit_command(&self, data: &Path) -> Command {
        let config = data.join("rabbitmq.conf");
        std::fs::write(
            &config,
            format!(
                "listeners.tcp.default = 127.0.0.1:{}\nloopback_users = none\n",
                self.port
            ),
        )
        .expect("rabbitmq.conf");
        // `/proc/self` belongs to this process's user.
        let root = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
            .unwrap_or(false);
        if root {
            let owned = Command::new("chown")
                .args(["-R", "rabbitmq:rabbitmq"])
                .arg(data)
                .status();
            assert!(matches!(owned, Ok(s) if s.success()), "chown {data:?}");
        }
        let mut c = Command::new("rabbitmq-server");
        c.env(
            "RABBITMQ_NODENAME",
            format!("sked-test-{}@localhost", self.port),
        )
        .env("RABBITMQ_CONFIG_FILE", &config)
        .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
        .env("RABBITMQ_MNESIA_BASE", data.join("mnesia"))
        .env("RABBITMQ_LOG_BASE", data.join("log"))
        .env("RABBITMQ_PID_FILE", data.join("pid"))
        .env("RABBITMQ_ENABLED_PLUGINS_FILE", data.join("plugins"));
        c
    }

    /// The broker's own process: the server, or RabbitMQ's node (named by its pid file, as
    /// the launcher's child).
    fn pid(&self) -> Option<Pid> {
        if self.kind == Kind::Rabbit {
            let pid = std::fs::read_to_string(self.dir.path().join("pid")).unwrap_or_default();
            return pid.trim().parse::<i32>().ok().map(Pid::from_raw);
        }
        self.child.as_ref().map(|c| Pid::from_raw(c.id() as i32))
    }

    /// Freezes the broker (SIGSTOP): connections stay open and what clients send waits in
    /// their sockets, unanswered, as with a broker stalled on its disk.
    pub fn freeze(&self) {
        if let Some(pid) = self.pid() {
            kill(pid, Signal::SIGSTOP).expect("SIGSTOP the broker");
        }
    }

    /// Lets a frozen broker go on (SIGCONT): it handles what waited.
    pub fn thaw(&self) {
        if let Some(pid) = self.pid() {
            kill(pid, Signal::SIGCONT).expect("SIGCONT the broker");
        }
    }

    /// Kills the broker with SIGKILL: no goodbye to its clients, nothing flushed on the way
    /// out.
    pub fn kill(&mut self) {
        if self.kind == Kind::Rabbit {
            if let Some(pid) = self.pid() {
                let _ = kill(pid, Signal::SIGKILL);
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(Instant::now() < deadline, "{:?} still listens", self.kind);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Declares the durable destination [`DESTINATION`] (an exchange with a queue bound by
    /// routing key `jobs`, a stream on subject `sked-outage.>`; Redis needs nothing).
    pub async fn declare(&self) {
        match self.kind {
            Kind::Rabbit => {
                use lapin::options::{
                    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
                };
                use lapin::types::FieldTable;
                let (_connection, channel) = rabbit_channel(&self.url()).await;
                channel
                    .exchange_declare(
                        DESTINATION.into(),
                        lapin::ExchangeKind::Direct,
                        ExchangeDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .expect("exchange");
                channel
                    .queue_declare(
                        DESTINATION.into(),
                        QueueDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .expect("queue");
                channel
                    .queue_bind(
                        DESTINATION.into(),
                        DESTINATION.into(),
                        "jobs".into(),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .expect("bind");
            }
            Kind::Nats => {
                let js = nats_context(&self.url()).await;
                js.create_stream(async_nats::jetstream::stream::Config {
                    name: DESTINATION.to_uppercase().replace('-', "_"),
                    subjects: vec![format!("{DESTINATION}.>")],
                    storage: async_nats::jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .expect("stream");
            }
            Kind::Redis => {}
        }
    }

    /// The broker's side of a target publishing to [`DESTINATION`].
    pub fn target(&self, connection: &str) -> Value {
        match self.kind {
            Kind::Rabbit => serde_json::json!({"amqp": {
                "connection": connection, "exchange": DESTINATION, "routing_key": "jobs",
                "persistent": true}}),
            Kind::Nats => serde_json::json!({"nats": {
                "connection": connection, "subject": format!("{DESTINATION}.jobs")}}),
            Kind::Redis => serde_json::json!({"redis_stream": {
                "connection": connection, "stream": DESTINATION}}),
        }
    }

    /// Every message at [`DESTINATION`], as its headers (Redis: fields).
    pub async fn messages(&self) -> Vec<BTreeMap<String, String>> {
        match self.kind {
            Kind::Rabbit => rabbit_messages(&self.url(), DESTINATION).await,
            Kind::Nats => {
                let js = nats_context(&self.url()).await;
                nats_messages(&js, &DESTINATION.to_uppercase().replace('-', "_")).await
            }
            Kind::Redis => redis_messages(&self.url(), DESTINATION).await,
        }
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        self.kill();
    }
}

pub async fn rabbit_channel(url: &str) -> (lapin::Connection, lapin::Channel) {
    let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .expect("RabbitMQ");
    let channel = connection.create_channel().await.expect("channel");
    (connection, channel)
}

pub async fn nats_context(url: &str) -> async_nats::jetstream::Context {
    let client = async_nats::connect(url).await.expect("NATS");
    async_nats::jetstream::new(client)
}

/// Takes every message off `queue`.
pub async fn rabbit_messages(url: &str, queue: &str) -> Vec<BTreeMap<String, String>> {
    use lapin::options::BasicGetOptions;
    use lapin::types::AMQPValue;
    let (_connection, channel) = rabbit_channel(url).await;
    let mut messages = Vec::new();
    let options = BasicGetOptions { no_ack: true };
    while let Some(message) = channel
        .basic_get(queue.into(), options)
        .await
        .expect("basic_get")
    {
        let mut headers = BTreeMap::new();
        if let Some(table) = message.delivery.properties.headers() {
            for (name, value) in table.inner() {
                if let AMQPValue::LongString(text) = value {
                    headers.insert(name.to_string(), text.to_string());
                }
            }
        }
        messages.push(headers);
    }
    messages
}

/// Every message of `stream`, read by a new pull consumer.
pub async fn nats_messages(
    js: &async_nats::jetstream::Context,
    stream: &str,
) -> Vec<BTreeMap<String, String>> {
    let stream = js.get_stream(stream).await.expect("stream");
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config::default())
        .await
        .expect("consumer");
    let mut messages = Vec::new();
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .expect("fetch");
        let before = messages.len();
        while let Some(Ok(message)) = batch.next().await {
            let mut headers = BTreeMap::new();
            if let Some(map) = &message.headers {
                for (name, values) in map.iter() {
                    if let Some(value) = values.first() {
                        headers.insert(name.to_string(), value.to_string());
                    }
                }
            }
            messages.push(headers);
        }
        if messages.len() == before {
            return messages;
        }
    }
}

/// Every entry of stream `key`, as its fields.
pub async fn redis_messages(url: &str, key: &str) -> Vec<BTreeMap<String, String>> {
    let client = redis::Client::open(url).expect("Redis URL");
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .expect("Redis");
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await
        .expect("XRANGE");
    entries
        .into_iter()
        .map(|(_, fields)| fields.into_iter().collect())
        .collect()
}

/// The ledger check of a broker target: every message names a run of `runs` and the attempt
/// that sent it, no attempt sent two messages, and the broker holds a message of every
/// succeeded run (nothing is recorded as delivered that its broker did not confirm). The
/// message may be an earlier attempt's: JetStream acks a repeat of a message it holds as a
/// duplicate and keeps the first.
/// Returns how many messages each run has, by run id.
pub fn check_messages(
    runs: &[Value],
    messages: &[BTreeMap<String, String>],
) -> BTreeMap<i64, usize> {
    let by_id: BTreeMap<i64, &Value> = runs
        .iter()
        .filter_map(|r| Some((r["id"].as_i64()?, r)))
        .collect();
    let mut sent = HashSet::new();
    let mut per_run: BTreeMap<i64, usize> = BTreeMap::new();
    for headers in messages {
        let field = |name: &str| {
            headers
                .get(name)
                .cloned()
                .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
        };
        let run_id: i64 = field("sked-run-id").parse().expect("a run id");
        let attempt: u32 = field("sked-attempt").parse().expect("an attempt");
        let run = by_id
            .get(&run_id)
            .unwrap_or_else(|| panic!("a message for run {run_id}, which is not this job's"));
        let key = field("sked-idempotency-key");
        assert!(
            key.ends_with(&field("sked-scheduled-for")) && key.starts_with("default/"),
            "{headers:?} for {run}"
        );
        assert!(
            sent.insert((run_id, attempt)),
            "attempt {attempt} of run {run_id} sent two messages"
        );
        *per_run.entry(run_id).or_default() += 1;
    }
    for run in runs.iter().filter(|r| r["state"] == "succeeded") {
        let id = run["id"].as_i64().unwrap_or_default();
        assert!(
            per_run.contains_key(&id),
            "run {id} is recorded as published, and the broker holds no message of it: {run}"
        );
    }
    per_run
}
