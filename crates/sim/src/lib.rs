//! A discrete-event simulator of sked's dispatch policies.
//!
//! It replays a trace of requests against a pool of simulated sked workers ("servers") and
//! measures waits and durations under each combination of overload control and host strategy.
//! The policies it evaluates are not copies: every choice is made by the functions the live
//! dispatcher calls, [`sked_core::dispatch::assign`] (and through it `select`),
//! [`sked_core::dispatch::OverloadControl::observe`] and
//! [`sked_core::dispatch::queue_position`].
//!
//! # The model
//!
//! - **Requests.** A trace is a list of requests `{"at", "job", "key", "priority", "warm",
//!   "cold"}`: the arrival in seconds from the trace start, the job, the affinity key (a
//!   project), the priority (0 low, higher first) and the execution time when the server holds
//!   the key warm, or not. See [`trace`].
//! - **Servers.** `servers` servers, each a sked worker with `slots` execution slots (at most
//!   that many requests execute at once) and an acceptance capacity `accept` (requests in
//!   flight there: executing plus waiting inside it). A request handed to a server whose slots
//!   are all busy waits in the server's local queue, highest priority first, then earliest
//!   handed (the seed's executor). The server's stall gauge is the length of that queue.
//! - **Warm cache.** Each server keeps an LRU set of `cache` affinity keys. A request that
//!   starts on a server holding its key takes its `warm` time, otherwise its `cold` time; at
//!   start its key becomes the server's most recent (so requests of one key that start while
//!   another of that key runs are warm: the executor's de-duplication).
//! - **Reports.** Every `report_every` seconds (servers staggered by index) a server reports
//!   `running` (in flight), `stall` (local queue length) and its warm keys. The dispatcher's view
//!   of the server (a [`sked_core::dispatch::WorkerLoad`] whose `slots` is `accept`) takes
//!   `running` and `stall`, resets `assigned`, replaces `warm_keys`, and its overload control
//!   observes the stall. A completion reaches the dispatcher at once (sked workers report
//!   completions immediately): it sets the view's `running` to the server's in-flight count and
//!   resets `assigned`. Between those, the view changes only by `WorkerLoad::hand` inside
//!   `assign`. So the view's free slots are exact; the stall gauge, warm keys and overload
//!   state are as of the last report.
//! - **Dispatcher.** A central queue of requests not yet handed to a server, ordered by
//!   `queue_position(arrival, priority, aging)`. After every arrival, completion and report,
//!   `assign` runs over the queue's first `max(4 × free slots, 256)` entries (the live
//!   dispatcher's window) with each request's demand (the cell's host strategy, its key as
//!   affinity key, its priority, namespace `default`, no labels) against every server's view,
//!   each with `OverloadControl::new(cell overload, limits)`. A request no server takes waits
//!   in the central queue; none is ever dropped. A handed request starts at once if a slot is
//!   free, else joins the server's local queue.
//! - **Figures.** `wait` is arrival to start of execution (central and local queue together);
//!   `duration` is the execution time (warm or cold); slowdown is `wait / (wait + duration)`.
//!   See [`stats`].
//! - **Randomness.** Every draw (the `random` strategy, admission, the synthetic workload) comes
//!   from a [`rand::rngs::StdRng`] seeded by the caller: the same seed gives the same result.
//!   Time is integer microseconds, events at one instant run in the order they were scheduled.
//!
//! What it does not model: CPU contention (an executing request takes its time whatever else
//! runs), network delays, failures and retries, server restarts and pre-emption, prefetching,
//! and the dispatcher's own latency.
//!
//! Modules: [`trace`] (requests, JSONL), [`workload`] (the synthetic generator), [`engine`]
//! (one cell's event simulation), [`stats`] (figures, confidence intervals), [`matrix`] (cells
//! times seeds on threads, baseline ratios, output).

pub mod engine;
pub mod matrix;
pub mod stats;
pub mod trace;
pub mod workload;

pub use engine::{simulate, Cell, Model, Run, Served};
pub use matrix::{run_families, run_matrix, CellReport, MatrixReport, MatrixSpec, Source};
pub use trace::{Micros, Request, Trace, TraceLine};
pub use workload::{Family, Workload};

/// Everything that can go wrong reading a trace or setting up a simulation, in words a user can
/// act on.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot read the trace: {0}")]
    Io(#[from] std::io::Error),
    #[error("trace line {line}: {reason}")]
    Line { line: usize, reason: String },
    #[error("trace line {line} is longer than {max} bytes")]
    LineTooLong { line: usize, max: usize },
    #[error("the trace has more than {max} lines")]
    TooManyLines { max: usize },
    #[error("the trace has no requests")]
    EmptyTrace,
    #[error("{what} must be {range} (got {value})")]
    OutOfRange {
        what: &'static str,
        range: &'static str,
        value: String,
    },
    #[error("stall limits: {0}")]
    Limits(String),
    #[error(
        "the simulation stopped making progress at {at_s:.3} s with {waiting} requests waiting \
         (a dispatch policy never takes them)"
    )]
    Stuck { at_s: f64, waiting: usize },
}

impl SimError {
    fn out_of_range(what: &'static str, range: &'static str, value: impl ToString) -> SimError {
        SimError::OutOfRange {
            what,
            range,
            value: value.to_string(),
        }
    }
}
