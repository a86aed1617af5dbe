//! Firing lateness: N schedules each firing every `--every` (a minute by default), anchored
//! evenly across the period so that N/period instants fall due every second, each at its own
//! instant. Lateness is the time from an instant to its run's ledger row.
//!
//! With a worker (`--worker`), the no-op worker of `noop.rs` also leases and completes the runs,
//! so the firing happens beside dispatch and completion, and the time from each instant to its
//! attempt's start is reported too, and from its row to that start (the dispatch hop).

use crate::harness::{
    by_second, cluster, ms, percentiles_of, period_us, start, store_with_jobs, tail_json,
};
use crate::noop;
use anyhow::Result;
use chrono::{Duration, Utc};
use serde_json::{json, Value};
use sked_core::calendar::{CalendarSpec, Holiday};
use sked_core::job::JobSpec;
use sked_core::run::RunState;
use sked_core::stats::percentiles;
use sked_store::Audit;
use std::collections::HashMap;
use std::time::Instant as Clock;

/// What `sked-bench firing` was asked for.
pub struct Options<'a> {
    pub database_url: Option<&'a str>,
    pub nodes: usize,
    pub schedules: usize,
    /// Each schedule's period, as a job's `every` (`60s`, `10s`).
    pub every: &'a str,
    pub seconds: u64,
    /// Slots of a no-op worker completing the runs (split between one per node); none without.
    pub worker_slots: Option<u32>,
    /// Each schedule names a calendar that closes no day of the window.
    pub calendar: bool,
}

/// The calendars `--calendar` schedules name: `bench` includes `bench-past`, whose 1,000
/// holidays all lie before 2020, so every instant of the window runs while each one is judged.
fn bench_calendars() -> Vec<(String, CalendarSpec)> {
    let every_day = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"].map(String::from);
    let first = chrono::NaiveDate::from_ymd_opt(2017, 1, 2).expect("a date");
    let past = CalendarSpec {
        timezone: Some("Europe/London".into()),
        weekdays: Some(every_day.to_vec()),
        holidays: (0..1_000u64)
            .map(|i| Holiday {
                date: Some(first + chrono::Days::new(i)),
                from: None,
                to: None,
                label: format!("closed {i}"),
                yearly: false,
            })
            .collect(),
        include: Vec::new(),
        except: Vec::new(),
        description: None,
    };
    let bench = CalendarSpec {
        include: vec!["bench-past".into()],
        holidays: Vec::new(),
        ..past.clone()
    };
    vec![("bench-past".into(), past), ("bench".into(), bench)]
}

pub async fn run(options: Options<'_>) -> Result<Value> {
    let Options {
        database_url,
        nodes,
        schedules,
        every,
        seconds,
        worker_slots,
        calendar,
    } = options;
    let period_us = period_us(every, schedules)?;
    let base = Utc::now();
    let step_us = period_us / schedules as i64;
    let jobs = (0..schedules).map(move |i| {
        let anchor = base + Duration::microseconds(step_us * i as i64);
        let mut schedule = json!({"every": every, "anchor": anchor.to_rfc3339()});
        if calendar {
            schedule["calendar"] = json!("bench");
        }
        let spec: JobSpec = serde_json::from_value(json!({
            "schedule": schedule,
            "target": {"shell": {"command": "true"}},
        }))
        .expect("a valid benchmark job");
        (format!("job-{i:07}"), spec)
    });
    let calendars = if calendar {
        bench_calendars()
    } else {
        Vec::new()
    };
    let created = Clock::now();
    let (store, place) = store_with_jobs(database_url, jobs).await?;
    // Before any node starts: the firing loop reads each calendar as it loads the schedules.
    for (name, spec) in &calendars {
        store
            .put_calendar("default", name, spec, Utc::now(), Audit::none())
            .await?;
    }
    let create_s = created.elapsed().as_secs_f64();
    let started = Clock::now();
    let mut server = start(store.clone(), place, nodes).await?;
    let store_name = server.store_name();
    let ready_s = started.elapsed().as_secs_f64();
    let shares = if nodes > 1 {
        Some(
            cluster(&crate::harness::http_client(), server.base())
                .await?
                .shares(),
        )
    } else {
        None
    };
    let from = Utc::now() + Duration::seconds(1);
    let to = from + Duration::seconds(seconds as i64);
    // A second past the window, so its last instants are in the ledger before the nodes stop.
    let end = Clock::now() + std::time::Duration::from_secs(seconds + 2);
    let workers = worker_slots.map(|slots| {
        noop::spawn(
            &crate::harness::http_client(),
            &server.bases,
            slots,
            &noop::Until::deadline(end),
        )
    });
    tokio::time::sleep_until(end.into()).await;
    let completions = match workers {
        Some(workers) => Some(noop::join(workers).await?),
        None => None,
    };
    let fire_batches = server.metric_sum("sked_fire_batches_total").await?;
    server.stop().await;

    let window = server.finish_with_runs(store.as_ref(), from, to).await?;
    let p = percentiles_of(&window, |r| Some(ms(r.created_at - r.scheduled_for)));
    // The worst lateness of each second's instants: where in the window a tail happened.
    let worst_by_second = by_second(
        &window,
        from,
        seconds,
        |r| Some(ms(r.created_at - r.scheduled_for)),
        |values| percentiles(values).max,
    );
    // Instant -> attempt started: the first attempt's start (there are no retries here).
    let sp = percentiles_of(&window, |r| r.started_at.map(|s| ms(s - r.scheduled_for)));
    // Run recorded -> attempt started: the dispatch hop alone, without the firing's lateness.
    let hp = percentiles_of(&window, |r| r.started_at.map(|s| ms(s - r.created_at)));
    let succeeded = window
        .iter()
        .filter(|r| r.state == RunState::Succeeded)
        .count();
    // Every instant each schedule owed in the window, against its rows in the ledger.
    let (from_us, to_us) = (from.timestamp_micros(), to.timestamp_micros());
    let mut owed: HashMap<(String, i64), u32> = HashMap::new();
    for i in 0..schedules {
        let anchor = base.timestamp_micros() + step_us * i as i64;
        let mut t = anchor + (from_us - anchor).div_euclid(period_us) * period_us;
        if t < from_us {
            t += period_us;
        }
        while t < to_us {
            owed.insert((format!("job-{i:07}"), t), 0);
            t += period_us;
        }
    }
    let mut unexpected = 0usize;
    for r in &window {
        match owed.get_mut(&(r.job.clone(), r.scheduled_for.timestamp_micros())) {
            Some(count) => *count += 1,
            None => unexpected += 1,
        }
    }
    let lost = owed.values().filter(|&&c| c == 0).count();
    let doubled = owed.values().filter(|&&c| c > 1).count();
    let mut figures = json!({
        "scenario": "firing",
        "store": store_name,
        "nodes": nodes,
        "schedules": schedules,
        "every": every,
        "calendar": calendar,
        "fires_per_second": schedules as f64 * 1e6 / period_us as f64,
        "window_seconds": seconds,
        // The window's first instant, to line its seconds up with a trace taken beside it.
        "window_from": from.to_rfc3339(),
        "fires_expected": owed.len(),
        "fires_recorded": p.count,
        "fires_lost": lost,
        "fires_doubled": doubled,
        "fires_unexpected": unexpected,
        "lateness_ms": tail_json(&p),
        "lateness_max_by_second_ms": worst_by_second,
        "create_jobs_seconds": create_s,
        "start_to_ready_seconds": ready_s,
        "fire_batches": fire_batches,
    });
    if let Some(shares) = shares {
        figures["partitions_per_node"] = json!(shares);
    }
    if let Some(slots) = worker_slots {
        figures["worker_slots"] = json!(slots);
        figures["completions_sent"] = json!(completions);
        figures["runs_started"] = json!(sp.count);
        figures["runs_succeeded"] = json!(succeeded);
        figures["started_lateness_ms"] = tail_json(&sp);
        figures["recorded_to_started_ms"] = tail_json(&hp);
    }
    Ok(figures)
}
