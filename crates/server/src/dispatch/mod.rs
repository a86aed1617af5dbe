//! The dispatcher: matches queued runs with workers that are asking for work.
//!
//! Workers long-poll for attempts. A poll waits here until runs are ready for it; the choice of
//! worker for each run is `sked_core::dispatch::assign` over the workers polling at that moment,
//! in queue order (priority, aged by waiting: `sked_core::dispatch::queue_position`), so the
//! policy code is the one the simulator runs too. What a worker reports in its heartbeat (its
//! stall gauge, warm keys, its pool's overload control) is kept here with what this node
//! handed it since (keys then assumed warm), and goes into every choice. Runs with no
//! eligible worker wait (never dropped); runs not ready yet (retry backoff, jitter) wait for
//! their `ready_at`. The queue is indexed by what can serve each run (`queue`), so runs no
//! polling worker can take are never looked at by a match, however many wait ahead; and the
//! runs of several namespaces are offered to free slots by fair share (`holding` counts what
//! each holds; `sked_core::dispatch::fair_order` decides). The queue is memory only: the
//! store's queued runs are the truth, loaded at start, and compared with it again and again
//! (`reconcile`). In a cluster a node holds the runs it queued, and those other nodes queued that were
//! not started within a grace (`crate::changes`), so a worker gets work whichever node it
//! polls; when two nodes hand out the same run at once, the store starts it once and the
//! other start finds it no longer queued.

mod gates;
mod holding;
mod queue;
pub mod reconcile;

use crate::metrics::Metrics;
use chrono::Utc;
use holding::Holding;
use queue::{Queue, ReadyKey};
use rand::Rng;
use sked_core::dispatch::{
    assign, fair_order, serves, Demand, NoWorker, OverloadControl, Tenant, WorkerLoad,
    DEFAULT_WEIGHT,
};
use sked_core::flow::Hold;
use sked_core::Instant;
use sked_store::QueuedRun;
use sked_store::Store;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{oneshot, watch, Notify};

#[derive(Default)]
struct State {
    /// The runs queued here, by what can serve them.
    queue: Queue,
    /// Attempts handed to the workers this node knows, by namespace.
    holding: Holding,
    /// Runs that flow-control keys hold back.
    gates: gates::Gates,
    /// Namespaces with a cap of their own on queued runs (`max_queued_runs`).
    namespace_caps: HashMap<String, u64>,
    /// Namespaces with a weight of their own in the fair share of slots.
    namespace_weights: HashMap<String, u32>,
    /// Open long polls, by worker id.
    polls: HashMap<String, Poll>,
    /// The node is stopping: polls are answered at once, empty, so that workers go to
    /// another node and the node's open requests end without waiting out their long polls.
    closed: bool,
    turn: u64,
    poll_seq: u64,
    /// Registered workers: what a poll needs besides the worker's free slots.
    workers: HashMap<String, KnownWorker>,
}

/// A registered worker's labels, slots, what its token allows, and its load as this node
/// knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownWorker {
    pub labels: BTreeMap<String, String>,
    pub slots: u32,
    pub warm_keys: Vec<String>,
    /// Keys of runs this node handed it lately: assumed warm.
    pub recent_keys: Vec<String>,
    /// Its stall gauge, as last reported.
    pub stall: u32,
    /// Attempts this node handed it since its last heartbeat.
    pub assigned: u32,
    /// Attempts it holds as this node counts them: those its last heartbeat listed, plus
    /// those handed since, less the completions it reported since. Fresher than the count of
    /// a poll that has been open a while.
    pub in_flight: u32,
    /// Its pool's overload control, and its state under it.
    pub overload: OverloadControl,
    /// The namespaces whose runs it may take.
    pub namespaces: Vec<String>,
    /// The token it registered with: the only one that may speak for it.
    pub token_id: Option<i64>,
    /// Asked to drain: it is handed nothing more.
    pub draining: bool,
}

/// A key holding runs back here.
#[derive(Debug, Clone)]
pub struct KeyWait {
    pub namespace: String,
    pub key: String,
    pub reason: String,
    /// When its runs ask again.
    pub until: Instant,
    /// Its runs, by id.
    pub runs: Vec<i64>,
}

/// Runs queued here for one job and its namespace, and the namespace's own cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backlog {
    pub job: u64,
    pub namespace: u64,
    pub namespace_cap: Option<u64>,
}

impl State {
    /// Queues `run`, behind the runs its keys hold back if any.
    fn queue_run(&mut self, run: QueuedRun, now: Instant) {
        let until = self.gates.join(&run, now);
        self.queue.insert_until(run, until, now);
    }

    /// The load of the worker polling as `id`: its free slots as its poll gave them, and what
    /// its heartbeats reported since, which a long poll would otherwise hold stale (a breaker
    /// that opened before the poll must close as soon as a heartbeat says so).
    fn polled_load(&self, id: &str) -> WorkerLoad {
        let mut load = self.polls[id].load.clone();
        if let Some(known) = self.workers.get(id) {
            load.running = known.in_flight;
            load.stall = known.stall;
            load.overload = known.overload;
            load.warm_keys.clone_from(&known.warm_keys);
            load.recent_keys.clone_from(&known.recent_keys);
        }
        load
    }
}

struct Poll {
    seq: u64,
    load: WorkerLoad,
    tx: oneshot::Sender<Vec<QueuedRun>>,
}

pub struct Dispatcher {
    state: Mutex<State>,
    wake: Notify,
    metrics: Arc<Metrics>,
}

impl Dispatcher {
    pub fn new(metrics: Arc<Metrics>) -> Dispatcher {
        Dispatcher {
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain collections behind; keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn remember_worker(&self, id: &str, worker: KnownWorker) {
        self.lock().workers.insert(id.to_string(), worker);
    }

    pub fn known_worker(&self, id: &str) -> Option<KnownWorker> {
        self.lock().workers.get(id).cloned()
    }

    /// The worker hands out nothing more to worker `id`: its open poll, if any, is answered
    /// empty now, and its later ones at once.
    pub fn drain_worker(&self, id: &str) {
        let mut state = self.lock();
        if let Some(worker) = state.workers.get_mut(id) {
            worker.draining = true;
        }
        // Dropping the poll's sender answers it empty.
        state.polls.remove(id);
    }

    pub fn forget_worker(&self, id: &str) {
        let mut state = self.lock();
        state.holding.forget_worker(id);
        if state.workers.remove(id).is_some() {
            self.count_overloaded(&state);
        }
    }

    /// Worker `id` was handed these attempts (attempt id, namespace): they count in their
    /// namespaces' shares until they end. Attempts of a worker this node does not know (the
    /// server's own publisher) are a pool of their own and are not counted.
    pub fn started<'a>(&self, id: &str, attempts: impl IntoIterator<Item = (i64, &'a str)>) {
        let now = Utc::now();
        let mut state = self.lock();
        if !state.workers.contains_key(id) {
            return;
        }
        for (attempt_id, namespace) in attempts {
            state.holding.started(id, attempt_id, namespace, now);
        }
    }

    /// Takes a worker's heartbeat into account: the attempts it holds, its warm keys and stall
    /// gauge, under its pool's overload control (`overload`: its policy and thresholds, the
    /// state is kept).
    pub fn report_load(&self, id: &str, report: LoadReport, overload: OverloadControl) {
        let LoadReport {
            attempts,
            started_before,
            stall,
            warm_keys,
        } = report;
        let running = attempts.len() as u32;
        let mut state = self.lock();
        state.holding.listed(id, &attempts, started_before);
        let Some(worker) = state.workers.get_mut(id) else {
            return;
        };
        let freed = running < worker.in_flight;
        worker.in_flight = running;
        worker.warm_keys = warm_keys;
        worker.stall = stall;
        worker.assigned = 0;
        if (worker.overload.policy, worker.overload.limits) != (overload.policy, overload.limits) {
            worker.overload = overload;
        }
        let was = worker.overload.overloaded();
        worker.overload.observe(stall);
        let now = worker.overload.overloaded();
        if was != now {
            self.count_overloaded(&state);
        }
        drop(state);
        if (was && !now) || freed {
            // Its open poll may take the runs that waited meanwhile.
            self.wake.notify_one();
        }
    }

    fn count_overloaded(&self, state: &State) {
        let overloaded = state
            .workers
            .values()
            .filter(|w| w.overload.overloaded())
            .count();
        self.metrics.workers_overloaded.set(overloaded as i64);
    }

    /// Worker `id` reported attempts it no longer holds (completions, whether the store took
    /// them or had ended the run already): slots freed since its open poll counted them.
    pub fn completed(&self, id: &str, attempt_ids: &[i64]) {
        if attempt_ids.is_empty() {
            return;
        }
        let n = attempt_ids.len() as u32;
        let mut state = self.lock();
        state.holding.ended(attempt_ids);
        if let Some(worker) = state.workers.get_mut(id) {
            worker.in_flight = worker.in_flight.saturating_sub(n);
        }
        let woken = state.gates.released(attempt_ids);
        if !woken.is_empty() {
            state.queue.wake(woken, Utc::now());
        }
        drop(state);
        // Its open poll may now take runs that waited for a free slot.
        self.wake.notify_one();
    }

    /// Whether run `run_id` is queued here.
    #[cfg(test)]
    pub(crate) fn holds(&self, run_id: i64) -> bool {
        self.lock().queue.holds(run_id)
    }

    /// Those of `run_ids` not queued here.
    pub fn unheld(&self, run_ids: &[i64]) -> Vec<i64> {
        let state = self.lock();
        run_ids
            .iter()
            .copied()
            .filter(|id| !state.queue.holds(*id))
            .collect()
    }

    /// Why queued run `run_id` has no worker, judged over the workers this node knows (those
    /// polling now with their free slots, the others as busy). `None` when it is not queued
    /// here, not ready yet, or some worker could take it.
    pub fn waiting_for_workers(&self, run_id: i64) -> Option<String> {
        let state = self.lock();
        if state.queue.holds(run_id) {
            if let Some(reason) = state.gates.reason(run_id) {
                return Some(reason);
            }
        }
        let run = state.queue.ready(run_id)?;
        let loads: Vec<WorkerLoad> = state
            .workers
            .iter()
            .map(|(id, known)| match state.polls.get(id) {
                Some(_) => state.polled_load(id),
                None => WorkerLoad {
                    running: known.slots,
                    ..known.load(id)
                },
            })
            .collect();
        let demand = demand(run);
        let why = NoWorker::count(&demand, &loads);
        (why.free == 0 || why.overloaded == why.free).then(|| why.describe(&demand))
    }

    /// Adds queued runs (a run already present is replaced, never doubled).
    pub fn enqueue(&self, runs: Vec<QueuedRun>) {
        if runs.is_empty() {
            return;
        }
        let now = Utc::now();
        let mut state = self.lock();
        for run in runs {
            state.queue_run(run, now);
        }
        self.metrics.queue(&state.queue.per_priority);
        drop(state);
        self.wake.notify_one();
    }

    /// Puts back runs a flow-control key held back when they were to start on worker `id`,
    /// each to wait until its key may have room; the worker's slots they were counted in are
    /// free again.
    pub fn hold_back(&self, id: &str, held: Vec<(QueuedRun, Hold)>) {
        if held.is_empty() {
            return;
        }
        let now = Utc::now();
        let mut state = self.lock();
        if let Some(worker) = state.workers.get_mut(id) {
            let n = u32::try_from(held.len()).unwrap_or(u32::MAX);
            worker.in_flight = worker.in_flight.saturating_sub(n);
            worker.assigned = worker.assigned.saturating_sub(n);
        }
        for (run, hold) in held {
            let until = state.gates.hold(&run, hold, now);
            state.queue.insert_until(run, Some(until), now);
        }
        self.metrics.queue(&state.queue.per_priority);
        drop(state);
        // The loop's next wake-up may be sooner now.
        self.wake.notify_one();
    }

    /// The keys holding runs back here, with the runs each holds.
    pub fn key_waits(&self) -> Vec<KeyWait> {
        let state = self.lock();
        state
            .gates
            .waiting()
            .map(|((namespace, key), hold, until, runs)| KeyWait {
                namespace: namespace.clone(),
                key: key.clone(),
                reason: hold.describe(),
                until,
                runs: runs.iter().copied().collect(),
            })
            .collect()
    }

    /// The keys with the most runs held back here, at most `n`: `(namespace, key, runs)`.
    pub fn top_waiting_keys(&self, n: usize) -> Vec<(String, String, usize)> {
        let state = self.lock();
        state
            .gates
            .top_waiting(n)
            .into_iter()
            .map(|((namespace, key), runs)| (namespace.clone(), key.clone(), runs))
            .collect()
    }

    /// Attempts started for runs with concurrency keys: `(attempt id, namespace, keys)`.
    pub fn keys_held<'a>(
        &self,
        attempts: impl IntoIterator<Item = (i64, &'a str, &'a sked_core::flow::Gates)>,
    ) {
        let mut state = self.lock();
        for (attempt_id, namespace, gates) in attempts {
            state.gates.started(attempt_id, namespace, gates);
        }
    }

    /// Adds those of `runs` not queued here, and returns how many. (One handed out that has
    /// not started yet may be added again; the store starts it once, as when two nodes hand
    /// out one run.)
    pub fn enqueue_unheld(&self, runs: impl IntoIterator<Item = QueuedRun>) -> usize {
        let now = Utc::now();
        let mut state = self.lock();
        let mut added = 0;
        for run in runs {
            if !state.queue.holds(run.run_id) {
                state.queue_run(run, now);
                added += 1;
            }
        }
        if added > 0 {
            self.metrics.queue(&state.queue.per_priority);
            drop(state);
            self.wake.notify_one();
        }
        added
    }

    /// Replaces the whole queue with the store's queued runs (after events may have been missed).
    pub fn replace(&self, runs: Vec<QueuedRun>) {
        self.lock().queue.clear();
        self.enqueue(runs);
    }

    /// How many runs of job `job_id`, and of its namespace, wait here now, with the
    /// namespace's own cap if it has one. A job with none waiting is not placed in a
    /// namespace, so it counts none there either: admission is exact per job, and per
    /// namespace lets each job past the cap by one run at most.
    pub fn backlog(&self, job_id: i64) -> Backlog {
        let state = self.lock();
        match state.queue.backlog(job_id) {
            None => Backlog::default(),
            Some((job, namespace, in_namespace)) => Backlog {
                job,
                namespace: in_namespace,
                namespace_cap: state.namespace_caps.get(namespace).copied(),
            },
        }
    }

    /// How many runs of `namespace` wait here now, and its own cap if it has one (whether or
    /// not any job of it has runs here).
    pub fn namespace_backlog(&self, namespace: &str) -> (u64, Option<u64>) {
        let state = self.lock();
        (
            state.queue.queued_in(namespace),
            state.namespace_caps.get(namespace).copied(),
        )
    }

    /// Replaces the namespaces' own caps on queued runs and their weights in the fair share.
    pub fn set_namespace_settings(
        &self,
        caps: HashMap<String, u64>,
        weights: HashMap<String, u32>,
    ) {
        let mut state = self.lock();
        state.namespace_caps = caps;
        state.namespace_weights = weights;
    }

    /// Forgets runs that are no longer queued (started, cancelled or ended anywhere).
    pub fn remove(&self, run_ids: &[i64]) {
        let mut state = self.lock();
        for id in run_ids {
            state.queue.remove(*id);
        }
        self.metrics.queue(&state.queue.per_priority);
    }

    /// Waits up to `wait` for runs for worker `load` (its free slots are `load.slots -
    /// load.running`). The runs are taken out of the queue until the caller says they started
    /// ([`Handout::started`]); dropped before that, they go back in line.
    pub async fn poll(&self, load: WorkerLoad, wait: Duration) -> Handout<'_> {
        Handout {
            dispatcher: self,
            runs: self.wait_for_runs(load, wait).await,
        }
    }

    async fn wait_for_runs(&self, load: WorkerLoad, wait: Duration) -> Vec<QueuedRun> {
        let worker_id = load.id.clone();
        let (tx, rx) = oneshot::channel();
        let seq = {
            let mut state = self.lock();
            if state.closed {
                return Vec::new();
            }
            state.poll_seq += 1;
            let seq = state.poll_seq;
            // A newer poll from the same worker replaces an older one (its answer is empty).
            state
                .polls
                .insert(worker_id.clone(), Poll { seq, load, tx });
            seq
        };
        self.wake.notify_one();
        let mut pending = PendingPoll {
            dispatcher: self,
            worker_id,
            seq,
            rx,
            done: false,
        };
        match tokio::time::timeout(wait, &mut pending.rx).await {
            Ok(answer) => {
                pending.done = true;
                answer.unwrap_or_default()
            }
            Err(_) => pending.withdraw(),
        }
    }

    /// Matches ready runs with open polls. Called by the dispatcher loop whenever something
    /// changed.
    ///
    /// The candidates are the first runs of each service class some polling worker serves,
    /// as many as those workers have free slots (runs nobody polling can take are not looked
    /// at); they are offered to the slots in fair-share order between namespaces, each
    /// namespace's in queue order, and `assign` picks a worker for each by its job's policy.
    fn match_polls(&self) -> Option<Instant> {
        let now = Utc::now();
        let mut state = self.lock();
        let state = &mut *state;
        let next_delayed = state.queue.promote_due(now);
        state.gates.expire(now);
        if state.polls.is_empty() || !state.queue.any_ready() {
            return next_delayed;
        }
        let ids: Vec<String> = state.polls.keys().cloned().collect();
        let mut loads: Vec<WorkerLoad> = ids.iter().map(|id| state.polled_load(id)).collect();
        let keys = candidates(state, &loads);
        let demands: Vec<Demand<'_>> = keys
            .iter()
            .filter_map(|k| state.queue.get(k))
            .map(demand)
            .collect();
        let mut rng = rand::thread_rng();
        let pairs = assign(&demands, &mut loads, state.turn, || rng.gen());
        drop(demands);
        state.turn = state.turn.wrapping_add(pairs.len() as u64);
        // What was handed out counts until the workers' next heartbeats.
        for (load, id) in loads.iter().zip(&ids) {
            if load.assigned > 0 {
                if let Some(known) = state.workers.get_mut(id) {
                    known.assigned = known.assigned.saturating_add(load.assigned);
                    known.in_flight = known.in_flight.saturating_add(load.assigned);
                    known.recent_keys.clone_from(&load.recent_keys);
                }
            }
        }
        let mut per_worker: HashMap<usize, Vec<QueuedRun>> = HashMap::new();
        for (run_index, worker_index) in pairs {
            if let Some(run) = state.queue.remove(keys[run_index].2) {
                per_worker.entry(worker_index).or_default().push(run);
            }
        }
        for (worker_index, runs) in per_worker {
            if let Some(poll) = state.polls.remove(&ids[worker_index]) {
                if let Err(runs) = poll.tx.send(runs) {
                    // The poller is gone; its runs go back in line.
                    for run in runs {
                        state.queue_run(run, now);
                    }
                }
            }
        }
        self.metrics.queue(&state.queue.per_priority);
        next_delayed
    }

    /// The dispatcher loop: loads the store's queued runs, then matches on every change and at
    /// each delayed run's `ready_at`.
    pub async fn run(self: Arc<Self>, store: Arc<dyn Store>, mut shutdown: watch::Receiver<bool>) {
        loop {
            match store.queued_runs(None).await {
                Ok(runs) => {
                    self.enqueue(runs);
                    break;
                }
                Err(e) => tracing::error!("dispatch: cannot load queued runs, retrying: {e}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = crate::stopped(&mut shutdown) => {
                    self.close();
                    return;
                }
            }
        }
        loop {
            let next = self.match_polls();
            let wait = next
                .map(|at| (at - Utc::now()).to_std().unwrap_or_default())
                .unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                _ = crate::stopped(&mut shutdown) => {
                    self.close();
                    return;
                }
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Answers every open poll, empty, and every later one at once: the node is stopping.
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        // Dropping a poll's sender answers it with nothing.
        state.polls.clear();
    }
}

/// The runs one match offers to the polling workers `loads`, in the order they are offered:
/// from each service class some of them serve, its first runs, as many as those workers have
/// free slots; the namespaces' runs interleaved by fair share (the attempts each holds here,
/// over its weight), each namespace's in queue order.
fn candidates(state: &State, loads: &[WorkerLoad]) -> Vec<ReadyKey> {
    let per_class = state.queue.candidates(|class| {
        let demand = class.demand();
        loads
            .iter()
            .filter(|w| serves(&demand, w))
            .map(|w| w.free_slots() as usize)
            .sum()
    });
    let mut per_namespace: BTreeMap<&str, Vec<ReadyKey>> = BTreeMap::new();
    for (namespace, keys) in per_class {
        per_namespace.entry(namespace).or_default().extend(keys);
    }
    let queues: Vec<(&str, Vec<ReadyKey>)> = per_namespace
        .into_iter()
        .map(|(namespace, mut keys)| {
            keys.sort_unstable();
            (namespace, keys)
        })
        .collect();
    let tenants: Vec<Tenant<'_, ReadyKey>> = queues
        .iter()
        .map(|(namespace, keys)| Tenant {
            queue: keys,
            holding: state.holding.of(namespace),
            weight: state
                .namespace_weights
                .get(*namespace)
                .copied()
                .unwrap_or(DEFAULT_WEIGHT),
        })
        .collect();
    fair_order(&tenants)
        .into_iter()
        .map(|(tenant, at)| queues[tenant].1[at])
        .collect()
}

/// What a worker's heartbeat says of its load.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// The attempts it holds.
    pub attempts: Vec<i64>,
    /// Attempts started before this that it does not list have ended (a later one may have
    /// crossed the heartbeat on its way).
    pub started_before: Instant,
    pub stall: u32,
    pub warm_keys: Vec<String>,
}

impl LoadReport {
    /// A worker that holds nothing, as of `now`.
    pub fn idle(now: Instant) -> LoadReport {
        LoadReport {
            attempts: Vec::new(),
            started_before: now,
            stall: 0,
            warm_keys: Vec::new(),
        }
    }
}

/// What a queued run asks of a worker.
fn demand(run: &QueuedRun) -> Demand<'_> {
    Demand {
        namespace: &run.namespace,
        labels: &run.routing.labels,
        strategy: run.routing.strategy,
        affinity_key: run.routing.affinity_key.as_deref(),
        publishes_through: run.target.destination().map(|d| d.connection),
        priority: run.priority,
        pinned: run.pinned_worker.as_deref(),
        needs: run.target.needs(),
    }
}

impl KnownWorker {
    /// A worker with no labels, slots or load yet, under overload control `overload`.
    pub fn new(overload: OverloadControl) -> KnownWorker {
        KnownWorker {
            labels: BTreeMap::new(),
            slots: 0,
            warm_keys: Vec::new(),
            recent_keys: Vec::new(),
            stall: 0,
            assigned: 0,
            in_flight: 0,
            overload,
            namespaces: Vec::new(),
            token_id: None,
            draining: false,
        }
    }

    /// The worker as a dispatch policy sees it, with no attempts running.
    pub fn load(&self, id: &str) -> WorkerLoad {
        WorkerLoad {
            labels: self.labels.clone(),
            stall: self.stall,
            warm_keys: self.warm_keys.clone(),
            recent_keys: self.recent_keys.clone(),
            overload: self.overload,
            namespaces: self.namespaces.clone(),
            ..WorkerLoad::idle(id, self.slots)
        }
    }
}

/// Runs handed to one worker's poll. Until attempts for them are started, the store still has
/// them queued: if the request goes away meanwhile (the worker died, its connection dropped)
/// or starting fails, dropping this puts them back in line rather than forgetting them.
pub struct Handout<'a> {
    dispatcher: &'a Dispatcher,
    runs: Vec<QueuedRun>,
}

impl Handout<'_> {
    pub fn runs(&self) -> &[QueuedRun] {
        &self.runs
    }

    /// Attempts were started for these runs (or the store found them no longer queued).
    pub fn started(mut self) -> Vec<QueuedRun> {
        std::mem::take(&mut self.runs)
    }
}

impl Drop for Handout<'_> {
    fn drop(&mut self) {
        if !self.runs.is_empty() {
            self.dispatcher.enqueue(std::mem::take(&mut self.runs));
        }
    }
}

/// An open poll. If its request goes away (the HTTP connection dropped) before it is answered,
/// the poll is withdrawn and any runs already matched to it go back in line.
struct PendingPoll<'a> {
    dispatcher: &'a Dispatcher,
    worker_id: String,
    seq: u64,
    rx: oneshot::Receiver<Vec<QueuedRun>>,
    done: bool,
}

impl PendingPoll<'_> {
    fn withdraw(&mut self) -> Vec<QueuedRun> {
        self.done = true;
        {
            let mut state = self.dispatcher.lock();
            if state
                .polls
                .get(&self.worker_id)
                .is_some_and(|p| p.seq == self.seq)
            {
                state.polls.remove(&self.worker_id);
            }
        }
        // Matching happens under the lock, so an answer sent before the withdrawal is waiting
        // in the channel.
        self.rx.try_recv().unwrap_or_default()
    }
}

impl Drop for PendingPoll<'_> {
    fn drop(&mut self) {
        if !self.done {
            let runs = self.withdraw();
            self.dispatcher.enqueue(runs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sked_core::target::TargetSpec;

    fn queued(run_id: i64) -> QueuedRun {
        let now = Utc::now();
        QueuedRun {
            run_id,
            job_id: 1,
            namespace: "default".into(),
            job: "j".into(),
            scheduled_for: now,
            priority: 0,
            ready_at: now,
            target: serde_json::from_value::<TargetSpec>(
                serde_json::json!({"shell": {"command": "true"}}),
            )
            .expect("a shell target"),
            timeout: None,
            routing: Default::default(),
            event: None,
            graph_ranked: false,
            shard: None,
            pinned_worker: None,
            gates: Default::default(),
            params: None,
            trace_parent: None,
        }
    }

    fn worker() -> WorkerLoad {
        WorkerLoad::idle("w", 4)
    }

    /// One poll, answered by one matching pass once the poll is open.
    async fn poll_once(dispatcher: &Dispatcher) -> Handout<'_> {
        let matcher = async {
            tokio::task::yield_now().await;
            dispatcher.match_polls();
        };
        let (handout, ()) =
            tokio::join!(dispatcher.poll(worker(), Duration::from_secs(5)), matcher);
        handout
    }

    fn ids(runs: &[QueuedRun]) -> Vec<i64> {
        runs.iter().map(|r| r.run_id).collect()
    }

    #[tokio::test]
    async fn runs_handed_out_but_never_started_go_back_in_line() {
        let dispatcher = Dispatcher::new(Arc::new(Metrics::default()));
        dispatcher.enqueue(vec![queued(1), queued(2)]);
        let handout = poll_once(&dispatcher).await;
        assert_eq!(ids(handout.runs()), vec![1, 2]);
        assert_eq!(
            dispatcher.lock().queue.depth(),
            0,
            "taken out while handed out"
        );
        // The request went away before the attempts were started.
        drop(handout);
        assert_eq!(dispatcher.lock().queue.depth(), 2);

        let handout = poll_once(&dispatcher).await;
        assert_eq!(ids(&handout.started()), vec![1, 2]);
        assert_eq!(dispatcher.lock().queue.depth(), 0, "started runs stay out");
    }

    /// A stopping node answers its open long polls at once, and every later one, empty: its
    /// workers go to another node instead of holding the node's shutdown for a poll's length.
    #[tokio::test]
    async fn closing_answers_open_and_later_polls_at_once_and_empty() {
        let dispatcher = Dispatcher::new(Arc::new(Metrics::default()));
        let began = std::time::Instant::now();
        let closer = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            dispatcher.close();
        };
        let (open, ()) = tokio::join!(dispatcher.poll(worker(), Duration::from_secs(30)), closer);
        assert!(open.runs().is_empty());
        dispatcher.enqueue(vec![queued(1)]);
        let later = dispatcher.poll(worker(), Duration::from_secs(30)).await;
        assert!(later.runs().is_empty(), "nothing is handed out once closed");
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "{:?}",
            began.elapsed()
        );
    }

    #[tokio::test]
    async fn a_higher_rank_goes_first_equals_go_oldest_first_and_waiting_ages() {
        let dispatcher = Dispatcher::new(Arc::new(Metrics::default()));
        let ranked = |run_id: i64, priority: i32, age_s: i64| {
            let mut run = queued(run_id);
            run.priority = priority;
            run.ready_at -= chrono::Duration::seconds(age_s);
            run
        };
        // A leaf's old runs, and the root of a pipeline 40 jobs wide (`priority: auto`).
        dispatcher.enqueue(vec![ranked(1, 0, 30), ranked(2, 40, 1), ranked(3, 0, 60)]);
        let handout = poll_once(&dispatcher).await;
        assert_eq!(ids(handout.runs()), vec![2, 3, 1]);
        drop(handout.started());
        // Aging: a priority 0 run ready for four minutes goes before a priority 3 run ready
        // now (worth three), and after a priority 5 run (worth five).
        dispatcher.enqueue(vec![ranked(4, 3, 0), ranked(5, 0, 240), ranked(6, 5, 0)]);
        let handout = poll_once(&dispatcher).await;
        assert_eq!(ids(handout.runs()), vec![6, 5, 4]);
    }

    #[tokio::test]
    async fn a_poll_opened_while_overloaded_gets_work_once_a_heartbeat_says_it_recovered() {
        use sked_core::dispatch::{Overload, StallLimits};
        let dispatcher = Dispatcher::new(Arc::new(Metrics::default()));
        let control = OverloadControl::new(Overload::Breaker, StallLimits { trip: 4, reset: 1 });
        let known = KnownWorker {
            slots: 4,
            namespaces: vec!["*".into()],
            ..KnownWorker::new(control)
        };
        dispatcher.remember_worker("w", known);
        let stalled = |stall| LoadReport {
            stall,
            ..LoadReport::idle(Utc::now())
        };
        dispatcher.report_load("w", stalled(9), control);
        assert_eq!(dispatcher.metrics.workers_overloaded.get(), 1);
        dispatcher.enqueue(vec![queued(1)]);
        let heartbeats = async {
            tokio::task::yield_now().await;
            dispatcher.match_polls();
            let why = dispatcher.waiting_for_workers(1);
            // The worker's long poll stays open; its next heartbeat closes the breaker.
            dispatcher.report_load("w", stalled(0), control);
            dispatcher.match_polls();
            why
        };
        let (handout, why) = tokio::join!(
            dispatcher.poll(worker(), Duration::from_secs(5)),
            heartbeats
        );
        assert_eq!(
            why.as_deref(),
            Some("waiting for workers: 1 eligible, all over the breaker threshold")
        );
        assert_eq!(ids(&handout.started()), vec![1]);
        assert_eq!(dispatcher.metrics.workers_overloaded.get(), 0);
    }

    /// A poll opened while its worker was busy asked for little; completions since then make
    /// the worker the idlest, and the run goes there (within what the poll asked for).
    #[tokio::test]
    async fn a_long_open_poll_is_judged_by_the_workers_load_now() {
        let dispatcher = Dispatcher::new(Arc::new(Metrics::default()));
        let control = OverloadControl::default();
        for (id, running) in [("a", 3), ("b", 1)] {
            let known = KnownWorker {
                slots: 4,
                namespaces: vec!["*".into()],
                ..KnownWorker::new(control)
            };
            dispatcher.remember_worker(id, known);
            let report = LoadReport {
                attempts: (0..running).collect(),
                ..LoadReport::idle(Utc::now())
            };
            dispatcher.report_load(id, report, control);
        }
        let polling = |id: &str, running: u32| WorkerLoad {
            running,
            cap: 4 - running,
            ..WorkerLoad::idle(id, 4)
        };
        let mut run = queued(1);
        run.routing.strategy = sked_core::dispatch::Strategy::LeastLoaded;
        let matcher = async {
            tokio::task::yield_now().await;
            // `a` reports its three attempts ended while its poll is open.
            dispatcher.completed("a", &[0, 1, 2]);
            dispatcher.enqueue(vec![run]);
            dispatcher.match_polls();
        };
        let (to_a, to_b, ()) = tokio::join!(
            dispatcher.poll(polling("a", 3), Duration::from_millis(300)),
            dispatcher.poll(polling("b", 1), Duration::from_millis(300)),
            matcher
        );
        assert_eq!((ids(to_a.runs()), ids(to_b.runs())), (vec![1], vec![]));
    }

    #[test]
    fn a_run_queued_twice_is_held_once_and_removed_by_id() {
        let dispatcher = Dispatcher::new(Arc::new(Metrics::default()));
        let mut later = queued(7);
        later.ready_at += chrono::Duration::seconds(60);
        dispatcher.enqueue(vec![queued(7)]);
        dispatcher.enqueue(vec![later]);
        assert_eq!(
            dispatcher.lock().queue.depth(),
            1,
            "the second copy replaced the first"
        );
        dispatcher.remove(&[7, 8]);
        assert_eq!(dispatcher.lock().queue.depth(), 0);
    }
}
