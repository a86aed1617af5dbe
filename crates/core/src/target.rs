//! What a run does: the target of a job.

use crate::duration::HumanDuration;
use crate::error::SpecError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Exactly one kind of target; JSON `{"shell": {...}}` or `{"http": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TargetSpec {
    Shell(ShellTarget),
    Http(HttpTarget),
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
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
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
    pub headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expected_status: Vec<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
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

impl TargetSpec {
    /// Checks what serde cannot: non-empty commands, well-formed URLs and methods.
    pub fn validate(&mut self) -> Result<(), SpecError> {
        match self {
            TargetSpec::Shell(shell) => {
                if shell.command.trim().is_empty() {
                    return Err(SpecError::new("target.shell.command", "must not be empty"));
                }
                if shell.env.keys().any(|k| k.is_empty() || k.contains('=')) {
                    return Err(SpecError::new(
                        "target.shell.env",
                        "variable names must be non-empty and contain no '='",
                    ));
                }
            }
            TargetSpec::Http(http) => {
                http.method = http.method.to_ascii_uppercase();
                if !METHODS.contains(&http.method.as_str()) {
                    return Err(SpecError::new(
                        "target.http.method",
                        format!("{:?} is not one of {}", http.method, METHODS.join(", ")),
                    ));
                }
                let url = http.url.trim();
                let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
                if !scheme_ok || url.len() <= "https://".len() || url.contains(char::is_whitespace)
                {
                    return Err(SpecError::new(
                        "target.http.url",
                        format!("{url:?} is not an http:// or https:// URL"),
                    ));
                }
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
        }
        Ok(())
    }
}
