//! How often a token may call the API: a token bucket per token (GCRA, by the governor crate),
//! refused with 429 and `Retry-After` past it. The worker protocol is left out: a worker's calls
//! are bounded by its slots and long polls, and refusing them would stall runs, not a client.

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::num::NonZeroU32;
use std::time::Duration;

/// Requests per second per token, and how many may come at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub per_second: u32,
    pub burst: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            per_second: 100,
            burst: 200,
        }
    }
}

/// Tokens are counted by id; requests of an open development server without a token share
/// one bucket.
pub struct RequestRate {
    limiter: DefaultKeyedRateLimiter<Option<i64>>,
    clock: DefaultClock,
    checks: std::sync::atomic::AtomicU64,
}

/// Buckets idle long enough to be full again are dropped this often (in checks), so a store
/// of many tokens does not keep one each forever.
const PRUNE_EVERY: u64 = 10_000;

impl RequestRate {
    /// `None` when `limit` allows nothing (zero): no limit at all.
    pub fn new(limit: RateLimit) -> Option<RequestRate> {
        let per_second = NonZeroU32::new(limit.per_second)?;
        let burst = NonZeroU32::new(limit.burst.max(limit.per_second))?;
        Some(RequestRate {
            limiter: RateLimiter::keyed(Quota::per_second(per_second).allow_burst(burst)),
            clock: DefaultClock::default(),
            checks: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// One request of `token`: `Err(wait)` when it is over its rate.
    pub fn check(&self, token: Option<i64>) -> Result<(), Duration> {
        let n = self
            .checks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n % PRUNE_EVERY == PRUNE_EVERY - 1 {
            self.limiter.retain_recent();
        }
        self.limiter
            .check_key(&token)
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_gets_its_burst_then_waits_and_others_are_not_held_up() {
        let rate = RequestRate::new(RateLimit {
            per_second: 10,
            burst: 20,
        })
        .unwrap();
        for _ in 0..20 {
            assert!(rate.check(Some(1)).is_ok());
        }
        let wait = rate.check(Some(1)).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        assert!(rate.check(Some(2)).is_ok());
        assert!(rate.check(None).is_ok());
    }

    #[test]
    fn zero_means_no_limit() {
        assert!(RequestRate::new(RateLimit {
            per_second: 0,
            burst: 0
        })
        .is_none());
    }
}
