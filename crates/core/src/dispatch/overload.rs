//! Overload control: whether a worker that is eligible for a run should get more work now.
//!
//! A worker reports a stall gauge in each heartbeat: work waiting inside it (stalled attempts,
//! requests in flight to a slow target). Each report moves the worker's [`OverloadState`] by
//! [`OverloadState::observe`]; each choice asks [`OverloadControl::accepts`]. Plain values in,
//! plain values out: the dispatcher keeps the state per worker, the simulator per server.

use serde::{Deserialize, Serialize};

/// How a worker pool guards its workers against overload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overload {
    /// Every worker with a free slot is eligible, whatever its stall gauge says.
    None,
    /// A worker whose stall gauge went above `trip` gets nothing until it is back at or below
    /// `reset`: a circuit breaker with hysteresis, so a gauge near one threshold cannot flap.
    #[default]
    Breaker,
    /// A worker's share of new work shrinks while its gauge stays above `trip` and grows back
    /// while it is at or below `reset`; the lowest priorities are shed first (an adaptation of
    /// DAGOR's load shedding, driven by the stall gauge instead of a queueing time, and
    /// shedding a share of each class rather than whole classes in turn).
    Admission,
}

string_enum!(Overload {
    None => "none",
    Breaker => "breaker",
    Admission => "admission",
});

impl std::str::FromStr for Overload {
    type Err = String;

    fn from_str(s: &str) -> Result<Overload, String> {
        Overload::parse(s)
            .ok_or_else(|| format!("unknown overload policy {s:?}: {}", Overload::one_of()))
    }
}

/// The stall gauge's thresholds: above `trip` a worker is overloaded, at or below `reset` it
/// has recovered. `reset < trip`, so between the two a worker keeps the state it had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StallLimits {
    pub trip: u32,
    pub reset: u32,
}

impl StallLimits {
    /// Checks `reset < trip`, naming the field at fault.
    pub fn new(trip: u32, reset: u32) -> Result<StallLimits, String> {
        if reset >= trip {
            return Err(format!(
                "the reset threshold ({reset}) must be below the trip threshold ({trip})"
            ));
        }
        Ok(StallLimits { trip, reset })
    }
}

impl Default for StallLimits {
    /// The seed's circuit breaker tripped at 100 stalled requests; a worker here counts
    /// attempts rather than fragments of them, so its default is lower.
    fn default() -> StallLimits {
        StallLimits { trip: 8, reset: 4 }
    }
}

/// The admission level that admits every run.
pub const ADMIT_ALL: u16 = 1000;
/// How far one report at or below `reset` raises the admission level.
const ADMIT_STEP_UP: u16 = 50;

/// One worker's overload state, moved only by its reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverloadState {
    /// The breaker is open: the worker gets nothing.
    pub tripped: bool,
    /// Of [`ADMIT_ALL`], the share of priority class 0 the worker takes (class `c`: that
    /// times `2^c`).
    pub admission: u16,
}

impl Default for OverloadState {
    fn default() -> OverloadState {
        OverloadState {
            tripped: false,
            admission: ADMIT_ALL,
        }
    }
}

impl OverloadState {
    /// The state after a report of `stall`. Above `trip` the breaker opens and the admission
    /// level falls by a tenth (multiplicative decrease); at or below `reset` the breaker closes
    /// and the level climbs back by a fixed step (additive increase); in between nothing moves.
    pub fn observe(self, stall: u32, limits: StallLimits) -> OverloadState {
        if stall > limits.trip {
            OverloadState {
                tripped: true,
                admission: self.admission - self.admission.div_ceil(10),
            }
        } else if stall <= limits.reset {
            OverloadState {
                tripped: false,
                admission: (self.admission + ADMIT_STEP_UP).min(ADMIT_ALL),
            }
        } else {
            self
        }
    }
}

/// A worker pool's policy, its thresholds, and one worker's state under them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OverloadControl {
    pub policy: Overload,
    pub limits: StallLimits,
    pub state: OverloadState,
}

impl OverloadControl {
    pub fn new(policy: Overload, limits: StallLimits) -> OverloadControl {
        OverloadControl {
            policy,
            limits,
            state: OverloadState::default(),
        }
    }

    /// Takes a stall report into account.
    pub fn observe(&mut self, stall: u32) {
        self.state = self.state.observe(stall, self.limits);
    }

    /// Whether the worker should get a run of `priority` now. `draw` is any random number:
    /// under `admission` the worker takes a run of priority class `c` (0 to 9) with
    /// probability `level × 2^c` (at most 1), so the lowest class is shed first, and each
    /// class above it only once the level is half as high.
    pub fn accepts(&self, priority: i32, draw: u64) -> bool {
        match self.policy {
            Overload::None => true,
            Overload::Breaker => !self.state.tripped,
            Overload::Admission => {
                let class = priority.clamp(0, 9) as u32;
                (u64::from(self.state.admission) << class) > draw % u64::from(ADMIT_ALL)
            }
        }
    }

    /// Whether some draw would let a run of `priority` through now.
    pub fn admits_any(&self, priority: i32) -> bool {
        match self.policy {
            Overload::None => true,
            Overload::Breaker => !self.state.tripped,
            Overload::Admission => {
                let class = priority.clamp(0, 9) as u32;
                (u64::from(self.state.admission) << class) > 0
            }
        }
    }

    /// Over its thresholds: what a waiting run's reason says of this worker.
    pub fn overloaded(&self) -> bool {
        match self.policy {
            Overload::None => false,
            Overload::Breaker => self.state.tripped,
            Overload::Admission => self.state.admission < ADMIT_ALL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{prop_assert, prop_assert_eq, proptest};

    #[test]
    fn the_breaker_opens_above_trip_and_closes_only_at_reset() {
        let mut control = OverloadControl::new(Overload::Breaker, StallLimits::new(10, 5).unwrap());
        assert!(control.accepts(0, 0));
        control.observe(10);
        assert!(control.accepts(0, 0), "at the threshold is not over it");
        control.observe(11);
        assert!(!control.accepts(9, 0), "open for every priority");
        control.observe(6);
        assert!(
            !control.accepts(0, 0),
            "between the thresholds it stays open"
        );
        control.observe(5);
        assert!(control.accepts(0, 0));
        control.observe(9);
        assert!(
            control.accepts(0, 0),
            "between the thresholds it stays closed"
        );
    }

    #[test]
    fn admission_sheds_low_priorities_first_and_recovers() {
        let mut control =
            OverloadControl::new(Overload::Admission, StallLimits::new(10, 5).unwrap());
        let admitted = |c: &OverloadControl, priority| {
            (0..u64::from(ADMIT_ALL))
                .filter(|draw| c.accepts(priority, *draw))
                .count()
        };
        assert_eq!(admitted(&control, 0), 1000);
        for _ in 0..3 {
            control.observe(50);
        }
        // 1000 → 900 → 810 → 729: a share of the lowest class is shed, none of the others.
        assert_eq!(control.state.admission, 729);
        assert_eq!(admitted(&control, 0), 729);
        assert_eq!(admitted(&control, 1), 1000);
        assert!(control.overloaded());
        for _ in 0..10 {
            control.observe(50);
        }
        // 729 → ... → 252: class 0 gets a quarter, class 1 half, class 2 all.
        assert_eq!(control.state.admission, 252);
        assert_eq!(admitted(&control, 0), 252);
        assert_eq!(admitted(&control, 1), 504);
        assert_eq!(admitted(&control, 2), 1000);
        assert!(control.admits_any(0));
        for _ in 0..200 {
            control.observe(50);
        }
        assert_eq!(
            control.state.admission, 0,
            "down to nothing while it stays over"
        );
        assert!(!control.admits_any(9));
        assert_eq!(admitted(&control, 9), 0);
        for _ in 0..20 {
            control.observe(0);
        }
        assert_eq!(control.state.admission, ADMIT_ALL);
        assert_eq!(admitted(&control, 0), 1000);
        assert!(!control.overloaded());
    }

    /// A refused name lists every accepted one, from the same table `parse` reads.
    #[test]
    fn an_unknown_policy_is_refused_with_the_names_it_could_be() {
        let refused = "circuit".parse::<Overload>().unwrap_err();
        assert_eq!(
            refused,
            r#"unknown overload policy "circuit": none, breaker or admission"#
        );
        let refused = "fastest".parse::<crate::dispatch::Strategy>().unwrap_err();
        assert!(
            refused.ends_with("least_loaded, affinity, round_robin, random or consistent_hash"),
            "{refused}"
        );
        for &policy in Overload::ALL {
            assert_eq!(policy.as_str().parse::<Overload>(), Ok(policy));
        }
    }

    proptest! {
        /// `admits_any` says whether some draw would be accepted.
        #[test]
        fn admits_any_agrees_with_accepts(
            level in 0u16..=ADMIT_ALL, tripped in proptest::bool::ANY, priority in -20i32..20,
        ) {
            for &policy in Overload::ALL {
                let mut control = OverloadControl::new(policy, StallLimits::default());
                control.state = OverloadState { tripped, admission: level };
                let some = (0..u64::from(ADMIT_ALL)).any(|d| control.accepts(priority, d));
                prop_assert_eq!(control.admits_any(priority), some);
            }
        }
    }

    #[test]
    fn none_ignores_the_gauge() {
        let mut control = OverloadControl::new(Overload::None, StallLimits::default());
        control.observe(u32::MAX);
        assert!(control.accepts(0, 0));
        assert!(!control.overloaded());
    }

    #[test]
    fn limits_must_leave_a_gap() {
        assert!(StallLimits::new(5, 5).is_err());
        assert!(StallLimits::new(5, 6).is_err());
        assert!(StallLimits::new(5, 4).is_ok());
        assert_eq!("breaker".parse::<Overload>(), Ok(Overload::Breaker));
        assert!("dagor".parse::<Overload>().is_err());
    }

    proptest! {
        /// The breaker changes state only by crossing a threshold, never between them: a gauge
        /// wandering inside (reset, trip] cannot make it flap.
        #[test]
        fn the_breaker_never_flaps_between_thresholds(
            reset in 0u32..50, gap in 1u32..50,
            reports in proptest::collection::vec(0u32..120, 1..200),
        ) {
            let limits = StallLimits::new(reset + gap, reset).unwrap();
            let mut state = OverloadState::default();
            for stall in reports {
                let next = state.observe(stall, limits);
                if next.tripped != state.tripped {
                    let crossed = if next.tripped { stall > limits.trip } else { stall <= limits.reset };
                    prop_assert!(crossed, "changed at {}", stall);
                }
                prop_assert!(next.admission <= ADMIT_ALL);
                state = next;
            }
        }
    }
}
