//! How often a repeated failure is logged: the first of a run of failures at once, then at most
//! one per interval, each saying how many were held back since the one before. A failure that
//! repeats many times a second (a full disk) then costs a few log lines, not thousands, and
//! the count still says how often it happened. Pure: the caller passes the time.

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Throttle {
    interval: Duration,
    last_logged: Option<Instant>,
    held_back: u64,
}

impl Throttle {
    pub const fn new(interval: Duration) -> Throttle {
        Throttle {
            interval,
            last_logged: None,
            held_back: 0,
        }
    }

    /// One more failure at `now`: `Some(n)` when it is to be logged, `n` being how many were
    /// held back since the last one logged; `None` when it is to be held back.
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        let due = self
            .last_logged
            .is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if !due {
            self.held_back += 1;
            return None;
        }
        self.last_logged = Some(now);
        Some(std::mem::take(&mut self.held_back))
    }

    /// The run of failures ended: the next one is logged at once. Returns how many were held
    /// back and never reported.
    pub fn reset(&mut self) -> u64 {
        self.last_logged = None;
        std::mem::take(&mut self.held_back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_first_then_one_per_interval_with_the_count() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut throttle = Throttle::new(Duration::from_secs(1));
        assert_eq!(throttle.admit(at(0)), Some(0));
        // Ten a second, as a failing checkpoint every 100 ms would.
        let logged: Vec<_> = (1..=25)
            .filter_map(|i| throttle.admit(at(i * 100)))
            .collect();
        assert_eq!(
            logged,
            vec![9, 9],
            "at 1 s and 2 s, each after nine held back"
        );
        assert_eq!(throttle.reset(), 5, "2.1 s to 2.5 s were never reported");
        assert_eq!(
            throttle.admit(at(2600)),
            Some(0),
            "a new run starts at once"
        );
    }
}
