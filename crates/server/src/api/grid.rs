//! `GET /api/v1/runs/grid`: a page of a namespace's jobs (the job list's filters and cursor)
//! with each job's newest runs whose instants fall in a window, for the console's runs grid.
//!
//! It owns the grid's bounds (jobs a page, runs a job, the window's length) and their
//! refusals; which jobs match is `Store::list_jobs`', the cells are one
//! `GridStore::grid_runs` read. It writes nothing, and leaves the job list's handler alone
//! but for the label filter they share (`jobs::parse_label`).

use super::extract::Query;
use super::jobs::parse_label;
use super::{ApiError, Namespace};
use crate::auth::Caller;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use sked_core::job::JobState;
use sked_core::run::RunState;
use sked_core::schedule::ScheduleKind;
use sked_core::Instant;
use sked_store::grid::{MAX_GRID_JOBS, MAX_GRID_RUNS_PER_JOB};
use sked_store::{GridQuery, GridRun, JobQuery, JobSort, Page};
use std::collections::HashMap;

/// Jobs a page holds unless `jobs` says otherwise.
pub const DEFAULT_JOBS: u32 = 100;
/// The window when `from` is not given: the day before `to`.
pub const DEFAULT_WINDOW: Duration = Duration::days(1);
/// The longest window a call may ask for.
pub const MAX_WINDOW: Duration = Duration::days(31);

#[derive(Debug, Deserialize)]
pub struct GridParams {
    #[serde(default = "super::default_namespace")]
    namespace: String,
    search: Option<String>,
    state: Option<String>,
    kind: Option<String>,
    /// `key=value`: jobs whose routing asks for this label.
    label: Option<String>,
    from: Option<String>,
    to: Option<String>,
    /// Jobs a page, 1 to 500.
    jobs: Option<u32>,
    /// Runs a job, the newest instants first, 1 to 100.
    instants: Option<u32>,
    cursor: Option<String>,
}

/// One job's row of the grid.
#[derive(Debug, Serialize)]
pub struct GridRow {
    pub name: String,
    pub state: JobState,
    pub kind: &'static str,
    /// Its runs in the window, newest first.
    pub runs: Vec<GridCell>,
}

/// One run of a row.
#[derive(Debug, Serialize)]
pub struct GridCell {
    pub id: i64,
    pub scheduled_for: Instant,
    pub state: RunState,
    pub started_at: Option<Instant>,
    pub finished_at: Option<Instant>,
}

#[derive(Debug, Serialize)]
pub struct GridPage {
    pub namespace: String,
    pub from: Instant,
    pub to: Instant,
    pub jobs: Vec<GridRow>,
    pub next_cursor: Option<String>,
}

pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Query(p): Query<GridParams>,
) -> Result<Json<GridPage>, ApiError> {
    let namespace = Namespace {
        namespace: p.namespace,
    }
    .checked(&caller)?;
    let (from, to) = window(p.from.as_deref(), p.to.as_deref(), Utc::now())?;
    let limit = bounded("jobs", p.jobs, DEFAULT_JOBS, MAX_GRID_JOBS as u32)?;
    let per_job = bounded(
        "instants",
        p.instants,
        MAX_GRID_RUNS_PER_JOB,
        MAX_GRID_RUNS_PER_JOB,
    )?;
    let job_state = super::jobs::parse_job_state(p.state.as_deref())?;
    let kind = super::jobs::parse_schedule_kind(p.kind.as_deref())?;
    let query = JobQuery {
        namespace: namespace.clone(),
        search: p.search.filter(|s| !s.is_empty()),
        state: job_state,
        kind,
        last: None,
        label: parse_label(p.label.as_deref())?,
        sort: JobSort::Name,
        descending: false,
        limit,
        cursor: p.cursor.filter(|c| !c.is_empty()),
    };
    let Page { items, next_cursor } = state.store.list_jobs(&query).await?;
    let cells = state
        .store
        .grid_runs(&GridQuery {
            namespace: namespace.clone(),
            jobs: items.iter().map(|j| j.name.clone()).collect(),
            from,
            to,
            per_job,
        })
        .await?;
    let mut by_job: HashMap<String, Vec<GridCell>> = HashMap::new();
    for run in cells {
        let GridRun {
            id,
            job,
            scheduled_for,
            state,
            started_at,
            finished_at,
        } = run;
        by_job.entry(job).or_default().push(GridCell {
            id,
            scheduled_for,
            state,
            started_at,
            finished_at,
        });
    }
    let jobs = items
        .into_iter()
        .map(|job| GridRow {
            runs: by_job.remove(&job.name).unwrap_or_default(),
            kind: ScheduleKind::of(job.spec.schedule.as_ref()).as_str(),
            state: job.state,
            name: job.name,
        })
        .collect();
    Ok(Json(GridPage {
        namespace,
        from,
        to,
        jobs,
        next_cursor,
    }))
}

/// `value` if given, within `1..=max`; `default` if not.
fn bounded(field: &str, value: Option<u32>, default: u32, max: u32) -> Result<u32, ApiError> {
    match value {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(_) => Err(ApiError::invalid(
            field,
            format!("must be between 1 and {max}"),
        )),
    }
}

/// An RFC 3339 instant from the query parameter `field`.
fn instant(field: &str, text: &str) -> Result<Instant, ApiError> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| ApiError::invalid(field, format!("{text:?} is not an RFC 3339 instant ({e})")))
}

/// The window `[from, to)`: `to` defaults to `now`, `from` to [`DEFAULT_WINDOW`] before `to`;
/// `from` must come before `to`, at most [`MAX_WINDOW`] before it.
pub fn window(
    from: Option<&str>,
    to: Option<&str>,
    now: Instant,
) -> Result<(Instant, Instant), ApiError> {
    // An empty instant is no instant: refused like any other unreadable one.
    let to = match to {
        Some(text) => instant("to", text)?,
        None => now,
    };
    let from = match from {
        Some(text) => instant("from", text)?,
        None => to - DEFAULT_WINDOW,
    };
    if from >= to {
        return Err(ApiError::invalid("from", "must be before to"));
    }
    if to - from > MAX_WINDOW {
        return Err(ApiError::invalid(
            "from",
            format!(
                "the window may be at most {} days long",
                MAX_WINDOW.num_days()
            ),
        ));
    }
    Ok((from, to))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn now() -> Instant {
        Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap()
    }

    fn field(e: ApiError) -> Option<String> {
        e.field
    }

    #[test]
    fn a_window_defaults_to_the_day_before_now() {
        assert_eq!(
            window(None, None, now()).ok(),
            Some((now() - Duration::days(1), now()))
        );
        let to = "2026-02-01T00:00:00Z";
        let t = Utc.with_ymd_and_hms(2026, 2, 1, 0, 0, 0).unwrap();
        assert_eq!(
            window(None, Some(to), now()).ok(),
            Some((t - Duration::days(1), t))
        );
        assert_eq!(
            window(Some("2026-01-31T23:00:00+01:00"), Some(to), now()).ok(),
            Some((t - Duration::hours(2), t))
        );
    }

    #[test]
    fn a_window_backwards_too_long_or_unreadable_is_refused() {
        let refused = |from, to| window(from, to, now()).err().and_then(field);
        assert_eq!(refused(Some("yesterday"), None).as_deref(), Some("from"));
        assert_eq!(refused(Some(""), None).as_deref(), Some("from"));
        assert_eq!(refused(None, Some("")).as_deref(), Some("to"));
        assert_eq!(
            refused(None, Some("2026-13-01T00:00:00Z")).as_deref(),
            Some("to")
        );
        assert_eq!(
            refused(Some("2026-03-01T12:00:00Z"), None).as_deref(),
            Some("from"),
            "an empty window"
        );
        assert_eq!(
            refused(Some("2026-01-01T00:00:00Z"), None).as_deref(),
            Some("from"),
            "two months"
        );
        assert!(window(Some("2026-01-29T12:00:00Z"), None, now()).is_ok());
    }

    #[test]
    fn counts_are_bounded() {
        assert_eq!(bounded("jobs", None, 100, 500).ok(), Some(100));
        assert_eq!(bounded("jobs", Some(500), 100, 500).ok(), Some(500));
        assert!(bounded("jobs", Some(501), 100, 500).is_err());
        assert!(bounded("jobs", Some(0), 100, 500).is_err());
    }
}
