//! Whether this node's store can commit, as `/readyz` reports it: the outcome of the latest
//! write the node attempted (ledger writes of the firing loop, attempt starts, completions).
//! A failing write makes the node unready until a write succeeds again, and the failures are
//! logged at a bounded rate with a count. Writers report here; this module does no IO.

use sked_core::throttle::Throttle;
use sked_store::StoreError;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one log line per this long while writes keep failing.
const LOG_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct StoreHealth {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The latest failure while writes fail; `None` once one succeeded.
    failing: Option<String>,
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
    /// A write (`what`, e.g. "ledger write") failed.
    pub fn write_failed(&self, what: &str, error: &StoreError) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.failing = Some(format!("{what} failed: {error}"));
        state.failures += 1;
        if let Some(held_back) = state.throttle.admit(Instant::now()) {
            if held_back == 0 {
                tracing::error!("store: {what} failed: {error}");
            } else {
                tracing::error!(
                    "store: {what} failed: {error} ({held_back} more failures since the last \
                     report)"
                );
            }
        }
    }

    /// A write committed: the store can commit again.
    pub fn write_succeeded(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.failing.take().is_some() {
            state.throttle.reset();
            tracing::info!(
                "store: writes commit again after {} failures",
                std::mem::take(&mut state.failures)
            );
        }
    }

    /// The latest failure while writes fail.
    pub fn failure(&self) -> Option<String> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.failing.clone()
    }

    /// Reports `result` of a write and passes it on.
    pub fn report<T>(&self, what: &str, result: Result<T, StoreError>) -> Result<T, StoreError> {
        match &result {
            Ok(_) => self.write_succeeded(),
            Err(e) => self.write_failed(what, e),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_lasts_until_a_write_succeeds() {
        let health = StoreHealth::default();
        assert_eq!(health.failure(), None);
        let full = StoreError::Database("database or disk is full".into());
        for _ in 0..3 {
            health.write_failed("ledger write", &full);
        }
        let failure = health.failure().unwrap_or_default();
        assert!(failure.contains("disk is full"), "{failure}");
        assert!(health.report("completion", Ok(())).is_ok());
        assert_eq!(health.failure(), None);
    }
}
