//! Host choice: which of the workers that may take a run gets it, by the job's strategy.

use super::{Demand, WorkerLoad};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// The eligible worker with the most free slots.
    LeastLoaded,
    /// A worker known to hold the affinity key warm, else one recently handed a run with the
    /// key (assumed warm), else any; the least loaded within the best of those. Without a
    /// key, the least loaded: so it is the default (docs/DISPATCH.md, the chosen default).
    #[default]
    Affinity,
    /// Eligible workers in turn.
    RoundRobin,
    Random,
    /// The same affinity key goes to the same worker while that worker stays: a key moves only
    /// when its worker leaves or a new worker wins it (about 1/n of the keys for n workers).
    ConsistentHash,
}

string_enum!(Strategy {
    LeastLoaded => "least_loaded",
    Affinity => "affinity",
    RoundRobin => "round_robin",
    Random => "random",
    ConsistentHash => "consistent_hash",
});

impl std::str::FromStr for Strategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Strategy, String> {
        Strategy::parse(s)
            .ok_or_else(|| format!("unknown host strategy {s:?}: {}", Strategy::one_of()))
    }
}

/// How warm a worker is for a key, best last (so `max` prefers it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Warmth {
    Cold,
    /// The dispatcher recently handed the worker a run with this key.
    Assumed,
    /// The worker reported the key warm.
    Known,
}

fn warmth(worker: &WorkerLoad, key: Option<&str>) -> Warmth {
    let Some(key) = key else {
        return Warmth::Cold;
    };
    if worker.warm_keys.iter().any(|k| k == key) {
        Warmth::Known
    } else if worker.recent_keys.iter().any(|k| k == key) {
        Warmth::Assumed
    } else {
        Warmth::Cold
    }
}

/// Picks one of `candidates` (indexes into `workers`, all eligible and accepting) by the
/// demand's strategy. `turn` advances round-robin; `random` is any random u64.
pub(super) fn choose(
    demand: &Demand<'_>,
    workers: &[WorkerLoad],
    candidates: &[usize],
    turn: u64,
    random: u64,
) -> Option<usize> {
    if candidates.is_empty() {
        return None;
    }
    // Most slots not in use; ties to the fewest in flight, then to the id, so the choice is
    // stable. (Not `free_slots`: what a worker's poll asked for says when it asked, not how
    // busy it is now.)
    let load_order = |a: usize, b: usize| {
        let (wa, wb) = (&workers[a], &workers[b]);
        wa.headroom()
            .cmp(&wb.headroom())
            .then(wb.in_flight().cmp(&wa.in_flight()))
            .then(wb.id.cmp(&wa.id))
    };
    let least_loaded = || candidates.iter().copied().max_by(|&a, &b| load_order(a, b));
    match demand.strategy {
        Strategy::LeastLoaded => least_loaded(),
        Strategy::Affinity => candidates.iter().copied().max_by(|&a, &b| {
            warmth(&workers[a], demand.affinity_key)
                .cmp(&warmth(&workers[b], demand.affinity_key))
                .then_with(|| load_order(a, b))
        }),
        Strategy::RoundRobin => Some(candidates[(turn % candidates.len() as u64) as usize]),
        Strategy::Random => Some(candidates[(random % candidates.len() as u64) as usize]),
        Strategy::ConsistentHash => match demand.affinity_key {
            None => least_loaded(),
            // Rendezvous hashing: the worker with the highest hash of (key, worker) wins, so
            // a change in the pool moves only the keys the joining worker wins or the leaving
            // one held.
            Some(key) => candidates
                .iter()
                .copied()
                .max_by_key(|&i| rendezvous(key.as_bytes(), workers[i].id.as_bytes())),
        },
    }
}

/// FNV-1a of `a`, a zero byte and `b`, finished with MurmurHash3's 64-bit mix: FNV alone
/// ranks ids that differ in their last byte (`w3`, `w4`) too alike, and the pool's keys would
/// not spread evenly over its workers.
fn rendezvous(a: &[u8], b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in a.iter().chain([0u8].iter()).chain(b.iter()) {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}
