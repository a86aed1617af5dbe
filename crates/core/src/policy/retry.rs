//! Retries: how many attempts a run gets and how long to wait between them.

use crate::duration::HumanDuration;
use crate::error::SpecError;
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts that may fail before the run fails; 1 means no retry. Attempts lost with a dead
    /// worker do not count.
    #[serde(default = "one")]
    pub max_attempts: u32,
    #[serde(default)]
    pub backoff: Backoff,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    #[serde(default = "one_second")]
    pub initial: HumanDuration,
    #[serde(default = "five_minutes")]
    pub max: HumanDuration,
    #[serde(default = "two")]
    pub multiplier: f64,
    /// Spread each delay over its upper half, so retries of many runs do not arrive together.
    #[serde(default = "yes")]
    pub jitter: bool,
}

fn one() -> u32 {
    1
}
fn one_second() -> HumanDuration {
    HumanDuration::from_secs(1)
}
fn five_minutes() -> HumanDuration {
    HumanDuration::from_secs(300)
}
fn two() -> f64 {
    2.0
}
fn yes() -> bool {
    true
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: one_second(),
            max: five_minutes(),
            multiplier: two(),
            jitter: true,
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 1,
            backoff: Backoff::default(),
        }
    }
}

pub const MAX_ATTEMPTS_LIMIT: u32 = 1000;

impl RetryPolicy {
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS_LIMIT {
            return Err(SpecError::new(
                "retry.max_attempts",
                format!("must be between 1 and {MAX_ATTEMPTS_LIMIT}"),
            ));
        }
        let b = &self.backoff;
        if !(b.multiplier.is_finite() && (1.0..=100.0).contains(&b.multiplier)) {
            return Err(SpecError::new(
                "retry.backoff.multiplier",
                "must be between 1 and 100",
            ));
        }
        if b.max < b.initial {
            return Err(SpecError::new(
                "retry.backoff.max",
                "must not be less than initial",
            ));
        }
        Ok(())
    }

    /// The delay before the retry that follows `failures` counted failures (1 for the first
    /// retry). `unit_random` is uniform in [0, 1); with jitter the delay lies in the upper half
    /// of the nominal one, so delays still grow from one retry to the next.
    pub fn delay_after(&self, failures: u32, unit_random: f64) -> Duration {
        let b = &self.backoff;
        let exponent = failures.saturating_sub(1).min(64) as i32;
        let nominal = b.initial.0.as_secs_f64() * b.multiplier.powi(exponent);
        let capped = nominal.min(b.max.0.as_secs_f64());
        let secs = if b.jitter {
            capped / 2.0 + capped / 2.0 * unit_random.clamp(0.0, 1.0)
        } else {
            capped
        };
        Duration::from_secs_f64(secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_stop_at_the_cap() {
        let policy = RetryPolicy {
            max_attempts: 10,
            backoff: Backoff {
                initial: HumanDuration::from_secs(1),
                max: HumanDuration::from_secs(10),
                multiplier: 2.0,
                jitter: false,
            },
        };
        let delays: Vec<u64> = (1..=6)
            .map(|n| policy.delay_after(n, 0.5).as_secs())
            .collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn jittered_delays_still_grow() {
        let policy = RetryPolicy {
            max_attempts: 5,
            backoff: Backoff::default(),
        };
        for failures in 1..6 {
            let longest_now = policy.delay_after(failures, 0.999);
            let shortest_next = policy.delay_after(failures + 1, 0.0);
            assert!(longest_now <= shortest_next, "retry {failures}");
        }
    }

    #[test]
    fn rejects_nonsense() {
        let mut p = RetryPolicy {
            max_attempts: 0,
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "retry.max_attempts");
        p.max_attempts = 3;
        p.backoff.multiplier = f64::NAN;
        assert_eq!(p.validate().unwrap_err().field, "retry.backoff.multiplier");
    }
}
