//! Namespace settings: what an administrator allows in one namespace (shell targets, how many
//! jobs, how many queued runs), and the rule a job definition meets against them.
//!
//! Every namespace exists implicitly (a job names it); settings are kept only for namespaces an
//! administrator has configured, and a namespace without them has the defaults. This module
//! decides; the store applies the decision inside the transaction that writes the job, so two
//! writers cannot both slip under a cap. It does no IO.

use crate::error::SpecError;
use crate::target::TargetSpec;
use crate::Instant;
use serde::{Deserialize, Serialize};

/// The largest cap a namespace may set on its jobs or queued runs.
pub const MAX_CAP: u64 = 100_000_000;

/// Most secrets one namespace keeps.
pub const MAX_SECRETS_PER_NAMESPACE: u64 = 1_000;

/// Most namespaces with settings a store keeps (each node holds them all in memory).
pub const MAX_CONFIGURED_NAMESPACES: u64 = 10_000;

/// What an administrator sets for a namespace; absent fields keep their defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceSpec {
    /// Whether jobs here may have shell targets at all (an editor also needs a token with
    /// `shell`). Default true.
    #[serde(default = "yes")]
    pub allow_shell: bool,
    /// The most jobs the namespace may hold; no cap when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs: Option<u64>,
    /// The most runs of the namespace that may wait in the queue at once; past it an instant
    /// is recorded as skipped with reason `backlog`. The server's `--max-queued-per-namespace`
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued_runs: Option<u64>,
    /// Its weight in the fair share of worker slots between namespaces whose runs wait
    /// (`crate::dispatch::fair_order`): a namespace of weight 2 holds twice the slots of one
    /// of weight 1 while both wait. [`crate::dispatch::DEFAULT_WEIGHT`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// The `notify` rules of the namespace's jobs that give none of their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<crate::notify::NotifyRule>,
    /// Windows in which no job of the namespace runs a scheduled instant: each is recorded
    /// `skipped (blackout)` with the window's reason (`crate::schedule::blackout`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blackouts: Vec<crate::schedule::BlackoutSpec>,
}

fn yes() -> bool {
    true
}

impl Default for NamespaceSpec {
    fn default() -> Self {
        NamespaceSpec {
            allow_shell: true,
            max_jobs: None,
            max_queued_runs: None,
            weight: None,
            notify: Vec::new(),
            blackouts: Vec::new(),
        }
    }
}

impl NamespaceSpec {
    /// Caps are between 1 and [`MAX_CAP`]: a cap of 0 would be a namespace nobody can use,
    /// which deleting its jobs or pausing them says more plainly.
    pub fn validate(&self) -> Result<(), SpecError> {
        for (field, cap) in [
            ("max_jobs", self.max_jobs),
            ("max_queued_runs", self.max_queued_runs),
        ] {
            if let Some(cap) = cap {
                if !(1..=MAX_CAP).contains(&cap) {
                    return Err(SpecError::new(
                        field,
                        format!("must be between 1 and {MAX_CAP} (leave it out for no cap)"),
                    ));
                }
            }
        }
        if let Some(weight) = self.weight {
            let max = crate::dispatch::MAX_WEIGHT;
            if !(1..=max).contains(&weight) {
                return Err(SpecError::new(
                    "weight",
                    format!("must be between 1 and {max} (leave it out for 1)"),
                ));
            }
        }
        crate::notify::validate("notify", &self.notify)?;
        crate::schedule::Blackouts::compile(&self.blackouts).map(|_| ())
    }

    /// Its blackout windows, checked; `None` when it has none. Validation refuses windows
    /// that do not check at every write, so an error here is a stored definition this version
    /// no longer accepts.
    pub fn blackout_windows(&self) -> Result<Option<crate::schedule::Blackouts>, SpecError> {
        let windows = crate::schedule::Blackouts::compile(&self.blackouts)?;
        Ok((!windows.is_empty()).then_some(windows))
    }

    /// Its weight in the fair share of worker slots.
    pub fn dispatch_weight(&self) -> u32 {
        self.weight.unwrap_or(crate::dispatch::DEFAULT_WEIGHT)
    }
}

/// A namespace's settings as the store keeps them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamespaceRecord {
    pub name: String,
    #[serde(flatten)]
    pub spec: NamespaceSpec,
    pub created_at: Instant,
    pub updated_at: Instant,
}

/// Why a namespace's settings refuse a change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceRefusal {
    #[error("namespace {namespace:?} forbids shell targets")]
    ShellForbidden { namespace: String },
    #[error("namespace {namespace:?} holds {max} jobs, its most; delete some or raise max_jobs")]
    TooManyJobs { namespace: String, max: u64 },
    #[error(
        "namespace {namespace:?} has shell jobs ({}); change or delete them before forbidding \
         shell targets",
        jobs.join(", ")
    )]
    ShellJobsExist {
        namespace: String,
        jobs: Vec<String>,
    },
    #[error("namespace {namespace:?} holds {max} secrets, its most; delete some first")]
    TooManySecrets { namespace: String, max: u64 },
    #[error("namespace {namespace:?} holds {max} calendars, its most; delete some first")]
    TooManyCalendars { namespace: String, max: u64 },
    #[error("{max} namespaces have settings, the most a store keeps")]
    TooManyNamespaces { max: u64 },
}

/// Whether a job with `target` may be written to `namespace` with these settings.
/// `jobs_held` counts the namespace's jobs now; `creating` says the write adds one.
pub fn admit_job(
    namespace: &str,
    settings: &NamespaceSpec,
    target: &TargetSpec,
    jobs_held: u64,
    creating: bool,
) -> Result<(), NamespaceRefusal> {
    if !settings.allow_shell && matches!(target, TargetSpec::Shell(_)) {
        return Err(NamespaceRefusal::ShellForbidden {
            namespace: namespace.to_string(),
        });
    }
    match settings.max_jobs {
        Some(max) if creating && jobs_held >= max => Err(NamespaceRefusal::TooManyJobs {
            namespace: namespace.to_string(),
            max,
        }),
        _ => Ok(()),
    }
}

/// Whether `settings` may replace a namespace's settings while `shell_jobs` (names of its jobs
/// with shell targets) exist: forbidding shell targets would leave jobs that can no longer be
/// written as they are.
pub fn admit_settings(
    namespace: &str,
    settings: &NamespaceSpec,
    shell_jobs: &[String],
) -> Result<(), NamespaceRefusal> {
    if !settings.allow_shell && !shell_jobs.is_empty() {
        return Err(NamespaceRefusal::ShellJobsExist {
            namespace: namespace.to_string(),
            jobs: shell_jobs.to_vec(),
        });
    }
    Ok(())
}

/// A secret of a namespace, as listings show it: never its value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecretRecord {
    pub namespace: String,
    pub name: String,
    pub created_at: Instant,
    pub updated_at: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(json: serde_json::Value) -> TargetSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_namespace_without_shell_refuses_shell_targets_only() {
        let settings = NamespaceSpec {
            allow_shell: false,
            ..NamespaceSpec::default()
        };
        let shell = target(serde_json::json!({"shell": {"command": "true"}}));
        let http = target(serde_json::json!({"http": {"url": "https://example.com/"}}));
        assert!(matches!(
            admit_job("a", &settings, &shell, 0, false),
            Err(NamespaceRefusal::ShellForbidden { .. })
        ));
        assert_eq!(admit_job("a", &settings, &http, 0, true), Ok(()));
        assert_eq!(
            admit_job("a", &NamespaceSpec::default(), &shell, 0, true),
            Ok(())
        );
    }

    #[test]
    fn the_job_cap_stops_creations_but_not_updates() {
        let settings = NamespaceSpec {
            max_jobs: Some(2),
            ..NamespaceSpec::default()
        };
        let http = target(serde_json::json!({"http": {"url": "https://example.com/"}}));
        assert_eq!(admit_job("a", &settings, &http, 1, true), Ok(()));
        assert!(matches!(
            admit_job("a", &settings, &http, 2, true),
            Err(NamespaceRefusal::TooManyJobs { max: 2, .. })
        ));
        // Rewriting one of the jobs it holds, even past a lowered cap, stays possible.
        assert_eq!(admit_job("a", &settings, &http, 5, false), Ok(()));
    }

    #[test]
    fn forbidding_shell_waits_until_no_shell_job_is_left() {
        let forbid = NamespaceSpec {
            allow_shell: false,
            ..NamespaceSpec::default()
        };
        assert!(admit_settings("a", &forbid, &["backup".into()]).is_err());
        assert_eq!(admit_settings("a", &forbid, &[]), Ok(()));
        assert_eq!(
            admit_settings("a", &NamespaceSpec::default(), &["backup".into()]),
            Ok(())
        );
    }

    #[test]
    fn caps_are_bounded_and_absent_fields_keep_defaults() {
        let spec: NamespaceSpec = serde_json::from_str("{}").unwrap();
        assert_eq!(spec, NamespaceSpec::default());
        assert_eq!(spec.validate(), Ok(()));
        for bad in [0, MAX_CAP + 1] {
            let spec = NamespaceSpec {
                max_jobs: Some(bad),
                ..NamespaceSpec::default()
            };
            assert_eq!(spec.validate().unwrap_err().field, "max_jobs");
        }
        assert!(serde_json::from_str::<NamespaceSpec>(r#"{"allow_shel": false}"#).is_err());
    }
}
