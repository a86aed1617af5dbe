//! Dispatch policies: which worker gets an attempt, and in what order queued runs are served.
//!
//! Eligibility first (what the worker executes, its namespaces, labels, a free slot), then the
//! worker pool's overload control (`overload`), then the job's host strategy (`host`); the
//! order in which runs are offered is their queue position within a namespace, and fair share
//! between namespaces (`fair`). These
//! are the functions the server's dispatcher calls and the simulator (`sked-sim`) runs: they
//! see plain snapshots of worker load, do no IO and decide nothing else.

mod fair;
mod host;
mod overload;

pub use fair::{fair_order, Tenant, DEFAULT_WEIGHT, MAX_WEIGHT};
pub use host::Strategy;
pub use overload::{Overload, OverloadControl, OverloadState, StallLimits, ADMIT_ALL};

use crate::limits::Capability;
use crate::Instant;
use std::collections::BTreeMap;

/// The longest affinity key a job may name, and a worker may report warm.
pub const MAX_AFFINITY_KEY_BYTES: usize = 200;
/// Affinity keys a worker may report warm in one heartbeat.
pub const MAX_WARM_KEYS: usize = 256;
/// Affinity keys the dispatcher remembers handing one worker (assumed warm there).
pub const MAX_RECENT_KEYS: usize = 64;

/// One worker as the dispatcher sees it at the moment of choosing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLoad {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    pub slots: u32,
    /// Attempts running there, as last reported.
    pub running: u32,
    /// Attempts handed to it since `running` was reported.
    pub assigned: u32,
    /// The most it may be handed now, whatever its free slots: what its open poll asked for
    /// (`u32::MAX` when it asked for no limit of its own).
    pub cap: u32,
    /// Its stall gauge: work waiting inside it, as last reported.
    pub stall: u32,
    /// Affinity keys the worker reports as warm (cached data, open connections).
    pub warm_keys: Vec<String>,
    /// Affinity keys of runs recently handed to it, newest last: assumed warm.
    pub recent_keys: Vec<String>,
    /// Its pool's overload policy and its state under it.
    pub overload: OverloadControl,
    /// The namespaces whose runs its token lets it take (`["*"]`: all).
    pub namespaces: Vec<String>,
    /// The server's own publisher, which takes broker targets and nothing else.
    pub publisher: bool,
    /// The broker connections a worker can publish through (`sked worker --broker`).
    pub brokers: Vec<String>,
    /// What it can execute beyond plain shell and HTTP targets (containers, `run_as`,
    /// `limits`), as its poll says.
    pub capabilities: Vec<Capability>,
}

impl WorkerLoad {
    /// A worker with no load, no keys and the default overload control.
    pub fn idle(id: impl Into<String>, slots: u32) -> WorkerLoad {
        WorkerLoad {
            id: id.into(),
            labels: BTreeMap::new(),
            slots,
            running: 0,
            assigned: 0,
            cap: u32::MAX,
            stall: 0,
            warm_keys: Vec::new(),
            recent_keys: Vec::new(),
            overload: OverloadControl::default(),
            namespaces: vec![crate::auth::ALL_NAMESPACES.to_string()],
            publisher: false,
            brokers: Vec::new(),
            capabilities: Vec::new(),
        }
    }

    /// Attempts running or on their way there.
    pub fn in_flight(&self) -> u32 {
        self.running.saturating_add(self.assigned)
    }

    /// Slots not in use: how idle it is, what the strategies compare.
    pub fn headroom(&self) -> u32 {
        self.slots.saturating_sub(self.in_flight())
    }

    /// How many more runs it may be handed now: its headroom, within its cap.
    pub fn free_slots(&self) -> u32 {
        self.headroom().min(self.cap.saturating_sub(self.assigned))
    }

    /// Notes a run handed to the worker: a slot taken, and its key assumed warm there.
    pub fn hand(&mut self, affinity_key: Option<&str>) {
        self.assigned = self.assigned.saturating_add(1);
        if let Some(key) = affinity_key {
            remember_key(&mut self.recent_keys, key);
        }
    }
}

/// Puts `key` last in `keys` (most recent), keeping at most [`MAX_RECENT_KEYS`].
pub fn remember_key(keys: &mut Vec<String>, key: &str) {
    if let Some(at) = keys.iter().position(|k| k == key) {
        let key = keys.remove(at);
        keys.push(key);
    } else {
        if keys.len() >= MAX_RECENT_KEYS {
            keys.remove(0);
        }
        keys.push(key.to_string());
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
    /// The run's priority: admission control sheds low ones first.
    pub priority: i32,
    /// The one worker that may take it: a broadcast's share (`crate::shard`).
    pub pinned: Option<&'a str>,
    /// What the worker must be able to do (`TargetSpec::needs`).
    pub needs: &'a [Capability],
}

/// A worker may take the run: it executes that kind of target, it is the worker the run is
/// pinned to if any, its token serves the run's namespace, it carries every label asked for.
/// Load is not considered here.
pub fn serves(demand: &Demand<'_>, worker: &WorkerLoad) -> bool {
    executes(demand, worker)
        && demand.pinned.is_none_or(|id| id == worker.id)
        && carries(
            demand.namespace,
            demand.labels,
            &worker.namespaces,
            &worker.labels,
        )
}

/// A worker whose token serves `namespace` and that carries every label of `labels`.
pub fn carries(
    namespace: &str,
    labels: &BTreeMap<String, String>,
    worker_namespaces: &[String],
    worker_labels: &BTreeMap<String, String>,
) -> bool {
    crate::auth::worker_serves(worker_namespaces, namespace)
        && labels.iter().all(|(k, v)| worker_labels.get(k) == Some(v))
}

/// A worker may take the run now: it [`serves`] it and has a free slot.
pub fn eligible(demand: &Demand<'_>, worker: &WorkerLoad) -> bool {
    worker.free_slots() > 0 && serves(demand, worker)
}

/// Who executes which target. A server node's publisher takes broker targets and nothing
/// else, those of jobs routed to no labels: the server publishes them without a worker hop. A
/// worker takes every other target it has the capabilities for (a container engine, root for
/// `run_as`, limits), and a broker target of a job routed to labels. Either takes a broker
/// target only when it has the target's connection; a run whose connection nobody has stays
/// queued.
pub fn executes(demand: &Demand<'_>, worker: &WorkerLoad) -> bool {
    match demand.publishes_through {
        None => {
            !worker.publisher
                && demand
                    .needs
                    .iter()
                    .all(|need| worker.capabilities.contains(need))
        }
        Some(connection) => {
            worker.publisher == demand.labels.is_empty()
                && worker.brokers.iter().any(|b| b == connection)
        }
    }
}

/// Chooses among `workers` for one run: the eligible workers whose overload control accepts
/// it, then the demand's strategy. `turn` advances round-robin; `random` is any random u64.
pub fn select(
    demand: &Demand<'_>,
    workers: &[WorkerLoad],
    turn: u64,
    random: u64,
) -> Option<usize> {
    // Admission and the random strategy each get a draw of their own.
    let draw = random.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15;
    let candidates: Vec<usize> = (0..workers.len())
        .filter(|&i| {
            eligible(demand, &workers[i]) && workers[i].overload.accepts(demand.priority, draw)
        })
        .collect();
    host::choose(demand, workers, &candidates, turn, random)
}

/// Assigns queued runs, in the order given (highest priority first), to workers, noting each
/// assignment on the worker ([`WorkerLoad::hand`]). Returns `(run index, worker index)` pairs;
/// runs with no eligible worker stay unassigned and wait.
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
            workers[w].hand(demand.affinity_key);
            turn = turn.wrapping_add(1);
            out.push((run, w));
        }
    }
    out
}

/// Why a run has no worker, counted over the workers asking for work: what a waiting run
/// shows (`waiting for workers: 3 eligible, all over the breaker threshold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NoWorker {
    /// Workers asking for work that execute the run's kind of target, serve its namespace
    /// and carry its labels.
    pub serving: usize,
    /// Of those, with a free slot.
    pub free: usize,
    /// Of those, held back by their overload control.
    pub overloaded: usize,
    /// The policy that held them back (the last one seen, should pools differ).
    pub policy: Option<Overload>,
    /// The run may go to one worker only (a broadcast's share).
    pub pinned: bool,
}

impl NoWorker {
    pub fn count(demand: &Demand<'_>, workers: &[WorkerLoad]) -> NoWorker {
        let mut why = NoWorker {
            pinned: demand.pinned.is_some(),
            ..NoWorker::default()
        };
        for worker in workers.iter().filter(|w| serves(demand, w)) {
            why.serving += 1;
            if worker.free_slots() > 0 {
                why.free += 1;
                if worker.overload.overloaded() {
                    why.overloaded += 1;
                    why.policy = Some(worker.overload.policy);
                }
            }
        }
        why
    }
}

impl NoWorker {
    /// What a waiting run shows: [`NoWorker`]'s words, or, when the run is a broker target
    /// that nobody asking for work may publish, the connection they lack.
    pub fn describe(&self, demand: &Demand<'_>) -> String {
        if self.serving == 0 && !self.pinned && !demand.needs.is_empty() {
            let needs: Vec<&str> = demand.needs.iter().map(|n| n.missing()).collect();
            return format!(
                "waiting for workers: none asking for work that carries the run's labels and \
                 serves its namespace has {}",
                needs.join(" and ")
            );
        }
        match demand.publishes_through {
            Some(connection) if self.serving == 0 && !self.pinned => {
                if demand.labels.is_empty() {
                    format!(
                        "waiting for a server with broker connection {connection:?}: no node \
                         asking for work has it (sked server --broker {connection}=URL)"
                    )
                } else {
                    format!(
                        "waiting for workers with broker connection {connection:?}: none asking \
                         for work that carries the run's labels and serves its namespace has it \
                         (sked worker --broker {connection}=URL)"
                    )
                }
            }
            _ => self.to_string(),
        }
    }
}

impl std::fmt::Display for NoWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let NoWorker {
            serving,
            free,
            overloaded,
            policy,
            pinned,
        } = *self;
        let threshold = match policy {
            Some(Overload::Admission) => "shedding load (admission)",
            _ => "over the breaker threshold",
        };
        if serving == 0 && pinned {
            return write!(
                f,
                "waiting for workers: the one worker this share of a broadcast is pinned to is \
                 not asking for work"
            );
        }
        if serving == 0 {
            return write!(
                f,
                "waiting for workers: none asking for work carries the run's labels, serves \
                 its namespace and executes its target"
            );
        }
        if overloaded == serving {
            return write!(
                f,
                "waiting for workers: {serving} eligible, all {threshold}"
            );
        }
        if free == 0 {
            return write!(f, "waiting for workers: {serving} eligible, all busy");
        }
        write!(
            f,
            "waiting for workers: {serving} eligible, {free} with a free slot, \
             {overloaded} of them {threshold}"
        )
    }
}

/// One priority level of aging: a run that has waited this long is served as if it were one
/// priority higher. Within priorities 0 to 9, a run is overtaken only by higher runs that
/// became ready less than `(their priority - its priority) * AGING_STEP` after it, so no run
/// waits behind later work for more than `9 * AGING_STEP` (nine minutes).
pub const AGING_STEP: std::time::Duration = std::time::Duration::from_secs(60);

/// Where a run stands in the queue: runs are served by this instant, earliest first. It is
/// `ready_at` moved earlier by one [`AGING_STEP`] per priority level, so a higher priority goes
/// first unless a lower run has waited longer than the difference is worth.
pub fn queue_position(ready_at: Instant, priority: i32, step: std::time::Duration) -> Instant {
    // Bounded so the arithmetic stays far inside chrono's range: at a minute a level,
    // 100,000 levels are 69 days.
    let levels = i64::from(priority.clamp(-100_000, 100_000));
    let step_us = i64::try_from(step.as_micros()).unwrap_or(i64::MAX / 200_000);
    ready_at - chrono::Duration::microseconds(levels.saturating_mul(step_us))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{prop_assert, prop_assert_eq, prop_oneof, proptest, Just};

    fn worker(id: &str, slots: u32, running: u32, zone: &str) -> WorkerLoad {
        WorkerLoad {
            labels: [("zone".to_string(), zone.to_string())].into(),
            running,
            ..WorkerLoad::idle(id, slots)
        }
    }

    fn demand(labels: &BTreeMap<String, String>, strategy: Strategy) -> Demand<'_> {
        Demand {
            namespace: "default",
            labels,
            strategy,
            affinity_key: Some("customer-7"),
            publishes_through: None,
            priority: 0,
            pinned: None,
            needs: &[],
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
    fn a_pinned_run_goes_to_its_worker_or_waits() {
        let any = BTreeMap::new();
        let workers = vec![worker("a", 4, 0, "eu"), worker("b", 4, 3, "eu")];
        let pinned = |id| Demand {
            pinned: Some(id),
            needs: &[],
            ..demand(&any, Strategy::LeastLoaded)
        };
        // The busier worker, since it is the one the run is pinned to.
        assert_eq!(select(&pinned("b"), &workers, 0, 0), Some(1));
        assert_eq!(select(&pinned("gone"), &workers, 0, 0), None);
        let mut full = workers.clone();
        full[1].running = 4;
        assert_eq!(
            select(&pinned("b"), &full, 0, 0),
            None,
            "never another worker"
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
        fn assign_never_overfills_a_worker_nor_exceeds_its_cap(
            workers_given in proptest::collection::vec((0u32..4, 0u32..4, 0u32..6), 1..6),
            runs in 0usize..40,
            strategy in prop_oneof![
                Just(Strategy::LeastLoaded), Just(Strategy::RoundRobin),
                Just(Strategy::Random), Just(Strategy::ConsistentHash), Just(Strategy::Affinity)
            ],
        ) {
            let any = BTreeMap::new();
            // (slots, running, cap): what a poll asked for may be less than its free slots.
            let mut workers: Vec<WorkerLoad> = workers_given.iter().enumerate()
                .map(|(i, &(slots, running, cap))| WorkerLoad {
                    cap,
                    ..worker(&format!("w{i}"), slots + running, running, "x")
                })
                .collect();
            let demands = vec![demand(&any, strategy); runs];
            let mut seed = 1u64;
            let assigned = assign(&demands, &mut workers, 0, || { seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1); seed });
            let capacity: u32 = workers_given.iter().map(|&(slots, _, cap)| slots.min(cap)).sum();
            prop_assert_eq!(assigned.len(), runs.min(capacity as usize));
            for (w, &(_, _, cap)) in workers.iter().zip(&workers_given) {
                prop_assert!(w.in_flight() <= w.slots);
                prop_assert!(w.assigned <= cap);
            }
        }
    }

    #[test]
    fn affinity_prefers_known_then_assumed_warm_then_least_loaded() {
        let any = BTreeMap::new();
        let d = demand(&any, Strategy::Affinity);
        let mut workers = vec![
            worker("cold", 8, 0, "x"),
            worker("assumed", 8, 5, "x"),
            worker("known", 8, 6, "x"),
        ];
        workers[1].recent_keys = vec!["customer-7".into()];
        workers[2].warm_keys = vec!["customer-7".into()];
        assert_eq!(select(&d, &workers, 0, 0), Some(2));
        workers[2].running = 8;
        assert_eq!(select(&d, &workers, 0, 0), Some(1), "known warm but full");
        workers[1].assigned = 3;
        assert_eq!(select(&d, &workers, 0, 0), Some(0), "assumed warm but full");
        // Among equals, runs handed since the last report count as load.
        let mut equals = vec![worker("a", 8, 2, "x"), worker("b", 8, 2, "x")];
        equals[0].assigned = 1;
        assert_eq!(select(&d, &equals, 0, 0), Some(1));
    }

    #[test]
    fn a_handed_run_makes_its_key_assumed_warm_and_takes_a_slot() {
        let any = BTreeMap::new();
        let mut workers = vec![worker("a", 2, 0, "x"), worker("b", 2, 0, "x")];
        let demands = vec![demand(&any, Strategy::Affinity); 3];
        let pairs = assign(&demands, &mut workers, 0, || 0);
        // The first run picks by id among equals; the key then pulls the second one after it.
        assert_eq!(pairs, vec![(0, 0), (1, 0), (2, 1)]);
        assert_eq!(workers[0].recent_keys, vec!["customer-7".to_string()]);
        assert_eq!(workers[0].free_slots(), 0);
    }

    #[test]
    fn recent_keys_are_bounded_and_refreshed() {
        let mut keys = Vec::new();
        for i in 0..MAX_RECENT_KEYS + 10 {
            remember_key(&mut keys, &format!("k{i}"));
        }
        assert_eq!(keys.len(), MAX_RECENT_KEYS);
        assert_eq!(keys[0], "k10");
        remember_key(&mut keys, "k10");
        assert_eq!(keys.last().map(String::as_str), Some("k10"));
        assert_eq!(keys.len(), MAX_RECENT_KEYS);
    }

    #[test]
    fn an_overloaded_worker_is_passed_over_and_the_reason_says_so() {
        let any = BTreeMap::new();
        let d = demand(&any, Strategy::LeastLoaded);
        let limits = StallLimits::new(4, 1).unwrap();
        let mut workers: Vec<WorkerLoad> = (0..3)
            .map(|i| WorkerLoad {
                overload: OverloadControl::new(Overload::Breaker, limits),
                ..worker(&format!("w{i}"), 4, 0, "x")
            })
            .collect();
        workers[0].overload.observe(9);
        assert_eq!(select(&d, &workers, 0, 0), Some(1));
        workers[1].overload.observe(9);
        workers[2].overload.observe(9);
        assert_eq!(select(&d, &workers, 0, 0), None);
        assert_eq!(
            NoWorker::count(&d, &workers).to_string(),
            "waiting for workers: 3 eligible, all over the breaker threshold"
        );
        workers[2].running = 4;
        assert_eq!(
            NoWorker::count(&d, &workers).to_string(),
            "waiting for workers: 3 eligible, 2 with a free slot, 2 of them over the breaker threshold"
        );
        for w in &mut workers {
            w.running = 4;
        }
        assert_eq!(
            NoWorker::count(&d, &workers).to_string(),
            "waiting for workers: 3 eligible, all busy"
        );
        let eu: BTreeMap<_, _> = [("zone".to_string(), "eu".to_string())].into();
        assert!(
            NoWorker::count(&demand(&eu, Strategy::LeastLoaded), &workers)
                .to_string()
                .contains("none asking for work carries the run's labels")
        );
    }

    #[test]
    fn a_broker_run_nobody_may_publish_names_the_missing_connection() {
        let eu: BTreeMap<_, _> = [("zone".to_string(), "eu".to_string())].into();
        let mut worker_with = worker("w1", 4, 0, "eu");
        worker_with.brokers = vec!["other".into()];
        let workers = [worker_with];
        let labelled = Demand {
            publishes_through: Some("events"),
            ..demand(&eu, Strategy::LeastLoaded)
        };
        let why = NoWorker::count(&labelled, &workers);
        assert_eq!(why.serving, 0);
        assert_eq!(
            why.describe(&labelled),
            "waiting for workers with broker connection \"events\": none asking for work that \
             carries the run's labels and serves its namespace has it (sked worker --broker \
             events=URL)"
        );
        let any = BTreeMap::new();
        let server_side = Demand {
            publishes_through: Some("events"),
            ..demand(&any, Strategy::LeastLoaded)
        };
        assert!(NoWorker::count(&server_side, &workers)
            .describe(&server_side)
            .contains("sked server --broker events=URL"));
        // Any other run keeps the counted words.
        let plain = demand(&eu, Strategy::LeastLoaded);
        let why = NoWorker::count(&plain, &workers);
        assert_eq!(why.describe(&plain), why.to_string());
    }

    #[test]
    fn aging_lets_a_long_wait_overtake_a_higher_priority() {
        let t: Instant = "2026-03-01T12:00:00Z".parse().unwrap();
        let minute = chrono::Duration::minutes(1);
        let low = queue_position(t, 0, AGING_STEP);
        // A priority 3 run ready two minutes later goes first: it is worth three minutes.
        assert!(queue_position(t + minute * 2, 3, AGING_STEP) < low);
        // Ready four minutes later, it waits behind the older run.
        assert!(queue_position(t + minute * 4, 3, AGING_STEP) > low);
        // Equal priorities keep their order; extreme priorities stay in range.
        assert!(queue_position(t, 5, AGING_STEP) < queue_position(t + minute, 5, AGING_STEP));
        assert!(queue_position(t, i32::MAX, AGING_STEP) < queue_position(t, i32::MIN, AGING_STEP));
    }

    proptest! {
        /// Consistent hashing: when a worker joins, the keys that move are the ones it wins
        /// (they move to it); when one leaves, only its keys move. About 1/n either way.
        #[test]
        fn consistent_hash_moves_only_the_keys_of_the_worker_that_changed(
            n in 2usize..12, keys in 200usize..400,
        ) {
            let any = BTreeMap::new();
            let pool: Vec<WorkerLoad> = (0..=n).map(|i| worker(&format!("w{i}"), 1_000, 0, "x")).collect();
            let owner = |workers: &[WorkerLoad], key: &str| {
                let d = Demand { affinity_key: Some(key), ..demand(&any, Strategy::ConsistentHash) };
                select(&d, workers, 0, 0).map(|i| workers[i].id.clone())
            };
            let mut moved = 0usize;
            for k in 0..keys {
                let key = format!("project-{k}");
                let before = owner(&pool[..n], &key);
                let after = owner(&pool, &key);
                if before != after {
                    moved += 1;
                    prop_assert_eq!(after.as_deref(), Some(pool[n].id.as_str()), "a key moved only to the new worker");
                }
            }
            // The newcomer wins about 1/(n+1) of the keys: well under twice that.
            prop_assert!(moved * (n + 1) < keys * 2 + 40, "moved {} of {} with {} workers", moved, keys, n + 1);
        }

        /// No run waits behind later work for more than the aging bound: a run of priority
        /// 0..=9 sorts before every run of priority 0..=9 ready more than 9 steps after it.
        #[test]
        fn aging_bounds_how_long_later_work_overtakes(
            p_old in 0i32..=9, p_new in 0i32..=9, later_s in 541i64..100_000,
        ) {
            let t: Instant = "2026-03-01T12:00:00Z".parse().unwrap();
            let old = queue_position(t, p_old, AGING_STEP);
            let new = queue_position(t + chrono::Duration::seconds(later_s), p_new, AGING_STEP);
            prop_assert!(old < new);
        }
    }
}
