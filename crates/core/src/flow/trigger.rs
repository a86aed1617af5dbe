//! What a trigger or an event brings to debounce and dedup: a manual trigger's parameters and
//! their bounds, when a debounced run becomes ready, and the record of the triggers a
//! debounced run absorbed. Pure values and arithmetic; the store applies them inside the
//! transaction that records the trigger.

use super::DebounceSpec;
use crate::error::SpecError;
use crate::Instant;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most parameters one trigger may give.
pub const MAX_PARAMS: usize = 16;
/// The longest parameter name, in bytes.
pub const MAX_PARAM_NAME: usize = 64;
/// The longest parameter value, in bytes.
pub const MAX_PARAM_VALUE: usize = 1024;
/// How many absorbed triggers a debounced run keeps (the newest); its count goes on.
pub const MAX_ABSORBED_KEPT: usize = 100;

/// A manual trigger's parameters, by name.
pub type Params = BTreeMap<String, String>;

/// Checks a trigger's parameters; an error names the field (`params.NAME`).
pub fn validate_params(params: &Params) -> Result<(), SpecError> {
    if params.len() > MAX_PARAMS {
        return Err(SpecError::new(
            "params",
            format!("at most {MAX_PARAMS} parameters, not {}", params.len()),
        ));
    }
    for (name, value) in params {
        let shown: String = name.chars().take(MAX_PARAM_NAME).collect();
        if name.is_empty()
            || name.len() > MAX_PARAM_NAME
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        {
            return Err(SpecError::new(
                format!("params.{shown}"),
                format!("a parameter name is 1 to {MAX_PARAM_NAME} of A-Z, a-z, 0-9, _ and -"),
            ));
        }
        if value.len() > MAX_PARAM_VALUE {
            return Err(SpecError::new(
                format!("params.{name}"),
                format!("must be at most {MAX_PARAM_VALUE} bytes"),
            ));
        }
    }
    Ok(())
}

/// The environment variable a shell attempt finds parameter `name` in: `SKED_PARAM_` and
/// the name upper-cased, `-` as `_`.
pub fn param_env_name(name: &str) -> String {
    let mut env = String::with_capacity(11 + name.len());
    env.push_str("SKED_PARAM_");
    env.extend(name.chars().map(|c| {
        if c == '-' {
            '_'
        } else {
            c.to_ascii_uppercase()
        }
    }));
    env
}

/// When a debounced run whose burst began at `first` becomes ready, after a trigger at
/// `now`: `period` after the last trigger, and never later than `max_wait` after the first.
pub fn debounced_ready_at(spec: &DebounceSpec, first: Instant, now: Instant) -> Instant {
    let period = chrono::Duration::from_std(spec.period.0).unwrap_or(chrono::Duration::MAX);
    let max_wait = chrono::Duration::from_std(spec.max_wait()).unwrap_or(chrono::Duration::MAX);
    let after_last = now.checked_add_signed(period).unwrap_or(now);
    let latest = first.checked_add_signed(max_wait).unwrap_or(after_last);
    after_last.min(latest)
}

/// One trigger or event a debounced run absorbed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbsorbedTrigger {
    /// When it came.
    pub at: Instant,
    /// A manual trigger's parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Params>,
    /// An event's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
}

/// The triggers a debounced run absorbed: how many, and the newest
/// [`MAX_ABSORBED_KEPT`] of them, oldest first. A run with none absorbed yet has a count of 0.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Absorbed {
    pub count: u64,
    /// When its burst began: what `max_wait` counts from.
    pub first_at: Option<Instant>,
    #[serde(default)]
    pub triggers: Vec<AbsorbedTrigger>,
}

impl Absorbed {
    /// A burst that began at `first`.
    pub fn begun(first: Instant) -> Absorbed {
        Absorbed {
            count: 0,
            first_at: Some(first),
            triggers: Vec::new(),
        }
    }

    /// Counts `trigger` and keeps it, dropping the oldest kept past the bound.
    pub fn absorb(&mut self, trigger: AbsorbedTrigger) {
        self.count = self.count.saturating_add(1);
        self.triggers.push(trigger);
        if self.triggers.len() > MAX_ABSORBED_KEPT {
            let extra = self.triggers.len() - MAX_ABSORBED_KEPT;
            self.triggers.drain(..extra);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::duration::HumanDuration;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use std::time::Duration;

    fn at(ms: i64) -> Instant {
        chrono::Utc
            .timestamp_millis_opt(1_800_000_000_000 + ms)
            .unwrap()
    }

    fn spec(period_ms: u64, max_wait_ms: Option<u64>) -> DebounceSpec {
        DebounceSpec {
            key: "k".into(),
            period: HumanDuration(Duration::from_millis(period_ms)),
            max_wait: max_wait_ms.map(|m| HumanDuration(Duration::from_millis(m))),
        }
    }

    #[test]
    fn a_burst_moves_on_by_the_period_until_max_wait() {
        let s = spec(1000, Some(2500));
        assert_eq!(debounced_ready_at(&s, at(0), at(0)), at(1000));
        assert_eq!(debounced_ready_at(&s, at(0), at(900)), at(1900));
        assert_eq!(debounced_ready_at(&s, at(0), at(2000)), at(2500));
        // Without max_wait, ten periods.
        let s = spec(1000, None);
        assert_eq!(debounced_ready_at(&s, at(0), at(9500)), at(10_000));
    }

    proptest! {
        #[test]
        fn ready_at_is_never_past_max_wait_nor_before_now_within_it(
            period in 1u64..10_000, extra in 0u64..50_000, first in 0i64..100_000,
            later in 0i64..100_000,
        ) {
            let s = spec(period, Some(period + extra));
            let (first, now) = (at(first), at(first + later));
            let ready = debounced_ready_at(&s, first, now);
            let cap = first + chrono::Duration::milliseconds((period + extra) as i64);
            prop_assert!(ready <= cap.max(now));
            prop_assert!(ready <= now + chrono::Duration::milliseconds(period as i64));
            if now <= cap {
                prop_assert!(ready >= now);
            }
        }
    }

    #[test]
    fn params_are_bounded_and_refusals_name_the_field() {
        let ok = Params::from([("region".into(), "eu".into()), ("a-b_9".into(), "".into())]);
        assert!(validate_params(&ok).is_ok());
        let bad = Params::from([("bad name".into(), "x".into())]);
        assert_eq!(validate_params(&bad).unwrap_err().field, "params.bad name");
        let long = Params::from([("v".into(), "x".repeat(MAX_PARAM_VALUE + 1))]);
        assert_eq!(validate_params(&long).unwrap_err().field, "params.v");
        let many: Params = (0..=MAX_PARAMS)
            .map(|i| (format!("p{i}"), "x".into()))
            .collect();
        assert_eq!(validate_params(&many).unwrap_err().field, "params");
        let empty = Params::from([(String::new(), "x".into())]);
        assert_eq!(validate_params(&empty).unwrap_err().field, "params.");
        assert_eq!(param_env_name("order-id_2"), "SKED_PARAM_ORDER_ID_2");
    }

    #[test]
    fn absorbed_keeps_the_newest_and_counts_all() {
        let mut a = Absorbed::begun(at(0));
        for i in 0..150 {
            a.absorb(AbsorbedTrigger {
                at: at(i),
                params: None,
                event_id: Some(i.to_string()),
            });
        }
        assert_eq!(a.count, 150);
        assert_eq!(a.triggers.len(), MAX_ABSORBED_KEPT);
        assert_eq!(a.triggers[0].event_id.as_deref(), Some("50"));
    }
}
