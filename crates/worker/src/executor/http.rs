//! The HTTP executor: sends an `HttpTarget`'s request with the run's `X-Sked-*` headers,
//! judges the status against `expected_status` (any 2xx by default), and writes the start of
//! the response body (capped) to the output. Owns one request's lifetime, bounded by the
//! attempt's timeout and its stop signal; it must not speak the worker protocol. With
//! `callback`, a success only means the endpoint took the work: the attempt then waits for
//! the endpoint's report to reach the server, which ends it. What the
//! request may reach is the [`TargetClient`]'s to enforce; a refusal ends the attempt `failed`
//! saying why.

use super::{await_report, expire, human, ExecOptions, ExecResult, RunInfo, StopSignal};
use crate::error_chain;
use crate::output::OutputBuffer;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Request, Url};
use sked_core::protocol::{
    HEADER_ATTEMPT, HEADER_EVENT_ID, HEADER_EVENT_KEY, HEADER_JOB, HEADER_RUN_ID,
    HEADER_SCHEDULED_FOR, HEADER_SHARD, HEADER_SHARDS, HEADER_TRACEPARENT,
};
use sked_core::publish::{HEADER_COMPLETE_TOKEN, HEADER_COMPLETE_URL};
use sked_core::target::HttpTarget;
use sked_core::AttemptOutcome;
use sked_egress::{refusal_behind, SendError, TargetClient};
use std::time::Duration;

/// Sends the request and returns how the attempt ended.
pub async fn run(
    client: &TargetClient,
    target: &HttpTarget,
    info: &RunInfo,
    options: &ExecOptions,
    mut stop: StopSignal,
    output: &OutputBuffer,
) -> ExecResult {
    let (request, secret) = match build(client, target, info) {
        Ok(request) => request,
        Err(message) => {
            output.write(format!("[sked-worker: {message}]\n").as_bytes());
            return ExecResult::failed(message);
        }
    };
    let started = tokio::time::Instant::now();
    let limit = shorter(options.timeout, target.timeout.map(|t| t.0));
    tokio::select! {
        result = exchange(client, request, &secret, options.http_body_cap, output) => match result {
            Ok(status) if target.status_is_expected(status) && target.callback => {
                let waiting = format!("HTTP {status}");
                ExecResult {
                    http_status: Some(status),
                    ..await_report(&waiting, options, started, stop, output).await
                }
            }
            Ok(status) if target.status_is_expected(status) => ExecResult {
                outcome: AttemptOutcome::Succeeded,
                exit_code: None,
                http_status: Some(status),
                error: None,
            },
            Ok(status) => ExecResult {
                http_status: Some(status),
                ..ExecResult::failed(format!("unexpected HTTP status {status}"))
            },
            Err(e) => {
                let message = failure(&e);
                output.write(format!("[sked-worker: {message}]\n").as_bytes());
                ExecResult::failed(message)
            }
        },
        () = expire(limit) => {
            let limit = human(limit.unwrap_or_default());
            output.write(format!("\n[sked-worker: timed out after {limit}]\n").as_bytes());
            ExecResult::ended(AttemptOutcome::TimedOut, format!("timed out after {limit}"))
        }
        () = stop.requested() => {
            output.write(b"\n[sked-worker: stopped]\n");
            ExecResult::ended(AttemptOutcome::Cancelled, "stopped by the worker")
        }
    }
}

/// Why the request failed; a refusal of the HTTP target policy in its own words.
fn failure(e: &SendError) -> String {
    match e {
        SendError::Http(e) => match refusal_behind(e) {
            Some(refused) => refused.to_string(),
            None => format!("request failed: {}", error_chain(e)),
        },
        // It names the URL that answered with the redirect.
        redirect => redirect.to_string(),
    }
}

/// The tighter of two optional limits.
fn shorter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The request, and the names of its headers that carry secrets (never sent to another origin
/// by a redirect): the target's headers the server opened for this attempt, and the
/// completion token.
fn build(
    client: &TargetClient,
    target: &HttpTarget,
    info: &RunInfo,
) -> Result<(Request, Vec<HeaderName>), String> {
    let method = Method::from_bytes(target.method.to_ascii_uppercase().as_bytes())
        .map_err(|_| format!("{:?} is not an HTTP method", target.method))?;
    let url = Url::parse(target.url.trim())
        .map_err(|e| format!("{:?} is not a valid URL: {e}", target.url))?;
    client
        .permits(&url)
        .map_err(|refused| refused.to_string())?;
    let mut headers = HeaderMap::new();
    let plain = sked_core::target::plain_values(&target.headers)
        .map_err(|(name, why)| format!("header {name} {why}"))?;
    for (name, value) in plain {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("{name:?} is not a valid header name"))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("the value of header {name} is not a valid header value"))?;
        headers.append(name, value);
    }
    // The run's own headers describe the run and win over the job's.
    let mut ours = vec![
        (HEADER_RUN_ID, info.run_id.to_string()),
        (HEADER_ATTEMPT, info.attempt.to_string()),
        (HEADER_SCHEDULED_FOR, info.scheduled_for_rfc3339()),
        (HEADER_JOB, info.job.clone()),
    ];
    if let Some(shard) = info.shard {
        ours.push((HEADER_SHARD, shard.index.to_string()));
        ours.push((HEADER_SHARDS, shard.count.to_string()));
    }
    if let Some(event) = &info.event {
        ours.push((HEADER_EVENT_KEY, event.key.clone()));
        ours.push((HEADER_EVENT_ID, event.id.clone()));
    }
    if let Some(traceparent) = &info.traceparent {
        ours.push((HEADER_TRACEPARENT, traceparent.clone()));
    }
    if let Some(completion) = info.completion.as_ref().filter(|_| target.callback) {
        ours.push((HEADER_COMPLETE_URL, completion.url.clone()));
        ours.push((HEADER_COMPLETE_TOKEN, completion.token.clone()));
    }
    for (name, value) in ours {
        let value = HeaderValue::from_str(&value)
            .map_err(|_| format!("{value:?} cannot be sent in header {name}"))?;
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("{name:?} is not a valid header name"))?;
        headers.insert(name, value);
    }
    // Without a body of its own, a run an event started sends the event's payload.
    let event_body = info.event.as_ref().filter(|_| target.body.is_none());
    if let Some(event) = event_body {
        if event.payload_is_json() && !headers.contains_key(reqwest::header::CONTENT_TYPE) {
            headers.insert(
                reqwest::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
    }
    let mut request = client.http().request(method, url).headers(headers);
    if let Some(body) = &target.body {
        request = request.body(body.clone());
    } else if let Some(event) = event_body {
        request = request.body(event.payload_text());
    }
    let request = request
        .build()
        .map_err(|e| format!("the request cannot be built: {}", error_chain(&e)))?;
    let secret = info
        .secret_headers
        .iter()
        .map(String::as_str)
        .chain([HEADER_COMPLETE_TOKEN])
        .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
        .collect();
    Ok((request, secret))
}

/// Sends the request; copies at most `cap` bytes of the body to the output.
async fn exchange(
    client: &TargetClient,
    request: Request,
    secret: &[HeaderName],
    cap: usize,
    output: &OutputBuffer,
) -> Result<u16, SendError> {
    let mut response = client.send(request, secret).await?;
    let status = response.status().as_u16();
    let mut kept = 0usize;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = cap - kept;
                if chunk.len() > room {
                    output.write(&chunk[..room]);
                    output.write(
                        format!("\n[sked-worker: response body truncated to {cap} bytes]\n")
                            .as_bytes(),
                    );
                    break;
                }
                output.write(&chunk);
                kept += chunk.len();
            }
            Ok(None) => break,
            Err(e) => {
                // The status is in: the body is only for the log.
                let message = format!(
                    "\n[sked-worker: reading the response body failed: {}]\n",
                    error_chain(&e)
                );
                output.write(message.as_bytes());
                break;
            }
        }
    }
    Ok(status)
}
