//! Dispatch policies: which worker gets an attempt.
//!
//! Eligibility first (namespaces, labels, free slots), then selection by the job's strategy. These are the
//! functions the server's dispatcher calls; they see plain snapshots of worker load and decide
//! nothing else.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// The eligible worker with the most free slots.
    #[default]
    LeastLoaded,
    /// A worker that holds the affinity key warm, else the least loaded.
    Affinity,
    /// Eligible workers in turn.
    RoundRobin,
    Random,
    /// The same affinity key goes to the same worker while the set of workers is unchanged.
    ConsistentHash,
}

/// One worker as the dispatcher sees it at the moment of choosing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLoad {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    pub slots: u32,
    pub running: u32,
    /// Affinity keys the worker reports as warm (cached data, open connections).
    pub warm_keys: Vec<String>,
    /// The namespaces whose runs its token lets it take (`["*"]`: all).
    pub namespaces: Vec<String>,
    /// The server's own publisher, which takes broker targets and nothing else.
    pub publisher: bool,
    /// The broker connections a worker can publish through (`sked worker --broker`).
    pub brokers: Vec<String>,
}

impl WorkerLoad {
    pub fn free_slots(&self) -> u32 {
        self.slots.saturating_sub(self.running)
    }
}

/// What one queued run asks of a worker.
#[derive(Debug, Clone, Copy)]
pub struct Demand<'a> {
    pub namespace: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub strategy: Strategy,
    pub affinity_key: Option<&'a str>,
    /// A broker target's connection: see [`executes`] for who publishes it.
    pub publishes_through: Option<&'a str>,
}

/// A worker may take the run: it executes that kind of target, its token serves the run's
/// namespace, it carries every label asked for, and it has a free slot.
pub fn eligible(demand: &Demand<'_>, worker: &WorkerLoad) -> bool {
    worker.free_slots() > 0
        && executes(demand, worker)
        && crate::auth::worker_serves(&worker.namespaces, demand.namespace)
        && demand
            .labels
            .iter()
            .all(|(k, v)| worker.labels.get(k) == Some(v))
}

/// Who executes which target. A server node's publisher takes broker targets and nothing
/// else, those of jobs routed to no labels: the server publishes them without a worker hop. A
/// worker takes every other target, and a broker target of a job routed to labels. Either
/// takes a broker target only when it has the target's connection; a run whose connection
/// nobody has stays queued.
pub fn executes(demand: &Demand<'_>, worker: &WorkerLoad) -> bool {
    match demand.publishes_through {
        None => !worker.publisher,
        Some(connection) => {
            worker.publisher == demand.labels.is_empty()
                && worker.brokers.iter().any(|b| b == connection)
        }
    }
}

/// Chooses among `workers` for one run. `turn` advances round-robin; `random` is any random u64.
pub fn select(
    demand: &Demand<'_>,
    workers: &[WorkerLoad],
    turn: u64,
    random: u64,
) -> Option<usize> {
    let candidates: Vec<usize> = (0..workers.len())
        .filter(|&i| eligible(demand, &workers[i]))
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let least_loaded = |set: &[usize]| {
        // Most free slots; ties go to the fewest running, then to the id, so the choice is stable.
        set.iter().copied().max_by(|&a, &b| {
            let (wa, wb) = (&workers[a], &workers[b]);
            wa.free_slots()
                .cmp(&wb.free_slots())
                .then(wb.running.cmp(&wa.running))
                .then(wb.id.cmp(&wa.id))
        })
    };
    match demand.strategy {
        Strategy::LeastLoaded => least_loaded(&candidates),
        Strategy::Affinity => {
            let warm: Vec<usize> = match demand.affinity_key {
                Some(key) => candidates
                    .iter()
                    .copied()
                    .filter(|&i| workers[i].warm_keys.iter().any(|k| k == key))
                    .collect(),
                None => Vec::new(),
            };
            least_loaded(&warm).or_else(|| least_loaded(&candidates))
        }
        Strategy::RoundRobin => Some(candidates[(turn % candidates.len() as u64) as usize]),
        Strategy::Random => Some(candidates[(random % candidates.len() as u64) as usize]),
        Strategy::ConsistentHash => {
            let Some(key) = demand.affinity_key else {
                return least_loaded(&candidates);
            };
            // Rendezvous hashing: the worker with the highest hash of (key, worker) wins, so
            // adding or removing a worker moves only the keys it wins or held.
            candidates
                .iter()
                .copied()
                .max_by_key(|&i| fnv1a(key.as_bytes(), workers[i].id.as_bytes()))
        }
    }
}

/// Assigns queued runs, in the order given (highest priority first), to workers, taking a slot
/// for each assignment. Returns `(run index, worker index)` pairs; runs with no eligible worker
/// stay unassigned and wait.
pub fn assign(
    demands: &[Demand<'_>],
    workers: &mut [WorkerLoad],
    mut turn: u64,
    mut random: impl FnMut() -> u64,
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (run, demand) in demands.iter().enumerate() {
        if workers.iter().all(|w| w.free_slots() == 0) {
            break;
        }
        if let Some(w) = select(demand, workers, turn, random()) {
            workers[w].running += 1;
            turn = turn.wrapping_add(1);
            out.push((run, w));
        }
    }
    out
}

fn fnv1a(a: &[u8], b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in a.iter().chain([0u8].iter()).chain(b.iter()) {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{prop_assert, prop_assert_eq, prop_oneof, proptest, Just};

    fn worker(id: &str, slots: u32, running: u32, zone: &str) -> WorkerLoad {
        WorkerLoad {
            id: id.to_string(),
            labels: [("zone".to_string(), zone.to_string())].into(),
            slots,
            running,
            warm_keys: vec![],
            namespaces: vec!["*".to_string()],
            publisher: false,
            brokers: vec![],
        }
    }

    fn demand(labels: &BTreeMap<String, String>, strategy: Strategy) -> Demand<'_> {
        Demand {
            namespace: "default",
            labels,
            strategy,
            affinity_key: Some("customer-7"),
            publishes_through: None,
        }
    }

    #[test]
    fn broker_targets_go_to_the_publisher_unless_routed_to_labelled_workers() {
        let any = BTreeMap::new();
        let mut publisher = worker("publisher", 100, 0, "x");
        publisher.publisher = true;
        publisher.brokers = vec!["rabbit".to_string()];
        let mut with_rabbit = worker("b", 8, 0, "eu");
        with_rabbit.brokers = vec!["rabbit".to_string()];
        let workers = vec![worker("a", 8, 0, "eu"), publisher, with_rabbit];
        let broker = Demand {
            publishes_through: Some("rabbit"),
            ..demand(&any, Strategy::LeastLoaded)
        };
        // Routed to no labels: the server's publisher, even beside a worker with the connection.
        assert_eq!(select(&broker, &workers, 0, 0), Some(1));
        assert_eq!(
            select(&broker, &[workers[0].clone(), workers[2].clone()], 0, 0),
            None
        );
        // ... which has the connection: a run whose connection nobody has stays queued.
        let elsewhere = Demand {
            publishes_through: Some("nats"),
            ..broker
        };
        assert_eq!(select(&elsewhere, &workers, 0, 0), None);
        // Every other target: a worker, never the publisher.
        assert_eq!(
            select(&demand(&any, Strategy::LeastLoaded), &workers[..2], 0, 0),
            Some(0)
        );
        assert_eq!(
            select(&demand(&any, Strategy::LeastLoaded), &workers[1..2], 0, 0),
            None
        );
        // Routed by labels: only a worker carrying them and having the connection.
        let eu: BTreeMap<String, String> = [("zone".to_string(), "eu".to_string())].into();
        let routed = Demand {
            publishes_through: Some("rabbit"),
            ..demand(&eu, Strategy::LeastLoaded)
        };
        assert_eq!(select(&routed, &workers, 0, 0), Some(2));
        assert_eq!(select(&routed, &workers[..2], 0, 0), None);
        let elsewhere = Demand {
            publishes_through: Some("nats"),
            ..routed
        };
        assert_eq!(select(&elsewhere, &workers, 0, 0), None);
    }

    #[test]
    fn labels_must_match_and_slots_must_be_free() {
        let eu: BTreeMap<_, _> = [("zone".to_string(), "eu".to_string())].into();
        let workers = vec![
            worker("a", 4, 0, "us"),
            worker("b", 1, 1, "eu"),
            worker("c", 2, 1, "eu"),
        ];
        assert_eq!(
            select(&demand(&eu, Strategy::LeastLoaded), &workers, 0, 0),
            Some(2)
        );
        let none: BTreeMap<_, _> = [("zone".to_string(), "ap".to_string())].into();
        assert_eq!(
            select(&demand(&none, Strategy::LeastLoaded), &workers, 0, 0),
            None
        );
    }

    #[test]
    fn a_worker_takes_only_runs_of_namespaces_its_token_serves() {
        let any = BTreeMap::new();
        let mut only_b = worker("a", 8, 0, "x");
        only_b.namespaces = vec!["b".into()];
        let mut everything = worker("z", 1, 0, "x");
        everything.namespaces = vec!["*".into()];
        let workers = vec![only_b, everything];
        let in_ns = |namespace| Demand {
            namespace,
            ..demand(&any, Strategy::LeastLoaded)
        };
        assert_eq!(
            select(&in_ns("b"), &workers, 0, 0),
            Some(0),
            "most free slots"
        );
        assert_eq!(select(&in_ns("default"), &workers, 0, 0), Some(1));
        assert_eq!(select(&in_ns("default"), &workers[..1], 0, 0), None);
    }

    #[test]
    fn least_loaded_prefers_free_slots() {
        let any = BTreeMap::new();
        let workers = vec![
            worker("a", 4, 3, "x"),
            worker("b", 4, 1, "x"),
            worker("c", 8, 6, "x"),
        ];
        assert_eq!(
            select(&demand(&any, Strategy::LeastLoaded), &workers, 0, 0),
            Some(1)
        );
    }

    #[test]
    fn affinity_prefers_a_warm_worker() {
        let any = BTreeMap::new();
        let mut workers = vec![worker("a", 4, 0, "x"), worker("b", 4, 3, "x")];
        workers[1].warm_keys = vec!["customer-7".into()];
        assert_eq!(
            select(&demand(&any, Strategy::Affinity), &workers, 0, 0),
            Some(1)
        );
        workers[1].running = 4;
        assert_eq!(
            select(&demand(&any, Strategy::Affinity), &workers, 0, 0),
            Some(0)
        );
    }

    #[test]
    fn consistent_hash_is_stable() {
        let any = BTreeMap::new();
        let workers = vec![
            worker("a", 4, 0, "x"),
            worker("b", 4, 0, "x"),
            worker("c", 4, 0, "x"),
        ];
        let d = demand(&any, Strategy::ConsistentHash);
        let first = select(&d, &workers, 0, 0);
        for turn in 0..10 {
            assert_eq!(select(&d, &workers, turn, turn * 7), first);
        }
    }

    proptest! {
        #[test]
        fn assign_never_overfills_a_worker(
            slots in proptest::collection::vec(0u32..4, 1..6),
            runs in 0usize..40,
            strategy in prop_oneof![
                Just(Strategy::LeastLoaded), Just(Strategy::RoundRobin),
                Just(Strategy::Random), Just(Strategy::ConsistentHash), Just(Strategy::Affinity)
            ],
        ) {
            let any = BTreeMap::new();
            let mut workers: Vec<WorkerLoad> = slots.iter().enumerate()
                .map(|(i, s)| worker(&format!("w{i}"), *s, 0, "x")).collect();
            let demands = vec![demand(&any, strategy); runs];
            let mut seed = 1u64;
            let assigned = assign(&demands, &mut workers, 0, || { seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1); seed });
            let capacity: u32 = slots.iter().sum();
            prop_assert_eq!(assigned.len(), runs.min(capacity as usize));
            for w in &workers {
                prop_assert!(w.running <= w.slots);
            }
        }
    }
}
