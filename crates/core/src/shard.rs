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
//! `broadcast: true` is the same with one shard per worker: when an instant fires, every live
//! worker that may take the job's runs (its labels and namespace, not draining) gets one,
//! pinned to it, and N is how many there were. A shard whose worker is lost before it ran
//! fails: the instant did not run everywhere it was owed. With no such worker at all, the
//! instant is one run that waits for the first.
//!
//! This module owns the bound, the definition rules and who a broadcast goes to; the stores own
//! the rows.

use crate::error::SpecError;
use crate::job::JobSpec;
use crate::target::TargetSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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

/// A worker as a broadcast sees it: who it is, which namespaces its token serves, its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveWorker {
    pub id: String,
    pub namespaces: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// Where an instant's shards go, one entry per shard in order: `None` to any worker, or the
/// worker a broadcast's shard is pinned to. `live` are the workers alive and not draining. A
/// broadcast goes to at most [`MAX_SHARDS`] workers, the first by id: a larger pool is split
/// by labels into several broadcast jobs.
pub fn placements(spec: &JobSpec, namespace: &str, live: &[LiveWorker]) -> Vec<Option<String>> {
    if !spec.broadcast {
        return vec![None; usize::from(count(spec))];
    }
    let mut to: Vec<Option<String>> = live
        .iter()
        .filter(|w| {
            crate::dispatch::carries(namespace, &spec.routing.labels, &w.namespaces, &w.labels)
        })
        .map(|w| Some(w.id.clone()))
        .collect();
    to.sort();
    to.dedup();
    to.truncate(usize::from(MAX_SHARDS));
    if to.is_empty() {
        to.push(None);
    }
    to
}

/// The error of a broadcast's shard whose worker was lost before it ran.
pub fn worker_lost(worker: &str) -> String {
    format!("worker {worker} was lost before it ran its share of the broadcast")
}

/// Checks a definition's `shards` and `broadcast`.
pub fn validate(spec: &JobSpec) -> Result<(), SpecError> {
    if spec.broadcast {
        if spec.shards.is_some() {
            return Err(SpecError::new(
                "shards",
                "a broadcast has one shard per worker: give shards or broadcast, not both",
            ));
        }
        if !matches!(spec.target, TargetSpec::Shell(_) | TargetSpec::Http(_)) {
            return Err(SpecError::new(
                "broadcast",
                "a broadcast runs once on every worker: its target must be shell or http",
            ));
        }
    }
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
    fn a_broadcast_goes_once_to_each_worker_that_may_take_it() {
        let live = |id: &str, zone: &str, namespaces: &[&str]| LiveWorker {
            id: id.to_string(),
            namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            labels: [("zone".to_string(), zone.to_string())].into(),
        };
        let workers = [
            live("w3", "eu", &["*"]),
            live("w1", "eu", &["default"]),
            live("w2", "us", &["*"]),
            live("w4", "eu", &["other"]),
        ];
        let everywhere = spec(r#"{"target": {"shell": {"command": "true"}}, "broadcast": true}"#);
        assert_eq!(
            placements(&everywhere, "default", &workers),
            [Some("w1".into()), Some("w2".into()), Some("w3".into())],
            "every worker serving the namespace, by id"
        );
        let eu = spec(
            r#"{"target": {"shell": {"command": "true"}}, "broadcast": true,
                "routing": {"labels": {"zone": "eu"}}}"#,
        );
        assert_eq!(
            placements(&eu, "default", &workers),
            [Some("w1".into()), Some("w3".into())]
        );
        // Nobody to go to: one run, for whoever comes first.
        assert_eq!(placements(&eu, "default", &[]), [None]);
        // A pool past the bound: its first workers by id, and no more.
        let many: Vec<LiveWorker> = (0..300)
            .map(|i| live(&format!("w{i:03}"), "eu", &["*"]))
            .collect();
        let placed = placements(&everywhere, "default", &many);
        assert_eq!(placed.len(), usize::from(MAX_SHARDS));
        assert_eq!(placed.last(), Some(&Some("w255".to_string())));
        let sharded = spec(r#"{"target": {"shell": {"command": "true"}}, "shards": 3}"#);
        assert_eq!(
            placements(&sharded, "default", &workers),
            [None, None, None]
        );
    }

    #[test]
    fn a_broadcast_is_for_workers_and_sets_its_own_shards() {
        let both =
            spec(r#"{"target": {"shell": {"command": "true"}}, "broadcast": true, "shards": 2}"#);
        assert_eq!(validate(&both).unwrap_err().field, "shards");
        let heartbeat = spec(r#"{"target": {"heartbeat": {"grace": "1m"}}, "broadcast": true}"#);
        assert_eq!(validate(&heartbeat).unwrap_err().field, "broadcast");
        let http =
            spec(r#"{"target": {"http": {"url": "https://example.com/hook"}}, "broadcast": true}"#);
        assert!(validate(&http).is_ok());
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
