//! Sharded jobs: `shards: N` splits each instant of a job into N runs, shard 0 to N-1, which
//! the dispatcher spreads over workers like any runs. Each shard is a run of its own in the
//! ledger, keyed `(job, instant, shard)`, with its own attempts, retries, lease and output; it
//! learns its place from `SKED_SHARD` and `SKED_SHARDS` (headers and message fields for other
//! targets).
//!
//! What makes the N runs one occurrence:
//! - they are recorded together, in one transaction, in one state: the instant's overlap,
//!   misfire and dependency decisions are taken once and hold for every shard;
//! - overlap is between instants: a shard never waits behind, skips for or cancels a shard of
//!   its own instant;
//! - an upstream instant meets a `succeeded` dependency only when every one of its shards
//!   succeeded, and a `finished` one when every shard ended.
//!
//! This module owns the bound and the definition rules; the stores own the rows.

use crate::error::SpecError;
use crate::job::JobSpec;
use crate::target::TargetSpec;
use serde::{Deserialize, Serialize};

/// The most shards an instant may be split into: each is a run, so this bounds the rows one
/// instant writes.
pub const MAX_SHARDS: u16 = 256;

/// A run's place among its instant's shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shard {
    /// 0 to `count - 1`.
    pub index: u16,
    /// How many shards the instant was split into, as its job said when it fired.
    pub count: u16,
}

impl Shard {
    /// The shard a stored run is, from its columns: `None` for a job that is not sharded
    /// (a count of 1).
    pub fn of_run(index: i64, count: i64) -> Option<Shard> {
        let count = u16::try_from(count).ok().filter(|c| *c > 1)?;
        let index = u16::try_from(index).ok().filter(|i| *i < count)?;
        Some(Shard { index, count })
    }
}

/// The shards each of a job's instants is split into: 1 when it is not sharded.
pub fn count(spec: &JobSpec) -> u16 {
    spec.shards.unwrap_or(1)
}

/// Checks a definition's `shards`.
pub fn validate(spec: &JobSpec) -> Result<(), SpecError> {
    let Some(shards) = spec.shards else {
        return Ok(());
    };
    if shards == 0 || shards > MAX_SHARDS {
        return Err(SpecError::new(
            "shards",
            format!("must be between 1 and {MAX_SHARDS}"),
        ));
    }
    if shards > 1 && matches!(spec.target, TargetSpec::Heartbeat(_)) {
        return Err(SpecError::new(
            "shards",
            "a heartbeat job's runs wait for pings, which cannot be split",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> JobSpec {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn shards_are_bounded_and_refused_for_heartbeats() {
        let shell = r#"{"target": {"shell": {"command": "true"}}, "shards": SHARDS}"#;
        for (shards, ok) in [
            ("1", true),
            ("8", true),
            ("256", true),
            ("0", false),
            ("257", false),
        ] {
            let result = validate(&spec(&shell.replace("SHARDS", shards)));
            assert_eq!(result.is_ok(), ok, "shards {shards}");
            if let Err(e) = result {
                assert_eq!(e.field, "shards");
            }
        }
        let heartbeat = r#"{"target": {"heartbeat": {"grace": "1m"}}, "shards": 2}"#;
        assert_eq!(validate(&spec(heartbeat)).unwrap_err().field, "shards");
        // A negative or absurd count never parses into a definition at all.
        assert!(serde_json::from_str::<JobSpec>(&shell.replace("SHARDS", "-1")).is_err());
        assert!(serde_json::from_str::<JobSpec>(&shell.replace("SHARDS", "70000")).is_err());
    }

    #[test]
    fn a_run_is_a_shard_only_when_its_instant_was_split() {
        assert_eq!(Shard::of_run(0, 1), None);
        assert_eq!(Shard::of_run(2, 4), Some(Shard { index: 2, count: 4 }));
        // Rows that cannot be a shard read as an unsharded run rather than a wrong place.
        assert_eq!(Shard::of_run(4, 4), None);
        assert_eq!(Shard::of_run(-1, 4), None);
    }
}
