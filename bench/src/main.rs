//! sked's benchmarks, as commands that print their figures and write them as JSON.
//!
//! - `firing`: N schedules firing once a minute, spread evenly; reports firing lateness
//!   (instant -> run queued in the ledger) p50/p99/max.
//! - `e2e`: durable no-op runs end to end (fire -> worker over HTTP -> result recorded) per
//!   second, with a worker that completes each attempt at once.
//!
//! Both start the real server in this process on a fresh store: SQLite in a temporary
//! directory, or PostgreSQL with `--database-url`.

mod e2e;
mod firing;
mod harness;

use anyhow::Result;
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
        /// Slots of the no-op worker.
        #[arg(long, default_value_t = 4_000)]
        slots: u32,
    },
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
            Scenario::Firing { schedules, seconds } => {
                firing::run(database_url, schedules, seconds).await
            }
            Scenario::E2e {
                schedules,
                every,
                seconds,
                slots,
            } => e2e::run(database_url, schedules, &every, seconds, slots).await,
        }
    })?;
    let text = serde_json::to_string_pretty(&figures)?;
    println!("{text}");
    if let Some(path) = cli.json {
        std::fs::write(&path, text)?;
    }
    Ok(())
}
