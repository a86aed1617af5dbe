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
    /// while it is at or below `reset`; the lowest priorities are shed first (DAGOR's load
    /// shedding, driven by the stall gauge instead of a queueing time).
    Admission,
}

impl Overload {
    pub const ALL: [Overload; 3] = [Overload::None, Overload::Breaker, Overload::Admission];

    pub fn name(self) -> &'static str {
        match self {
            Overload::None => "none",
            Overload::Breaker => "breaker",
            Overload::Admission => "admission",
        }
    }
}

impl std::str::FromStr for Overload {
    type Err = String;

    fn from_str(s: &str) -> Result<Overload, String> {
        Overload::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| format!("unknown overload policy {s:?}: none, breaker or admission"))
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
    /// Of [`ADMIT_ALL`], how much of the priority range the worker admits.
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
    /// under `admission` it spreads the shedding over the runs of one priority, as DAGOR's
    /// user priority does.
    pub fn accepts(&self, priority: i32, draw: u64) -> bool {
        match self.policy {
            Overload::None => true,
            Overload::Breaker => !self.state.tripped,
            Overload::Admission => {
                // Ranks 0..1000: the priority class (clamped to 0..=9) in hundreds, the draw
                // below it. The level admits the top `admission` ranks.
                let class = priority.clamp(0, 9) as u16;
                let rank = class * 100 + (draw % 100) as u16;
                rank >= ADMIT_ALL - self.state.admission
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
    use proptest::prelude::{prop_assert, proptest};

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
            (0..100u64)
                .filter(|draw| c.accepts(priority, *draw))
                .count()
        };
        assert_eq!(admitted(&control, 0), 100);
        for _ in 0..3 {
            control.observe(50);
        }
        // 1000 → 900 → 810 → 729: ranks from 271 up are admitted.
        assert_eq!(control.state.admission, 729);
        assert_eq!(admitted(&control, 0), 0, "priority 0 is shed first");
        assert_eq!(admitted(&control, 2), 29, "priority 2 in part");
        assert_eq!(
            admitted(&control, 9),
            100,
            "high priority still goes through"
        );
        assert!(control.overloaded());
        for _ in 0..6 {
            control.observe(0);
        }
        assert_eq!(control.state.admission, ADMIT_ALL);
        assert_eq!(admitted(&control, 0), 100);
        assert!(!control.overloaded());
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
