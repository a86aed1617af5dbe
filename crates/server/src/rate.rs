//! How often a token may call the API: a token bucket per token (GCRA, by the governor crate),
//! refused with 429 and `Retry-After` past it. The worker protocol is left out: a worker's calls
//! are bounded by its slots and long polls, and refusing them would stall runs, not a client.
//! And how often a peer may be refused ([`Refusals`]): on the routes that take no API token, and
//! in authentication (`crate::auth`).

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// Pings a heartbeat job may take through its ping address: a job is pinged once a period,
/// so this only stops a leaked address from making the node write at line rate.
pub const PINGS_PER_JOB: RateLimit = RateLimit {
    per_second: 5,
    burst: 20,
};

/// Worker registrations one token may make: a pool restarting registers each worker once, so
/// even a large fleet sharing a token re-registers within seconds (a worker refused 429 tries
/// again after `Retry-After`), while a token registering at line rate is held to this.
pub const REGISTRATIONS_PER_TOKEN: RateLimit = RateLimit {
    per_second: 10,
    burst: 100,
};

/// Tokens are counted by id (or, for pings, jobs by theirs); requests of an open development
/// server without a token share one bucket.
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

/// Refused requests per peer address (a consumer's completion, a ping by address, a failed
/// authentication): past `limit` refusals within one second, the peer's further requests of
/// that kind are answered 429 before the store is read, until that second is over. So no one
/// can make the server read its store at line rate with made-up tokens; what is genuine is
/// told apart before the check and never held back.
pub struct Refusals {
    limit: u32,
    /// Each peer's current second: when it began, and the refusals in it.
    seen: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

/// Refused reports one peer may send in a second.
pub const REFUSALS_PER_SECOND: u32 = 20;
/// Peers remembered at once; past it, those whose second is over are forgotten first, and a
/// new peer beyond it is not counted (the bound is on memory, not on the peers heard).
const MAX_PEERS: usize = 10_000;
const WINDOW: Duration = Duration::from_secs(1);

impl Refusals {
    pub fn new(limit: u32) -> Refusals {
        Refusals {
            limit,
            seen: Mutex::new(HashMap::new()),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, (Instant, u32)>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `peer` may be heard at `now`: `Err(wait)` while it is over its refusals.
    pub fn check(&self, peer: IpAddr, now: Instant) -> Result<(), Duration> {
        match self.seen().get(&peer) {
            Some((start, n)) if now.duration_since(*start) < WINDOW && *n >= self.limit => {
                Err(WINDOW.saturating_sub(now.duration_since(*start)))
            }
            _ => Ok(()),
        }
    }

    /// Counts one refused report of `peer` at `now`.
    pub fn refused(&self, peer: IpAddr, now: Instant) {
        let mut seen = self.seen();
        if seen.len() >= MAX_PEERS && !seen.contains_key(&peer) {
            seen.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
            if seen.len() >= MAX_PEERS {
                return;
            }
        }
        let entry = seen.entry(peer).or_insert((now, 0));
        if now.duration_since(entry.0) >= WINDOW {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_over_its_refusals_waits_out_its_second_and_others_are_heard() {
        let refusals = Refusals::new(3);
        let t0 = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for _ in 0..3 {
            assert!(refusals.check(a, t0).is_ok());
            refusals.refused(a, t0);
        }
        let later = t0 + Duration::from_millis(400);
        assert_eq!(refusals.check(a, later), Err(Duration::from_millis(600)));
        assert!(refusals.check(b, later).is_ok());
        assert!(refusals.check(a, t0 + WINDOW).is_ok());
        refusals.refused(a, t0 + WINDOW);
        assert!(
            refusals.check(a, t0 + WINDOW).is_ok(),
            "a new second counts anew"
        );
    }

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
