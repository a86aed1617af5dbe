//! Server settings, with the defaults a single node wants.

use crate::auth::AuthMode;
use crate::http::{ConnectionLimits, Tls};
use crate::rate::RateLimit;
use crate::secrets::SecretKey;
use sked_core::egress::EgressPolicy;
use sked_core::policy::BacklogLimits;
use sked_core::publish::{BrokerAllowance, BrokerConnection};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address the HTTP API listens on.
    pub listen: String,
    /// How often workers are asked to heartbeat.
    pub heartbeat_interval: Duration,
    /// A worker silent this long is declared dead and its attempts are re-queued.
    pub heartbeat_timeout: Duration,
    /// Output kept per attempt; past it the attempt is marked truncated.
    pub output_cap: u64,
    /// Longest long poll a worker may ask for.
    pub max_lease_wait: Duration,
    /// Finished runs older than this are deleted with their output; `None` keeps them forever.
    pub retention: Option<Duration>,
    /// Make time partitions of runs (on a store that has them) for retention to drop whole.
    pub partition_runs: bool,
    /// Most instants written to the ledger in one transaction.
    pub fire_batch: usize,
    /// How long this node's partition and maintenance leases last unrenewed; it renews them
    /// every third of this. A dead node's partitions move after at most about this plus one
    /// renewal.
    pub node_lease: Duration,
    /// Start of this node's id (a random suffix makes each start a node of its own).
    pub node_name: String,
    /// Past these many queued runs of a job, or of a namespace, an instant is recorded as
    /// skipped (`backlog`) instead of queuing one more.
    pub backlog: BacklogLimits,
    /// The overload control of workers whose heartbeats name none (`sked worker --overload`
    /// names their pool's).
    pub overload: sked_core::dispatch::OverloadControl,
    /// Header timeout and the most connections open at once.
    pub connections: ConnectionLimits,
    /// Workers declared dead are deleted once silent this long.
    pub worker_retention: Duration,
    /// Log streams followed at once; more are refused with 429.
    pub max_log_follows: usize,
    /// Whether requests need a token.
    pub auth: AuthMode,
    /// Audit entries older than this are deleted; `None` keeps them forever.
    pub audit_retention: Option<Duration>,
    /// Seals secrets in job definitions; without it a definition with a secret is refused.
    pub secret_key: Option<SecretKey>,
    /// HTTPS with this certificate; plain HTTP when `None`.
    pub tls: Option<Tls>,
    /// Requests per second per token on the API (the worker protocol is not counted); zero
    /// per second turns it off.
    pub rate_limit: RateLimit,
    /// What HTTP targets may reach. Workers enforce it, each with the policy it got when it
    /// registered; definitions whose URL it refuses by itself are refused at write time. The
    /// default restricts nothing; `sked server` refuses internal addresses unless allowed.
    pub http_target_policy: EgressPolicy,
    /// Broker connections that broker targets name (`--broker NAME=URL`); this node publishes
    /// their messages itself.
    pub brokers: Vec<BrokerConnection>,
    /// Which namespaces may publish through which connection, under which prefix
    /// (`--broker-allow`); a connection none names is open to every namespace.
    pub broker_allowances: Vec<BrokerAllowance>,
    /// The images and host paths container targets may use (`--image-allow`,
    /// `--mount-allow`); `sked dev` allows every image.
    pub container_policy: sked_core::container::ContainerPolicy,
    /// The URL clients reach this node at (`--public-url`), for addresses the node hands out:
    /// where a consumer reports a completion. `None`: the address it listens on.
    pub public_url: Option<String>,
    /// The SMTP relay `email` notifications are sent through; without it they fail, saying so.
    pub smtp: Option<SmtpRelay>,
    /// Console logins through this OpenID Connect provider, besides API tokens
    /// (`--oidc-issuer` and the rest).
    pub oidc: Option<crate::oidc::OidcConfig>,
    /// Told `true` once, when the node first becomes ready (its first schedules loaded, as
    /// `/readyz` first answers 200): what a service manager's readiness notice waits for.
    pub on_ready: Option<tokio::sync::watch::Sender<bool>>,
    /// Traces of runs exported over OTLP; `None` (the default) exports nothing and hands
    /// attempts no trace context.
    pub traces: Option<crate::traces::TraceSettings>,
}

/// An SMTP relay (`--smtp-url`, `--smtp-from`). The URL may hold credentials, so it is never
/// printed.
#[derive(Clone)]
pub struct SmtpRelay {
    /// `smtps://user:pass@host:465` (TLS), `smtp://user:pass@host:587?tls=required`
    /// (STARTTLS), or `smtp://host:port` (unencrypted).
    pub url: String,
    /// The sender address of every notification email.
    pub from: String,
}

impl std::fmt::Debug for SmtpRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpRelay")
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8080".to_string(),
            heartbeat_interval: Duration::from_secs(2),
            heartbeat_timeout: Duration::from_secs(10),
            output_cap: 1024 * 1024,
            max_lease_wait: Duration::from_secs(30),
            retention: Some(Duration::from_secs(30 * 24 * 3600)),
            partition_runs: false,
            fire_batch: 2000,
            node_lease: Duration::from_secs(3),
            node_name: "sked".to_string(),
            backlog: BacklogLimits::default(),
            overload: sked_core::dispatch::OverloadControl::default(),
            connections: ConnectionLimits::default(),
            max_log_follows: 256,
            worker_retention: Duration::from_secs(24 * 3600),
            auth: AuthMode::Tokens,
            audit_retention: Some(Duration::from_secs(365 * 24 * 3600)),
            secret_key: None,
            rate_limit: RateLimit::default(),
            tls: None,
            http_target_policy: EgressPolicy::default(),
            brokers: Vec::new(),
            broker_allowances: Vec::new(),
            container_policy: Default::default(),
            public_url: None,
            smtp: None,
            oidc: None,
            on_ready: None,
            traces: None,
        }
    }
}
