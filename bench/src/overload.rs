//! Past the ceiling: the `e2e` scenario at rising offered rates, one after the other on fresh
//! stores, to show whether more offered load means fewer runs done. What matters per rate is
//! what the server completed per second during the window (not the runs due in it, which past
//! the ceiling wait behind older ones), and how each second's lateness grows. The summary is
//! the completions per second at the highest rate over the best of any rate: 1.0 is flat.

use crate::e2e;
use anyhow::{bail, Result};
use serde_json::{json, Value};

pub async fn run(
    database_url: Option<&str>,
    rates: &[usize],
    seconds: u64,
    slots: u32,
) -> Result<Value> {
    if rates.is_empty() {
        bail!("--rates needs at least one rate");
    }
    let mut steps = Vec::new();
    for &rate in rates {
        let figures = e2e::run(database_url, 1, rate, "1s", seconds, slots).await?;
        let lateness = figures["instant_to_recorded_p50_by_second_ms"].clone();
        let step = json!({
            "offered_per_second": rate,
            "completed_per_second": figures["completed_per_second"],
            "fired_per_second": figures["fired_per_second"],
            "skipped_backlog_per_second": figures["skipped_backlog_per_second"],
            "due_in_window_succeeded": figures["succeeded_in_window"],
            "due_in_window": figures["runs_in_window"],
            "instant_to_recorded_p50_by_second_ms": lateness,
        });
        eprintln!("{step}");
        steps.push(step);
    }
    let completed: Vec<f64> = steps
        .iter()
        .map(|s| s["completed_per_second"].as_f64().unwrap_or(0.0))
        .collect();
    let best = completed.iter().copied().fold(0.0, f64::max);
    let at_highest = completed.last().copied().unwrap_or(0.0);
    Ok(json!({
        "scenario": "overload",
        "window_seconds": seconds,
        "steps": steps,
        "best_completed_per_second": best,
        "highest_rate_over_best": if best > 0.0 { at_highest / best } else { 0.0 },
    }))
}
