//! The dispatcher's queue: the runs this node holds for workers, indexed by what can serve
//! them, with the counts that admission and the metrics read.
//!
//! Ready runs are grouped by their *service class*: the fields of a run that decide which
//! workers may take it at all (`sked_core::dispatch::serves`: its namespace, labels, broker
//! connection, the worker a broadcast's share is pinned to, the capabilities its target
//! needs). A match looks only at the classes
//! that some polling worker serves, so runs nobody can take — however many, whatever their
//! priority — never stand in the way of runs that somebody can. Within a class, runs are kept
//! in queue order (aged priority, `sked_core::dispatch::queue_position`).
//!
//! Memory only, rebuilt from the store; it decides nothing about who gets a run.

use sked_core::dispatch::{queue_position, Demand, AGING_STEP};
use sked_core::Instant;
use sked_store::QueuedRun;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A ready run's place: its aged queue position, then the higher priority, then the id.
pub type ReadyKey = (Instant, Reverse<i32>, i64);
type DelayedKey = (Instant, i64);

/// What a run asks of a worker before load is considered: two runs of one class are served by
/// exactly the same workers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceClass {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub connection: Option<String>,
    pub pinned: Option<String>,
    /// What a worker must be able to do to run it (a container engine, `run_as`, limits).
    pub needs: &'static [sked_core::limits::Capability],
}

impl ServiceClass {
    pub fn of(run: &QueuedRun) -> ServiceClass {
        ServiceClass {
            namespace: run.namespace.clone(),
            labels: run.routing.labels.clone(),
            connection: run.target.destination().map(|d| d.connection.to_string()),
            pinned: run.pinned_worker.clone(),
            needs: run.target.needs(),
        }
    }

    /// The class as eligibility sees it (strategy, key and priority play no part there).
    pub fn demand(&self) -> Demand<'_> {
        Demand {
            namespace: &self.namespace,
            labels: &self.labels,
            strategy: Default::default(),
            affinity_key: None,
            publishes_through: self.connection.as_deref(),
            priority: 0,
            pinned: self.pinned.as_deref(),
            needs: self.needs,
        }
    }
}

/// What a queued run needs to be found again: both keys, its job, its class, and when it was
/// queued here (by [`Queue::stamp`]).
struct Held {
    priority: i32,
    ready_at: Instant,
    /// When it becomes ready: its `ready_at`, or later while a key holds it back.
    wake_at: Instant,
    job_id: i64,
    class: Arc<ServiceClass>,
    stamp: u64,
}

/// Runs queued here for one job, and its namespace.
struct JobBacklog {
    queued: u64,
    namespace: String,
}

#[derive(Default)]
pub struct Queue {
    /// Ready runs by service class, each class in queue order.
    classes: HashMap<Arc<ServiceClass>, BTreeMap<ReadyKey, QueuedRun>>,
    /// Runs whose `ready_at` is still ahead.
    delayed: BTreeMap<DelayedKey, QueuedRun>,
    held: HashMap<i64, Held>,
    per_job: HashMap<i64, JobBacklog>,
    per_namespace: HashMap<String, u64>,
    /// Runs queued here by priority (for `sked_queue_depth`).
    pub per_priority: BTreeMap<i32, u64>,
    /// Counts every insert: a run's stamp says whether it was queued before a given moment.
    stamp: u64,
}

fn ready_key(priority: i32, ready_at: Instant, run_id: i64) -> ReadyKey {
    (
        queue_position(ready_at, priority, AGING_STEP),
        Reverse(priority),
        run_id,
    )
}

impl Queue {
    /// Queues `run`, replacing any earlier copy of it (never doubling it).
    pub fn insert(&mut self, run: QueuedRun, now: Instant) {
        self.insert_until(run, None, now);
    }

    /// Queues `run` to become ready no sooner than `not_before` (a key holds it back until
    /// then), keeping its place in line (its age counts from its `ready_at` still).
    pub fn insert_until(&mut self, run: QueuedRun, not_before: Option<Instant>, now: Instant) {
        self.remove(run.run_id);
        let wake_at = not_before.map_or(run.ready_at, |t| t.max(run.ready_at));
        self.stamp += 1;
        let class = ServiceClass::of(&run);
        let class = match self.classes.get_key_value(&class) {
            Some((shared, _)) => shared.clone(),
            None => Arc::new(class),
        };
        self.held.insert(
            run.run_id,
            Held {
                priority: run.priority,
                ready_at: run.ready_at,
                wake_at,
                job_id: run.job_id,
                class: class.clone(),
                stamp: self.stamp,
            },
        );
        self.per_job
            .entry(run.job_id)
            .or_insert_with(|| JobBacklog {
                queued: 0,
                namespace: run.namespace.clone(),
            })
            .queued += 1;
        *self.per_namespace.entry(run.namespace.clone()).or_default() += 1;
        *self.per_priority.entry(run.priority).or_default() += 1;
        if wake_at <= now {
            self.classes
                .entry(class)
                .or_default()
                .insert(ready_key(run.priority, run.ready_at, run.run_id), run);
        } else {
            self.delayed.insert((wake_at, run.run_id), run);
        }
    }

    pub fn remove(&mut self, run_id: i64) -> Option<QueuedRun> {
        let held = self.held.remove(&run_id)?;
        self.uncount(held.job_id);
        if let Some(n) = self.per_priority.get_mut(&held.priority) {
            *n -= 1;
            if *n == 0 {
                self.per_priority.remove(&held.priority);
            }
        }
        let key = ready_key(held.priority, held.ready_at, run_id);
        let ready = match self.classes.get_mut(&held.class) {
            Some(runs) => {
                let run = runs.remove(&key);
                if runs.is_empty() {
                    self.classes.remove(&held.class);
                }
                run
            }
            None => None,
        };
        ready.or_else(|| self.delayed.remove(&(held.wake_at, run_id)))
    }

    /// Makes the held-back runs among `run_ids` ready now (their key was released), those
    /// whose own `ready_at` has come.
    pub fn wake(&mut self, run_ids: impl IntoIterator<Item = i64>, now: Instant) {
        for id in run_ids {
            let Some(held) = self.held.get(&id) else {
                continue;
            };
            if held.wake_at > now && held.ready_at <= now {
                if let Some(run) = self.delayed.remove(&(held.wake_at, id)) {
                    self.insert(run, now);
                }
            }
        }
    }

    /// One run of `job_id` left the queue.
    fn uncount(&mut self, job_id: i64) {
        let Some(job) = self.per_job.get_mut(&job_id) else {
            return;
        };
        job.queued = job.queued.saturating_sub(1);
        if let Some(n) = self.per_namespace.get_mut(&job.namespace) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_namespace.remove(&job.namespace);
            }
        }
        if job.queued == 0 {
            self.per_job.remove(&job_id);
        }
    }

    pub fn clear(&mut self) {
        *self = Queue {
            stamp: self.stamp,
            ..Queue::default()
        };
    }

    pub fn holds(&self, run_id: i64) -> bool {
        self.held.contains_key(&run_id)
    }

    /// The stamp of the latest insert: runs held with a stamp up to it were queued here
    /// before this moment.
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// The runs held here that were queued here up to stamp `stamp`.
    pub fn held_since(&self, stamp: u64) -> Vec<i64> {
        self.held
            .iter()
            .filter(|(_, held)| held.stamp <= stamp)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Runs of job `job_id` here, and of its namespace (none when the job has none here).
    pub fn backlog(&self, job_id: i64) -> Option<(u64, &str, u64)> {
        let job = self.per_job.get(&job_id)?;
        let namespace = self.per_namespace.get(&job.namespace).copied().unwrap_or(0);
        Some((job.queued, &job.namespace, namespace))
    }

    /// Runs of `namespace` here.
    pub fn queued_in(&self, namespace: &str) -> u64 {
        self.per_namespace.get(namespace).copied().unwrap_or(0)
    }

    /// Moves the delayed runs whose `ready_at` has come to the ready ones; returns the next
    /// `ready_at` still ahead.
    pub fn promote_due(&mut self, now: Instant) -> Option<Instant> {
        let due: Vec<DelayedKey> = self
            .delayed
            .range(..=(now, i64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            if let Some(run) = self.delayed.remove(&key) {
                self.insert(run, now);
            }
        }
        self.delayed.keys().next().map(|(at, _)| *at)
    }

    pub fn any_ready(&self) -> bool {
        !self.classes.is_empty()
    }

    /// The ready run `run_id`, if it is ready.
    pub fn ready(&self, run_id: i64) -> Option<&QueuedRun> {
        let held = self.held.get(&run_id)?;
        self.classes
            .get(&held.class)?
            .get(&ready_key(held.priority, held.ready_at, run_id))
    }

    pub fn get(&self, key: &ReadyKey) -> Option<&QueuedRun> {
        let held = self.held.get(&key.2)?;
        self.classes.get(&held.class)?.get(key)
    }

    /// For each class that `capacity` gives room to (the free slots of the polling workers
    /// that serve it, 0 for none), the keys of its first runs, as many as that room: the
    /// candidates of one match, with the namespace of each class.
    pub fn candidates(
        &self,
        mut capacity: impl FnMut(&ServiceClass) -> usize,
    ) -> Vec<(&str, Vec<ReadyKey>)> {
        self.classes
            .iter()
            .filter_map(|(class, runs)| {
                let room = capacity(class);
                (room > 0).then(|| {
                    let keys = runs.keys().take(room).copied().collect();
                    (class.namespace.as_str(), keys)
                })
            })
            .collect()
    }
}

#[cfg(test)]
impl Queue {
    /// Runs held, checked against every count kept beside them.
    pub fn depth(&self) -> u64 {
        let ready: usize = self.classes.values().map(BTreeMap::len).sum();
        let depth = (ready + self.delayed.len()) as u64;
        assert_eq!(depth, self.held.len() as u64);
        assert_eq!(self.per_priority.values().sum::<u64>(), depth);
        assert_eq!(self.per_namespace.values().sum::<u64>(), depth);
        assert_eq!(self.per_job.values().map(|j| j.queued).sum::<u64>(), depth);
        assert!(self.classes.values().all(|runs| !runs.is_empty()));
        depth
    }
}
