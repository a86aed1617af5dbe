//! What a run does: the target of a job.

use crate::celery::CeleryTarget;
use crate::container::ContainerTarget;
use crate::duration::HumanDuration;
use crate::error::SpecError;
use crate::limits::{Capability, Limits, RunAs};
use crate::publish::{AmqpTarget, BrokerKind, Destination, NatsTarget, RedisStreamTarget};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Exactly one kind of target; JSON `{"shell": {...}}`, `{"http": {...}}`,
/// `{"container": {...}}` (`crate::container`), a broker's,
/// `{"amqp": {...}}`, `{"nats": {...}}`, `{"redis_stream": {...}}` (`crate::publish`),
/// `{"celery": {...}}` (`crate::celery`), or
/// `{"heartbeat": {...}}`, which runs nothing and waits for pings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TargetSpec {
    Shell(ShellTarget),
    Http(HttpTarget),
    Container(ContainerTarget),
    Amqp(AmqpTarget),
    Nats(NatsTarget),
    RedisStream(RedisStreamTarget),
    Celery(CeleryTarget),
    Heartbeat(HeartbeatTarget),
}

/// A dead-man's switch: each run, at its instant, waits for a ping (`POST
/// /api/v1/jobs/{name}/ping`, or `/ping/{token}`) for `grace`, and fails when none came. No
/// worker runs it. See [`crate::heartbeat`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatTarget {
    #[serde(default = "default_grace")]
    pub grace: HumanDuration,
}

fn default_grace() -> HumanDuration {
    HumanDuration::from_secs(60)
}

/// A process. With `args` empty, `command` is run by `/bin/sh -c`; otherwise `command` is the
/// program and `args` its arguments, with no shell in between.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellTarget {
    pub command: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, TargetValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The OS user (and group) the job runs as; the worker's own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as: Option<RunAs>,
    /// What the job's whole process tree may use.
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
}

/// An HTTP request. The attempt succeeds when the response status is one of `expected_status`
/// (any 2xx when the list is empty). `timeout` bounds the request; the job's `timeout` bounds
/// the attempt; whichever is shorter applies, and either ends the attempt `timed_out`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpTarget {
    #[serde(default = "default_method")]
    pub method: String,
    pub url: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, TargetValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expected_status: Vec<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    /// The endpoint starts long work and reports its outcome later to the address the request
    /// carries (`sked-complete-url`, `sked-complete-token`): the run stays `running` after
    /// the response until then, or until the job's `timeout`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub callback: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// An env variable's or a header's value: text, or a secret. A secret is given in clear once,
/// `{"secret": "..."}`; the server seals it before it is stored (`{"sealed": "..."}`, encrypted
/// with the server's key), shows only the sealed form, and opens it only in the attempt it
/// hands to a worker. A sealed value sent back unchanged keeps its secret. A reference,
/// `{"secret_ref": "db-password"}`, names a secret of the job's namespace
/// (`/api/v1/secrets`), read when an attempt is handed out, so rotating it changes no job.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TargetValue {
    Plain(String),
    Secret(SecretText),
    Sealed(SealedText),
    SecretRef(SecretRef),
}

/// A secret in clear, as a definition gives it: never stored, never shown.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretText {
    pub secret: String,
}

/// The name of a secret of the job's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    pub secret_ref: String,
}

/// A secret encrypted with the server's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedText {
    pub sealed: String,
}

impl TargetValue {
    /// The text a worker uses: plain values only (the server opens secrets before an attempt
    /// leaves it).
    pub fn text(&self) -> Option<&str> {
        match self {
            TargetValue::Plain(text) => Some(text),
            TargetValue::Secret(_) | TargetValue::Sealed(_) | TargetValue::SecretRef(_) => None,
        }
    }

    /// The clear text that validation checks: plain values and secrets given in clear.
    fn clear(&self) -> Option<&str> {
        match self {
            TargetValue::Plain(text) => Some(text),
            TargetValue::Secret(s) => Some(&s.secret),
            TargetValue::Sealed(_) | TargetValue::SecretRef(_) => None,
        }
    }
}

impl From<&str> for TargetValue {
    fn from(text: &str) -> TargetValue {
        TargetValue::Plain(text.to_string())
    }
}

/// A secret's text never reaches a log line through `Debug`.
impl std::fmt::Debug for TargetValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetValue::Plain(text) => write!(f, "{text:?}"),
            TargetValue::Secret(_) => f.write_str("Secret(..)"),
            TargetValue::Sealed(_) => f.write_str("Sealed(..)"),
            TargetValue::SecretRef(r) => write!(f, "SecretRef({:?})", r.secret_ref),
        }
    }
}

/// `values` as the text a process or a request is given; otherwise the name of one that is not
/// plain (a secret the server did not open) and why it could not be.
pub fn plain_values(
    values: &BTreeMap<String, TargetValue>,
) -> Result<Vec<(&str, &str)>, (&str, &'static str)> {
    values
        .iter()
        .map(|(name, value)| match value {
            TargetValue::Plain(text) => Ok((name.as_str(), text.as_str())),
            TargetValue::SecretRef(_) => Err((
                name.as_str(),
                "refers to a secret its namespace does not have (sked secret set)",
            )),
            TargetValue::Secret(_) | TargetValue::Sealed(_) => Err((
                name.as_str(),
                "is a secret the server did not open (is every server node given the same \
                 --secret-key-file?)",
            )),
        })
        .collect()
}

fn default_method() -> String {
    "GET".to_string()
}

const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];

impl HttpTarget {
    pub fn status_is_expected(&self, status: u16) -> bool {
        if self.expected_status.is_empty() {
            (200..300).contains(&status)
        } else {
            self.expected_status.contains(&status)
        }
    }
}

/// Refuses a value with a NUL byte, which no process argument, variable or path can carry.
pub(crate) fn no_nul(field: &str, value: &str) -> Result<(), SpecError> {
    if value.contains('\0') {
        return Err(SpecError::new(field, "must not contain a NUL byte"));
    }
    Ok(())
}

/// Variable names are non-empty without `=` or NUL, and values have no NUL: what a process
/// environment can carry. `field` is where they are (`target.shell.env`).
pub(crate) fn check_env(field: &str, env: &BTreeMap<String, TargetValue>) -> Result<(), SpecError> {
    for (name, value) in env {
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(SpecError::new(
                field,
                "variable names must be non-empty and contain no '=' or NUL",
            ));
        }
        if let Some(text) = value.clear() {
            no_nul(&format!("{field}.{name}"), text)?;
        }
    }
    Ok(())
}

/// An absolute http:// or https:// URL with a host, parsed the way the worker's HTTP client
/// parses it, so a URL accepted here is one a run can request.
pub(crate) fn check_url(field: &str, text: &str) -> Result<(), SpecError> {
    let invalid = |why: String| {
        SpecError::new(
            field,
            format!("{text:?} is not a usable http:// or https:// URL: {why}"),
        )
    };
    let url = url::Url::parse(text).map_err(|e| invalid(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(format!("the scheme is {:?}", url.scheme())));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("it has no host".to_string()));
    }
    Ok(())
}

/// Header names are HTTP tokens and values hold no control characters (no header smuggling);
/// `field` is where the headers are, for the error.
pub(crate) fn check_headers(
    field: &str,
    headers: &BTreeMap<String, TargetValue>,
) -> Result<(), SpecError> {
    for (name, value) in headers {
        if !is_header_name(name) {
            return Err(SpecError::new(
                field,
                format!("{name:?} is not a header name (letters, digits and !#$%&'*+-.^_`|~ only)"),
            ));
        }
        if value
            .clear()
            .is_some_and(|text| text.chars().any(|c| c.is_control() && c != '\t'))
        {
            return Err(SpecError::new(
                format!("{field}.{name}"),
                "must not contain control characters such as CR, LF or NUL",
            ));
        }
    }
    Ok(())
}

/// An HTTP header name: one or more token characters (RFC 9110).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl TargetSpec {
    /// Where this target's env or header values are, for error messages
    /// (`target.shell.env.DB_PASSWORD`).
    pub fn values_field(&self) -> &'static str {
        match self {
            TargetSpec::Shell(_) => "target.shell.env",
            TargetSpec::Container(_) => "target.container.env",
            TargetSpec::Http(_) => "target.http.headers",
            TargetSpec::Amqp(_)
            | TargetSpec::Nats(_)
            | TargetSpec::RedisStream(_)
            | TargetSpec::Celery(_)
            | TargetSpec::Heartbeat(_) => "target",
        }
    }

    /// The env or header values that may hold secrets; broker targets have none.
    fn values(&self) -> Option<&BTreeMap<String, TargetValue>> {
        match self {
            TargetSpec::Shell(shell) => Some(&shell.env),
            TargetSpec::Container(container) => Some(&container.env),
            TargetSpec::Http(http) => Some(&http.headers),
            TargetSpec::Amqp(_)
            | TargetSpec::Nats(_)
            | TargetSpec::RedisStream(_)
            | TargetSpec::Celery(_)
            | TargetSpec::Heartbeat(_) => None,
        }
    }

    /// Whether it runs commands on a worker's host (a process, or a container): what the
    /// `shell` grant of a token covers.
    pub fn runs_commands(&self) -> bool {
        matches!(self, TargetSpec::Shell(_) | TargetSpec::Container(_))
    }

    /// What a worker must be able to do to execute it, beyond plain shell and HTTP.
    pub fn needs(&self) -> &'static [Capability] {
        match self {
            TargetSpec::Container(_) => &[Capability::Container],
            TargetSpec::Shell(shell) => {
                match (shell.run_as.is_some(), shell.limits.binds_processes()) {
                    (true, true) => &[Capability::RunAs, Capability::Limits],
                    (true, false) => &[Capability::RunAs],
                    (false, true) => &[Capability::Limits],
                    (false, false) => &[],
                }
            }
            _ => &[],
        }
    }

    /// The names of the namespace secrets this target refers to.
    pub fn secret_refs(&self) -> impl Iterator<Item = &str> {
        self.values()
            .into_iter()
            .flat_map(BTreeMap::values)
            .filter_map(|value| match value {
                TargetValue::SecretRef(r) => Some(r.secret_ref.as_str()),
                _ => None,
            })
    }

    /// The names of the HTTP headers whose values are secrets (sealed or a namespace secret's
    /// reference): what a redirect to another origin must not carry once they are opened.
    pub fn secret_headers(&self) -> Vec<String> {
        match self {
            TargetSpec::Http(http) => http
                .headers
                .iter()
                .filter(|(_, value)| !matches!(value, TargetValue::Plain(_)))
                .map(|(name, _)| name.clone())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Every env and header value: where secrets are.
    pub fn values_mut(&mut self) -> impl Iterator<Item = (&String, &mut TargetValue)> {
        let values = match self {
            TargetSpec::Shell(shell) => Some(&mut shell.env),
            TargetSpec::Container(container) => Some(&mut container.env),
            TargetSpec::Http(http) => Some(&mut http.headers),
            TargetSpec::Amqp(_)
            | TargetSpec::Nats(_)
            | TargetSpec::RedisStream(_)
            | TargetSpec::Celery(_)
            | TargetSpec::Heartbeat(_) => None,
        };
        values.into_iter().flat_map(|v| v.iter_mut())
    }

    /// The kinds of broker connection a broker target may publish through (none for the
    /// others), and its name in a definition, for messages.
    pub fn broker_kinds(&self) -> (&'static [BrokerKind], &'static str) {
        match self {
            TargetSpec::Shell(_)
            | TargetSpec::Http(_)
            | TargetSpec::Container(_)
            | TargetSpec::Heartbeat(_) => (&[], "broker"),
            TargetSpec::Amqp(_) => (&[BrokerKind::Amqp], "amqp"),
            TargetSpec::Nats(_) => (&[BrokerKind::Nats], "nats"),
            TargetSpec::RedisStream(_) => (&[BrokerKind::Redis], "redis_stream"),
            TargetSpec::Celery(_) => (&[BrokerKind::Amqp, BrokerKind::Redis], "celery"),
        }
    }

    /// Whether a run of this target ends with a report from elsewhere (an HTTP endpoint's
    /// callback, a broker message's consumer) rather than when the request or publish did.
    pub fn awaits_completion(&self) -> bool {
        match self {
            TargetSpec::Http(t) => t.callback,
            _ => self.destination().is_some_and(|d| d.await_completion),
        }
    }

    /// Where a broker target publishes, for the operator's allowances.
    pub fn destination(&self) -> Option<Destination<'_>> {
        match self {
            TargetSpec::Shell(_)
            | TargetSpec::Http(_)
            | TargetSpec::Container(_)
            | TargetSpec::Heartbeat(_) => None,
            TargetSpec::Amqp(t) => Some(Destination {
                connection: &t.connection,
                field: "target.amqp.exchange",
                name: &t.exchange,
                await_completion: t.await_completion,
            }),
            TargetSpec::Nats(t) => Some(Destination {
                connection: &t.connection,
                field: "target.nats.subject",
                name: &t.subject,
                await_completion: t.await_completion,
            }),
            TargetSpec::RedisStream(t) => Some(Destination {
                connection: &t.connection,
                field: "target.redis_stream.stream",
                name: &t.stream,
                await_completion: t.await_completion,
            }),
            // A Celery worker reports to its result backend, not to sked: `await_result` is
            // followed there (`crate::celery`), not through a completion address.
            TargetSpec::Celery(t) => Some(Destination {
                connection: &t.connection,
                field: if t.routing_key.is_some() {
                    "target.celery.routing_key"
                } else {
                    "target.celery.queue"
                },
                name: t.routing_key(),
                await_completion: false,
            }),
        }
    }

    /// Checks what serde cannot: non-empty commands without NUL bytes, URLs a client can
    /// request, header names and values HTTP can carry, methods.
    pub fn validate(&mut self) -> Result<(), SpecError> {
        let place = self.values_field();
        for (name, value) in self.values_mut() {
            if let TargetValue::SecretRef(r) = value {
                crate::job::validate_name(&format!("{place}.{name}.secret_ref"), &r.secret_ref)?;
            }
        }
        match self {
            TargetSpec::Shell(shell) => {
                if shell.command.trim().is_empty() {
                    return Err(SpecError::new("target.shell.command", "must not be empty"));
                }
                // A NUL cannot pass through exec: refuse it here rather than fail every run.
                no_nul("target.shell.command", &shell.command)?;
                for arg in &shell.args {
                    no_nul("target.shell.args", arg)?;
                }
                if let Some(cwd) = &shell.cwd {
                    no_nul("target.shell.cwd", cwd)?;
                }
                check_env("target.shell.env", &shell.env)?;
                if let Some(run_as) = &shell.run_as {
                    run_as.validate("target.shell.run_as")?;
                }
                shell.limits.validate("target.shell.limits")?;
            }
            TargetSpec::Http(http) => {
                http.method = http.method.to_ascii_uppercase();
                if !METHODS.contains(&http.method.as_str()) {
                    return Err(SpecError::new(
                        "target.http.method",
                        format!("{:?} is not one of {}", http.method, METHODS.join(", ")),
                    ));
                }
                check_url("target.http.url", http.url.trim())?;
                check_headers("target.http.headers", &http.headers)?;
                if let Some(bad) = http
                    .expected_status
                    .iter()
                    .find(|s| !(100..600).contains(*s))
                {
                    return Err(SpecError::new(
                        "target.http.expected_status",
                        format!("{bad} is not an HTTP status code"),
                    ));
                }
                if let Some(timeout) = http.timeout {
                    if timeout.0.is_zero() || timeout.0 > crate::job::MAX_TIMEOUT {
                        return Err(SpecError::new(
                            "target.http.timeout",
                            "must be between 1ms and 7 days",
                        ));
                    }
                }
            }
            TargetSpec::Container(container) => container.validate()?,
            TargetSpec::Amqp(amqp) => amqp.validate()?,
            TargetSpec::Nats(nats) => nats.validate()?,
            TargetSpec::RedisStream(redis) => redis.validate()?,
            TargetSpec::Celery(celery) => celery.validate()?,
            TargetSpec::Heartbeat(heartbeat) => crate::heartbeat::validate_grace(heartbeat.grace)?,
        }
        Ok(())
    }
}
