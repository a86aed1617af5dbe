//! sked's benchmarks, as commands that print their figures and write them as JSON.
//!
//! - `firing`: N schedules firing every `--every` (a minute by default), spread evenly; reports
//!   firing lateness (instant -> run queued in the ledger) p50/p90/p99/max, and each second's
//!   worst, to place a tail in time; with `--worker`, a no-op worker also completes the runs
//!   and the time from instant to attempt started is reported, and from the run's row to it.
//! - `e2e`: durable no-op runs end to end (fire -> worker over HTTP -> result recorded) per
//!   second, with a worker that completes each attempt at once.
//! - `overload`: `e2e` at rising offered rates; the completions per second at each, to show that
//!   past the ceiling throughput holds and lateness grows smoothly.
//! - `burst`: N runs due at the same instant (10,000 by default); how long until the last one
//!   is queued, handed to the no-op worker, and recorded as succeeded.
//! - `shell`: shell process starts per second on one real `sked worker` process, with its CPU
//!   time per run.
//! - `scale`: a million hourly schedules in a SQLite store served by a real `sked server`
//!   process; start-up time, resident memory, API latency under load, firing lateness.
//! - `takeover`: three `sked server` processes on PostgreSQL, one killed at a time; how long
//!   until its partitions are taken over, and whether any instant was lost or doubled.
//! - `publish`: N schedules publishing to RabbitMQ, NATS JetStream or Redis Streams (40,000
//!   every 5 s by default), published by the server with confirms and counted back by a
//!   consumer; messages per second, lag, the count check (one message per succeeded run, none
//!   twice), peak memory; minute by minute, the lag by stage and what the runtime and the
//!   machine were doing (`probe`).
//! - `dispatch`: the dispatch simulator's workload replayed through a real server and `sked
//!   worker` processes whose HTTP targets model servers with slots and warm caches, once per
//!   overload/host cell: waits, durations and per-worker wait variance, against the first cell.
//! - `ledger`: the store alone, fires, starts and completions a batch at a time as the ledger
//!   grows to millions of runs; the time of each call per slice of the growth.
//! - `console`: the web console's pages on a store of `--jobs` jobs and `--runs` ended runs;
//!   each page's time, p50/p99/max.
//! - `soak`: the `e2e` load for half an hour on PostgreSQL with run retention on; each minute,
//!   what the run and attempt tables weigh, their dead rows and autovacuum passes, and the
//!   minute's completions and lateness.
//! - `deadlines`: the at-risk estimator on a synthetic history (a chain of five jobs with
//!   log-normal durations, one run a day): how early it warns of a missed deadline, and how
//!   often it warns of one that is met. No server: a simulation, deterministic per seed.
//! - `workflow`: N jobs in one dependency graph (chain, tree, wide fan-out, fan-in) whose root
//!   runs once; per-edge release latency and the whole graph's scheduling overhead.
//! - `fairness`: namespace A queues 50,000 runs at once while namespace B triggers one every
//!   100 ms, both on one saturated worker pool with weight 1; B's start lateness p50/p99/max
//!   while A's backlog drains (the bar: p99 under 1 s), A's drain time and throughput.
//! - `flow`: the `e2e` load without flow control and with it (each run holding one concurrency
//!   key of 1,000, limit 50, and one rate limit that never holds), alternated in one process;
//!   the runs/s of each, their ratio, and the store's start call time.
//! - `traces`: the `e2e` load with trace export off and on at ratios 1.0 and 0.01 (to an
//!   OTLP/HTTP sink in the process), alternated in one process; runs/s, fire lateness and CPU
//!   per run of each, their ratios over off, and the spans, requests and bytes exported.
//!
//! `--pg-latency-ms D` puts D ms each way between the benchmark (its server nodes included)
//! and PostgreSQL, through a delaying proxy in its process (`latency.rs`).
//!
//! `firing`, `e2e`, `burst`, `fairness`, `flow`, `traces` and `shell` start the real server in
//! this process on a fresh store: SQLite in a temporary directory, or PostgreSQL with
//! `--database-url`, where `--nodes N` (`firing`, `e2e`, `publish`) starts N nodes sharing it. `shell`, `scale` and
//! `takeover` also run the `sked` binary (the one next to this benchmark, or `--sked-bin`).

mod burst;
mod console;
mod console_pg;
mod container;
mod deadlines;
mod dispatch;
mod e2e;
mod fairness;
mod firing;
mod flow;
mod harness;
mod latency;
mod ledger;
mod noop;
mod overload;
mod pgcost;
mod probe;
mod process;
mod publish;
mod scale;
mod shell;
mod soak;
mod takeover;
mod traces;
mod workflow;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(name = "sked-bench")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
    /// Write the figures as JSON here too.
    #[arg(long, global = true)]
    json: Option<PathBuf>,
    /// Run on PostgreSQL (in a new schema of this database, dropped afterwards) instead of
    /// SQLite in a temporary directory.
    #[arg(long, global = true, env = "SKED_DATABASE_URL")]
    database_url: Option<String>,
    /// Put this many milliseconds of latency each way between everything in the benchmark
    /// and PostgreSQL (a proxy in the benchmark's process; a round trip costs twice this).
    #[arg(long, global = true)]
    pg_latency_ms: Option<f64>,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// N schedules each publishing a message to a broker every `--every`, published by the
    /// server with confirms and counted back by a consumer: messages per second, lag, the
    /// count check, peak memory.
    Publish {
        #[arg(long, default_value_t = 40_000)]
        schedules: usize,
        #[arg(long, default_value = "5s")]
        every: String,
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        /// The broker to publish to: amqp://, nats:// or redis:// (a new exchange and queue,
        /// stream, or key, removed afterwards).
        #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
        broker_url: String,
        /// Server nodes sharing the store (above 1 needs --database-url).
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        /// Give every schedule the same anchor, so all N instants of a period fall due at once
        /// (by default the anchors are spread evenly over the period).
        #[arg(long)]
        aligned: bool,
        /// Seconds from the jobs' creation to their first instants (default: 15 on SQLite,
        /// 30 + 20 a node on PostgreSQL). Creating 40,000 jobs can take longer on a busy
        /// machine; the output's `ready_after_first_instant` says when the lead was short.
        #[arg(long)]
        lead: Option<u64>,
    },
    /// The web console's pages on a store of `--jobs` jobs and `--runs` ended runs: each
    /// page asked `--samples` times, its time p50/p99/max.
    Console {
        #[arg(long, default_value_t = 100_000)]
        jobs: usize,
        #[arg(long, default_value_t = 1_000_000)]
        runs: usize,
        #[arg(long, default_value_t = 20)]
        samples: usize,
    },
    /// The ledger's cost as it grows, alone on the store: `--runs` runs of `--jobs` jobs
    /// fired, started and completed a batch at a time; the time of each call per slice.
    Ledger {
        #[arg(long, default_value_t = 40_000)]
        jobs: usize,
        #[arg(long, default_value_t = 4_800_000)]
        runs: usize,
        #[arg(long, default_value_t = 400)]
        batch: usize,
        #[arg(long, default_value_t = 12)]
        slices: usize,
    },
    /// Firing lateness with N schedules each firing every `--every`, anchors spread over it.
    Firing {
        #[arg(long, default_value_t = 10_000)]
        schedules: usize,
        #[arg(long, default_value = "60s")]
        every: String,
        /// How long to measure, from a second after the server is ready.
        #[arg(long, default_value_t = 70)]
        seconds: u64,
        /// Server nodes sharing the store (above 1 needs --database-url).
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        /// Also run the no-op worker, so runs are started and completed, and report the time
        /// from each instant, and from each run's row, to its attempt's start.
        #[arg(long)]
        worker: bool,
        /// Slots of the no-op worker, with --worker (split between one worker per node).
        #[arg(long, default_value_t = 1_000)]
        slots: u32,
        /// Each schedule names a calendar (open every day, 1,000 holidays in past years, and
        /// one it includes), as a business-day schedule would: what a calendar costs firing.
        #[arg(long)]
        calendar: bool,
    },
    /// N runs due at the same instant: how long until all are queued, started and recorded.
    Burst {
        /// Jobs, each with one instant, the same for all.
        #[arg(long, default_value_t = 10_000)]
        runs: usize,
        /// Slots of the no-op worker (default: as many as runs; split into workers of at most
        /// 10,000 slots each).
        #[arg(long)]
        slots: Option<u32>,
        /// Seconds from the start of job creation to the instant (default: planned from
        /// --runs).
        #[arg(long)]
        lead: Option<f64>,
        /// Seconds after the instant every run may take to succeed.
        #[arg(long, default_value_t = 60)]
        limit: u64,
    },
    /// The at-risk estimator on a synthetic history: how early it warns, how often for
    /// nothing (a simulation; no server).
    Deadlines {
        #[arg(long, default_value_t = 2_000)]
        days: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The share of days the chain meets its deadline.
        #[arg(long, default_value_t = 0.85)]
        on_time: f64,
    },
    /// N jobs in one dependency graph whose root runs once: per-edge release latency and the
    /// whole graph's scheduling overhead, with the no-op worker.
    Workflow {
        #[arg(long, default_value_t = 1_000)]
        jobs: usize,
        #[arg(long, value_enum, default_value = "tree")]
        shape: workflow::Shape,
        /// Slots of the no-op worker.
        #[arg(long, default_value_t = 1_000)]
        slots: u32,
        /// Seconds after the root's instant every run may take to succeed.
        #[arg(long, default_value_t = 120)]
        limit: u64,
    },
    /// Fair share under a flood: namespace A queues `--runs` runs at once, namespace B
    /// triggers one every `--every-ms`, one pool of `--slots` slots whose attempts take
    /// `--duration-ms` serves both; B's start lateness while A's backlog drains.
    Fairness {
        #[arg(long, default_value_t = 50_000)]
        runs: usize,
        #[arg(long, default_value_t = 40)]
        slots: u32,
        /// How long each attempt holds its slot (the pool's ceiling is slots / duration).
        #[arg(long, default_value_t = 20)]
        duration_ms: u64,
        /// Between two of B's triggers.
        #[arg(long, default_value_t = 100)]
        every_ms: u64,
        /// Seconds A's backlog may take to drain.
        #[arg(long, default_value_t = 600)]
        limit: u64,
    },
    /// Dispatch policies with real workers: the simulator's workload replayed through a
    /// server and `sked worker` processes whose HTTP targets are modelled servers with slots
    /// and warm caches, once per cell (overload/host), side by side.
    Dispatch(dispatch::Args),
    /// A container target's start-to-exit through one real `sked worker` process against
    /// `podman run` called directly, alternating, in one sitting (needs podman, runc and
    /// busybox-static).
    Container {
        /// Runs of each kind.
        #[arg(long, default_value_t = 50)]
        rounds: usize,
        /// The `sked` binary (default: the one next to this benchmark).
        #[arg(long)]
        sked_bin: Option<PathBuf>,
    },
    /// Shell process starts per second on one real `sked worker` process.
    Shell {
        /// Schedules, each firing every `--every`, anchors spread over the period.
        #[arg(long, default_value_t = 2_000)]
        schedules: usize,
        #[arg(long, default_value = "1s")]
        every: String,
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// The worker's `--slots`.
        #[arg(long, default_value_t = 64)]
        slots: u32,
        /// The jobs' shell command.
        #[arg(long, default_value = "true")]
        command: String,
        /// The `sked` binary (default: the one next to this benchmark).
        #[arg(long)]
        sked_bin: Option<PathBuf>,
    },
    /// A million stored hourly schedules served by a real `sked server` process (SQLite only):
    /// start-up time, resident memory, API latency and firing lateness under load.
    Scale {
        #[arg(long, default_value_t = 1_000_000)]
        schedules: usize,
        /// Keep the prepared store here and reuse it in later runs (the jobs are created only
        /// when it does not already hold them; a store last served over an hour ago is
        /// refused). Default: a temporary directory, removed afterwards.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Length of the load phase.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// API requests per second of each kind (reading a job, listing a page).
        #[arg(long, default_value_t = 200)]
        rate: u32,
        /// Concurrent clients of each kind, sharing its rate.
        #[arg(long, default_value_t = 4)]
        clients: u32,
        /// Slots of the no-op worker completing the runs during the load phase.
        #[arg(long, default_value_t = 1_000)]
        slots: u32,
        /// No worker: the runs stay queued.
        #[arg(long)]
        no_worker: bool,
        /// The `sked` binary (default: the one next to this benchmark).
        #[arg(long)]
        sked_bin: Option<PathBuf>,
    },
    /// End-to-end no-op runs per second.
    E2e {
        /// Schedules, each firing every `--every`.
        #[arg(long, default_value_t = 2_000)]
        schedules: usize,
        #[arg(long, default_value = "1s")]
        every: String,
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Slots of the no-op worker (split between one worker per node).
        #[arg(long, default_value_t = 4_000)]
        slots: u32,
        /// Server nodes sharing the store (above 1 needs --database-url).
        #[arg(long, default_value_t = 1)]
        nodes: usize,
    },
    /// What flow control costs: the `e2e` load without limits and with them (one concurrency
    /// key per run out of `--keys`, limit 50, and one rate limit that never holds), `--pairs`
    /// times each, alternated; runs/s of each, the ratio, the store's start call time. Fails
    /// if a run ends other than succeeded, a start is held back, or a key exceeds its limit.
    Flow {
        /// Schedules, each firing every second (the jobs are spread evenly over the keys).
        #[arg(long, default_value_t = 10_000)]
        schedules: usize,
        #[arg(long, default_value_t = 1_000)]
        keys: usize,
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Slots of the no-op worker.
        #[arg(long, default_value_t = 8_000)]
        slots: u32,
        /// Pairs of passes (without limits, then with them).
        #[arg(long, default_value_t = 2)]
        pairs: usize,
    },
    /// What trace export costs: the `e2e` load with tracing off and on at each of `--ratios`
    /// (OTLP/HTTP to a sink in this process that counts and answers at once), `--rounds`
    /// times each, alternated; runs/s, lateness and CPU per run of each, their ratios over
    /// off. Fails if a run ends other than succeeded, a span is exported with tracing off,
    /// none at ratio 1, or a span is dropped.
    Traces {
        /// Schedules, each firing every second.
        #[arg(long, default_value_t = 10_000)]
        schedules: usize,
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Slots of the no-op worker.
        #[arg(long, default_value_t = 8_000)]
        slots: u32,
        /// Sampling ratios of the traced passes, in the order they are run after each pass
        /// with tracing off.
        #[arg(long, value_delimiter = ',', default_value = "1,0.01")]
        ratios: Vec<f64>,
        /// Seconds after its instant past which a run that started is kept as late whatever
        /// the ratio (long, so that the ratio decides what is kept).
        #[arg(long, default_value_t = 60)]
        late_after: u64,
        /// Rounds of passes (off, then each ratio).
        #[arg(long, default_value_t = 2)]
        rounds: usize,
    },
    /// `e2e` at each of several offered rates (runs per second, each from that many schedules
    /// every second): completions per second and lateness past the ceiling.
    Overload {
        /// Offered runs per second, comma-separated, in the order they are run.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "10000,20000,30000,40000,50000"
        )]
        rates: Vec<usize>,
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Slots of the no-op worker.
        #[arg(long, default_value_t = 8_000)]
        slots: u32,
    },
    /// The `e2e` load held for a long time on PostgreSQL (needs --database-url) with run
    /// retention on: how the tables, their dead rows and the lateness age.
    Soak {
        /// Schedules, each firing every second.
        #[arg(long, default_value_t = 5_000)]
        schedules: usize,
        #[arg(long, default_value_t = 1_800)]
        seconds: u64,
        /// Slots of the no-op worker.
        #[arg(long, default_value_t = 4_000)]
        slots: u32,
        /// Finished runs older than this are deleted by the retention passes.
        #[arg(long, default_value_t = 300)]
        retention_seconds: u64,
        /// Seconds between samples.
        #[arg(long, default_value_t = 60)]
        sample_seconds: u64,
        /// Have the node make time partitions of runs (`sked server --partition-runs`).
        #[arg(long)]
        partition_runs: bool,
    },
    /// Takeover of a killed node's partitions: three `sked server` processes on PostgreSQL
    /// (needs --database-url), one killed with SIGKILL at a time.
    Takeover {
        /// Schedules, each firing every `--every`, anchors spread over the period.
        #[arg(long, default_value_t = 1_000)]
        schedules: usize,
        #[arg(long, default_value = "1s")]
        every: String,
        /// Nodes killed, one after the other, each restarted before the next.
        #[arg(long, default_value_t = 3)]
        kills: usize,
        /// The `sked` binary (default: the one next to this benchmark).
        #[arg(long)]
        sked_bin: Option<PathBuf>,
        /// Slots of the `sked worker`.
        #[arg(long, default_value_t = 256)]
        slots: u32,
        /// The servers' `--node-lease`.
        #[arg(long, default_value = "3s")]
        node_lease: String,
    },
}

/// Several nodes share a store only on PostgreSQL.
fn check_nodes(nodes: usize, database_url: Option<&str>) -> Result<()> {
    if nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    if nodes > 1 && database_url.is_none() {
        bail!("--nodes {nodes} needs --database-url: only PostgreSQL is shared between nodes");
    }
    Ok(())
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let database_url = match (cli.database_url, cli.pg_latency_ms) {
        (Some(url), Some(ms)) if ms > 0.0 => {
            let one_way = std::time::Duration::from_secs_f64(ms / 1000.0);
            Some(runtime.block_on(latency::proxied(&url, one_way))?)
        }
        (Some(_), Some(_)) => bail!("--pg-latency-ms must be above 0"),
        (None, Some(_)) => bail!("--pg-latency-ms needs --database-url"),
        (url, None) => url,
    };
    let database_url = database_url.as_deref();
    let figures = runtime.block_on(async {
        match cli.scenario {
            Scenario::Firing {
                schedules,
                every,
                seconds,
                nodes,
                worker,
                slots,
                calendar,
            } => {
                check_nodes(nodes, database_url)?;
                firing::run(firing::Options {
                    database_url,
                    nodes,
                    schedules,
                    every: &every,
                    seconds,
                    worker_slots: worker.then_some(slots),
                    calendar,
                })
                .await
            }
            Scenario::Burst {
                runs,
                slots,
                lead,
                limit,
            } => {
                burst::run(burst::Options {
                    database_url,
                    runs,
                    slots: slots.unwrap_or(u32::try_from(runs).unwrap_or(u32::MAX)),
                    lead_seconds: lead,
                    limit_seconds: limit,
                })
                .await
            }
            Scenario::Deadlines {
                days,
                seed,
                on_time,
            } => deadlines::run(deadlines::Options {
                days,
                seed,
                on_time,
            }),
            Scenario::Workflow {
                jobs,
                shape,
                slots,
                limit,
            } => {
                workflow::run(workflow::Options {
                    database_url,
                    jobs,
                    shape,
                    slots,
                    limit_seconds: limit,
                })
                .await
            }
            Scenario::Fairness {
                runs,
                slots,
                duration_ms,
                every_ms,
                limit,
            } => {
                fairness::run(fairness::Options {
                    database_url,
                    runs,
                    slots,
                    duration_ms,
                    every_ms,
                    limit_seconds: limit,
                })
                .await
            }
            Scenario::Dispatch(args) => dispatch::run(args, database_url).await,
            Scenario::Container { rounds, sked_bin } => {
                container::run(container::Options { rounds, sked_bin }).await
            }
            Scenario::Shell {
                schedules,
                every,
                seconds,
                slots,
                command,
                sked_bin,
            } => {
                shell::run(shell::Options {
                    database_url,
                    schedules,
                    every,
                    seconds,
                    slots,
                    command,
                    sked_bin,
                })
                .await
            }
            Scenario::Scale {
                schedules,
                data_dir,
                seconds,
                rate,
                clients,
                slots,
                no_worker,
                sked_bin,
            } => {
                if database_url.is_some() {
                    bail!("scale runs on SQLite only: its store is a --data-dir");
                }
                scale::run(scale::Options {
                    schedules,
                    data_dir,
                    seconds,
                    rate,
                    clients,
                    worker_slots: (!no_worker).then_some(slots),
                    sked_bin,
                })
                .await
            }
            Scenario::Flow {
                schedules,
                keys,
                seconds,
                slots,
                pairs,
            } => {
                flow::run(flow::Options {
                    database_url,
                    schedules,
                    keys,
                    seconds,
                    slots,
                    pairs,
                })
                .await
            }
            Scenario::Traces {
                schedules,
                seconds,
                slots,
                ratios,
                late_after,
                rounds,
            } => {
                traces::run(traces::Options {
                    database_url,
                    schedules,
                    seconds,
                    slots,
                    ratios,
                    late_after: std::time::Duration::from_secs(late_after),
                    rounds,
                })
                .await
            }
            Scenario::Overload {
                rates,
                seconds,
                slots,
            } => overload::run(database_url, &rates, seconds, slots).await,
            Scenario::Soak {
                schedules,
                seconds,
                slots,
                retention_seconds,
                sample_seconds,
                partition_runs,
            } => {
                let options = soak::Options {
                    schedules,
                    seconds,
                    slots,
                    retention: std::time::Duration::from_secs(retention_seconds),
                    sample: std::time::Duration::from_secs(sample_seconds.max(1)),
                    partition_runs,
                };
                soak::run(database_url, options).await
            }
            Scenario::Publish {
                schedules,
                every,
                seconds,
                broker_url,
                nodes,
                aligned,
                lead,
            } => {
                check_nodes(nodes, database_url)?;
                publish::run(publish::Options {
                    database_url,
                    broker_url: &broker_url,
                    schedules,
                    every: &every,
                    seconds,
                    nodes,
                    aligned,
                    lead,
                })
                .await
            }
            Scenario::Console {
                jobs,
                runs,
                samples,
            } => {
                console::run(console::Options {
                    database_url,
                    jobs,
                    runs,
                    samples,
                })
                .await
            }
            Scenario::Ledger {
                jobs,
                runs,
                batch,
                slices,
            } => {
                ledger::run(ledger::Options {
                    database_url,
                    jobs,
                    runs,
                    batch,
                    slices,
                })
                .await
            }
            Scenario::E2e {
                schedules,
                every,
                seconds,
                slots,
                nodes,
            } => {
                check_nodes(nodes, database_url)?;
                e2e::run(database_url, nodes, schedules, &every, seconds, slots).await
            }
            Scenario::Takeover {
                schedules,
                every,
                kills,
                sked_bin,
                slots,
                node_lease,
            } => {
                let Some(database_url) = database_url else {
                    bail!("takeover needs --database-url: the nodes share a PostgreSQL database");
                };
                takeover::run(takeover::Options {
                    database_url: database_url.to_string(),
                    schedules,
                    every,
                    kills,
                    sked_bin,
                    slots,
                    node_lease,
                })
                .await
            }
        }
    })?;
    let text = serde_json::to_string_pretty(&figures)?;
    println!("{text}");
    if let Some(path) = cli.json {
        std::fs::write(&path, text)?;
    }
    Ok(())
}
