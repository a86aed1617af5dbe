//! Whether this node's store can commit, as `/readyz` reports it, from every write transaction
//! the node attempts, whoever asked for it (the firing loop, attempt starts and completions,
//! API requests, maintenance). A failed write makes the node unready for at least [`HOLD`], and
//! then until a write commits: a write that changes nothing can commit on a full disk while
//! the ones that must grow the file fail, so a commit just after a failure proves little.
//! Failures are logged at a bounded rate with a count. The store reports every write here
//! (`sked_store::WriteObserver`); this module does no IO.

use sked_core::throttle::Throttle;
use sked_store::{StoreError, WriteObserver};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one log line per this long while writes keep failing.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// How long a failed write keeps the node unready, whatever commits meanwhile.
pub const HOLD: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct StoreHealth {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The latest failure and when it happened, until the node is ready again.
    failing: Option<(String, Instant)>,
    failures: u64,
    throttle: Throttle,
}

impl Default for StoreHealth {
    fn default() -> Self {
        StoreHealth {
            state: Mutex::new(State {
                failing: None,
                failures: 0,
                throttle: Throttle::new(LOG_EVERY),
            }),
        }
    }
}

impl StoreHealth {
    /// A write failed at `now`.
    fn write_failed(&self, error: &StoreError, now: Instant) {
        let mut state = self.lock();
        state.failing = Some((format!("a write failed: {error}"), now));
        state.failures += 1;
        if let Some(held_back) = state.throttle.admit(now) {
            if held_back == 0 {
                tracing::error!("store: a write failed: {error}");
            } else {
                tracing::error!(
                    "store: a write failed: {error} ({held_back} more failures since the last \
                     report)"
                );
            }
        }
    }

    /// A write committed at `now`: the node is ready again if the latest failure is [`HOLD`]
    /// old.
    fn write_committed(&self, now: Instant) {
        let mut state = self.lock();
        let recovered = state
            .failing
            .as_ref()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= HOLD);
        if recovered {
            state.failing = None;
            state.throttle.reset();
            tracing::info!(
                "store: writes commit again after {} failures",
                std::mem::take(&mut state.failures)
            );
        }
    }

    /// The latest failure while the node is unready because of it.
    pub fn failure(&self) -> Option<String> {
        self.lock().failing.as_ref().map(|(what, _)| what.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl WriteObserver for StoreHealth {
    fn committed(&self) {
        self.write_committed(Instant::now());
    }

    fn failed(&self, error: &StoreError) {
        self.write_failed(error, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_lasts_its_hold_and_then_until_a_write_commits() {
        let health = StoreHealth::default();
        assert_eq!(health.failure(), None);
        let full = StoreError::Database("database or disk is full".into());
        let t0 = Instant::now();
        for i in 0..3 {
            health.write_failed(&full, t0 + Duration::from_millis(i));
        }
        let failure = health.failure().unwrap_or_default();
        assert!(failure.contains("disk is full"), "{failure}");
        // A commit within the hold (one that wrote nothing, say) does not make it ready.
        health.write_committed(t0 + HOLD - Duration::from_millis(1));
        assert!(health.failure().is_some());
        // Past the hold, nothing changes until a write commits.
        assert!(health.failure().is_some());
        health.write_committed(t0 + HOLD + Duration::from_millis(2));
        assert_eq!(health.failure(), None);
        // A new failure starts a new hold.
        health.write_failed(&full, t0 + HOLD * 2);
        health.write_committed(t0 + HOLD * 2 + Duration::from_secs(1));
        assert!(health.failure().is_some());
    }
}
