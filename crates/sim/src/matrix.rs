//! The matrix: every cell (overload policy × host strategy) over several seeds, on threads,
//! with each cell's figures against the baseline cell.
//!
//! Owns the replicates (which trace and which seed each run gets), the thread pool, the
//! averaging into one report per cell and priority class, and the report's two printed forms
//! (an aligned table, JSON lines). Must not simulate or define a figure itself: `engine` runs,
//! `stats` measures.
//!
//! Replicate `k` (1 to `seeds`) runs with seed `k`. With a trace, every replicate replays it;
//! with a synthetic workload of seed `S`, replicate `k` replays the workload of seed
//! `S + k − 1`, so replicates are independent and replicate 1's workload is `sked sim workload
//! --seed S`. [`run_families`] runs the whole matrix once per workload family, each a report
//! of its own.

use crate::engine::{simulate, Cell, Model};
use crate::stats::{ci95, class_figures, mean, ClassFigures};
use crate::trace::Trace;
use crate::workload::{Family, Workload};
use crate::SimError;
use serde::Serialize;
use sked_core::dispatch::{Overload, Strategy};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The most seeds a matrix runs.
pub const MAX_SEEDS: u32 = 100;

/// Where the requests come from.
#[derive(Debug, Clone)]
pub enum Source {
    Trace(Trace),
    /// A synthetic workload; replicate `k` uses its seed plus `k − 1`.
    Synthetic(Workload),
}

/// What to run.
#[derive(Debug, Clone)]
pub struct MatrixSpec {
    pub source: Source,
    pub seeds: u32,
    pub model: Model,
    /// The cells to report; the baseline runs too (for the ratios) whether listed or not.
    pub cells: Vec<Cell>,
}

/// Baseline over cell: above 1 the cell does better.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ratios {
    pub mean_wait: Option<f64>,
    pub mean_duration: Option<f64>,
    pub mean_at_server: Option<f64>,
}

/// One cell and priority class, averaged over the seeds. Seconds throughout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellReport {
    pub overload: Overload,
    pub host: Strategy,
    pub priority: i32,
    pub mean_wait: f64,
    pub p99_wait: f64,
    pub mean_duration: f64,
    /// From being handed to a server to completion: the wait inside it plus execution (the
    /// study's "duration").
    pub mean_at_server: f64,
    pub mean_slowdown: f64,
    /// Averaged over the seeds where it is defined.
    pub variance_spread: Option<f64>,
    pub ci95_mean_wait: [f64; 2],
    pub ci95_mean_duration: [f64; 2],
    pub ci95_mean_at_server: [f64; 2],
    pub vs_baseline: Ratios,
    /// Requests of the class in one replicate (the mean over replicates, rounded).
    pub requests: u64,
    /// The share of the class's requests that started on a server holding their key warm.
    pub warm_share: f64,
    /// Replicates the figures average over.
    pub seeds: u32,
    /// The workload family, when the matrix ran per family.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
}

/// The matrix's result: what was run, and one report per cell and class.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixReport {
    /// Requests in one replicate (mean over replicates), and per class.
    pub requests: f64,
    pub class_requests: Vec<(i32, f64)>,
    pub hours: f64,
    pub seeds: u32,
    pub model: Model,
    pub rows: Vec<CellReport>,
    /// The workload family, when the matrix ran per family.
    pub family: Option<Family>,
}

/// Runs every cell of `spec` for every seed, on up to `available_parallelism` threads.
pub fn run_matrix(spec: &MatrixSpec) -> Result<MatrixReport, SimError> {
    if !(1..=MAX_SEEDS).contains(&spec.seeds) {
        return Err(SimError::out_of_range("seeds", "1 to 100", spec.seeds));
    }
    spec.model.validate()?;
    let traces = replicate_traces(spec)?;
    let mut cells = spec.cells.clone();
    if !cells.contains(&Cell::BASELINE) {
        cells.push(Cell::BASELINE);
    }
    let seeds = spec.seeds as usize;
    let jobs = cells.len() * seeds;
    let results = parallel(jobs, |job| {
        let (cell, k) = (cells[job / seeds], job % seeds);
        let trace = &traces[k.min(traces.len() - 1)];
        let run = simulate(trace, &spec.model, cell, k as u64 + 1)?;
        Ok(class_figures(trace, &run, spec.model.servers))
    })?;
    let per_cell: Vec<&[Vec<ClassFigures>]> = results.chunks(seeds).collect();
    let classes: BTreeSet<i32> = traces.iter().flat_map(|t| t.classes()).collect();
    let baseline = cells
        .iter()
        .position(|&c| c == Cell::BASELINE)
        .map(|i| per_cell[i]);
    let mut rows = Vec::new();
    for (i, cell) in cells.iter().enumerate() {
        if !spec.cells.contains(cell) {
            continue;
        }
        for &priority in &classes {
            let mut row = average(*cell, priority, per_cell[i]);
            let base = baseline.map(|b| average(Cell::BASELINE, priority, b));
            row.vs_baseline = Ratios {
                mean_wait: base
                    .as_ref()
                    .and_then(|b| ratio(b.mean_wait, row.mean_wait)),
                mean_duration: base
                    .as_ref()
                    .and_then(|b| ratio(b.mean_duration, row.mean_duration)),
                mean_at_server: base
                    .as_ref()
                    .and_then(|b| ratio(b.mean_at_server, row.mean_at_server)),
            };
            rows.push(row);
        }
    }
    let sizes: Vec<f64> = traces.iter().map(|t| t.requests().len() as f64).collect();
    let class_requests = classes
        .iter()
        .map(|&p| {
            let counts: Vec<f64> = traces
                .iter()
                .map(|t| t.requests().iter().filter(|r| r.priority == p).count() as f64)
                .collect();
            (p, mean(&counts))
        })
        .collect();
    let hours = match &spec.source {
        Source::Trace(t) => t.hours(),
        Source::Synthetic(w) => w.hours,
    };
    Ok(MatrixReport {
        requests: mean(&sizes),
        class_requests,
        hours,
        seeds: spec.seeds,
        model: spec.model.clone(),
        rows,
        family: None,
    })
}

/// The matrix of `spec` once for each of `families`, applied to its synthetic workload (a
/// trace has no family): one report each, in the order given, its rows naming the family.
pub fn run_families(spec: &MatrixSpec, families: &[Family]) -> Result<Vec<MatrixReport>, SimError> {
    let Source::Synthetic(base) = &spec.source else {
        return Err(SimError::out_of_range(
            "the source of a matrix per family",
            "a synthetic workload",
            "a trace",
        ));
    };
    families
        .iter()
        .map(|family| {
            let mut report = run_matrix(&MatrixSpec {
                source: Source::Synthetic(family.apply(base)),
                ..spec.clone()
            })?;
            for row in &mut report.rows {
                row.family = Some(family.name());
            }
            report.family = Some(*family);
            Ok(report)
        })
        .collect()
}

/// The trace of each replicate: the one trace, or one synthetic workload a seed.
fn replicate_traces(spec: &MatrixSpec) -> Result<Vec<Trace>, SimError> {
    match &spec.source {
        Source::Trace(trace) => Ok(vec![trace.clone()]),
        Source::Synthetic(workload) => parallel(spec.seeds as usize, |k| {
            Workload {
                seed: workload.seed.wrapping_add(k as u64),
                ..workload.clone()
            }
            .trace()
        }),
    }
}

/// `f(0..jobs)` on up to `available_parallelism` threads, results in job order; the first
/// error (by job) wins.
fn parallel<T: Send>(
    jobs: usize,
    f: impl Fn(usize) -> Result<T, SimError> + Sync,
) -> Result<Vec<T>, SimError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs)
        .max(1);
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, Result<T, SimError>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let job = next.fetch_add(1, Ordering::Relaxed);
                        if job >= jobs {
                            return mine;
                        }
                        mine.push((job, f(job)));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    done.sort_by_key(|(job, _)| *job);
    done.into_iter().map(|(_, r)| r).collect()
}

/// One cell's figures for `priority`, averaged over the replicates that have the class.
fn average(cell: Cell, priority: i32, replicates: &[Vec<ClassFigures>]) -> CellReport {
    let figures: Vec<&ClassFigures> = replicates
        .iter()
        .filter_map(|r| r.iter().find(|f| f.priority == priority))
        .collect();
    let of =
        |get: fn(&ClassFigures) -> f64| -> Vec<f64> { figures.iter().map(|f| get(f)).collect() };
    let waits = of(|f| f.mean_wait);
    let durations = of(|f| f.mean_duration);
    let at_server = of(|f| f.mean_at_server);
    let spreads: Vec<f64> = figures.iter().filter_map(|f| f.variance_spread).collect();
    CellReport {
        overload: cell.overload,
        host: cell.host,
        priority,
        mean_wait: mean(&waits),
        p99_wait: mean(&of(|f| f.p99_wait)),
        mean_duration: mean(&durations),
        mean_at_server: mean(&at_server),
        mean_slowdown: mean(&of(|f| f.mean_slowdown)),
        variance_spread: (!spreads.is_empty()).then(|| mean(&spreads)),
        ci95_mean_wait: ci95(&waits),
        ci95_mean_duration: ci95(&durations),
        ci95_mean_at_server: ci95(&at_server),
        vs_baseline: Ratios {
            mean_wait: None,
            mean_duration: None,
            mean_at_server: None,
        },
        requests: mean(&of(|f| f.requests as f64)).round() as u64,
        warm_share: mean(&of(|f| f.warm_share)),
        seeds: figures.len() as u32,
        family: None,
    }
}

/// `baseline / cell`; 1 when both are 0, none when only the cell's is.
fn ratio(baseline: f64, cell: f64) -> Option<f64> {
    if cell > 0.0 {
        Some(baseline / cell)
    } else if baseline == 0.0 {
        Some(1.0)
    } else {
        None
    }
}

impl MatrixReport {
    /// One JSON object a line, a line per cell and class.
    pub fn json_lines(&self) -> String {
        let mut out = String::new();
        for row in &self.rows {
            // A row is plain numbers and names: it always serializes.
            if let Ok(line) = serde_json::to_string(row) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }

    /// What was run, in one line (two, the first naming the family, for a matrix per family).
    pub fn header(&self) -> String {
        let m = &self.model;
        let family = match &self.family {
            Some(f) => format!(
                "family {}: {} keys, Zipf {:?}, {}% of exports in bursts\n",
                f.name(),
                f.keys,
                f.zipf,
                f.burst_share * 100.0
            ),
            None => String::new(),
        };
        let classes: Vec<String> = self
            .class_requests
            .iter()
            .map(|(p, n)| format!("{} at priority {p}", thousands(*n)))
            .collect();
        format!(
            "{family}workload: {} requests a replicate ({}) over {:.2} h; {} servers x {} slots, \
             accept {}, cache {} keys, reports every {} s; {} seed{}; stall limits trip {} \
             reset {}",
            thousands(self.requests),
            classes.join(", "),
            self.hours,
            m.servers,
            m.slots,
            m.accept,
            m.cache,
            m.report_every.secs(),
            self.seeds,
            if self.seeds == 1 { "" } else { "s" },
            m.limits.trip,
            m.limits.reset,
        )
    }

    /// The header and an aligned table, seconds to 3 decimals.
    pub fn table(&self) -> String {
        let mut out = self.header();
        out.push('\n');
        let _ = writeln!(
            out,
            "{:<10} {:<16} {:>4} {:>10} {:>19} {:>10} {:>10} {:>10} {:>9} {:>8} {:>7} {:>7} \
             {:>7} {:>6}",
            "overload",
            "host",
            "prio",
            "mean_wait",
            "ci95_wait",
            "p99_wait",
            "mean_dur",
            "at_server",
            "slowdown",
            "spread",
            "x_wait",
            "x_dur",
            "x_srv",
            "warm"
        );
        for r in &self.rows {
            let opt = |v: Option<f64>, digits: usize| match v {
                Some(v) => format!("{v:.digits$}"),
                None => "-".to_string(),
            };
            let _ = writeln!(
                out,
                "{:<10} {:<16} {:>4} {:>10.3} {:>19} {:>10.3} {:>10.3} {:>10.3} {:>9.4} {:>8} {:>7} \
                 {:>7} {:>7} {:>5.1}%",
                r.overload.as_str(),
                r.host.as_str(),
                r.priority,
                r.mean_wait,
                format!("[{:.3}, {:.3}]", r.ci95_mean_wait[0], r.ci95_mean_wait[1]),
                r.p99_wait,
                r.mean_duration,
                r.mean_at_server,
                r.mean_slowdown,
                opt(r.variance_spread, 1),
                opt(r.vs_baseline.mean_wait, 2),
                opt(r.vs_baseline.mean_duration, 2),
                opt(r.vs_baseline.mean_at_server, 2),
                r.warm_share * 100.0,
            );
        }
        out
    }
}

/// `1234567.4` as `1,234,567`.
fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(seeds: u32) -> MatrixSpec {
        MatrixSpec {
            source: Source::Synthetic(Workload::new(2, 0.02).unwrap()),
            seeds,
            model: Model::default(),
            cells: Cell::all(),
        }
    }

    #[test]
    fn every_cell_and_class_is_reported_and_the_baseline_is_one() {
        let report = run_matrix(&spec(2)).unwrap();
        assert_eq!(report.rows.len(), 15 * 2);
        for row in &report.rows {
            assert_eq!(row.seeds, 2);
            assert!(
                row.ci95_mean_wait[0] <= row.mean_wait && row.mean_wait <= row.ci95_mean_wait[1]
            );
            if row.overload == Overload::None && row.host == Strategy::Random {
                assert_eq!(row.vs_baseline.mean_wait, Some(1.0));
                assert_eq!(row.vs_baseline.mean_duration, Some(1.0));
                assert_eq!(row.vs_baseline.mean_at_server, Some(1.0));
            }
        }
        let lines = report.json_lines();
        let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
        let keys: Vec<&str> = first
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        // serde_json's map is sorted unless order is preserved; check presence, not order.
        for k in [
            "overload",
            "host",
            "priority",
            "mean_wait",
            "p99_wait",
            "mean_duration",
            "mean_at_server",
            "mean_slowdown",
            "variance_spread",
            "ci95_mean_wait",
            "ci95_mean_duration",
            "ci95_mean_at_server",
            "vs_baseline",
            "requests",
        ] {
            assert!(keys.contains(&k), "{k}");
        }
        assert!(
            lines.starts_with("{\"overload\":\"none\",\"host\":\"least_loaded\",\"priority\":0,")
        );
        assert!(report.table().lines().count() == 2 + 30);
    }

    #[test]
    fn the_matrix_is_deterministic_and_a_single_cell_runs_with_its_baseline() {
        let a = run_matrix(&spec(1)).unwrap();
        let b = run_matrix(&spec(1)).unwrap();
        assert_eq!(a, b);
        let one = MatrixSpec {
            cells: vec![Cell {
                overload: Overload::Breaker,
                host: Strategy::Affinity,
            }],
            ..spec(1)
        };
        let report = run_matrix(&one).unwrap();
        assert_eq!(report.rows.len(), 2);
        let same = a
            .rows
            .iter()
            .find(|r| r.overload == Overload::Breaker && r.host == Strategy::Affinity)
            .unwrap();
        assert_eq!(&report.rows[0], same);
        assert_eq!(
            a.rows
                .iter()
                .filter(|r| r.ci95_mean_wait[0] == r.ci95_mean_wait[1])
                .count(),
            30
        );
    }

    #[test]
    fn a_matrix_per_family_reports_each_family() {
        let families = Family::parse_list("zipf1.2-keys50,zipf0.8-keys500").unwrap();
        let spec = MatrixSpec {
            cells: vec![Cell::BASELINE],
            ..spec(1)
        };
        let reports = run_families(&spec, &families).unwrap();
        assert_eq!(reports.len(), 2);
        for (report, family) in reports.iter().zip(&families) {
            assert_eq!(report.family, Some(*family));
            assert!(report
                .table()
                .starts_with(&format!("family {}: ", family.name())));
            assert!(report
                .table()
                .lines()
                .nth(1)
                .unwrap()
                .starts_with("workload: "));
            for row in &report.rows {
                assert_eq!(row.family.as_deref(), Some(family.name().as_str()));
            }
            assert!(report
                .json_lines()
                .contains(&format!("\"family\":\"{}\"", family.name())));
        }
        // Each family's report is the plain matrix of its workload.
        let alone = run_matrix(&MatrixSpec {
            source: Source::Synthetic(families[0].apply(&Workload::new(2, 0.02).unwrap())),
            ..spec.clone()
        })
        .unwrap();
        assert_eq!(alone.rows[0].mean_wait, reports[0].rows[0].mean_wait);
        assert_eq!(alone.family, None);
        assert!(!alone.json_lines().contains("family"));
        let trace = MatrixSpec {
            source: Source::Trace(Workload::new(2, 0.02).unwrap().trace().unwrap()),
            ..spec
        };
        assert!(run_families(&trace, &families).is_err());
    }

    /// The figures of `cell`'s priority-0 requests on `trace` (replicate seed 1), and the
    /// largest variance of their waits on one server.
    fn low_priority(trace: &Trace, cell: Cell) -> (ClassFigures, f64) {
        let model = Model::default();
        let run = simulate(trace, &model, cell, 1).unwrap();
        let mut per_server = vec![Vec::new(); model.servers as usize];
        for (served, request) in run.served.iter().zip(trace.requests()) {
            if request.priority == 0 {
                per_server[served.server as usize].push(served.wait.secs());
            }
        }
        let largest = per_server
            .iter()
            .filter_map(|waits| crate::stats::variance(waits))
            .fold(0.0, f64::max);
        let figures = class_figures(trace, &run, model.servers).remove(0);
        assert_eq!(figures.priority, 0);
        (figures, largest)
    }

    const NONE_AFFINITY: Cell = Cell {
        overload: Overload::None,
        host: Strategy::Affinity,
    };
    const BREAKER_AFFINITY: Cell = Cell {
        overload: Overload::Breaker,
        host: Strategy::Affinity,
    };

    /// Affinity with bounded load on skewed keys (docs/BENCHMARKS.md, "Affinity with bounded
    /// load"). Over a whole day of each 500-key family, the wait variance spread stays within 5
    /// without any overload control (with the load unbounded it was 34 to 1,269 over five
    /// seeds). On 50 keys the spread is not held to 5: nearly every request starts at once, and
    /// it compares servers whose waits vary by a few milliseconds. What holds there, over the
    /// first two hours, is that no server's waits vary more than the most varied server's under
    /// random placement: a hot key no longer queues on one server (it did, 10 to 40 times
    /// more).
    #[test]
    fn affinity_keeps_waits_even_across_servers_on_skewed_keys() {
        let day = Workload::new(1, 24.0).unwrap();
        let hours = Workload::new(1, 2.0).unwrap();
        let (many, few): (Vec<Family>, Vec<Family>) =
            Family::SKEWED.iter().partition(|f| f.keys == 500);
        assert_eq!((many.len(), few.len()), (3, 3));
        let (spreads, largest) = std::thread::scope(|scope| {
            let spreads: Vec<_> = many
                .iter()
                .map(|family| {
                    let trace = family.apply(&day).trace().unwrap();
                    scope.spawn(move || low_priority(&trace, NONE_AFFINITY).0.variance_spread)
                })
                .collect();
            let largest: Vec<[f64; 3]> = few
                .iter()
                .map(|family| {
                    let trace = family.apply(&hours).trace().unwrap();
                    [NONE_AFFINITY, BREAKER_AFFINITY, Cell::BASELINE]
                        .map(|cell| low_priority(&trace, cell).1)
                })
                .collect();
            let spreads: Vec<Option<f64>> =
                spreads.into_iter().map(|h| h.join().unwrap()).collect();
            (spreads, largest)
        });
        for (family, spread) in many.iter().zip(spreads) {
            let spread = spread.unwrap();
            assert!(spread <= 5.0, "{}: spread {spread}", family.name());
        }
        for (family, [none, breaker, random]) in few.iter().zip(largest) {
            let name = family.name();
            assert!(
                none <= random,
                "{name}: {none} against random placement's {random}"
            );
            assert!(breaker <= random, "{name}: {breaker} against {random}");
        }
    }

    /// The targets of docs/DISPATCH.md on the default workload hold with the bounded load: at
    /// low priority, against random placement, at least 2 times shorter execution and time at
    /// the server and 3 times shorter waits, with and without the breaker (08:00 to 20:00,
    /// seed 1; the whole day over five seeds is in docs/BENCHMARKS.md).
    #[test]
    fn affinity_keeps_its_ratios_to_random_placement_on_the_default_workload() {
        let report = run_matrix(&MatrixSpec {
            source: Source::Synthetic(Workload::new(1, 12.0).unwrap()),
            seeds: 1,
            model: Model::default(),
            cells: vec![NONE_AFFINITY, BREAKER_AFFINITY],
        })
        .unwrap();
        for row in report.rows.iter().filter(|r| r.priority == 0) {
            let cell = format!("{} {}", row.overload.as_str(), row.host.as_str());
            let x = row.vs_baseline;
            assert!(x.mean_duration.unwrap() >= 2.0, "{cell}: {x:?}");
            assert!(x.mean_at_server.unwrap() >= 2.0, "{cell}: {x:?}");
            assert!(x.mean_wait.unwrap() >= 3.0, "{cell}: {x:?}");
            assert!(row.variance_spread.unwrap() <= 5.0, "{cell}: {row:?}");
        }
    }

    #[test]
    fn bounds_are_checked() {
        assert!(run_matrix(&spec(0)).is_err());
        assert!(run_matrix(&spec(101)).is_err());
        assert_eq!(ratio(0.0, 0.0), Some(1.0));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(3.0, 1.5), Some(2.0));
        assert_eq!(thousands(1_234_567.4), "1,234,567");
        assert_eq!(thousands(12.0), "12");
    }
}
