//! The broker executor: publishes a broker target's message through this worker's connection
//! of that name (`sked worker --broker`) and succeeds only on the broker's confirm, as the
//! server's publisher does for jobs routed to no labels. With `await_completion`, the
//! confirmed message's consumer reports the outcome and the attempt waits for it. Owns one
//! publish's lifetime, bounded by the attempt's timeout and its stop signal; the broker
//! protocols are `sked_broker`'s. A Celery target with `await_result` is followed in its
//! result backend after the confirm, and revoked when it times out or the worker stops it.

use super::{await_report, expire, human, ExecOptions, ExecResult, StopSignal};
use crate::output::OutputBuffer;
use sked_broker::Brokers;
use sked_core::protocol::{LeasedAttempt, DEFAULT_AWAIT_TIMEOUT};
use sked_core::AttemptOutcome;
use std::time::Duration;

/// Publishes the attempt's message and returns how the attempt ended.
pub async fn run(
    brokers: &Brokers,
    attempt: &LeasedAttempt,
    options: &ExecOptions,
    mut stop: StopSignal,
    output: &OutputBuffer,
) -> ExecResult {
    let started = tokio::time::Instant::now();
    let run = attempt.run_context();
    let connection = attempt
        .target
        .destination()
        .map_or("", |d| d.connection)
        .to_string();
    let limit = attempt.publish_limit();
    let published = tokio::select! {
        published = brokers.publish(&attempt.target, &run) => published,
        () = expire(Some(limit)) => {
            let limit = human(limit);
            output.write(format!("[sked-worker: no confirm within {limit}]\n").as_bytes());
            return ExecResult::ended(
                AttemptOutcome::TimedOut,
                format!("no confirm from the broker within {limit}"),
            );
        }
        () = stop.requested() => {
            output.write(b"[sked-worker: stopped]\n");
            return ExecResult::ended(AttemptOutcome::Cancelled, "stopped by the worker");
        }
    };
    match published {
        Ok(()) if attempt.completion.is_some() => {
            let taken = format!("published through connection {connection}");
            await_report(&taken, options, started, stop, output).await
        }
        Ok(()) if sked_core::celery::follows_result(&attempt.target).is_some() => {
            output.write(
                format!("[sked-worker: published through connection {connection}; following the task's result]\n")
                    .as_bytes(),
            );
            follow(brokers, attempt, started, stop, output).await
        }
        Ok(()) => {
            output.write(
                format!("[sked-worker: published through connection {connection}]\n").as_bytes(),
            );
            ExecResult {
                outcome: AttemptOutcome::Succeeded,
                exit_code: None,
                http_status: None,
                error: None,
            }
        }
        Err(e) => {
            let message = format!("connection {connection}: {e}");
            output.write(format!("[sked-worker: {message}]\n").as_bytes());
            ExecResult::failed(message)
        }
    }
}

/// Follows a confirmed Celery task in its result backend until it ends, the attempt's timeout
/// passes, or the worker is told to stop; the last two revoke the task.
async fn follow(
    brokers: &Brokers,
    attempt: &LeasedAttempt,
    started: tokio::time::Instant,
    mut stop: StopSignal,
    output: &OutputBuffer,
) -> ExecResult {
    let Some(celery) = sked_core::celery::follows_result(&attempt.target) else {
        return ExecResult::failed("not a Celery target that awaits its result");
    };
    let run = attempt.run_context();
    let limit = attempt
        .timeout_ms
        .map_or(DEFAULT_AWAIT_TIMEOUT, Duration::from_millis)
        .saturating_sub(started.elapsed());
    let followed = brokers
        .follow_celery_until(celery, &run, limit, stop.requested())
        .await;
    let (outcome, error) = followed.outcome();
    let said = error.as_deref().unwrap_or("no error");
    output.write(format!("[sked-worker: the task ended {outcome}: {said}]\n").as_bytes());
    ExecResult {
        outcome,
        exit_code: None,
        http_status: None,
        error,
    }
}
