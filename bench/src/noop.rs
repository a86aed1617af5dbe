//! The no-op worker: a minimal client of the HTTP worker protocol that completes every attempt
//! it leases at once, successfully. The benchmarks that run it measure sked's own cost of
//! handing out and recording runs, with nothing executed. Like `sked worker`, it polls for more
//! work while its completions are on their way.
//!
//! A worker registers at most [`MAX_SLOTS`] slots, so a larger number of slots is split
//! between several such workers.

use anyhow::{bail, Context, Result};
use serde_json::json;
use sked_core::protocol::{Completion, LeaseResponse, RegisterResponse};
use sked_core::run::AttemptOutcome;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant as Clock};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// The most slots the server accepts for one worker.
pub const MAX_SLOTS: u32 = 10_000;

/// How long one lease request waits for work (long poll).
const LEASE_WAIT_MS: u64 = 200;

/// The most completions in one report: a request body under the server's 1 MiB limit.
const REPORT_BATCH: usize = 2_000;

/// When the no-op workers stop: at `deadline`, or as soon as they have completed `enough`
/// attempts between them.
#[derive(Clone)]
pub struct Until {
    pub deadline: Clock,
    pub enough: Option<u64>,
    completed: Arc<AtomicU64>,
}

impl Until {
    pub fn deadline(deadline: Clock) -> Until {
        Until {
            deadline,
            enough: None,
            completed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Stops at `deadline`, or once `enough` attempts are completed.
    pub fn enough(deadline: Clock, enough: u64) -> Until {
        Until {
            enough: Some(enough),
            ..Until::deadline(deadline)
        }
    }

    /// Stops `limit` after `instant` (a moment of the wall clock), or once `enough` attempts
    /// are completed: for scenarios whose work all falls due at one instant.
    pub fn after_instant(instant: sked_core::Instant, limit: Duration, enough: u64) -> Until {
        let until_instant = (instant - chrono::Utc::now()).to_std().unwrap_or_default();
        Until::enough(Clock::now() + until_instant + limit, enough)
    }

    fn done(&self) -> bool {
        Clock::now() >= self.deadline
            || self
                .enough
                .is_some_and(|n| self.completed.load(Ordering::Relaxed) >= n)
    }
}

/// No-op workers with `slots` slots in all, split evenly between the nodes at `bases` (each
/// node's share split again into workers of at most [`MAX_SLOTS`]), each polling its own node.
pub fn spawn(
    http: &reqwest::Client,
    bases: &[String],
    slots: u32,
    until: &Until,
) -> JoinSet<Result<u64>> {
    let mut workers = JoinSet::new();
    let count = bases.len().max(1) as u32;
    for (i, base) in bases.iter().enumerate() {
        let mut share = slots / count + u32::from((i as u32) < slots % count);
        while share > 0 {
            let chunk = share.min(MAX_SLOTS);
            share -= chunk;
            workers.spawn(noop_worker(
                http.clone(),
                base.clone(),
                chunk,
                until.clone(),
            ));
        }
    }
    workers
}

/// Waits for the workers of [`spawn`]; returns how many attempts they completed in all.
pub async fn join(mut workers: JoinSet<Result<u64>>) -> Result<u64> {
    let mut completed = 0u64;
    while let Some(done) = workers.join_next().await {
        completed += done.context("no-op worker")??;
    }
    Ok(completed)
}

/// A worker with `slots` slots on the node at `base` that completes every attempt it leases at
/// once, until `until`; returns how many it completed.
pub async fn noop_worker(
    http: reqwest::Client,
    base: String,
    slots: u32,
    until: Until,
) -> Result<u64> {
    let resp = http
        .post(format!("{base}/api/v1/workers"))
        .json(&json!({"name": "noop", "slots": slots}))
        .send()
        .await
        .context("register")?;
    if !resp.status().is_success() {
        bail!("register: {}: {}", resp.status(), resp.text().await?);
    }
    let reg: RegisterResponse = resp.json().await.context("register")?;
    let worker = reg.worker_id;
    // Every attempt completes within its lease poll, so heartbeats carry no attempts; they only
    // keep the worker alive.
    let heartbeats = tokio::spawn({
        let (http, url) = (
            http.clone(),
            format!("{base}/api/v1/workers/{worker}/heartbeat"),
        );
        let every = Duration::from_millis(reg.heartbeat_interval_ms);
        async move {
            loop {
                let _ = http.post(&url).json(&json!({"running": []})).send().await;
                tokio::time::sleep(every).await;
            }
        }
    });
    let leased = lease_loop(&http, &base, &worker, slots, &until).await;
    heartbeats.abort();
    leased
}

async fn lease_loop(
    http: &reqwest::Client,
    base: &str,
    worker: &str,
    slots: u32,
    until: &Until,
) -> Result<u64> {
    // Completions go out on a task of their own while the next lease poll is already waiting,
    // as `sked worker` reports them: a worker that polls only after its last report commits
    // would make every instant that falls due meanwhile wait for that commit.
    let (ended, reports) = mpsc::unbounded_channel();
    let reporter = tokio::spawn(report_loop(
        http.clone(),
        format!("{base}/api/v1/workers/{worker}/complete"),
        reports,
        until.clone(),
    ));
    let leasing: Result<()> = async {
        while !until.done() {
            let lease: LeaseResponse = http
                .post(format!("{base}/api/v1/workers/{worker}/lease"))
                .json(&json!({"max": slots, "wait_ms": LEASE_WAIT_MS}))
                .send()
                .await?
                .json()
                .await
                .context("lease")?;
            if lease.attempts.is_empty() {
                continue;
            }
            let completions = lease.attempts.iter().map(|a| Completion {
                attempt_id: a.attempt_id,
                token: a.token,
                outcome: AttemptOutcome::Succeeded,
                exit_code: Some(0),
                http_status: None,
                error: None,
            });
            if ended.send(completions.collect()).is_err() {
                // The reporter stopped on an error, which joining it returns.
                break;
            }
        }
        Ok(())
    }
    .await;
    drop(ended);
    if let Err(e) = leasing {
        // The benchmark has failed: what the reporter still holds must not reach a server
        // that is being stopped, nor outlive the worker.
        reporter.abort();
        return Err(e);
    }
    reporter.await.context("the no-op worker's reporter")?
}

/// Sends the completions of `reports` to `url` until the lease loop ends, each request carrying
/// all that ended meanwhile (at most [`REPORT_BATCH`]); returns how many it sent.
async fn report_loop(
    http: reqwest::Client,
    url: String,
    mut reports: mpsc::UnboundedReceiver<Vec<Completion>>,
    until: Until,
) -> Result<u64> {
    let mut completed = 0u64;
    let mut ended: Vec<Completion> = Vec::new();
    while let Some(first) = reports.recv().await {
        ended.extend(first);
        while let Ok(more) = reports.try_recv() {
            ended.extend(more);
        }
        while !ended.is_empty() {
            let batch: Vec<Completion> = ended.drain(..ended.len().min(REPORT_BATCH)).collect();
            let resp = http
                .post(&url)
                .json(&json!({"completions": batch}))
                .send()
                .await?;
            if !resp.status().is_success() {
                bail!("complete: {}", resp.text().await?);
            }
            completed += batch.len() as u64;
            until
                .completed
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
    }
    Ok(completed)
}
