//! Starting the attempts of a dispatcher handout and recording their outcomes: what the worker
//! protocol's lease and complete do for an external worker, and what the server's publisher
//! does for itself. One path, so an attempt is fenced, counted and re-queued the same way
//! whoever executes it.

use crate::api::error::log_throttled;
use crate::api::ApiError;
use crate::dispatch::Handout;
use crate::secrets::{open_target, Binding};
use crate::AppState;
use chrono::Utc;
use rand::Rng;
use sked_core::protocol::{lease_renewal_slack, CompletionResult, LeasedAttempt};
use sked_core::run::RunState;
use sked_core::throttle::Throttle;
use sked_store::{
    AttemptReport, AttemptStart, CompletionEffect, FlowClaim, LeaseRenewal, NotStarted, QueuedRun,
    SecretName,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

/// When a lease handed out now expires unless a heartbeat extends it.
pub fn lease_until(state: &AppState) -> sked_core::Instant {
    Utc::now() + chrono::Duration::from_std(state.config.heartbeat_timeout).unwrap_or_default()
}

/// How a heartbeat received now extends leases: to [`lease_until`], except those that still
/// end no earlier than the slack of [`lease_renewal_slack`] before it (an attempt started
/// within the last second, with the defaults), so that a worker holding thousands of short
/// attempts does not have each rewritten at every beat, and a lease left alone still outlasts
/// the worker's own fence.
pub fn lease_renewal(state: &AppState) -> LeaseRenewal {
    let until = lease_until(state);
    let slack = lease_renewal_slack(
        state.config.heartbeat_timeout,
        state.config.heartbeat_interval,
    );
    LeaseRenewal {
        until,
        renew_before: until - chrono::Duration::from_std(slack).unwrap_or_default(),
    }
}

/// Attempts started before this that a heartbeat does not list never reached their worker: a
/// lease answer goes out within milliseconds, and a heartbeat interval plus a second leaves room
/// for the heartbeat that crossed it and for clocks of different nodes.
pub fn forgotten_before(state: &AppState, now: sked_core::Instant) -> sked_core::Instant {
    now - chrono::Duration::from_std(state.config.heartbeat_interval).unwrap_or_default()
        - chrono::Duration::seconds(1)
}

/// Starts an attempt of every run of `handout` for `worker_id`, and returns those that started
/// (a run cancelled or deleted while it waited has none), their secrets opened.
pub async fn start(
    state: &AppState,
    worker_id: &str,
    handout: Handout<'_>,
) -> Result<Vec<LeasedAttempt>, ApiError> {
    // Read before the attempts start: if the store cannot answer, the runs go back in line.
    let namespace_secrets = referenced_secrets(state, handout.runs()).await?;
    let now = Utc::now();
    let expires = lease_until(state);
    let starts: Vec<AttemptStart> = {
        let mut rng = rand::thread_rng();
        handout
            .runs()
            .iter()
            .map(|run| AttemptStart {
                run_id: run.run_id,
                worker_id: worker_id.to_string(),
                token: rng.gen_range(1..i64::MAX),
                lease_expires_at: expires,
                flow: (!run.gates.is_empty()).then(|| FlowClaim {
                    namespace: run.namespace.clone(),
                    job: run.job.clone(),
                    gates: run.gates.clone(),
                }),
            })
            .collect()
    };
    // Dropped before this (the request went away, or starting failed), the handout puts its
    // runs back in line.
    let started = state
        .metrics
        .store_call("start_attempts", state.store.start_attempts(&starts, now))
        .await?;
    let runs = handout.started();
    // A store that answered late (a frozen connection, a stalled database) may have answered
    // after this worker's heartbeats ended these attempts as never received (see
    // `forgotten_before`): handed out now they would run beside the attempts that replace
    // them. Kept back, they end by that same path, and their runs are queued again.
    let took = Utc::now() - now;
    if now - took < forgotten_before(state, now) {
        // Runs a flow gate held were not started: they wait where they would have.
        let held: Vec<_> = runs
            .into_iter()
            .zip(started)
            .filter_map(|(run, started)| match started {
                Err(NotStarted::Held(hold)) => Some((run, hold)),
                _ => None,
            })
            .collect();
        state.dispatcher.hold_back(worker_id, held);
        tracing::warn!(
            worker = worker_id,
            "the store took {} ms to start {} attempts, too long for the worker to get them \
             safely; they are left to end unreceived and their runs to be queued again",
            took.num_milliseconds(),
            starts.len()
        );
        return Ok(Vec::new());
    }
    let mut attempts = Vec::with_capacity(runs.len());
    let mut held = Vec::new();
    let mut keyed = Vec::new();
    for ((run, start), started) in runs.into_iter().zip(starts).zip(started) {
        let started = match started {
            Ok(started) => started,
            // Cancelled, deleted or started elsewhere while it waited: nothing to run.
            Err(NotStarted::NotQueued) => continue,
            Err(NotStarted::Held(hold)) => {
                state.metrics.flow_held(&run.namespace, &hold);
                held.push((run, hold));
                continue;
            }
        };
        if !run.gates.concurrency.is_empty() {
            keyed.push((started.attempt_id, run.namespace.clone(), run.gates.clone()));
        }
        state
            .metrics
            .started(&run.namespace, now - run.scheduled_for);
        // Secrets are opened here, for this attempt only; one that cannot be opened stays
        // sealed and the worker fails the attempt naming it.
        let mut target = run.target;
        let secret_headers = target.secret_headers();
        let refs: BTreeMap<&str, &str> = namespace_secrets
            .iter()
            .filter(|((namespace, _), _)| *namespace == run.namespace)
            .map(|((_, name), sealed)| (name.as_str(), sealed.as_str()))
            .collect();
        let binding = Binding::Job {
            namespace: &run.namespace,
            job: &run.job,
        };
        if let Err(e) = open_target(
            state.config.secret_key.as_ref(),
            binding,
            &mut target,
            &refs,
        ) {
            // A node given the wrong key meets this on every run of such a job.
            static UNOPENED: Mutex<Throttle> = Mutex::new(Throttle::new(Duration::from_secs(1)));
            let (run_id, job) = (run.run_id, &run.job);
            log_throttled(&UNOPENED, format_args!("run {run_id} of job {job}: {e}"));
        }
        let completion = target.awaits_completion().then(|| {
            crate::completion::address(state, run.run_id, started.attempt_id, start.token)
        });
        attempts.push(LeasedAttempt {
            completion,
            attempt_id: started.attempt_id,
            token: start.token,
            run_id: run.run_id,
            attempt: started.number,
            namespace: run.namespace,
            job: run.job,
            scheduled_for: run.scheduled_for,
            target,
            timeout_ms: run.timeout.map(|t| t.as_millis() as u64),
            event: run.event,
            affinity_key: run.routing.affinity_key,
            shard: run.shard,
            secret_headers,
            params: run.params.unwrap_or_default(),
            traceparent: state.run_traces.map(|traces| {
                traces.traceparent(run.run_id, run.trace_parent.as_deref(), started.attempt_id)
            }),
        });
    }
    state.dispatcher.hold_back(worker_id, held);
    state.dispatcher.keys_held(
        keyed
            .iter()
            .map(|(attempt_id, namespace, gates)| (*attempt_id, namespace.as_str(), gates)),
    );
    state.metrics.attempts_started.inc_by(attempts.len() as u64);
    state.dispatcher.started(
        worker_id,
        attempts
            .iter()
            .map(|a| (a.attempt_id, a.namespace.as_str())),
    );
    Ok(attempts)
}

/// The sealed values of the namespace secrets that `runs` refer to.
async fn referenced_secrets(
    state: &AppState,
    runs: &[QueuedRun],
) -> Result<BTreeMap<SecretName, String>, ApiError> {
    let wanted: BTreeSet<SecretName> = runs
        .iter()
        .flat_map(|run| {
            run.target
                .secret_refs()
                .map(|name| (run.namespace.clone(), name.to_string()))
        })
        .collect();
    let wanted: Vec<SecretName> = wanted.into_iter().collect();
    Ok(state.store.sealed_secrets(&wanted).await?)
}

/// Records the outcome of attempts (fenced by each one's token and worker), counts them, and
/// hands runs queued again (retries, released waiting runs) back to the dispatcher.
pub async fn complete(
    state: &AppState,
    reports: &[AttemptReport],
) -> Result<Vec<CompletionResult>, ApiError> {
    let now = Utc::now();
    let effects = state
        .metrics
        .store_call(
            "complete_attempts",
            state.store.complete_attempts(reports, now),
        )
        .await?;
    let mut requeued = Vec::new();
    let mut retries = 0;
    let mut results = Vec::with_capacity(effects.len());
    for (report, effect) in reports.iter().zip(effects) {
        results.push(match effect {
            CompletionEffect::Accepted {
                requeued: ids,
                run_state,
                namespace,
                started_at,
                job_label,
                ..
            } => {
                state.metrics.attempt_ended(
                    &namespace,
                    job_label.as_deref(),
                    report.outcome,
                    now - started_at,
                    run_state,
                );
                if run_state == RunState::Queued {
                    retries += 1;
                }
                requeued.extend(ids);
                CompletionResult {
                    attempt_id: report.attempt_id,
                    accepted: true,
                    reason: None,
                }
            }
            CompletionEffect::Rejected { reason } => CompletionResult {
                attempt_id: report.attempt_id,
                accepted: false,
                reason: Some(reason),
            },
        });
    }
    let accepted = results.iter().filter(|r| r.accepted).count() as u64;
    state.metrics.completions_accepted.inc_by(accepted);
    state.metrics.retries.inc_by(retries);
    state
        .metrics
        .completions_rejected
        .inc_by(results.len() as u64 - accepted);
    if !requeued.is_empty() {
        state
            .dispatcher
            .enqueue(state.store.queued_runs(Some(&requeued)).await?);
    }
    Ok(results)
}
