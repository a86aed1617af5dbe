//! Host choice: which of the workers that may take a run gets it, by the job's strategy.
//!
//! `affinity` keeps a key's runs where the key is warm, within a bounded load: a worker is
//! passed over for a key it holds warm once taking the run would leave it above
//! (1 + [`AFFINITY_EPSILON_PERCENT`] / 100) times the candidates' mean load while it already
//! uses more than 1 / [`AFFINITY_FLOOR_DIVISOR`] of its slots. The key then spills to another
//! worker: one that holds it warm within the bound if any, else the first within the bound in
//! the key's rendezvous order, so a hot key spills to the same second worker every time and
//! that worker stays warm for it (docs/DISPATCH.md, "Affinity with bounded load").

use super::{Demand, WorkerLoad};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// The eligible worker with the most free slots.
    LeastLoaded,
    /// A worker known to hold the affinity key warm, else one recently handed a run with the
    /// key (assumed warm), else any; the least loaded within the best of those. A worker over
    /// the bounded load (the module's documentation) counts only when every candidate is: a
    /// hot key spills, to its next worker in rendezvous order when no worker within the bound
    /// holds it warm. Without a key, the least loaded: so it is the default (docs/DISPATCH.md,
    /// the chosen default).
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

/// ε of `affinity`'s bounded load, in percent: a worker warm for a key keeps taking its runs up
/// to (1 + ε) times the candidates' mean load, twice the mean at 100. Lower spills hot keys
/// sooner and costs warm starts; higher lets a hot key queue longer on one worker.
pub const AFFINITY_EPSILON_PERCENT: u64 = 100;

/// A worker with at most 1/N of its slots in use (a quarter) is never over `affinity`'s bound,
/// whatever the mean: with most of its slots free it is not loaded, and spilling a key from it
/// would only trade a warm start for a cold one.
pub const AFFINITY_FLOOR_DIVISOR: u32 = 4;

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
        Strategy::Affinity => match demand.affinity_key {
            None => least_loaded(),
            Some(key) => {
                let bound = Bound::over(workers, candidates);
                // Each candidate: within the bound, and its warmth for the key.
                let rank: Vec<(usize, bool, Warmth)> = candidates
                    .iter()
                    .map(|&i| (i, bound.admits(&workers[i]), warmth(&workers[i], Some(key))))
                    .collect();
                // The key is warm somewhere: a cold choice spills it, by rendezvous order so
                // it spills to the same worker each time. A key warm nowhere goes to the
                // least loaded, as before.
                let spilled = workers.iter().any(|w| warmth(w, Some(key)) != Warmth::Cold);
                rank.iter()
                    .max_by(|&&(a, a_within, a_warmth), &&(b, b_within, b_warmth)| {
                        a_within
                            .cmp(&b_within)
                            .then(a_warmth.cmp(&b_warmth))
                            .then_with(|| {
                                if spilled && a_warmth == Warmth::Cold {
                                    rendezvous(key.as_bytes(), workers[a].id.as_bytes())
                                        .cmp(&rendezvous(key.as_bytes(), workers[b].id.as_bytes()))
                                } else {
                                    load_order(a, b)
                                }
                            })
                    })
                    .map(|&(i, _, _)| i)
            }
        },
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

/// `affinity`'s bounded load over one choice's candidates: Mirrokni, Thorup and
/// Zadimoghaddam's consistent hashing with bounded loads, with a floor. The load of a worker is
/// its runs in flight (running as last reported, plus handed since). The bound is
/// `⌈(1 + ε) × (L + 1) / n⌉` for `L` runs in flight on the `n` candidates (the run being placed
/// counted): a worker is within it while it holds fewer runs than that, or while it uses at
/// most 1 / [`AFFINITY_FLOOR_DIVISOR`] of its slots. The candidates
/// together always have room under the first part, so some candidate is within the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bound {
    cap: u64,
}

impl Bound {
    fn over(workers: &[WorkerLoad], candidates: &[usize]) -> Bound {
        let load: u64 = candidates
            .iter()
            .map(|&i| u64::from(workers[i].in_flight()))
            .sum();
        let n = (candidates.len() as u64).max(1);
        let scaled = (100 + AFFINITY_EPSILON_PERCENT).saturating_mul(load.saturating_add(1));
        Bound {
            cap: scaled.div_ceil(n.saturating_mul(100)),
        }
    }

    /// The worker may take one more run of a key it holds warm.
    fn admits(&self, worker: &WorkerLoad) -> bool {
        let load = u64::from(worker.in_flight());
        let floor =
            load.saturating_mul(u64::from(AFFINITY_FLOOR_DIVISOR)) <= u64::from(worker.slots);
        load < self.cap || floor
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{prop_assert, prop_assert_eq, proptest};
    use std::collections::BTreeMap;

    const KEY: &str = "project-7";

    fn worker(id: &str, slots: u32, running: u32) -> WorkerLoad {
        WorkerLoad {
            running,
            ..WorkerLoad::idle(id, slots)
        }
    }

    fn pick(workers: &[WorkerLoad], key: Option<&str>) -> Option<usize> {
        let labels = BTreeMap::new();
        let demand = Demand {
            namespace: "default",
            labels: &labels,
            strategy: Strategy::Affinity,
            affinity_key: key,
            publishes_through: None,
            priority: 0,
            pinned: None,
            needs: &[],
        };
        let all: Vec<usize> = (0..workers.len()).collect();
        choose(&demand, workers, &all, 0, 0)
    }

    /// Four workers of 12 slots: the first holds the key warm with `warm_load` in flight, the
    /// others run `others` each.
    fn pool(warm_load: u32, others: [u32; 3]) -> Vec<WorkerLoad> {
        let mut workers = vec![worker("w0", 12, warm_load)];
        workers[0].warm_keys = vec![KEY.to_string()];
        for (i, load) in others.into_iter().enumerate() {
            workers.push(worker(&format!("w{}", i + 1), 12, load));
        }
        workers
    }

    /// Where the key spills among `cold` workers: the first in its rendezvous order.
    fn rendezvous_first(workers: &[WorkerLoad], cold: &[usize]) -> usize {
        cold.iter()
            .copied()
            .max_by_key(|&i| rendezvous(KEY.as_bytes(), workers[i].id.as_bytes()))
            .unwrap()
    }

    #[test]
    fn a_key_stays_on_its_warm_worker_up_to_the_bound() {
        // 3 in flight against the others' 1: within twice the mean (⌈2 × 7 / 4⌉ = 4), so the
        // warm worker keeps the key although three idler workers could take it; with 4 it is at
        // the bound and the key goes elsewhere.
        assert_eq!(pick(&pool(3, [1, 1, 1]), Some(KEY)), Some(0));
        assert_ne!(pick(&pool(4, [1, 1, 1]), Some(KEY)), Some(0));
        // An idle pool: the mean bound is ⌈2 × 4 / 4⌉ = 2, but 3 of 12 slots is a quarter: the
        // floor keeps the key where it is warm while at most a quarter of its slots are in use.
        assert_eq!(pick(&pool(3, [0, 0, 0]), Some(KEY)), Some(0));
        assert_ne!(pick(&pool(4, [0, 0, 0]), Some(KEY)), Some(0));
        // Assumed warm counts as warm.
        let mut assumed = pool(3, [1, 1, 1]);
        assumed[0].warm_keys.clear();
        assumed[0].recent_keys = vec![KEY.to_string()];
        assert_eq!(pick(&assumed, Some(KEY)), Some(0));
    }

    #[test]
    fn a_hot_key_spills_once_its_warm_worker_is_over_the_bound() {
        // 4 in flight against the others' 1: at ⌈2 × 8 / 4⌉ = 4 and over a quarter of its slots.
        // The key spills, although the warm worker has 8 free slots, to the first cold worker
        // in the key's rendezvous order (not the least loaded).
        let workers = pool(4, [1, 1, 1]);
        let to = pick(&workers, Some(KEY));
        assert_ne!(to, Some(0));
        assert_eq!(to, Some(rendezvous_first(&workers, &[1, 2, 3])));
        // Far over: the same.
        let workers = pool(11, [2, 0, 1]);
        assert_eq!(
            pick(&workers, Some(KEY)),
            Some(rendezvous_first(&workers, &[1, 2, 3]))
        );
        // A pool evenly loaded: every worker is within twice the mean, so the warm one keeps
        // the key however busy the pool is.
        let mut busy = pool(9, [9, 9, 9]);
        busy[1].running = 10;
        assert_eq!(pick(&busy, Some(KEY)), Some(0));
        // A second worker warm within the bound takes it before any cold one.
        let mut two_warm = pool(6, [1, 3, 1]);
        two_warm[2].warm_keys = vec![KEY.to_string()];
        assert_eq!(pick(&two_warm, Some(KEY)), Some(2));
    }

    #[test]
    fn a_spilled_key_goes_to_the_same_second_worker() {
        let first = pick(&pool(6, [1, 1, 1]), Some(KEY)).unwrap();
        assert_ne!(first, 0);
        // Whatever the loads of the cold workers within the bound, the same one: not the least
        // loaded.
        for others in [[0, 2, 1], [2, 0, 1], [1, 2, 0], [2, 2, 2], [0, 0, 0]] {
            let workers = pool(8, others);
            assert_eq!(pick(&workers, Some(KEY)), Some(first), "{others:?}");
        }
        // Once handed the key it is assumed warm there, and keeps it while within the bound.
        let mut workers = pool(8, [1, 1, 1]);
        workers[first].running = 3;
        workers[first].recent_keys = vec![KEY.to_string()];
        assert_eq!(pick(&workers, Some(KEY)), Some(first));
        // When the second is over the bound too, the key goes on to its third worker: eight
        // workers, the first two with 6 in flight each and over ⌈2 × 13 / 8⌉ = 4.
        let mut workers = pool(6, [0, 0, 0]);
        workers.extend((4..8).map(|i| worker(&format!("w{i}"), 12, 0)));
        let second = rendezvous_first(&workers, &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(pick(&workers, Some(KEY)), Some(second));
        workers[second].running = 6;
        let rest: Vec<usize> = (1..8).filter(|&i| i != second).collect();
        let third = pick(&workers, Some(KEY));
        assert_eq!(third, Some(rendezvous_first(&workers, &rest)));
        assert_ne!(third, Some(0));
        // The order is the key's own: another key may spill elsewhere, but always to one place.
        let other = |workers: &[WorkerLoad]| {
            let mut workers = workers.to_vec();
            workers[0].warm_keys = vec!["project-8".to_string()];
            pick(&workers, Some("project-8"))
        };
        assert_eq!(other(&pool(8, [1, 1, 1])), other(&pool(8, [0, 2, 1])));
    }

    #[test]
    fn a_key_warm_nowhere_or_no_key_goes_to_the_least_loaded() {
        let mut workers = pool(5, [3, 0, 2]);
        workers[0].warm_keys.clear();
        assert_eq!(pick(&workers, Some(KEY)), Some(2));
        assert_eq!(pick(&workers, None), Some(2));
    }

    proptest! {
        /// The bound always leaves a candidate, the choice is within it, and a worker warm for
        /// the key within the bound is never passed over for a cold one.
        #[test]
        fn the_choice_is_within_the_bound_and_warm_when_it_can_be(
            loads in proptest::collection::vec((1u32..40, 0u32..40, 0u8..3), 1..12),
        ) {
            let workers: Vec<WorkerLoad> = loads
                .iter()
                .enumerate()
                .map(|(i, &(slots, running, warm))| {
                    let mut w = worker(&format!("w{i}"), slots + running, running);
                    match warm {
                        1 => w.warm_keys = vec![KEY.to_string()],
                        2 => w.recent_keys = vec![KEY.to_string()],
                        _ => {}
                    }
                    w
                })
                .collect();
            let all: Vec<usize> = (0..workers.len()).collect();
            let bound = Bound::over(&workers, &all);
            prop_assert!(workers.iter().any(|w| bound.admits(w)));
            let chosen = pick(&workers, Some(KEY)).unwrap();
            prop_assert!(bound.admits(&workers[chosen]));
            let warm_within = workers
                .iter()
                .any(|w| bound.admits(w) && warmth(w, Some(KEY)) != Warmth::Cold);
            prop_assert_eq!(
                warmth(&workers[chosen], Some(KEY)) != Warmth::Cold,
                warm_within
            );
        }
    }
}
