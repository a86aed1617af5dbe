//! The event simulation of one cell: a trace, a pool of servers, one overload policy and one
//! host strategy, one seed.
//!
//! Owns the servers (slots, local queues, warm caches), the dispatcher's central queue and its
//! views of the servers, and the event loop. Every dispatch decision is
//! [`sked_core::dispatch::assign`]'s, every overload state change
//! [`sked_core::dispatch::OverloadControl::observe`]'s and the queue order
//! [`sked_core::dispatch::queue_position`]'s: this module must not decide any of those itself.
//! It computes no figures (see `stats`).

use crate::trace::{Micros, Trace};
use crate::SimError;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use sked_core::dispatch::{
    assign, queue_position, Demand, Overload, OverloadControl, StallLimits, Strategy, WorkerLoad,
    AGING_STEP, MAX_WARM_KEYS,
};
use sked_core::Instant;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::time::Duration;

/// The pool being simulated and how it reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub servers: u32,
    /// Requests one server executes at once.
    pub slots: u32,
    /// Requests one server accepts in flight (executing and waiting in it).
    pub accept: u32,
    /// Affinity keys one server holds warm (0 to 4,096).
    pub cache: u32,
    /// How often each server reports its load.
    pub report_every: Micros,
    /// The queue's aging step (see `queue_position`).
    pub aging: Duration,
    /// The stall gauge's thresholds for `breaker` and `admission`.
    pub limits: StallLimits,
}

impl Default for Model {
    fn default() -> Model {
        Model {
            servers: 14,
            slots: 4,
            accept: 64,
            cache: 32,
            report_every: Micros(5_000_000),
            aging: AGING_STEP,
            limits: StallLimits::default(),
        }
    }
}

impl Model {
    /// Checks the bounds a user can get wrong.
    pub fn validate(&self) -> Result<(), SimError> {
        let within = |what, value: u32, max: u32, range| {
            if (1..=max).contains(&value) {
                Ok(())
            } else {
                Err(SimError::out_of_range(what, range, value))
            }
        };
        within("servers", self.servers, 10_000, "1 to 10,000")?;
        within("slots", self.slots, 10_000, "1 to 10,000")?;
        within("accept", self.accept, 1_000_000, "1 to 1,000,000")?;
        if self.accept < self.slots {
            return Err(SimError::out_of_range(
                "accept",
                "at least slots",
                self.accept,
            ));
        }
        if self.cache > 4_096 {
            return Err(SimError::out_of_range("cache", "0 to 4,096", self.cache));
        }
        if !(1_000..=3_600_000_000).contains(&self.report_every.0) {
            return Err(SimError::out_of_range(
                "report_every",
                "0.001 to 3600 seconds",
                self.report_every.secs(),
            ));
        }
        if self.aging > Duration::from_secs(86_400) {
            return Err(SimError::out_of_range(
                "aging",
                "at most 86400 seconds",
                self.aging.as_secs_f64(),
            ));
        }
        StallLimits::new(self.limits.trip, self.limits.reset).map_err(SimError::Limits)?;
        Ok(())
    }
}

/// One combination of the matrix: an overload policy and a host strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cell {
    pub overload: Overload,
    pub host: Strategy,
}

impl Cell {
    /// What the ratios compare against: no overload control, a random host.
    pub const BASELINE: Cell = Cell {
        overload: Overload::None,
        host: Strategy::Random,
    };

    /// Every combination, overload policies outermost.
    pub fn all() -> Vec<Cell> {
        Overload::ALL
            .iter()
            .flat_map(|&overload| {
                Strategy::ALL
                    .iter()
                    .map(move |&host| Cell { overload, host })
            })
            .collect()
    }
}

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Served {
    /// From arrival to the start of execution.
    pub wait: Micros,
    /// Execution: its warm or cold time.
    pub duration: Micros,
    /// Of `wait`, the part spent inside the server it was handed to (queued behind its busy
    /// slots).
    pub local_wait: Micros,
    /// The server it ran on.
    pub server: u32,
    /// Whether the server held its key warm.
    pub warm: bool,
}

/// One cell's simulation: what happened to each request, in the trace's order.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub served: Vec<Served>,
    /// Requests that completed (every one of them, when `simulate` returns).
    pub completed: usize,
    /// Requests handed, under the `breaker` policy, to a server whose view's breaker was open
    /// (none, if `assign` honours the breaker).
    pub handed_while_tripped: u64,
    /// The longest the central queue got.
    pub max_central_queue: usize,
    /// Completions of a request that had completed already (none, if the engine is right).
    pub repeated: u64,
}

/// The epoch simulated time 0 stands for, in the queue's order (any fixed instant will do).
fn epoch() -> Instant {
    chrono::DateTime::from_timestamp(1_767_225_600, 0).unwrap_or_default()
}

/// After this long without any request in flight while some wait, the simulation gives up.
const STUCK_AFTER: Micros = Micros(1_000_000 * 86_400 * 30);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A request finished executing on a server.
    Done { server: u32, request: u32 },
    /// A server's periodic load report.
    Report { server: u32 },
}

/// Which priorities some server could take now, worked out once a priority per dispatch.
#[derive(Default)]
struct Takers {
    known: Vec<(i32, bool)>,
}

impl Takers {
    /// Whether some server with a free slot admits `priority` for some draw.
    fn anyone(&mut self, views: &[WorkerLoad], priority: i32) -> bool {
        if let Some(&(_, yes)) = self.known.iter().find(|(p, _)| *p == priority) {
            return yes;
        }
        let yes = views
            .iter()
            .any(|w| w.free_slots() > 0 && w.overload.admits_any(priority));
        self.known.push((priority, yes));
        yes
    }
}

/// A request waiting inside a server: highest priority first, then earliest handed.
type Waiting = (i32, Reverse<Micros>, Reverse<u32>);

/// One server as it really is (the dispatcher sees it through a `WorkerLoad`).
struct Server {
    executing: u32,
    in_flight: u32,
    local: BinaryHeap<Waiting>,
    /// Warm keys, least recent first.
    cache: VecDeque<u32>,
}

impl Server {
    /// Makes `key` the most recent; says whether it was there.
    fn touch(&mut self, key: u32, capacity: usize) -> bool {
        if let Some(at) = self.cache.iter().position(|&k| k == key) {
            self.cache.remove(at);
            self.cache.push_back(key);
            return true;
        }
        if capacity > 0 {
            if self.cache.len() >= capacity {
                self.cache.pop_front();
            }
            self.cache.push_back(key);
        }
        false
    }
}

struct Sim<'t> {
    trace: &'t Trace,
    model: &'t Model,
    host: Strategy,
    servers: Vec<Server>,
    views: Vec<WorkerLoad>,
    central: BTreeSet<(Instant, u32)>,
    events: BinaryHeap<Reverse<(Micros, u64, Event)>>,
    seq: u64,
    turn: u64,
    rng: StdRng,
    run: Run,
    finished: Vec<bool>,
    /// The trace's priorities.
    classes: Vec<i32>,
    /// Requests in flight on all servers together.
    in_flight: usize,
}

/// Simulates `trace` under `cell` until every request has completed. `seed` drives every
/// random draw (the `random` strategy, admission); the same arguments give the same [`Run`].
pub fn simulate(trace: &Trace, model: &Model, cell: Cell, seed: u64) -> Result<Run, SimError> {
    model.validate()?;
    let n = trace.requests().len();
    let control = OverloadControl::new(cell.overload, model.limits);
    let views = (0..model.servers)
        .map(|i| WorkerLoad {
            overload: control,
            ..WorkerLoad::idle(format!("server-{i:05}"), model.accept)
        })
        .collect();
    let servers = (0..model.servers)
        .map(|_| Server {
            executing: 0,
            in_flight: 0,
            local: BinaryHeap::new(),
            cache: VecDeque::new(),
        })
        .collect();
    let mut sim = Sim {
        trace,
        model,
        host: cell.host,
        servers,
        views,
        central: BTreeSet::new(),
        events: BinaryHeap::new(),
        seq: 0,
        turn: 0,
        rng: StdRng::seed_from_u64(seed),
        run: Run {
            served: vec![Served::default(); n],
            completed: 0,
            handed_while_tripped: 0,
            max_central_queue: 0,
            repeated: 0,
        },
        finished: vec![false; n],
        classes: trace.classes(),
        in_flight: 0,
    };
    // Staggered: server i first reports i/servers of the way into the first period.
    for server in 0..model.servers {
        let offset = model.report_every.0 * i64::from(server) / i64::from(model.servers);
        sim.schedule(Micros(offset), Event::Report { server });
    }
    sim.run_to_completion()?;
    Ok(sim.run)
}

impl Sim<'_> {
    fn schedule(&mut self, at: Micros, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, event)));
    }

    fn run_to_completion(&mut self) -> Result<(), SimError> {
        let requests = self.trace.requests();
        let epoch = epoch();
        let mut next_arrival = 0usize;
        let mut idle_since: Option<Micros> = None;
        while self.run.completed < requests.len() {
            let arrival = requests.get(next_arrival).map(|r| r.at);
            let event = self.events.peek().map(|Reverse((at, _, _))| *at);
            let now = match (arrival, event) {
                // Completions and reports at an instant go before arrivals at it.
                (Some(a), Some(e)) if a < e => {
                    self.arrive(next_arrival, epoch);
                    next_arrival += 1;
                    a
                }
                (_, Some(e)) => {
                    if let Some(Reverse((_, _, event))) = self.events.pop() {
                        self.handle(event, e);
                    }
                    e
                }
                (Some(a), None) => {
                    self.arrive(next_arrival, epoch);
                    next_arrival += 1;
                    a
                }
                (None, None) => break,
            };
            self.dispatch(now);
            // A guard against a policy that never takes what waits: nothing in flight anywhere
            // for a month of simulated time while requests wait.
            if self.in_flight == 0 && !self.central.is_empty() {
                let since = *idle_since.get_or_insert(now);
                if now - since > STUCK_AFTER {
                    return Err(SimError::Stuck {
                        at_s: now.secs(),
                        waiting: self.central.len(),
                    });
                }
            } else {
                idle_since = None;
            }
        }
        Ok(())
    }

    fn arrive(&mut self, index: usize, epoch: Instant) {
        let request = &self.trace.requests()[index];
        let ready = epoch + chrono::Duration::microseconds(request.at.0);
        let position = queue_position(ready, request.priority, self.model.aging);
        self.central.insert((position, index as u32));
        self.run.max_central_queue = self.run.max_central_queue.max(self.central.len());
    }

    fn handle(&mut self, event: Event, now: Micros) {
        match event {
            Event::Done { server, request } => {
                let s = &mut self.servers[server as usize];
                s.executing -= 1;
                s.in_flight -= 1;
                self.in_flight -= 1;
                match self.finished.get_mut(request as usize) {
                    Some(done @ false) => {
                        *done = true;
                        self.run.completed += 1;
                    }
                    _ => self.run.repeated += 1,
                }
                if let Some((_, Reverse(handed), Reverse(next))) = s.local.pop() {
                    self.start(server, next, handed, now);
                }
                // Completions reach the dispatcher at once.
                let view = &mut self.views[server as usize];
                view.running = self.servers[server as usize].in_flight;
                view.assigned = 0;
            }
            Event::Report { server } => {
                let s = &self.servers[server as usize];
                let stall = u32::try_from(s.local.len()).unwrap_or(u32::MAX);
                let skip = s.cache.len().saturating_sub(MAX_WARM_KEYS);
                let warm_keys = s
                    .cache
                    .iter()
                    .skip(skip)
                    .map(|&k| self.trace.key(k).to_string())
                    .collect();
                let view = &mut self.views[server as usize];
                view.running = s.in_flight;
                view.stall = stall;
                view.assigned = 0;
                view.warm_keys = warm_keys;
                view.overload.observe(stall);
                self.schedule(now + self.model.report_every, Event::Report { server });
            }
        }
    }

    /// Hands what it can of the central queue to servers: `assign` decides.
    ///
    /// Requests no server could take whatever the draw (every server with a free slot refuses
    /// their priority: its breaker is open, or admission sheds the whole class) are left out of
    /// the call: `select` would return none for them. That changes which random numbers the
    /// others get, not how they are drawn, and keeps a long queue behind tripped servers from
    /// costing a scan of the window on every event.
    fn dispatch(&mut self, now: Micros) {
        if self.central.is_empty() {
            return;
        }
        let free: u64 = self.views.iter().map(|w| u64::from(w.free_slots())).sum();
        if free == 0 {
            // `assign` would stop before its first choice.
            return;
        }
        let mut takers = Takers::default();
        if self.classes.len() <= 16 && !self.classes.iter().any(|&p| takers.anyone(&self.views, p))
        {
            return;
        }
        let window = usize::try_from(free.saturating_mul(4))
            .unwrap_or(usize::MAX)
            .max(256);
        let trace = self.trace;
        let requests = trace.requests();
        let labels = BTreeMap::new();
        let mut queued: Vec<(Instant, u32)> = Vec::new();
        for &entry in self.central.iter().take(window) {
            if takers.anyone(&self.views, requests[entry.1 as usize].priority) {
                queued.push(entry);
            }
        }
        if queued.is_empty() {
            return;
        }
        let demands: Vec<Demand<'_>> = queued
            .iter()
            .map(|&(_, i)| {
                let request = &requests[i as usize];
                Demand {
                    namespace: "default",
                    labels: &labels,
                    strategy: self.host,
                    affinity_key: Some(trace.key(request.key)),
                    publishes_through: None,
                    priority: request.priority,
                    pinned: None,
                    needs: &[],
                }
            })
            .collect();
        let rng = &mut self.rng;
        let pairs = assign(&demands, &mut self.views, self.turn, || rng.next_u64());
        self.turn = self.turn.wrapping_add(pairs.len() as u64);
        for (d, w) in pairs {
            let entry = queued[d];
            self.central.remove(&entry);
            let overload = &self.views[w].overload;
            if overload.policy == Overload::Breaker && overload.state.tripped {
                self.run.handed_while_tripped += 1;
            }
            self.hand(w as u32, entry.1, now);
        }
    }

    /// A request reaches a server: it starts if a slot is free, else waits inside.
    fn hand(&mut self, server: u32, request: u32, now: Micros) {
        self.in_flight += 1;
        let s = &mut self.servers[server as usize];
        s.in_flight += 1;
        if s.executing < self.model.slots {
            self.start(server, request, now, now);
        } else {
            let priority = self.trace.requests()[request as usize].priority;
            s.local.push((priority, Reverse(now), Reverse(request)));
        }
    }

    /// Starts executing `request`, which reached `server` at `handed`.
    fn start(&mut self, server: u32, request: u32, handed: Micros, now: Micros) {
        let r = self.trace.requests()[request as usize];
        let s = &mut self.servers[server as usize];
        s.executing += 1;
        let warm = s.touch(r.key, self.model.cache as usize);
        let duration = if warm { r.warm } else { r.cold };
        self.run.served[request as usize] = Served {
            wait: now - r.at,
            duration,
            local_wait: now - handed,
            server,
            warm,
        };
        self.schedule(now + duration, Event::Done { server, request });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceLine;
    use proptest::prelude::{prop_assert, prop_assert_eq, proptest};

    fn line(at: f64, key: &str, priority: i32, warm: f64, cold: f64) -> TraceLine {
        TraceLine {
            at,
            job: "j".into(),
            key: key.into(),
            priority,
            warm,
            cold,
        }
    }

    fn one_server(slots: u32) -> Model {
        Model {
            servers: 1,
            slots,
            accept: 64,
            ..Model::default()
        }
    }

    fn secs(run: &Run) -> Vec<(f64, f64)> {
        run.served
            .iter()
            .map(|s| (s.wait.secs(), s.duration.secs()))
            .collect()
    }

    #[test]
    fn one_slot_by_hand() {
        // One server, one slot, all handed at once (accept 64). A (key a) starts at 0, cold: 4 s.
        // B (key a) arrives at 1 and C (key b, priority 1) at 2; both wait inside the server.
        // At 4 C goes first (priority): wait 2, cold 2 s. B starts at 6: wait 5, warm 1 s.
        let trace = Trace::from_lines([
            line(0.0, "a", 0, 1.0, 4.0),
            line(1.0, "a", 0, 1.0, 4.0),
            line(2.0, "b", 1, 0.5, 2.0),
        ])
        .unwrap();
        for cell in Cell::all() {
            let run = simulate(&trace, &one_server(1), cell, 1).unwrap();
            assert_eq!(
                secs(&run),
                vec![(0.0, 4.0), (5.0, 1.0), (2.0, 2.0)],
                "{cell:?}"
            );
            // Handed at once, so every wait was inside the server.
            let local: Vec<f64> = run.served.iter().map(|s| s.local_wait.secs()).collect();
            assert_eq!(local, vec![0.0, 5.0, 2.0], "{cell:?}");
            assert_eq!(run.completed, 3);
        }
    }

    #[test]
    fn the_cache_is_lru_of_its_capacity() {
        // One slot, a cache of 2 keys, requests 10 s apart (each done before the next).
        let keys = ["a", "b", "c", "a", "c", "b"];
        let trace = Trace::from_lines(
            keys.iter()
                .enumerate()
                .map(|(i, k)| line(i as f64 * 10.0, k, 0, 1.0, 3.0)),
        )
        .unwrap();
        let model = Model {
            cache: 2,
            ..one_server(1)
        };
        let run = simulate(&trace, &model, Cell::BASELINE, 7).unwrap();
        let warm: Vec<bool> = run.served.iter().map(|s| s.warm).collect();
        // a, b cold; c cold (holds b c); a cold (c a); c warm (a c); b cold (c b).
        assert_eq!(warm, vec![false, false, false, false, true, false]);
        let durations: Vec<f64> = run.served.iter().map(|s| s.duration.secs()).collect();
        assert_eq!(durations, vec![3.0, 3.0, 3.0, 3.0, 1.0, 3.0]);
        let none = Model {
            cache: 0,
            ..one_server(1)
        };
        let run = simulate(&trace, &none, Cell::BASELINE, 7).unwrap();
        assert!(run.served.iter().all(|s| !s.warm));
    }

    #[test]
    fn requests_of_a_key_running_together_share_the_warm_key() {
        // Two slots: the second request of `a` starts while the first runs: warm.
        let trace =
            Trace::from_lines([line(0.0, "a", 0, 1.0, 5.0), line(0.5, "a", 0, 1.0, 5.0)]).unwrap();
        let run = simulate(&trace, &one_server(2), Cell::BASELINE, 1).unwrap();
        assert_eq!(secs(&run), vec![(0.0, 5.0), (0.0, 1.0)]);
    }

    #[test]
    fn a_full_server_leaves_requests_in_the_central_queue() {
        // accept 1: the view is full while one request is in flight; the others wait centrally.
        let trace =
            Trace::from_lines((0..3).map(|i| line(f64::from(i) * 0.1, "k", 0, 1.0, 1.0))).unwrap();
        let model = Model {
            accept: 1,
            ..one_server(1)
        };
        let run = simulate(&trace, &model, Cell::BASELINE, 1).unwrap();
        assert_eq!(run.max_central_queue, 2);
        let waits: Vec<f64> = run.served.iter().map(|s| s.wait.secs()).collect();
        assert_eq!(waits, vec![0.0, 0.9, 1.8]);
        // None of it inside the server: each started as it was handed.
        assert!(run.served.iter().all(|s| s.local_wait == Micros(0)));
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let trace = crate::workload::Workload::new(3, 0.05)
            .and_then(|w| w.trace())
            .unwrap();
        for cell in Cell::all() {
            let a = simulate(&trace, &Model::default(), cell, 11).unwrap();
            let b = simulate(&trace, &Model::default(), cell, 11).unwrap();
            assert_eq!(a, b, "{cell:?}");
            assert_eq!(a.completed, trace.requests().len());
        }
    }

    #[test]
    fn the_breaker_never_hands_to_a_tripped_server() {
        // Load enough to trip breakers: 2 servers, 1 slot, many requests at once.
        let trace = Trace::from_lines(
            (0..400).map(|i| line(f64::from(i) * 0.05, &format!("k{}", i % 7), 0, 0.5, 1.5)),
        )
        .unwrap();
        let model = Model {
            servers: 2,
            slots: 1,
            accept: 1_000,
            limits: StallLimits::new(3, 1).unwrap(),
            ..Model::default()
        };
        for &host in Strategy::ALL {
            let cell = Cell {
                overload: Overload::Breaker,
                host,
            };
            let run = simulate(&trace, &model, cell, 5).unwrap();
            assert_eq!(run.handed_while_tripped, 0, "{host:?}");
            assert!(run.max_central_queue > 0, "the breaker held work back");
            assert_eq!(run.completed, 400);
            // Without the breaker the same pool takes every request at once.
            let open = simulate(
                &trace,
                &model,
                Cell {
                    overload: Overload::None,
                    host,
                },
                5,
            )
            .unwrap();
            assert!(open.max_central_queue <= 1, "{host:?}");
        }
    }

    #[test]
    fn bad_models_are_refused() {
        let trace = Trace::from_lines([line(0.0, "a", 0, 1.0, 1.0)]).unwrap();
        let bad = [
            Model {
                servers: 0,
                ..Model::default()
            },
            Model {
                slots: 10_001,
                ..Model::default()
            },
            Model {
                accept: 2,
                ..Model::default()
            },
            Model {
                limits: StallLimits { trip: 4, reset: 4 },
                ..Model::default()
            },
        ];
        for model in bad {
            assert!(simulate(&trace, &model, Cell::BASELINE, 1).is_err());
        }
    }

    proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        /// Under every cell, every request of a random small trace completes exactly once,
        /// with a wait of zero or more and its warm or cold time.
        #[test]
        fn every_request_completes_once(
            reqs in proptest::collection::vec(
                (0u32..20_000, 0u8..5, 0i32..3, 0u32..3_000, 0u32..6_000), 1..60),
            servers in 1u32..4, slots in 1u32..3, accept_extra in 0u32..4,
            cache in 0u32..3, seed in 0u64..1_000,
        ) {
            let trace = Trace::from_lines(reqs.iter().map(|&(at, key, priority, warm, cold)| {
                line(f64::from(at) / 1000.0, &format!("k{key}"), priority,
                     f64::from(warm) / 1000.0, f64::from(cold) / 1000.0)
            })).unwrap();
            let model = Model {
                servers, slots, accept: slots + accept_extra, cache,
                limits: StallLimits::new(1, 0).unwrap(),
                ..Model::default()
            };
            for cell in Cell::all() {
                let run = simulate(&trace, &model, cell, seed).unwrap();
                prop_assert_eq!(run.completed, trace.requests().len());
                prop_assert_eq!(run.repeated, 0);
                prop_assert_eq!(run.served.len(), trace.requests().len());
                prop_assert_eq!(run.handed_while_tripped, 0);
                for (served, request) in run.served.iter().zip(trace.requests()) {
                    prop_assert!(served.wait >= Micros(0));
                    prop_assert!(served.local_wait >= Micros(0));
                    prop_assert!(served.local_wait <= served.wait);
                    prop_assert!(served.server < servers);
                    let expected = if served.warm { request.warm } else { request.cold };
                    prop_assert_eq!(served.duration, expected);
                }
            }
        }
    }
}
