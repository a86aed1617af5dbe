//! Completion by the consumer. A broker target with `await_completion` keeps its run
//! `running` after the broker confirmed the message, and an HTTP target with `callback` after
//! the endpoint answered, until whoever does the work reports the outcome with the address and
//! token the message or request carries (`POST /api/v1/runs/{id}/complete`), or the job's
//! `timeout` passes. This module owns those tokens and the reports; a lease hands tokens out
//! (`crate::attempts`), the API takes reports (`crate::api::runs`).
//!
//! A token is an HMAC-SHA256 of one attempt (its id and fencing token) under a key derived
//! from the secret key, after the attempt's id and fencing token in clear (`c2.`). Any node
//! with the same secret key checks a token another node issued, nothing is stored, and a token
//! opens only its own attempt, and only while that attempt runs: once the run ends, or a later
//! attempt took it over, the token is refused. Since the ids travel with the tag, a token the
//! server made is told from a made-up one before anything is read ([`CompletionKey::made`]),
//! so the limit on refused reports never holds up a genuine one. Tokens of the first version
//! (`c1.`, the tag alone), handed out before, are still taken.

use crate::api::ApiError;
use crate::secrets::SecretKey;
use crate::{attempts, AppState};
use axum::http::StatusCode;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use sked_core::protocol::CompletionAddress;
use sked_core::records::{AttemptRecord, RunRecord};
use sked_core::run::{AttemptOutcome, AttemptState};
use sked_store::AttemptReport;

type HmacSha256 = Hmac<sha2::Sha256>;

/// Tokens start with this, so a token of another kind or version is told apart.
const VERSION: &str = "c2.";
/// Tokens of the first version: the tag alone.
const VERSION_1: &str = "c1.";
/// Ping tokens start with this.
const PING_VERSION: &str = "p1.";
/// Longest `message` a consumer may send; it is kept in the attempt's output or error.
pub const MAX_MESSAGE_LEN: usize = 4096;
/// Longest `token` taken: a real one is at most 86 characters.
const MAX_TOKEN_LEN: usize = 128;

/// The key completion tokens are made and checked with.
pub struct CompletionKey([u8; 32]);

impl CompletionKey {
    /// Derived from the secret key, so every node of a cluster agrees; without one (an
    /// embedded deployment started without a key), a key of this process's own.
    pub fn new(secret: Option<&SecretKey>) -> CompletionKey {
        CompletionKey(secret.map_or_else(rand::random, SecretKey::completion_key))
    }

    fn mac(&self, attempt_id: i64, fencing_token: i64) -> HmacSha256 {
        // HMAC takes a key of any length: this cannot fail.
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(format!("{attempt_id}:{fencing_token}").as_bytes());
        mac
    }

    /// The token of one attempt.
    pub fn token(&self, attempt_id: i64, fencing_token: i64) -> String {
        let tag = self.mac(attempt_id, fencing_token).finalize().into_bytes();
        format!(
            "{VERSION}{attempt_id}.{fencing_token}.{}",
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// The attempt (id, fencing token) `given` was made for, when this key made it (checked in
    /// constant time, before anything is read). `None` for a first-version token, which names
    /// no attempt.
    pub fn made(&self, given: &str) -> Option<(i64, i64)> {
        if given.len() > MAX_TOKEN_LEN {
            return None;
        }
        let mut parts = given.strip_prefix(VERSION)?.splitn(3, '.');
        let attempt_id: i64 = parts.next()?.parse().ok()?;
        let fencing_token: i64 = parts.next()?.parse().ok()?;
        let tag = URL_SAFE_NO_PAD.decode(parts.next()?).ok()?;
        self.mac(attempt_id, fencing_token)
            .verify_slice(&tag)
            .ok()?;
        Some((attempt_id, fencing_token))
    }

    /// The token of heartbeat job `job_id`'s ping address (`/ping/{token}`): it names the job
    /// and proves the server made it. A job defined again under its name is a new job with a
    /// new id, so an old address stops working.
    pub fn ping_token(&self, job_id: i64) -> String {
        let tag = self.ping_mac(job_id).finalize().into_bytes();
        format!("{PING_VERSION}{job_id}.{}", URL_SAFE_NO_PAD.encode(tag))
    }

    /// The job a ping token was made for, when it is one of this key's (checked in constant
    /// time, before anything is read).
    pub fn ping_job(&self, given: &str) -> Option<i64> {
        if given.len() > MAX_TOKEN_LEN {
            return None;
        }
        let (id, encoded) = given.strip_prefix(PING_VERSION)?.split_once('.')?;
        let job_id: i64 = id.parse().ok()?;
        let tag = URL_SAFE_NO_PAD.decode(encoded).ok()?;
        self.ping_mac(job_id).verify_slice(&tag).ok()?;
        Some(job_id)
    }

    fn ping_mac(&self, job_id: i64) -> HmacSha256 {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        // Another message than an attempt's `{id}:{token}`, so no token opens the other kind.
        mac.update(format!("ping:{job_id}").as_bytes());
        mac
    }

    /// Whether `given` is the token of this attempt (compared in constant time).
    pub fn check(&self, attempt_id: i64, fencing_token: i64, given: &str) -> bool {
        if given.starts_with(VERSION) {
            return self.made(given) == Some((attempt_id, fencing_token));
        }
        let Some(encoded) = given.strip_prefix(VERSION_1) else {
            return false;
        };
        let Ok(tag) = URL_SAFE_NO_PAD.decode(encoded) else {
            return false;
        };
        self.mac(attempt_id, fencing_token)
            .verify_slice(&tag)
            .is_ok()
    }
}

/// What a consumer sends.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionReport {
    pub token: String,
    /// `succeeded` or `failed`.
    pub outcome: AttemptOutcome,
    #[serde(default)]
    pub message: Option<String>,
}

/// Where and with what the outcome of an attempt of run `run_id` is reported:
/// `{public url}/api/v1/runs/{id}/complete` and the attempt's token.
pub fn address(
    state: &AppState,
    run_id: i64,
    attempt_id: i64,
    fencing_token: i64,
) -> CompletionAddress {
    CompletionAddress {
        url: format!("{}/api/v1/runs/{run_id}/complete", state.public_url()),
        token: state.completion.token(attempt_id, fencing_token),
    }
}

/// Records a consumer's report about run `run` (whose attempts are `attempts`) once: the
/// token must be that of the run's latest attempt, which must still be running.
pub async fn record(
    state: &AppState,
    run: &RunRecord,
    attempts: &[AttemptRecord],
    report: CompletionReport,
) -> Result<(), ApiError> {
    let refused = || {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "bad_completion_token",
            format!("this is not the completion token of run {}", run.id),
        )
    };
    if report.token.len() > MAX_TOKEN_LEN {
        return Err(refused());
    }
    if !matches!(
        report.outcome,
        AttemptOutcome::Succeeded | AttemptOutcome::Failed
    ) {
        return Err(ApiError::invalid(
            "outcome",
            "a consumer reports succeeded or failed",
        ));
    }
    if report.message.as_ref().map_or(0, String::len) > MAX_MESSAGE_LEN {
        return Err(ApiError::invalid(
            "message",
            format!("at most {MAX_MESSAGE_LEN} bytes"),
        ));
    }
    // Only the latest attempt may be running; an earlier attempt's token is refused like any
    // other wrong token.
    let latest = attempts
        .iter()
        .max_by_key(|a| a.number)
        .filter(|a| state.completion.check(a.id, a.token, &report.token))
        .ok_or_else(refused)?;
    if latest.state != AttemptState::Running {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_completed",
            format!(
                "attempt {} of run {} is no longer waiting for its outcome",
                latest.number, run.id
            ),
        ));
    }
    if let (AttemptOutcome::Succeeded, Some(message)) = (report.outcome, &report.message) {
        // The attempt's output is what its consumer said; a failure's message is its error.
        let line = format!("{message}\n");
        state
            .store
            .append_output(
                latest.id,
                latest.token,
                &latest.worker_id,
                line.as_bytes(),
                state.config.output_cap,
            )
            .await?;
    }
    let error = match report.outcome {
        AttemptOutcome::Succeeded => None,
        _ => Some(
            report
                .message
                .unwrap_or_else(|| "the consumer reported a failure".to_string()),
        ),
    };
    let reports = [AttemptReport {
        attempt_id: latest.id,
        token: latest.token,
        worker_id: latest.worker_id.clone(),
        outcome: report.outcome,
        exit_code: None,
        http_status: None,
        error,
    }];
    let results = attempts::complete(state, &reports).await?;
    match results.first() {
        Some(result) if result.accepted => Ok(()),
        // Another report got there first (two consumers, or the timeout).
        _ => Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_completed",
            format!("run {} is no longer waiting for its outcome", run.id),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_only_its_own_attempt() {
        let key = CompletionKey([7; 32]);
        let token = key.token(41, 9001);
        assert!(token.starts_with(VERSION) && token.len() < MAX_TOKEN_LEN);
        assert!(key.check(41, 9001, &token));
        assert!(!key.check(42, 9001, &token), "another attempt");
        assert!(!key.check(41, 9002, &token), "the same run taken over");
        assert!(
            !CompletionKey([8; 32]).check(41, 9001, &token),
            "another key"
        );
        let mut forged = token.clone();
        forged.pop();
        forged.push(if token.ends_with('A') { 'B' } else { 'A' });
        assert!(!key.check(41, 9001, &forged));
        assert!(!key.check(41, 9001, ""));
        assert!(!key.check(41, 9001, token.trim_start_matches(VERSION)));
        assert_eq!(key.made(&token), Some((41, 9001)));
        assert_eq!(key.made(&forged), None);
        let moved = token.replacen("c2.41.", "c2.42.", 1);
        assert_eq!(
            key.made(&moved),
            None,
            "another attempt under this one's tag"
        );
        assert!(!key.check(42, 9001, &moved));
        assert_eq!(CompletionKey([8; 32]).made(&token), None);
    }

    #[test]
    fn a_first_version_token_is_still_taken_but_names_no_attempt() {
        let key = CompletionKey([7; 32]);
        let tag = key.mac(41, 9001).finalize().into_bytes();
        let old = format!("{VERSION_1}{}", URL_SAFE_NO_PAD.encode(tag));
        assert!(key.check(41, 9001, &old));
        assert!(!key.check(41, 9002, &old));
        assert_eq!(key.made(&old), None);
    }

    #[test]
    fn a_ping_token_names_its_job_and_nothing_else_opens() {
        let key = CompletionKey([7; 32]);
        let token = key.ping_token(41);
        assert!(token.starts_with(PING_VERSION) && token.len() < MAX_TOKEN_LEN);
        assert_eq!(key.ping_job(&token), Some(41));
        let other = token.replacen("p1.41.", "p1.42.", 1);
        assert_eq!(
            key.ping_job(&other),
            None,
            "another job under this job's tag"
        );
        assert_eq!(CompletionKey([8; 32]).ping_job(&token), None, "another key");
        assert_eq!(key.ping_job(&key.token(41, 0)), None, "a completion token");
        assert!(
            !key.check(41, 0, &token),
            "a ping token is no completion token"
        );
        for bad in ["", "p1.", "p1.41", "p1.x.AAAA", &"p".repeat(500)] {
            assert_eq!(key.ping_job(bad), None, "{bad}");
        }
    }

    #[test]
    fn nodes_with_one_secret_key_agree_on_tokens() {
        let text = SecretKey::generate();
        let a = SecretKey::from_base64(&text).expect("a key");
        let b = SecretKey::from_base64(&text).expect("a key");
        let token = CompletionKey::new(Some(&a)).token(1, 2);
        assert!(CompletionKey::new(Some(&b)).check(1, 2, &token));
        assert!(!CompletionKey::new(None).check(1, 2, &token));
    }
}
