//! `WorkerConfig`: the worker's settings and their defaults, and their validation. Owns no
//! behaviour; the agent and the executors read these values.

use crate::WorkerError;
use sked_core::protocol::MAX_WORKER_BROKERS;
use std::collections::BTreeMap;
use std::time::Duration;

/// Largest number of slots the server accepts (`server::api::workers::MAX_SLOTS`).
const MAX_SLOTS: u32 = 10_000;

/// How a worker finds its servers, what it offers them, and its timings.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Base URLs such as `http://127.0.0.1:8080`, tried in order: on a connection error the
    /// worker moves to the next one (and wraps around). The first is the worker's home: while
    /// it works through another, it checks the first every `home_check_interval` and goes back
    /// once that is ready.
    pub servers: Vec<String>,
    /// How often a worker that failed over checks whether its first server is ready again.
    pub home_check_interval: Duration,
    /// Shown in `sked worker list`; the server derives the worker id from it.
    pub name: String,
    /// Jobs route to workers by these.
    pub labels: BTreeMap<String, String>,
    /// Attempts executed at once.
    pub slots: u32,
    /// Broker connections this worker publishes through: it takes broker targets of jobs
    /// routed to its labels that name one of them.
    pub brokers: Vec<sked_core::publish::BrokerConnection>,
    /// The token sent with every request (a `worker` token; `None` for an open development
    /// server). Its namespaces and label rules bound what this worker may claim.
    pub token: Option<sked_core::auth::Secret>,
    /// Certificates (PEM) trusted for HTTPS servers besides the public roots: the CA of a
    /// server started with its own certificate.
    pub trusted_certificates: Vec<u8>,
    /// How long a lease request may wait on the server for work (long poll).
    pub lease_wait: Duration,
    /// Timeout of every protocol request except the lease long poll (which gets `lease_wait`
    /// on top of it).
    pub request_timeout: Duration,
    /// Timeout of establishing a connection to a server.
    pub connect_timeout: Duration,
    /// How often output of running attempts is sent to the server.
    pub output_flush_interval: Duration,
    /// Output kept in memory per attempt while it cannot be sent; beyond it output is dropped
    /// (and the log says how much).
    pub max_buffered_output: usize,
    /// Between SIGTERM and SIGKILL when a shell attempt's process group is stopped.
    pub kill_grace: Duration,
    /// After a shell command's main process exits, how long processes it left in its group
    /// may keep its output open before the group is terminated.
    pub output_drain: Duration,
    /// The part of an HTTP target's response body that goes to the log.
    pub http_body_cap: usize,
    /// The executable run once as the supervisor server that forks each shell attempt's
    /// supervisor (see [`executor::supervisor`](crate::executor::supervisor)): `sked` sets its
    /// own.
    pub supervisor: Option<std::path::PathBuf>,
    /// First delay before retrying a failed protocol request; it doubles up to `retry_max`.
    pub retry_initial: Duration,
    /// Longest delay between retries.
    pub retry_max: Duration,
    /// At shutdown, how long the attempts running may take to finish, while nothing new is
    /// leased, before they are stopped: a drain. Zero stops them at once.
    pub drain_grace: Duration,
    /// At shutdown, how long the worker keeps trying to report what its attempts did.
    pub shutdown_timeout: Duration,
    /// An HTTP attempt in flight longer than this counts in the stall gauge the worker
    /// reports: its target is slow, and more work sent here would wait behind it.
    pub stall_after: Duration,
    /// With it, HTTP attempts in flight beyond this many (the newest) count in the stall gauge
    /// too: the concurrency of the service behind the HTTP targets, past which work waits.
    pub stall_over: Option<u32>,
    /// This worker's pool's overload control; the server's default when `None`.
    pub overload: Option<sked_core::protocol::OverloadSetting>,
    /// The container engine for container targets: `podman` or `docker`, `none` for no
    /// container targets, or `None` for whichever of podman and docker is on PATH.
    pub container_runtime: Option<String>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            servers: vec!["http://127.0.0.1:8080".to_string()],
            home_check_interval: Duration::from_secs(10),
            name: "worker".to_string(),
            labels: BTreeMap::new(),
            slots: 8,
            brokers: Vec::new(),
            token: None,
            trusted_certificates: Vec::new(),
            lease_wait: Duration::from_secs(20),
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            output_flush_interval: Duration::from_millis(200),
            max_buffered_output: 4 * 1024 * 1024,
            kill_grace: Duration::from_secs(5),
            output_drain: Duration::from_secs(2),
            http_body_cap: 64 * 1024,
            supervisor: None,
            retry_initial: Duration::from_millis(200),
            retry_max: Duration::from_secs(5),
            drain_grace: Duration::ZERO,
            shutdown_timeout: Duration::from_secs(15),
            stall_after: Duration::from_secs(10),
            stall_over: None,
            overload: None,
            container_runtime: None,
        }
    }
}

impl WorkerConfig {
    /// Rejects settings that cannot work; normalizes server URLs (no trailing `/`).
    pub(crate) fn validated(mut self) -> Result<Self, WorkerError> {
        let invalid = |m: String| Err(WorkerError::Config(m));
        if self.servers.is_empty() {
            return invalid("at least one server URL is needed".to_string());
        }
        for server in &mut self.servers {
            let trimmed = server.trim().trim_end_matches('/').to_string();
            let scheme_ok = trimmed.starts_with("http://") || trimmed.starts_with("https://");
            if !scheme_ok || reqwest::Url::parse(&trimmed).is_err() {
                return invalid(format!("{server:?} is not an http:// or https:// URL"));
            }
            *server = trimmed;
        }
        if self.slots == 0 || self.slots > MAX_SLOTS {
            return invalid(format!("slots must be between 1 and {MAX_SLOTS}"));
        }
        if self.brokers.len() > MAX_WORKER_BROKERS {
            return invalid(format!("at most {MAX_WORKER_BROKERS} broker connections"));
        }
        let mut names: Vec<&str> = self.brokers.iter().map(|b| b.name.as_str()).collect();
        names.sort_unstable();
        if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
            return invalid(format!("broker connection {:?} is given twice", twice[0]));
        }
        if self.name.is_empty() || self.name.len() > 256 {
            return invalid("the name must be 1 to 256 bytes".to_string());
        }
        let positive = [
            ("request_timeout", self.request_timeout),
            ("connect_timeout", self.connect_timeout),
            ("output_flush_interval", self.output_flush_interval),
            ("retry_initial", self.retry_initial),
            ("retry_max", self.retry_max),
            ("home_check_interval", self.home_check_interval),
            ("stall_after", self.stall_after),
        ];
        for (field, value) in positive {
            if value.is_zero() {
                return invalid(format!("{field} must be more than zero"));
            }
        }
        if let Some(overload) = self.overload {
            sked_core::dispatch::StallLimits::new(overload.trip, overload.reset)
                .map_err(WorkerError::Config)?;
        }
        if let Some(runtime) = &self.container_runtime {
            if !matches!(runtime.as_str(), "podman" | "docker" | "none") {
                return invalid(format!(
                    "container runtime {runtime:?}: podman, docker or none"
                ));
            }
        }
        if self.retry_max < self.retry_initial {
            self.retry_max = self.retry_initial;
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_urls_are_normalized() {
        let config = WorkerConfig {
            servers: vec!["http://a:1/".to_string(), " https://b ".to_string()],
            ..WorkerConfig::default()
        };
        let config = config.validated().map_err(|e| e.to_string());
        assert_eq!(
            config.map(|c| c.servers),
            Ok(vec!["http://a:1".to_string(), "https://b".to_string()])
        );
    }

    #[test]
    fn bad_settings_are_rejected() {
        let cases = [
            WorkerConfig {
                servers: vec![],
                ..WorkerConfig::default()
            },
            WorkerConfig {
                servers: vec!["ftp://x".to_string()],
                ..WorkerConfig::default()
            },
            WorkerConfig {
                slots: 0,
                ..WorkerConfig::default()
            },
            WorkerConfig {
                name: String::new(),
                ..WorkerConfig::default()
            },
            WorkerConfig {
                output_flush_interval: Duration::ZERO,
                ..WorkerConfig::default()
            },
        ];
        for case in cases {
            assert!(matches!(case.validated(), Err(WorkerError::Config(_))));
        }
    }
}
