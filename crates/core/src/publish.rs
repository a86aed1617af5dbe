//! Broker targets: a run that publishes a message (RabbitMQ, NATS JetStream, Redis Streams)
//! instead of running a command. Owns the target definitions and their validation, the one
//! template rule of payloads and names, and the envelope every message carries. Connecting
//! and publishing are the server's; this module does no IO.
//!
//! A job names a connection the operator configured (`--broker NAME=URL`), never a URL: a
//! definition carries no broker credentials, and the operator decides which namespaces may use
//! which connection under which prefix ([`BrokerAllowance`]).

use crate::error::SpecError;
use crate::event::RunEvent;
use crate::protocol::CompletionAddress;
use crate::Instant;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most headers (or Redis fields) a job adds to the envelope.
pub const MAX_HEADERS: usize = 64;
/// Longest header name or value, and longest exchange, routing key, subject or stream key.
pub const MAX_NAME_LEN: usize = 255;
pub const MAX_HEADER_VALUE_LEN: usize = 4096;
/// Largest payload, rendered.
pub const MAX_PAYLOAD_LEN: usize = 256 * 1024;

/// The envelope's header names, which consumers rely on.
pub const HEADER_NAMESPACE: &str = "sked-namespace";
pub const HEADER_JOB: &str = "sked-job";
pub const HEADER_RUN_ID: &str = "sked-run-id";
pub const HEADER_ATTEMPT: &str = "sked-attempt";
pub const HEADER_SCHEDULED_FOR: &str = "sked-scheduled-for";
pub const HEADER_IDEMPOTENCY_KEY: &str = "sked-idempotency-key";
/// For a run of a sharded job (`crate::shard`): its shard, 0 to N-1, and N.
pub const HEADER_SHARD: &str = "sked-shard";
pub const HEADER_SHARDS: &str = "sked-shards";
/// For a run an event started (`schedule: {event}`): the event's key and id.
pub const HEADER_EVENT_KEY: &str = "sked-event-key";
pub const HEADER_EVENT_ID: &str = "sked-event-id";
/// JetStream drops a second message with the same id within its duplicate window.
pub const HEADER_NATS_MSG_ID: &str = "Nats-Msg-Id";
/// Where and with what a consumer reports the outcome of a run that awaits completion.
pub const HEADER_COMPLETE_URL: &str = "sked-complete-url";
pub const HEADER_COMPLETE_TOKEN: &str = "sked-complete-token";

/// RabbitMQ (AMQP 0-9-1): published with the mandatory flag, under publisher confirms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpTarget {
    pub connection: String,
    /// The exchange; empty is the default exchange (routing key = queue name).
    #[serde(default)]
    pub exchange: String,
    #[serde(default)]
    pub routing_key: String,
    #[serde(default)]
    pub payload: Payload,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Delivery mode 2: the broker writes it to disk. Default true.
    #[serde(default = "yes")]
    pub persistent: bool,
    /// The run stays `running` after the confirm until a consumer reports its outcome.
    #[serde(default, skip_serializing_if = "is_false")]
    pub await_completion: bool,
}

/// NATS JetStream: the attempt succeeds on the stream's ack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsTarget {
    pub connection: String,
    pub subject: String,
    #[serde(default)]
    pub payload: Payload,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// The run stays `running` after the ack until a consumer reports its outcome.
    #[serde(default, skip_serializing_if = "is_false")]
    pub await_completion: bool,
}

/// Redis Streams: `XADD stream [MAXLEN ~ n] * field value ...`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisStreamTarget {
    pub connection: String,
    pub stream: String,
    /// Fields added to the envelope's; `payload` is one more field when given.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Payload>,
    /// Trims the stream to about this many entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maxlen: Option<u64>,
    /// The run stays `running` after the `XADD` until a consumer reports its outcome.
    #[serde(default, skip_serializing_if = "is_false")]
    pub await_completion: bool,
}

fn yes() -> bool {
    true
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A message body: a JSON value, sent as JSON, or a string, sent as it is. `{{scheduled_for}}`,
/// `{{run_id}}` and `{{job}}` in it are replaced ([`render`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Payload(pub serde_json::Value);

impl Payload {
    /// The body's text before the template rule.
    fn text(&self) -> String {
        match &self.0 {
            serde_json::Value::Null => String::new(),
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        }
    }
}

/// The run a message is published for: what templates and the envelope are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunContext<'a> {
    pub namespace: &'a str,
    pub job: &'a str,
    pub run_id: i64,
    pub attempt: u32,
    pub scheduled_for: Instant,
    /// For a run that awaits completion: where its consumer reports, and the attempt's token.
    pub completion: Option<&'a CompletionAddress>,
    /// For a run an event started: the event, whose payload is the message when the target
    /// gives none.
    pub event: Option<&'a RunEvent>,
    /// For a run of a sharded job: its place among the instant's shards.
    pub shard: Option<crate::shard::Shard>,
    /// The attempt's W3C `traceparent`, when the server exports traces.
    pub traceparent: Option<&'a str>,
}

impl RunContext<'_> {
    /// RFC 3339 with microseconds, in UTC: the ledger's instant.
    pub fn scheduled_for_text(&self) -> String {
        self.scheduled_for
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    }

    /// The same for every attempt of one run, and different for each shard of an instant: a
    /// consumer drops a second message with it.
    pub fn idempotency_key(&self) -> String {
        let key = format!(
            "{}/{}/{}",
            self.namespace,
            self.job,
            self.scheduled_for_text()
        );
        match self.shard {
            Some(shard) => format!("{key}/shard-{}", shard.index),
            None => key,
        }
    }

    /// The envelope's headers (Redis: fields), in a fixed order; then the shard, for a run of
    /// a sharded job; then the event's key and id,
    /// for a run an event started; the W3C `traceparent` when traces are exported; the completion address last, for a run that awaits
    /// completion.
    pub fn envelope(&self) -> Vec<(&'static str, String)> {
        let mut envelope = vec![
            (HEADER_NAMESPACE, self.namespace.to_string()),
            (HEADER_JOB, self.job.to_string()),
            (HEADER_RUN_ID, self.run_id.to_string()),
            (HEADER_ATTEMPT, self.attempt.to_string()),
            (HEADER_SCHEDULED_FOR, self.scheduled_for_text()),
            (HEADER_IDEMPOTENCY_KEY, self.idempotency_key()),
        ];
        if let Some(shard) = self.shard {
            envelope.push((HEADER_SHARD, shard.index.to_string()));
            envelope.push((HEADER_SHARDS, shard.count.to_string()));
        }
        if let Some(event) = self.event {
            envelope.push((HEADER_EVENT_KEY, event.key.clone()));
            envelope.push((HEADER_EVENT_ID, event.id.clone()));
        }
        if let Some(traceparent) = self.traceparent {
            envelope.push((crate::protocol::HEADER_TRACEPARENT, traceparent.to_string()));
        }
        if let Some(completion) = &self.completion {
            envelope.push((HEADER_COMPLETE_URL, completion.url.to_string()));
            envelope.push((HEADER_COMPLETE_TOKEN, completion.token.to_string()));
        }
        envelope
    }
}

/// The one template rule: `{{scheduled_for}}`, `{{run_id}}` and `{{job}}` are replaced by the
/// run's instant (RFC 3339), id and job name; nothing else is special.
pub fn render(template: &str, run: &RunContext<'_>) -> String {
    if !template.contains("{{") {
        return template.to_string();
    }
    template
        .replace("{{scheduled_for}}", &run.scheduled_for_text())
        .replace("{{run_id}}", &run.run_id.to_string())
        .replace("{{job}}", run.job)
}

/// The rendered body of a payload. A target without one sends the payload of the event that
/// started the run, as it came (events are data, not templates).
pub fn render_payload(payload: &Payload, run: &RunContext<'_>) -> Vec<u8> {
    match run.event {
        Some(event) if payload.0.is_null() => event.payload_text().into_bytes(),
        _ => render(&payload.text(), run).into_bytes(),
    }
}

/// Where a target publishes, as an allowance judges it: the connection, and the exchange,
/// subject or stream key that must begin with the namespace's prefix.
pub struct Destination<'a> {
    pub connection: &'a str,
    pub field: &'static str,
    pub name: &'a str,
    /// Whether the run waits for its consumer's report after the broker confirmed.
    pub await_completion: bool,
}

/// A connection name: like a job's name, and never a URL.
pub(crate) fn check_connection(field: &str, connection: &str) -> Result<(), SpecError> {
    if connection.contains("://") {
        return Err(SpecError::new(
            field,
            "name a connection the server was given with --broker NAME=URL, not a URL: a job \
             definition carries no broker credentials",
        ));
    }
    crate::job::validate_name(field, connection)
}

pub(crate) fn check_text(
    field: &str,
    text: &str,
    max: usize,
    may_be_empty: bool,
) -> Result<(), SpecError> {
    if text.is_empty() && !may_be_empty {
        return Err(SpecError::new(field, "must not be empty"));
    }
    if text.len() > max {
        return Err(SpecError::new(field, format!("is longer than {max} bytes")));
    }
    if text.chars().any(char::is_control) {
        return Err(SpecError::new(field, "must not contain control characters"));
    }
    Ok(())
}

pub(crate) fn check_pairs(field: &str, pairs: &BTreeMap<String, String>) -> Result<(), SpecError> {
    if pairs.len() > MAX_HEADERS {
        return Err(SpecError::new(
            field,
            format!("has {} entries; at most {MAX_HEADERS}", pairs.len()),
        ));
    }
    for (name, value) in pairs {
        check_text(field, name, MAX_NAME_LEN, false)?;
        if name.to_ascii_lowercase().starts_with("sked-") {
            return Err(SpecError::new(
                format!("{field}.{name}"),
                "names beginning with sked- are the envelope's",
            ));
        }
        check_text(
            &format!("{field}.{name}"),
            value,
            MAX_HEADER_VALUE_LEN,
            true,
        )?;
    }
    Ok(())
}

fn check_payload(field: &str, payload: &Payload) -> Result<(), SpecError> {
    if payload.text().len() > MAX_PAYLOAD_LEN {
        return Err(SpecError::new(
            field,
            format!("is longer than {MAX_PAYLOAD_LEN} bytes"),
        ));
    }
    Ok(())
}

/// A NATS subject: dot-separated tokens, none empty, no whitespace; wildcards are for
/// subscribers, not publishers.
fn check_subject(field: &str, subject: &str) -> Result<(), SpecError> {
    check_text(field, subject, MAX_NAME_LEN, false)?;
    let bad = subject.split('.').any(|token| {
        token.is_empty() || token.contains(char::is_whitespace) || token == "*" || token == ">"
    });
    if bad {
        return Err(SpecError::new(
            field,
            format!("{subject:?} is not a subject to publish to (dot-separated tokens, no spaces or wildcards)"),
        ));
    }
    Ok(())
}

impl AmqpTarget {
    pub fn validate(&self) -> Result<(), SpecError> {
        check_connection("target.amqp.connection", &self.connection)?;
        check_text("target.amqp.exchange", &self.exchange, MAX_NAME_LEN, true)?;
        check_text(
            "target.amqp.routing_key",
            &self.routing_key,
            MAX_NAME_LEN,
            true,
        )?;
        check_pairs("target.amqp.headers", &self.headers)?;
        check_payload("target.amqp.payload", &self.payload)
    }
}

impl NatsTarget {
    pub fn validate(&self) -> Result<(), SpecError> {
        check_connection("target.nats.connection", &self.connection)?;
        check_subject("target.nats.subject", &self.subject)?;
        check_pairs("target.nats.headers", &self.headers)?;
        check_payload("target.nats.payload", &self.payload)
    }
}

impl RedisStreamTarget {
    pub fn validate(&self) -> Result<(), SpecError> {
        check_connection("target.redis_stream.connection", &self.connection)?;
        check_text(
            "target.redis_stream.stream",
            &self.stream,
            MAX_NAME_LEN,
            false,
        )?;
        check_pairs("target.redis_stream.fields", &self.fields)?;
        if let Some(payload) = &self.payload {
            check_payload("target.redis_stream.payload", payload)?;
        }
        if self.maxlen == Some(0) {
            return Err(SpecError::new(
                "target.redis_stream.maxlen",
                "must be at least 1 (leave it out to keep every entry)",
            ));
        }
        Ok(())
    }
}

/// The kind of broker a connection reaches, from its URL's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrokerKind {
    Amqp,
    Nats,
    Redis,
}

impl BrokerKind {
    /// The target that publishes through this kind of connection.
    pub fn target_name(self) -> &'static str {
        match self {
            BrokerKind::Amqp => "amqp",
            BrokerKind::Nats => "nats",
            BrokerKind::Redis => "redis_stream",
        }
    }
}

/// `--broker NAME=URL`: a connection jobs name. The URL may hold credentials: it is never
/// shown (`Debug` and [`BrokerConnection::display`] give the name, kind and host only).
#[derive(Clone, PartialEq, Eq)]
pub struct BrokerConnection {
    pub name: String,
    pub kind: BrokerKind,
    pub url: String,
}

impl BrokerConnection {
    /// `name (kind at host:port)`, for logs.
    pub fn display(&self) -> String {
        let host = url::Url::parse(&self.url)
            .ok()
            .map(|u| {
                let host = u.host_str().unwrap_or("").to_string();
                match u.port() {
                    Some(port) => format!("{host}:{port}"),
                    None => host,
                }
            })
            .unwrap_or_default();
        format!("{} ({} at {host})", self.name, self.kind.target_name())
    }
}

impl std::fmt::Debug for BrokerConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display())
    }
}

impl std::str::FromStr for BrokerConnection {
    type Err = String;

    /// `NAME=amqp://...` (or `amqps://`), `NAME=nats://...` (or `tls://`), `NAME=redis://...`
    /// (or `rediss://`). Errors never repeat the URL, which may hold a password.
    fn from_str(text: &str) -> Result<Self, String> {
        let (name, url) = text
            .split_once('=')
            .ok_or_else(|| "a broker connection is NAME=URL".to_string())?;
        crate::job::validate_name("connection", name).map_err(|e| e.message)?;
        let parsed = url::Url::parse(url)
            .map_err(|e| format!("the URL of broker connection {name:?} does not parse: {e}"))?;
        let kind = match parsed.scheme() {
            "amqp" | "amqps" => BrokerKind::Amqp,
            "nats" | "tls" => BrokerKind::Nats,
            "redis" | "rediss" => BrokerKind::Redis,
            other => {
                return Err(format!(
                    "broker connection {name:?}: {other}:// is not amqp://, amqps://, nats://, \
                     tls://, redis:// or rediss://"
                ))
            }
        };
        Ok(BrokerConnection {
            name: name.to_string(),
            kind,
            url: url.to_string(),
        })
    }
}

/// Whether a broker target may be defined on this server: its connection exists and is of
/// its kind, and its namespace's allowances let it publish there. A job routed to labelled
/// workers (`routed_to_workers`) is published by them, through their own connections
/// (`sked worker --broker`): a name this server does not know is theirs, and their worker
/// checks its kind when it publishes.
pub fn check_destination(
    target: &crate::target::TargetSpec,
    namespace: &str,
    routed_to_workers: bool,
    connections: &[BrokerConnection],
    allowances: &[BrokerAllowance],
) -> Result<(), SpecError> {
    let Some(destination) = target.destination() else {
        return Ok(());
    };
    let (kinds, target_name) = target.broker_kinds();
    let field = format!("target.{target_name}.connection");
    match connections
        .iter()
        .find(|c| c.name == destination.connection)
    {
        None if routed_to_workers => {}
        None => {
            let known: Vec<&str> = connections.iter().map(|c| c.name.as_str()).collect();
            let known = if known.is_empty() {
                "it has none (sked server --broker NAME=URL)".to_string()
            } else {
                format!("it has {}", known.join(", "))
            };
            return Err(SpecError::new(
                field,
                format!(
                    "this server has no broker connection named {:?}; {known}; a job routed \
                     to labelled workers (routing.labels) may name theirs (sked worker --broker)",
                    destination.connection
                ),
            ));
        }
        Some(connection) if !kinds.contains(&connection.kind) => {
            return Err(SpecError::new(
                field,
                format!(
                    "connection {:?} is a {} connection, not for a {target_name} target",
                    connection.name,
                    connection.kind.target_name(),
                ),
            ));
        }
        Some(_) => {}
    }
    if let crate::target::TargetSpec::Celery(celery) = target {
        check_result_backend(celery, routed_to_workers, connections)?;
    }
    allowed(allowances, namespace, &destination)
}

/// A Celery target's result backend is a Redis connection of the server that follows it, or
/// of the labelled workers that publish it.
fn check_result_backend(
    celery: &crate::celery::CeleryTarget,
    routed_to_workers: bool,
    connections: &[BrokerConnection],
) -> Result<(), SpecError> {
    let Some(backend) = &celery.result_backend else {
        return Ok(());
    };
    match connections.iter().find(|c| &c.name == backend) {
        None if routed_to_workers => Ok(()),
        None => Err(SpecError::new(
            "target.celery.result_backend",
            format!("this server has no broker connection named {backend:?} (--broker NAME=redis://...)"),
        )),
        Some(c) if c.kind != BrokerKind::Redis => Err(SpecError::new(
            "target.celery.result_backend",
            format!(
                "connection {backend:?} is a {} connection; sked reads Celery results from Redis",
                c.kind.target_name()
            ),
        )),
        Some(_) => Ok(()),
    }
}

/// `--broker-allow NS=CONN:PREFIX`: namespace NS may publish through connection CONN to
/// exchanges, subjects and stream keys beginning with PREFIX.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerAllowance {
    pub namespace: String,
    pub connection: String,
    pub prefix: String,
}

impl std::str::FromStr for BrokerAllowance {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not NAMESPACE=CONNECTION:PREFIX");
        let (namespace, rest) = text.split_once('=').ok_or_else(bad)?;
        let (connection, prefix) = rest.split_once(':').ok_or_else(bad)?;
        crate::job::validate_name("namespace", namespace).map_err(|e| e.message)?;
        crate::job::validate_name("connection", connection).map_err(|e| e.message)?;
        Ok(BrokerAllowance {
            namespace: namespace.to_string(),
            connection: connection.to_string(),
            prefix: prefix.to_string(),
        })
    }
}

/// Whether `namespace` may publish to `destination` under `allowances`. A connection no
/// allowance names is open to every namespace without a prefix (one tenant); once one names
/// it, only the namespaces named may use it, each under its prefix.
pub fn allowed(
    allowances: &[BrokerAllowance],
    namespace: &str,
    destination: &Destination<'_>,
) -> Result<(), SpecError> {
    let mut for_connection = allowances
        .iter()
        .filter(|a| a.connection == destination.connection)
        .peekable();
    if for_connection.peek().is_none() {
        return Ok(());
    }
    let mut prefixes = Vec::new();
    for allowance in for_connection.filter(|a| a.namespace == namespace) {
        if destination.name.starts_with(&allowance.prefix) {
            return Ok(());
        }
        prefixes.push(allowance.prefix.as_str());
    }
    let message = if prefixes.is_empty() {
        format!(
            "namespace {namespace:?} may not publish through connection {:?}",
            destination.connection
        )
    } else {
        format!(
            "namespace {namespace:?} may publish through connection {:?} only to names \
             beginning with {}",
            destination.connection,
            prefixes
                .iter()
                .map(|p| format!("{p:?}"))
                .collect::<Vec<_>>()
                .join(" or ")
        )
    };
    Err(SpecError::new(destination.field, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn run() -> RunContext<'static> {
        RunContext {
            namespace: "billing",
            job: "invoice",
            run_id: 42,
            attempt: 2,
            scheduled_for: chrono::Utc
                .with_ymd_and_hms(2026, 11, 25, 9, 30, 0)
                .single()
                .unwrap_or_default(),
            completion: None,
            event: None,
            shard: None,
            traceparent: None,
        }
    }

    #[test]
    fn an_event_run_sends_its_event_when_the_target_says_nothing() {
        let event = RunEvent {
            key: "sales.ready".into(),
            id: "2026-11-24".into(),
            payload: serde_json::json!({"rows": "{{job}}"}),
        };
        let started = RunContext {
            event: Some(&event),
            ..run()
        };
        assert_eq!(
            render_payload(&Payload::default(), &started),
            br#"{"rows":"{{job}}"}"#,
            "as it came, no template"
        );
        let own = Payload(serde_json::json!("mine {{job}}"));
        assert_eq!(render_payload(&own, &started), b"mine invoice");
        assert_eq!(
            &started.envelope()[6..],
            [
                (HEADER_EVENT_KEY, "sales.ready".to_string()),
                (HEADER_EVENT_ID, "2026-11-24".to_string()),
            ]
        );
    }

    #[test]
    fn templates_replace_the_three_names_and_nothing_else() {
        let text = render("{{job}}.{{run_id}}@{{scheduled_for}} {{other}}", &run());
        assert_eq!(text, "invoice.42@2026-11-25T09:30:00.000000Z {{other}}");
        let json = Payload(serde_json::json!({"run": "{{run_id}}", "n": 1}));
        assert_eq!(render_payload(&json, &run()), br#"{"n":1,"run":"42"}"#);
        let text = Payload(serde_json::json!("plain {{job}}"));
        assert_eq!(render_payload(&text, &run()), b"plain invoice");
        assert_eq!(render_payload(&Payload::default(), &run()), b"");
    }

    #[test]
    fn the_envelope_names_the_run_and_its_key_is_the_same_for_every_attempt() {
        let first = run();
        let second = RunContext {
            attempt: 3,
            ..run()
        };
        assert_eq!(
            first.idempotency_key(),
            "billing/invoice/2026-11-25T09:30:00.000000Z"
        );
        assert_eq!(first.idempotency_key(), second.idempotency_key());
        let names: Vec<&str> = first.envelope().iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "sked-namespace",
                "sked-job",
                "sked-run-id",
                "sked-attempt",
                "sked-scheduled-for",
                "sked-idempotency-key"
            ]
        );
        let address = CompletionAddress {
            url: "https://sked.example/api/v1/runs/42/complete".into(),
            token: "t0k3n".into(),
        };
        let awaiting = RunContext {
            completion: Some(&address),
            ..run()
        };
        assert_eq!(
            &awaiting.envelope()[6..],
            [
                (HEADER_COMPLETE_URL, address.url.clone()),
                (HEADER_COMPLETE_TOKEN, "t0k3n".to_string()),
            ]
        );
        assert!(!format!("{address:?}").contains("t0k3n"));
    }

    #[test]
    fn each_shard_of_an_instant_has_its_own_key_and_says_which_it_is() {
        let shard = |index| RunContext {
            shard: Some(crate::shard::Shard { index, count: 3 }),
            traceparent: None,
            ..run()
        };
        assert_eq!(
            shard(2).idempotency_key(),
            "billing/invoice/2026-11-25T09:30:00.000000Z/shard-2"
        );
        assert_ne!(shard(0).idempotency_key(), shard(1).idempotency_key());
        assert_ne!(shard(0).idempotency_key(), run().idempotency_key());
        assert_eq!(
            &shard(1).envelope()[6..],
            [
                (HEADER_SHARD, "1".to_string()),
                (HEADER_SHARDS, "3".to_string()),
            ]
        );
    }

    #[test]
    fn a_job_names_a_connection_never_a_url_and_stays_out_of_the_envelope() {
        let mut target = AmqpTarget {
            connection: "amqp://guest:guest@rabbit:5672/".into(),
            exchange: "jobs".into(),
            routing_key: "x".into(),
            payload: Payload::default(),
            headers: BTreeMap::new(),
            persistent: true,
            await_completion: false,
        };
        assert_eq!(
            target.validate().unwrap_err().field,
            "target.amqp.connection"
        );
        target.connection = "main".into();
        assert_eq!(target.validate(), Ok(()));
        target.headers.insert("Sked-Run-Id".into(), "forged".into());
        assert!(target.validate().is_err());
        let nats = NatsTarget {
            connection: "main".into(),
            subject: "jobs.*".into(),
            payload: Payload::default(),
            headers: BTreeMap::new(),
            await_completion: false,
        };
        assert_eq!(nats.validate().unwrap_err().field, "target.nats.subject");
    }

    #[test]
    fn connections_are_parsed_by_scheme_and_never_show_their_credentials() {
        let c: BrokerConnection = "main=amqp://user:hunter2@rabbit:5672/%2f".parse().unwrap();
        assert_eq!((c.name.as_str(), c.kind), ("main", BrokerKind::Amqp));
        assert_eq!(format!("{c:?}"), "main (amqp at rabbit:5672)");
        assert!(!c.display().contains("hunter2"));
        let err = "x=http://user:hunter2@h/"
            .parse::<BrokerConnection>()
            .unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
        assert!("nourl".parse::<BrokerConnection>().is_err());
        let nats: BrokerConnection = "events=nats://127.0.0.1:4222".parse().unwrap();
        let target: crate::TargetSpec = serde_json::from_value(serde_json::json!(
            {"amqp": {"connection": "events", "exchange": "x"}}
        ))
        .unwrap();
        let nats = std::slice::from_ref(&nats);
        // A connection of another kind is refused, even for a job routed to workers.
        for routed in [false, true] {
            let err = check_destination(&target, "default", routed, nats, &[]).unwrap_err();
            assert_eq!(err.field, "target.amqp.connection");
        }
        let err = check_destination(&target, "default", false, &[], &[]).unwrap_err();
        assert!(err.message.contains("has none"), "{err}");
        // A name the server does not know is a labelled worker's, under the same allowances.
        assert_eq!(
            check_destination(&target, "default", true, &[], &[]),
            Ok(())
        );
        let only_ops: Vec<BrokerAllowance> = vec!["ops=events:ops.".parse().unwrap()];
        let err = check_destination(&target, "default", true, &[], &only_ops).unwrap_err();
        assert!(err.message.contains("may not publish through"), "{err}");
        let target: crate::TargetSpec = serde_json::from_value(serde_json::json!(
            {"nats": {"connection": "events", "subject": "jobs.a"}}
        ))
        .unwrap();
        assert_eq!(
            check_destination(&target, "default", false, nats, &[]),
            Ok(())
        );
    }

    #[test]
    fn allowances_bind_a_connection_to_namespaces_and_prefixes() {
        let allowances: Vec<BrokerAllowance> = ["billing=main:billing.", "ops=main:ops."]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let to = |connection, name| Destination {
            connection,
            field: "target.amqp.exchange",
            name,
            await_completion: false,
        };
        assert_eq!(
            allowed(&allowances, "billing", &to("main", "billing.jobs")),
            Ok(())
        );
        assert!(allowed(&allowances, "billing", &to("main", "ops.jobs")).is_err());
        assert!(allowed(&allowances, "other", &to("main", "billing.jobs")).is_err());
        // A connection nobody named is open to every namespace.
        assert_eq!(
            allowed(&allowances, "other", &to("spare", "anything")),
            Ok(())
        );
        assert!("billing".parse::<BrokerAllowance>().is_err());
        assert!("billing=main".parse::<BrokerAllowance>().is_err());
    }
}
