//! The reaper: declares dead the workers that stopped heartbeating and takes their attempts'
//! leases away. Those runs go back to the queue without spending their retry budget; the
//! worker, if it is alive after all, learns at its next heartbeat and stops them.
//!
//! A worker's heartbeats are recorded in the store, so the silence the reaper reads there is a
//! worker's only while the store was taking writes. While it was not (PostgreSQL down or
//! failing over to a standby, this node cut off from it), every worker's heartbeats failed
//! with it, and judging them the moment the store is back would declare every one of them
//! dead and run all their attempts again. So the reaper judges only once it has reached the
//! store, round after round, for a whole heartbeat timeout ([`Watch`]): after this node's
//! start, after it becomes the maintenance node, and after any round that could not reach
//! the store.

use crate::AppState;
use chrono::Utc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub async fn run(state: AppState, shutdown: watch::Receiver<bool>) {
    let config = state.config.clone();
    let watch = std::sync::Mutex::new(Watch::default());
    super::every(
        config.heartbeat_interval,
        config.heartbeat_interval,
        state.maintenance.clone(),
        shutdown,
        || reap_once(&state, &watch),
    )
    .await;
}

/// Whether the reaper may judge the workers: it has reached the store in every round, with no
/// gap between rounds, since a heartbeat timeout ago. Plain data, told the time.
#[derive(Debug, Default)]
struct Watch {
    /// The first round that reached the store since the last gap or failure.
    reached_since: Option<Instant>,
    /// When the previous round ended.
    last_round: Option<Instant>,
}

impl Watch {
    /// A round begins at `now`, rounds being `interval` apart: whether it may judge, a
    /// `timeout` after the store was first reached again. A round later than two intervals
    /// after the previous one ended (the first round, or one after this node was not the
    /// maintenance node for a while) starts the wait again.
    fn may_judge(&mut self, now: Instant, interval: Duration, timeout: Duration) -> bool {
        let resumed = self
            .last_round
            .is_none_or(|last| now.saturating_duration_since(last) > interval * 2);
        if resumed {
            self.reached_since = None;
        }
        self.reached_since
            .is_some_and(|since| now.saturating_duration_since(since) >= timeout)
    }

    /// The round that began at `began` reached the store, and ended at `now`.
    fn reached(&mut self, began: Instant, now: Instant) {
        self.reached_since.get_or_insert(began);
        self.last_round = Some(now);
    }

    /// The round could not reach the store; it ended at `now`.
    fn failed(&mut self, now: Instant) {
        self.reached_since = None;
        self.last_round = Some(now);
    }
}

async fn reap_once(state: &AppState, watch: &std::sync::Mutex<Watch>) {
    let config = &state.config;
    let began = Instant::now();
    let judge = lock(watch).may_judge(began, config.heartbeat_interval, config.heartbeat_timeout);
    let now = Utc::now();
    if !judge {
        // Only whether the store answers: the workers have a timeout from then to be heard.
        match state.store.cluster_nodes(now).await {
            Ok(_) => lock(watch).reached(began, Instant::now()),
            Err(e) => {
                lock(watch).failed(Instant::now());
                tracing::debug!("reaper: the store does not answer: {e}");
            }
        }
        return;
    }
    let silent_since =
        now - chrono::Duration::from_std(config.heartbeat_timeout).unwrap_or_default();
    let outcome = match state.store.reap(silent_since, now).await {
        Ok(outcome) => {
            lock(watch).reached(began, Instant::now());
            outcome
        }
        Err(e) => {
            lock(watch).failed(Instant::now());
            tracing::error!("reaper: {e}");
            return;
        }
    };
    for worker in &outcome.dead_workers {
        tracing::warn!(%worker, "reaper: a worker missed its heartbeats and is declared dead");
        // Or `known_worker` would still let it lease and complete from memory.
        state.dispatcher.forget_worker(worker);
    }
    state
        .metrics
        .workers_declared_dead
        .inc_by(outcome.dead_workers.len() as u64);
    state
        .metrics
        .attempts_lost
        .inc_by((outcome.requeued.len() + outcome.cancelled.len()) as u64);
    if !outcome.failed.is_empty() {
        tracing::warn!(
            runs = ?outcome.failed,
            "reaper: broadcast shards failed: their worker was lost before they ran"
        );
        state.dispatcher.remove(&outcome.failed);
    }
    if outcome.requeued.is_empty() {
        return;
    }
    match state.store.queued_runs(Some(&outcome.requeued)).await {
        Ok(runs) => state.dispatcher.enqueue(runs),
        Err(e) => tracing::error!("reaper: cannot read re-queued runs: {e}"),
    }
}

fn lock(watch: &std::sync::Mutex<Watch>) -> std::sync::MutexGuard<'_, Watch> {
    // The watch holds two instants; a round that panicked left them usable.
    watch
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(300);
    const TIMEOUT: Duration = Duration::from_secs(2);

    /// Rounds every interval from `from` for `count` rounds, each reaching the store (or not,
    /// by `reaches`): whether each may judge.
    fn rounds(
        watch: &mut Watch,
        from: Instant,
        count: u32,
        reaches: impl Fn(u32) -> bool,
    ) -> Vec<bool> {
        (0..count)
            .map(|i| {
                let at = from + INTERVAL * i;
                let judge = watch.may_judge(at, INTERVAL, TIMEOUT);
                if reaches(i) {
                    watch.reached(at, at + Duration::from_millis(5));
                } else {
                    watch.failed(at + Duration::from_millis(5));
                }
                judge
            })
            .collect()
    }

    #[test]
    fn workers_are_judged_a_timeout_after_the_store_is_first_reached() {
        let mut watch = Watch::default();
        let t0 = Instant::now();
        let judged = rounds(&mut watch, t0, 10, |_| true);
        // 2 s of 300 ms rounds: the eighth round (2.1 s) is the first to judge.
        let first = judged.iter().position(|j| *j);
        assert_eq!(first, Some(7), "{judged:?}");
        assert!(judged[7..].iter().all(|j| *j));
    }

    #[test]
    fn a_store_outage_makes_the_workers_wait_a_timeout_after_it_ends() {
        let mut watch = Watch::default();
        let t0 = Instant::now();
        rounds(&mut watch, t0, 10, |_| true);
        // Rounds 10 to 19 fail (PostgreSQL failing over, 3 s): the first tries to judge and
        // finds the store gone, the others only knock. From round 20 the store answers
        // again, and no round judges before 2 s later.
        let after = t0 + INTERVAL * 10;
        let judged = rounds(&mut watch, after, 30, |i| !(0..10).contains(&i));
        assert!(judged[0], "{judged:?}");
        assert!(judged[1..17].iter().all(|j| !*j), "{judged:?}");
        assert!(judged[17..].iter().all(|j| *j), "{judged:?}");
    }

    #[test]
    fn a_gap_in_the_rounds_makes_the_workers_wait_a_timeout_again() {
        let mut watch = Watch::default();
        let t0 = Instant::now();
        rounds(&mut watch, t0, 10, |_| true);
        // Not the maintenance node for 5 s (its lease lapsed while the store was away), then
        // elected again: the store is reached at once, but the workers wait a timeout.
        let back = t0 + INTERVAL * 10 + Duration::from_secs(5);
        let judged = rounds(&mut watch, back, 10, |_| true);
        assert_eq!(judged.iter().position(|j| *j), Some(7), "{judged:?}");
    }
}
