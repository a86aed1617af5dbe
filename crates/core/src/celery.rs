//! The Celery target: a run that sends a task message an unmodified `celery worker` executes,
//! in Celery's message protocol version 2, through an AMQP connection (RabbitMQ) or a Redis
//! connection (kombu's Redis transport). Owns the target's definition and validation, the
//! message (headers, properties, body) built from a run, the task id, the revoke command, and
//! what a result backend's task state means for the run. Pure: connecting, publishing and
//! reading the backend are `sked_broker`'s and the executors'.
//!
//! The task id is derived from the run's idempotency key and its attempt, so a message sent
//! again for the same attempt (a node that took over a publish) carries the same id, and a
//! retry by sked's policy is a new task a result backend tells apart.

use crate::error::SpecError;
use crate::publish::{self, RunContext};
use crate::HumanDuration;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The queue Celery's workers consume when none is configured.
pub const DEFAULT_QUEUE: &str = "celery";
/// Longest task name.
pub const MAX_TASK_LEN: usize = 255;
/// The exchange Celery's remote control commands (revoke) are broadcast on.
pub const PIDBOX_EXCHANGE: &str = "celery.pidbox";
/// Where a Redis result backend keeps a task's state: this prefix and the task id.
pub const RESULT_KEY_PREFIX: &str = "celery-task-meta-";
/// kombu's Redis transport keeps a priority's messages in a list named by the queue, this
/// separator and the priority step; priority 0 uses the plain queue.
pub const REDIS_PRIORITY_SEPARATOR: &str = "\x06\x16";
/// kombu's default priority steps for Redis.
pub const REDIS_PRIORITY_STEPS: [u8; 4] = [0, 3, 6, 9];

/// `target: {celery: {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CeleryTarget {
    /// A broker connection (`--broker NAME=URL`) of kind AMQP or Redis.
    pub connection: String,
    /// The task's registered name, `proj.tasks.add`.
    pub task: String,
    /// Positional arguments. Strings in them follow the template rule (`{{scheduled_for}}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<Value>,
    /// Keyword arguments, templated like `args`.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub kwargs: Map<String, Value>,
    /// The queue its workers consume ([`DEFAULT_QUEUE`] when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// AMQP only: the exchange; the default exchange (routing key = queue) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchange: Option<String>,
    /// The routing key; the queue when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_key: Option<String>,
    /// 0-255 on RabbitMQ (for a queue declared with `x-max-priority`); on Redis, kombu's
    /// steps 0, 3, 6, 9, where lower is served first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// A worker discards the task once this much after the run's instant has passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<HumanDuration>,
    /// Headers added to the task message's (not `sked-` names; Celery's own are set here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Follow the task's state in `result_backend` after the broker confirmed, and end the run
    /// with it (up to the job's timeout); without it the run succeeds on the confirm.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub await_result: bool,
    /// The Redis connection (`--broker NAME=redis://...`) of the app's result backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_backend: Option<String>,
}

/// Celery's own header names, which `headers` may not set.
const PROTOCOL_HEADERS: &[&str] = &[
    "lang",
    "task",
    "id",
    "shadow",
    "eta",
    "expires",
    "group",
    "group_index",
    "retries",
    "timelimit",
    "root_id",
    "parent_id",
    "argsrepr",
    "kwargsrepr",
    "origin",
    "ignore_result",
];

impl CeleryTarget {
    pub fn queue(&self) -> &str {
        self.queue.as_deref().unwrap_or(DEFAULT_QUEUE)
    }

    pub fn routing_key(&self) -> &str {
        self.routing_key.as_deref().unwrap_or_else(|| self.queue())
    }

    pub fn exchange(&self) -> &str {
        self.exchange.as_deref().unwrap_or("")
    }

    pub fn validate(&self) -> Result<(), SpecError> {
        publish::check_connection("target.celery.connection", &self.connection)?;
        publish::check_text("target.celery.task", &self.task, MAX_TASK_LEN, false)?;
        if self.task.contains(char::is_whitespace) {
            return Err(SpecError::new(
                "target.celery.task",
                "a task name has no spaces (proj.tasks.add)",
            ));
        }
        for (field, text) in [
            ("target.celery.queue", self.queue.as_deref()),
            ("target.celery.routing_key", self.routing_key.as_deref()),
        ] {
            if let Some(text) = text {
                publish::check_text(field, text, publish::MAX_NAME_LEN, false)?;
            }
        }
        if let Some(exchange) = &self.exchange {
            publish::check_text(
                "target.celery.exchange",
                exchange,
                publish::MAX_NAME_LEN,
                true,
            )?;
        }
        publish::check_pairs("target.celery.headers", &self.headers)?;
        if let Some(name) = self
            .headers
            .keys()
            .find(|name| PROTOCOL_HEADERS.contains(&name.as_str()))
        {
            return Err(SpecError::new(
                format!("target.celery.headers.{name}"),
                "is a header of Celery's protocol, which sked sets",
            ));
        }
        let body = serde_json::to_string(&(&self.args, &self.kwargs)).unwrap_or_default();
        if body.len() > publish::MAX_PAYLOAD_LEN {
            return Err(SpecError::new(
                "target.celery.args",
                format!(
                    "args and kwargs are {} bytes as JSON; at most {}",
                    body.len(),
                    publish::MAX_PAYLOAD_LEN
                ),
            ));
        }
        if let Some(expires) = self.expires {
            if expires.0.is_zero() || expires.0 > crate::job::MAX_TIMEOUT {
                return Err(SpecError::new(
                    "target.celery.expires",
                    "must be between 1ms and 7 days",
                ));
            }
        }
        match (&self.result_backend, self.await_result) {
            (None, true) => {
                return Err(SpecError::new(
                    "target.celery.result_backend",
                    "await_result needs the Redis connection of the app's result backend",
                ))
            }
            (Some(backend), _) => {
                publish::check_connection("target.celery.result_backend", backend)?
            }
            (None, false) => {}
        }
        Ok(())
    }

    /// The task message of `run`.
    pub fn message(&self, run: &RunContext<'_>) -> TaskMessage {
        let id = task_id(run);
        let args: Vec<Value> = self.args.iter().map(|v| render_value(v, run)).collect();
        let kwargs: Map<String, Value> = self
            .kwargs
            .iter()
            .map(|(k, v)| (k.clone(), render_value(v, run)))
            .collect();
        let expires = self.expires.and_then(|expires| {
            chrono::Duration::from_std(expires.0)
                .ok()
                .map(|d| run.scheduled_for + d)
                .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
        });
        let mut headers = Map::new();
        for (name, value) in run.envelope() {
            headers.insert(name.to_string(), Value::String(value));
        }
        for (name, value) in &self.headers {
            headers.insert(name.clone(), Value::String(value.clone()));
        }
        let protocol = json!({
            "lang": "py",
            "task": self.task,
            "id": id,
            "shadow": null,
            "eta": null,
            "expires": expires,
            "group": null,
            "group_index": null,
            "retries": run.attempt.saturating_sub(1),
            "timelimit": [null, null],
            "root_id": id,
            "parent_id": null,
            "argsrepr": python_repr(&Value::Array(args.clone())),
            "kwargsrepr": python_repr(&Value::Object(kwargs.clone())),
            "origin": format!("sked:{}/{}", run.namespace, run.job),
            "ignore_result": false,
        });
        if let Value::Object(protocol) = protocol {
            headers.extend(protocol);
        }
        let embed = json!({"callbacks": null, "errbacks": null, "chain": null, "chord": null});
        let body = Value::Array(vec![Value::Array(args), Value::Object(kwargs), embed]);
        TaskMessage {
            id,
            headers,
            body: body.to_string().into_bytes(),
            priority: self.priority,
        }
    }
}

/// One task message, ready for a transport.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskMessage {
    /// The task id: also the message's `correlation_id`.
    pub id: String,
    /// Protocol 2's headers and sked's envelope.
    pub headers: Map<String, Value>,
    /// `[args, kwargs, embed]` as JSON.
    pub body: Vec<u8>,
    pub priority: Option<u8>,
}

pub const CONTENT_TYPE: &str = "application/json";
pub const CONTENT_ENCODING: &str = "utf-8";

impl TaskMessage {
    /// The message as kombu's Redis transport stores it in a queue's list: the body in base64
    /// and the properties beside it.
    pub fn kombu_redis_envelope(&self, exchange: &str, routing_key: &str) -> String {
        json!({
            "body": base64::engine::general_purpose::STANDARD.encode(&self.body),
            "content-encoding": CONTENT_ENCODING,
            "content-type": CONTENT_TYPE,
            "headers": self.headers,
            "properties": {
                "correlation_id": self.id,
                "reply_to": null,
                "delivery_mode": 2,
                "delivery_info": {"exchange": exchange, "routing_key": routing_key},
                "priority": self.priority.unwrap_or(0),
                "body_encoding": "base64",
                "delivery_tag": self.id,
            }
        })
        .to_string()
    }
}

/// The Redis list kombu serves `priority` of `queue` from: the plain queue for the first
/// step, `queue\x06\x16STEP` for the others, a priority counting as its nearest step.
pub fn redis_priority_queue(queue: &str, priority: Option<u8>) -> String {
    let priority = priority.unwrap_or(0);
    let step = REDIS_PRIORITY_STEPS
        .iter()
        .copied()
        .min_by_key(|step| step.abs_diff(priority))
        .unwrap_or(0);
    if step == 0 {
        queue.to_string()
    } else {
        format!("{queue}{REDIS_PRIORITY_SEPARATOR}{step}")
    }
}

/// The task id of `run`'s attempt: a UUID-shaped digest of its idempotency key and attempt.
pub fn task_id(run: &RunContext<'_>) -> String {
    let key = format!("{}#{}", run.idempotency_key(), run.attempt);
    // Two FNV-1a passes with different offsets: stable across builds and platforms, which a
    // std hasher does not promise; the id is a name, not a secret.
    let a = fnv1a(0xcbf2_9ce4_8422_2325, key.as_bytes());
    let b = fnv1a(0x6c62_272e_07bb_0142, key.as_bytes());
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_be_bytes());
    bytes[8..].copy_from_slice(&b.to_be_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x80; // version 8: custom
    bytes[8] = (bytes[8] & 0x3f) | 0x80; // RFC 4122 variant
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn fnv1a(offset: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(offset, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Strings follow the template rule; other values are kept.
fn render_value(value: &Value, run: &RunContext<'_>) -> Value {
    match value {
        Value::String(text) => Value::String(publish::render(text, run)),
        Value::Array(items) => Value::Array(items.iter().map(|v| render_value(v, run)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), render_value(v, run)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// How Python's `repr` writes a JSON value: what `argsrepr` and `kwargsrepr` show in Flower
/// and in the worker's log.
pub fn python_repr(value: &Value) -> String {
    match value {
        Value::Null => "None".to_string(),
        Value::Bool(true) => "True".to_string(),
        Value::Bool(false) => "False".to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(text) => python_str(text),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(python_repr).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{}: {}", python_str(k), python_repr(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn python_str(text: &str) -> String {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// The remote control command that revokes `task_id` on every worker, as the broadcast
/// (pidbox) exchange carries it.
pub fn revoke_command(task_id: &str, terminate: bool) -> Vec<u8> {
    json!({
        "method": "revoke",
        "arguments": {"task_id": task_id, "terminate": terminate, "signal": "SIGTERM"},
        "destination": null,
        "pattern": null,
        "matcher": null,
    })
    .to_string()
    .into_bytes()
}

/// A task's state in a result backend, as it bears on the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskState {
    /// Not in the backend yet, or `PENDING`, `RECEIVED`, `STARTED`, `RETRY`: still going.
    Going {
        state: String,
    },
    Succeeded,
    /// `FAILURE`: the exception and its traceback.
    Failed {
        error: String,
    },
    /// `REVOKED`.
    Revoked,
}

/// What a Redis result backend's value for a task (`celery-task-meta-ID`) says.
pub fn task_state(meta: Option<&str>) -> TaskState {
    let Some(meta) = meta else {
        return TaskState::Going {
            state: "PENDING".to_string(),
        };
    };
    let Ok(meta) = serde_json::from_str::<Value>(meta) else {
        return TaskState::Failed {
            error: "the result backend holds something that is not Celery's JSON".to_string(),
        };
    };
    let state = meta["status"].as_str().unwrap_or("PENDING");
    match state {
        "SUCCESS" => TaskState::Succeeded,
        "REVOKED" => TaskState::Revoked,
        "FAILURE" => {
            let result = &meta["result"];
            let kind = result["exc_type"].as_str().unwrap_or("error");
            let message = match &result["exc_message"] {
                Value::Array(parts) => parts
                    .iter()
                    .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_string))
                    .collect::<Vec<_>>()
                    .join(", "),
                Value::Null => String::new(),
                other => other
                    .as_str()
                    .map_or_else(|| other.to_string(), str::to_string),
            };
            let mut error = format!("{kind}: {message}");
            if let Some(traceback) = meta["traceback"].as_str() {
                error.push('\n');
                error.push_str(traceback);
            }
            TaskState::Failed { error }
        }
        other => TaskState::Going {
            state: other.to_string(),
        },
    }
}

impl TaskState {
    /// The attempt's outcome for an ended task, and its error.
    pub fn outcome(&self) -> (crate::AttemptOutcome, Option<String>) {
        use crate::AttemptOutcome;
        match self {
            TaskState::Succeeded => (AttemptOutcome::Succeeded, None),
            TaskState::Failed { error } => (AttemptOutcome::Failed, Some(error.clone())),
            TaskState::Revoked => (
                AttemptOutcome::Cancelled,
                Some("the task was revoked".to_string()),
            ),
            TaskState::Going { state } => (
                AttemptOutcome::Failed,
                Some(format!("the task had not ended ({state})")),
            ),
        }
    }
}

/// How following a task ended: with its final state, with a backend that could not be
/// followed, or given up (the time ran out, or the run was stopped) after a revoke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followed {
    Ended(TaskState),
    Unfollowable(String),
    TimedOut {
        limit: std::time::Duration,
        revoke: Result<(), String>,
    },
    Stopped {
        revoke: Result<(), String>,
    },
}

impl Followed {
    /// The attempt's outcome, and its error.
    pub fn outcome(&self) -> (crate::AttemptOutcome, Option<String>) {
        use crate::AttemptOutcome;
        let revoked = |revoke: &Result<(), String>| match revoke {
            Ok(()) => "the task was revoked".to_string(),
            Err(e) => format!("the revoke failed: {e}"),
        };
        match self {
            Followed::Ended(state) => state.outcome(),
            Followed::Unfollowable(why) => (AttemptOutcome::Failed, Some(why.clone())),
            Followed::TimedOut { limit, revoke } => (
                AttemptOutcome::TimedOut,
                Some(format!(
                    "the task did not end within {}; {}",
                    crate::HumanDuration(*limit),
                    revoked(revoke)
                )),
            ),
            Followed::Stopped { revoke } => (
                AttemptOutcome::Cancelled,
                Some(format!("stopped; {}", revoked(revoke))),
            ),
        }
    }
}

/// Whether `target` is a Celery target whose run follows its task's result.
pub fn follows_result(target: &crate::TargetSpec) -> Option<&CeleryTarget> {
    match target {
        crate::TargetSpec::Celery(celery) if celery.await_result => Some(celery),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::RunContext;

    fn target() -> CeleryTarget {
        serde_json::from_value(json!({
            "connection": "rabbit", "task": "proj.tasks.add",
            "args": [2, "{{job}}"], "kwargs": {"when": "{{scheduled_for}}", "n": null},
            "expires": "10m",
        }))
        .unwrap()
    }

    fn run(attempt: u32) -> RunContext<'static> {
        RunContext {
            namespace: "default",
            job: "adder",
            run_id: 7,
            attempt,
            scheduled_for: "2026-11-29T10:00:00Z".parse().unwrap(),
            completion: None,
            event: None,
            shard: None,
            traceparent: None,
        }
    }

    #[test]
    fn the_message_is_protocol_2_with_templated_arguments() {
        let message = target().message(&run(1));
        let body: Value = serde_json::from_slice(&message.body).unwrap();
        assert_eq!(body[0], json!([2, "adder"]));
        assert_eq!(body[1]["when"], json!("2026-11-29T10:00:00.000000Z"));
        assert_eq!(body[2]["chord"], Value::Null);
        let h = &message.headers;
        assert_eq!(h["task"], json!("proj.tasks.add"));
        assert_eq!(h["id"], json!(message.id));
        assert_eq!(h["root_id"], json!(message.id));
        assert_eq!(h["lang"], json!("py"));
        assert_eq!(h["retries"], json!(0));
        assert_eq!(h["expires"], json!("2026-11-29T10:10:00.000000Z"));
        assert_eq!(h["argsrepr"], json!("[2, 'adder']"));
        assert_eq!(
            h["kwargsrepr"],
            json!("{'n': None, 'when': '2026-11-29T10:00:00.000000Z'}")
        );
        assert_eq!(
            h["sked-idempotency-key"],
            json!("default/adder/2026-11-29T10:00:00.000000Z")
        );
    }

    #[test]
    fn the_task_id_is_stable_per_attempt_and_differs_between_attempts() {
        let first = task_id(&run(1));
        assert_eq!(first, task_id(&run(1)));
        assert_ne!(first, task_id(&run(2)));
        assert_eq!(first.len(), 36);
        assert_eq!(&first[14..15], "8");
    }

    #[test]
    fn celery_headers_and_missing_backends_are_refused_by_field() {
        let mut t = target();
        t.headers.insert("retries".into(), "3".into());
        assert_eq!(
            t.validate().unwrap_err().field,
            "target.celery.headers.retries"
        );
        let mut t = target();
        t.await_result = true;
        assert_eq!(
            t.validate().unwrap_err().field,
            "target.celery.result_backend"
        );
        let mut t = target();
        t.task = "two words".into();
        assert_eq!(t.validate().unwrap_err().field, "target.celery.task");
        let mut t = target();
        t.args = vec![Value::String("x".repeat(publish::MAX_PAYLOAD_LEN))];
        assert_eq!(t.validate().unwrap_err().field, "target.celery.args");
        assert!(target().validate().is_ok());
    }

    #[test]
    fn python_repr_quotes_as_python_does() {
        assert_eq!(python_repr(&json!("it's")), "\"it's\"");
        assert_eq!(python_repr(&json!("a'b\"c")), "'a\\'b\"c'");
        assert_eq!(
            python_repr(&json!([true, 1.5, {"k": [null]}])),
            "[True, 1.5, {'k': [None]}]"
        );
    }

    #[test]
    fn redis_priorities_go_to_kombus_step_queues() {
        assert_eq!(redis_priority_queue("celery", None), "celery");
        assert_eq!(redis_priority_queue("celery", Some(1)), "celery");
        assert_eq!(redis_priority_queue("celery", Some(5)), "celery\x06\x166");
        assert_eq!(redis_priority_queue("celery", Some(200)), "celery\x06\x169");
    }

    #[test]
    fn giving_up_says_how_and_whether_the_revoke_went_out() {
        use crate::AttemptOutcome;
        let (outcome, error) = Followed::TimedOut {
            limit: std::time::Duration::from_secs(3),
            revoke: Ok(()),
        }
        .outcome();
        assert_eq!(outcome, AttemptOutcome::TimedOut);
        assert_eq!(
            error.as_deref(),
            Some("the task did not end within 3s; the task was revoked")
        );
        let (outcome, error) = Followed::Stopped {
            revoke: Err("no connection".into()),
        }
        .outcome();
        assert_eq!(outcome, AttemptOutcome::Cancelled);
        assert_eq!(
            error.as_deref(),
            Some("stopped; the revoke failed: no connection")
        );
        assert_eq!(
            Followed::Ended(TaskState::Revoked).outcome().0,
            AttemptOutcome::Cancelled
        );
        assert_eq!(
            Followed::Unfollowable("no backend".into()).outcome(),
            (AttemptOutcome::Failed, Some("no backend".to_string()))
        );
    }

    #[test]
    fn a_celery_target_takes_an_amqp_or_a_redis_connection_and_a_redis_backend() {
        use crate::publish::{check_destination, BrokerConnection};
        let connections: Vec<BrokerConnection> =
            ["rabbit=amqp://h", "cache=redis://h", "bus=nats://h"]
                .iter()
                .map(|c| c.parse().unwrap())
                .collect();
        let check = |connection: &str, backend: Option<&str>| {
            let mut t = target();
            t.connection = connection.into();
            t.result_backend = backend.map(str::to_string);
            t.await_result = backend.is_some();
            check_destination(
                &crate::TargetSpec::Celery(t),
                "default",
                false,
                &connections,
                &[],
            )
            .map_err(|e| e.field)
        };
        assert_eq!(check("rabbit", Some("cache")), Ok(()));
        assert_eq!(check("cache", None), Ok(()));
        assert_eq!(
            check("bus", None),
            Err("target.celery.connection".to_string())
        );
        assert_eq!(
            check("rabbit", Some("rabbit")),
            Err("target.celery.result_backend".to_string())
        );
        assert_eq!(
            check("rabbit", Some("nowhere")),
            Err("target.celery.result_backend".to_string())
        );
    }

    #[test]
    fn backend_states_map_to_outcomes() {
        assert!(matches!(task_state(None), TaskState::Going { .. }));
        assert!(matches!(
            task_state(Some(r#"{"status": "RETRY"}"#)),
            TaskState::Going { state } if state == "RETRY"
        ));
        assert_eq!(
            task_state(Some(r#"{"status": "SUCCESS", "result": 3}"#)),
            TaskState::Succeeded
        );
        assert_eq!(
            task_state(Some(r#"{"status": "REVOKED"}"#)),
            TaskState::Revoked
        );
        let failed = task_state(Some(
            r#"{"status": "FAILURE", "result": {"exc_type": "ValueError", "exc_message": ["boom"]},
                "traceback": "Traceback (most recent call last):\n..."}"#,
        ));
        let TaskState::Failed { error } = failed else {
            panic!()
        };
        assert!(error.starts_with("ValueError: boom\nTraceback"), "{error}");
    }
}
