//! sked's benchmarks, as commands that print their figures and write them as JSON.
//!
//! - `firing`: N schedules firing once a minute, spread evenly; reports firing lateness
//!   (instant -> run queued in the ledger) p50/p99/max.
//! - `e2e`: durable no-op runs end to end (fire -> worker over HTTP -> result recorded) per
//!   second, with a worker that completes each attempt at once.
//! - `takeover`: three `sked server` processes on PostgreSQL, one killed at a time; how long
//!   until its partitions are taken over, and whether any instant was lost or doubled.
//!
//! `firing` and `e2e` start the real server in this process on a fresh store: SQLite in a
//! temporary directory, or PostgreSQL with `--database-url`, where `--nodes N` starts N nodes
//! sharing it.

mod e2e;
mod firing;
mod harness;
mod takeover;

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
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// Firing lateness with N schedules each firing once a minute.
    Firing {
        #[arg(long, default_value_t = 10_000)]
        schedules: usize,
        /// How long to measure after the first minute boundary is reached.
        #[arg(long, default_value_t = 70)]
        seconds: u64,
        /// Server nodes sharing the store (above 1 needs --database-url).
        #[arg(long, default_value_t = 1)]
        nodes: usize,
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
    let database_url = cli.database_url.as_deref();
    let figures = runtime.block_on(async {
        match cli.scenario {
            Scenario::Firing {
                schedules,
                seconds,
                nodes,
            } => {
                check_nodes(nodes, database_url)?;
                firing::run(database_url, nodes, schedules, seconds).await
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
