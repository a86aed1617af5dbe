//! Rate limits as GCRA, the generic cell rate algorithm: one number per key, its *theoretical
//! arrival time* (TAT), says when the key is next due if runs came exactly at the rate. A run
//! may start when starting it now keeps the TAT within the burst's tolerance of now; starting
//! moves the TAT on by one emission interval. It is a token bucket stated as one timestamp, so
//! the store keeps a single row per key and two nodes serialize on that row alone.

use crate::duration::HumanDuration;
use serde::{Deserialize, Serialize};

/// `limit` starts per `per`, with up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    pub limit: u32,
    pub per: HumanDuration,
    /// How many may start back to back (1 when absent: starts spaced evenly, so no window of
    /// length `per` ever holds more than `limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

pub const MAX_RATE_LIMIT: u32 = 1_000_000;
pub const MAX_BURST: u32 = 100_000;
pub const MAX_PER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl Rate {
    pub fn validate(&self, field: &str) -> Result<(), crate::SpecError> {
        if !(1..=MAX_RATE_LIMIT).contains(&self.limit) {
            return Err(crate::SpecError::new(
                format!("{field}.limit"),
                format!("must be 1 to {MAX_RATE_LIMIT}"),
            ));
        }
        if self.per.0.is_zero() || self.per.0 > MAX_PER {
            return Err(crate::SpecError::new(
                format!("{field}.per"),
                "must be between 1ms and 1 day",
            ));
        }
        if self.per.0.as_micros() < u128::from(self.limit) {
            return Err(crate::SpecError::new(
                format!("{field}.per"),
                "is shorter than one microsecond per start",
            ));
        }
        if let Some(burst) = self.burst {
            if !(1..=MAX_BURST).contains(&burst) {
                return Err(crate::SpecError::new(
                    format!("{field}.burst"),
                    format!("must be 1 to {MAX_BURST}"),
                ));
            }
        }
        Ok(())
    }

    /// The emission interval, in microseconds: `per / limit`, rounded up so that the rate
    /// is never exceeded.
    pub fn interval_us(&self) -> i64 {
        let per = i64::try_from(self.per.0.as_micros()).unwrap_or(i64::MAX / 2);
        let limit = i64::from(self.limit.max(1));
        ((per + limit - 1) / limit).max(1)
    }

    /// How far ahead of now the TAT may be and a start still pass.
    fn tolerance_us(&self) -> i64 {
        self.interval_us()
            .saturating_mul(i64::from(self.burst.unwrap_or(1).max(1) - 1))
    }

    /// Whether a run may start at `now_us` when the key's TAT is `tat_us` (`None`: never
    /// used). `Ok(new TAT)` if it may; `Err(earliest start)` if it must wait.
    pub fn admit(&self, tat_us: Option<i64>, now_us: i64) -> Result<i64, i64> {
        let tat = tat_us.map_or(now_us, |t| t.max(now_us));
        let tolerance = self.tolerance_us();
        if tat - now_us > tolerance {
            Err(tat - tolerance)
        } else {
            Ok(tat.saturating_add(self.interval_us()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rate(limit: u32, per_ms: u64, burst: Option<u32>) -> Rate {
        Rate {
            limit,
            per: HumanDuration(std::time::Duration::from_millis(per_ms)),
            burst,
        }
    }

    #[test]
    fn without_a_burst_starts_are_spaced_by_the_interval() {
        let r = rate(10, 1000, None);
        let tat = r.admit(None, 0).unwrap();
        assert_eq!(tat, 100_000);
        assert_eq!(
            r.admit(Some(tat), 50_000),
            Err(100_000),
            "the next start waits"
        );
        assert_eq!(r.admit(Some(tat), 100_000), Ok(200_000));
    }

    #[test]
    fn a_burst_lets_that_many_start_at_once_then_the_rate_holds() {
        let r = rate(10, 1000, Some(5));
        let mut tat = None;
        for _ in 0..5 {
            tat = Some(r.admit(tat, 0).unwrap());
        }
        assert_eq!(r.admit(tat, 0), Err(100_000));
    }

    proptest! {
        /// Whatever the arrivals, no window of length `per` holds more than `limit + burst - 1`
        /// starts, and a run refused is told a moment at which it is admitted.
        #[test]
        fn no_window_holds_more_than_the_rate_allows(
            limit in 1u32..20,
            per_ms in 1u64..2000,
            burst in proptest::option::of(1u32..6),
            gaps in proptest::collection::vec(0i64..200_000, 1..300),
        ) {
            let r = rate(limit, per_ms, burst);
            let (mut tat, mut now, mut starts) = (None, 0i64, Vec::new());
            for gap in gaps {
                now += gap;
                match r.admit(tat, now) {
                    Ok(next) => { tat = Some(next); starts.push(now); }
                    Err(at) => {
                        prop_assert!(at > now);
                        prop_assert!(r.admit(tat, at).is_ok());
                    }
                }
            }
            let per = i64::try_from(per_ms * 1000).unwrap();
            let allowed = (limit + burst.unwrap_or(1) - 1) as usize;
            for (i, &s) in starts.iter().enumerate() {
                let within = starts[i..].iter().take_while(|&&t| t < s + per).count();
                prop_assert!(within <= allowed, "{within} starts in one window, {allowed} allowed");
            }
        }
    }
}
