//! `sked sim`: the dispatch simulator (`sked-sim`) on the command line. Turns flags into the
//! simulator's types, runs it and prints to standard output. Needs no server, no store and no
//! network; holds no simulation logic of its own.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use sked_core::dispatch::{Overload, StallLimits, Strategy};
use sked_sim::{Cell, Family, MatrixReport, MatrixSpec, Micros, Model, Source, Trace, Workload};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct SimArgs {
    #[command(subcommand)]
    pub command: SimCommand,
}

#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// Prints a synthetic workload, one request a line (JSONL), shaped like the seed's rule
    /// processing traffic (see docs/DISPATCH.md).
    Workload(WorkloadArgs),
    /// Runs every overload policy with every host strategy on one workload over several
    /// seeds, and prints each cell's figures against the baseline (none, random).
    Matrix(MatrixArgs),
    /// Runs one overload policy and host strategy, and prints its figures (and the ratios to
    /// the baseline, which runs too).
    Run(RunArgs),
}

#[derive(Debug, Args)]
pub struct WorkloadArgs {
    /// The workload's seed: the same seed gives the same workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How many hours of requests, from 08:00 (more than 0, at most 168).
    #[arg(long, default_value_t = 1.0)]
    pub hours: f64,
    /// The share of 14 servers x 4 slots the requests keep busy over the day if they all ran
    /// warm.
    #[arg(long, default_value_t = 0.3)]
    pub utilisation: f64,
    /// The exponent of the projects' Zipf popularity.
    #[arg(long, default_value_t = 1.0)]
    pub zipf: f64,
    /// How many projects (affinity keys) the requests draw from.
    #[arg(long, default_value_t = 2_000)]
    pub keys: u32,
    /// The share of exports sent as a burst of requests of one project (0 to 1).
    #[arg(long, default_value_t = 0.5)]
    pub bursts: f64,
    /// A burst's size, drawn uniformly from MIN to MAX requests (2 to 1,000).
    #[arg(long, value_name = "MIN-MAX", default_value = "5-20", value_parser = burst_size)]
    pub burst_size: (u32, u32),
    /// Workload families, comma-separated: `skewed` (Zipf 0.8, 1.0 and 1.2 over 50 and 500
    /// keys), or names such as `zipf1.2-keys50` and `zipf1.0-keys500-bursts0.9` (the keys, the
    /// Zipf exponent and the share of bursts; the rest as the other flags say). `matrix` and
    /// `run` report each family in turn; `workload` prints one.
    #[arg(long, conflicts_with_all = ["zipf", "keys", "bursts"])]
    pub family: Option<String>,
}

/// `5-20` as `(5, 20)`.
fn burst_size(text: &str) -> Result<(u32, u32), String> {
    let bad = || format!("{text:?} is not MIN-MAX, two whole numbers such as 5-20");
    let (min, max) = text.split_once('-').ok_or_else(bad)?;
    let min = min.trim().parse().map_err(|_| bad())?;
    let max = max.trim().parse().map_err(|_| bad())?;
    Ok((min, max))
}

impl WorkloadArgs {
    fn workload(&self) -> Result<Workload> {
        let (burst_min, burst_max) = self.burst_size;
        let workload = Workload {
            utilisation: self.utilisation,
            zipf: self.zipf,
            projects: self.keys,
            burst_share: self.bursts,
            burst_min,
            burst_max,
            ..Workload::new(self.seed, self.hours)?
        };
        workload.validate()?;
        Ok(workload)
    }

    /// The families `--family` names, if it does.
    fn families(&self) -> Result<Option<Vec<Family>>> {
        let Some(names) = &self.family else {
            return Ok(None);
        };
        let families = Family::parse_list(names)?;
        let base = self.workload()?;
        for family in &families {
            family.apply(&base).validate()?;
        }
        Ok(Some(families))
    }

    /// The one workload `sked sim workload` prints: the flags', or the one family's.
    fn single(&self) -> Result<Workload> {
        match self.families()?.as_deref() {
            None => self.workload(),
            Some([family]) => Ok(family.apply(&self.workload()?)),
            Some(_) => anyhow::bail!("sked sim workload prints one --family at a time"),
        }
    }
}

#[derive(Debug, Args)]
pub struct SourceArgs {
    /// Replay this trace (JSONL, `-` for standard input) instead of a synthetic workload.
    #[arg(
        long,
        conflicts_with_all = [
            "seed", "hours", "utilisation", "zipf", "keys", "bursts", "burst_size", "family",
        ]
    )]
    pub trace: Option<PathBuf>,
    /// Without `--trace`: the synthetic workload (replicate k uses seed + k - 1).
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Replicates: seeds 1 to N drive each run's random draws (1 to 100).
    #[arg(long, default_value_t = 5)]
    pub seeds: u32,
    /// Servers in the pool (1 to 10,000).
    #[arg(long, default_value_t = 14)]
    pub servers: u32,
    /// Requests one server executes at once (1 to 10,000).
    #[arg(long, default_value_t = 4)]
    pub slots: u32,
    /// Requests one server accepts in flight, executing or waiting inside it.
    #[arg(long, default_value_t = 64)]
    pub accept: u32,
    /// Affinity keys one server holds warm (LRU, 0 to 4,096).
    #[arg(long, default_value_t = 32)]
    pub cache: u32,
    /// Seconds between a server's load reports.
    #[arg(long, default_value_t = 5.0)]
    pub report_every: f64,
    /// Seconds of waiting worth one priority level in the central queue.
    #[arg(long, default_value_t = sked_core::dispatch::AGING_STEP.as_secs_f64())]
    pub aging: f64,
    /// The stall gauge's trip threshold (breaker and admission).
    #[arg(long, default_value_t = StallLimits::default().trip)]
    pub trip: u32,
    /// The stall gauge's reset threshold, below `--trip`.
    #[arg(long, default_value_t = StallLimits::default().reset)]
    pub reset: u32,
    /// One JSON object a line, per cell and priority, instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl ModelArgs {
    fn model(&self) -> Result<Model> {
        let seconds = |what: &str, value: f64| {
            if value.is_finite() && value >= 0.0 {
                Micros::from_secs(value).with_context(|| format!("--{what} is too large"))
            } else {
                anyhow::bail!("--{what} must be a number of seconds, 0 or more")
            }
        };
        let model = Model {
            servers: self.servers,
            slots: self.slots,
            accept: self.accept,
            cache: self.cache,
            report_every: seconds("report-every", self.report_every)?,
            aging: Duration::from_micros(seconds("aging", self.aging)?.0.unsigned_abs()),
            limits: StallLimits::new(self.trip, self.reset)
                .map_err(|e| anyhow::anyhow!("--trip/--reset: {e}"))?,
        };
        model.validate()?;
        Ok(model)
    }
}

#[derive(Debug, Args)]
pub struct MatrixArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    /// none, breaker or admission.
    #[arg(long, default_value = "breaker")]
    pub overload: Overload,
    /// least_loaded, affinity, round_robin, random or consistent_hash.
    #[arg(long, default_value = "affinity")]
    pub host: Strategy,
}

/// Runs `sked sim ...`, printing to standard output.
pub fn run(args: SimArgs) -> Result<()> {
    match args.command {
        SimCommand::Workload(w) => {
            let workload = w.single()?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            match workload.write_jsonl(&mut out) {
                Ok(_) => finish(out.flush()),
                Err(sked_sim::SimError::Io(e)) => finish(Err(e)),
                Err(e) => Err(e.into()),
            }
        }
        SimCommand::Matrix(m) => matrix(&m.source, &m.model, Cell::all()),
        SimCommand::Run(r) => matrix(
            &r.source,
            &r.model,
            vec![Cell {
                overload: r.overload,
                host: r.host,
            }],
        ),
    }
}

fn matrix(source: &SourceArgs, model: &ModelArgs, cells: Vec<Cell>) -> Result<()> {
    let sim_model = model.model()?;
    let families = match &source.trace {
        Some(_) => None,
        None => source.workload.families()?,
    };
    let spec = MatrixSpec {
        source: match &source.trace {
            Some(path) => Source::Trace(read_trace(path)?),
            None => Source::Synthetic(source.workload.workload()?),
        },
        seeds: model.seeds,
        model: sim_model,
        cells,
    };
    let started = std::time::Instant::now();
    let reports = match families {
        None => vec![sked_sim::run_matrix(&spec)?],
        Some(families) => sked_sim::run_families(&spec, &families)?,
    };
    eprintln!("simulated in {:.1} s", started.elapsed().as_secs_f64());
    print(&reports, model.json)
}

/// The reports one after the other: JSON lines, or tables a blank line apart.
fn print(reports: &[MatrixReport], json: bool) -> Result<()> {
    let text = if json {
        reports.iter().map(MatrixReport::json_lines).collect()
    } else {
        let tables: Vec<String> = reports.iter().map(MatrixReport::table).collect();
        tables.join("\n")
    };
    let mut out = std::io::stdout().lock();
    finish(out.write_all(text.as_bytes()).and_then(|()| out.flush()))
}

fn read_trace(path: &PathBuf) -> Result<Trace> {
    let trace = if path.as_os_str() == "-" {
        Trace::read(std::io::stdin().lock())
    } else {
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        Trace::read(std::io::BufReader::new(file))
    };
    trace.with_context(|| format!("trace {}", path.display()))
}

/// A reader that went away (`| head`) is not an error.
fn finish(result: std::io::Result<()>) -> Result<()> {
    match result {
        Err(e) if broken_pipe(&e) => Ok(()),
        other => other.context("cannot write to standard output"),
    }
}

fn broken_pipe(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}
