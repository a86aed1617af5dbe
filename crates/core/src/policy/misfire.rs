//! Misfire: instants that fell due while nothing could fire them (the server was down, or a
//! partition had no owner). They are found when a schedule is loaded; each gets a ledger row, and
//! this policy says whether that row runs or is recorded as skipped (reason `misfire`).

use crate::duration::HumanDuration;
use crate::Instant;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MisfireKind {
    /// Every missed instant is recorded as skipped.
    Skip,
    /// The latest missed instant runs; the others are recorded as skipped.
    #[default]
    RunOnce,
    /// Every missed instant within `catchup_window` of now runs; older ones are skipped.
    RunAll,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MisfirePolicy {
    #[serde(default)]
    pub policy: MisfireKind,
    /// How far back `run_all` catches up (default one hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catchup_window: Option<HumanDuration>,
}

pub const DEFAULT_CATCHUP_WINDOW: HumanDuration =
    HumanDuration(std::time::Duration::from_secs(3600));

impl MisfirePolicy {
    /// Whether the missed `instant` runs. `is_latest` says it is the last instant missed before
    /// `now` (the next one is not yet due).
    pub fn runs_missed(&self, instant: Instant, is_latest: bool, now: Instant) -> bool {
        match self.policy {
            MisfireKind::Skip => false,
            MisfireKind::RunOnce => is_latest,
            MisfireKind::RunAll => {
                let window = self.catchup_window.unwrap_or(DEFAULT_CATCHUP_WINDOW);
                now - instant <= window.as_chrono()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, TimeZone, Utc};

    #[test]
    fn each_policy_decides_the_missed_instants() {
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap();
        let long_ago = now - Duration::hours(2);
        let recent = now - Duration::seconds(5);
        let skip = MisfirePolicy {
            policy: MisfireKind::Skip,
            catchup_window: None,
        };
        let once = MisfirePolicy {
            policy: MisfireKind::RunOnce,
            catchup_window: None,
        };
        let all = MisfirePolicy {
            policy: MisfireKind::RunAll,
            catchup_window: None,
        };
        assert!(!skip.runs_missed(recent, true, now));
        assert!(once.runs_missed(recent, true, now));
        assert!(!once.runs_missed(long_ago, false, now));
        assert!(all.runs_missed(recent, false, now));
        assert!(
            !all.runs_missed(long_ago, false, now),
            "outside the default one-hour window"
        );
        let wide = MisfirePolicy {
            policy: MisfireKind::RunAll,
            catchup_window: Some(HumanDuration::from_secs(3 * 3600)),
        };
        assert!(wide.runs_missed(long_ago, false, now));
    }
}
