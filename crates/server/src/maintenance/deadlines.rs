//! The deadline watcher: once a second, the runs of the jobs with a `deadline` are judged
//! (`sked_core::deadline`) — each run's deadlines resolved from its instant the first time it
//! is seen, the deadlines it missed, and, while it has not missed its `finish_by`, whether
//! the finish estimated from its job's history and what it still waits for
//! (`sked_core::deadline::estimate`) passes it. What is new is recorded through
//! `DeadlineStore::mark_deadlines`, which tells it under the job's `notify` rules; this duty
//! counts it in the metrics.
//!
//! It reads runs that have not ended, and those that ended since its last pass (from five
//! minutes back when it starts or takes over the maintenance lease), so a run that ends
//! between two passes is still judged at its end. It never changes a run's state: a
//! deadline tells, the job's `timeout` stops.

use crate::AppState;
use chrono::Utc;
use sked_core::deadline::estimate::{self, History, Stage, Step, HISTORY_RUNS, QUANTILE};
use sked_core::deadline::{self, DeadlineSpec, RunProgress, Zone};
use sked_core::records::{JobRecord, RunRecord};
use sked_core::run::{RunState, WaitReason};
use sked_core::Instant;
use sked_store::{DeadlineJob, DeadlineMark};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Mutex};

const INTERVAL: Duration = Duration::from_secs(1);
/// How far back the first pass reads ended runs.
const LOOKBACK: chrono::Duration = chrono::Duration::minutes(5);
/// Read again at each pass: a run's end recorded just before a pass began may commit after
/// the pass read, so the window overlaps the last one by this much.
const OVERLAP: chrono::Duration = chrono::Duration::seconds(5);
/// How long a job's history is kept before it is read again.
const HISTORY_TTL: Duration = Duration::from_secs(60);
/// The most steps one estimate walks up a chain, and how far up.
const MAX_STEPS: usize = 32;
const MAX_DEPTH: usize = 8;

/// What the watcher keeps between passes.
#[derive(Default)]
struct Watcher {
    /// When the last pass began.
    last_pass: Option<Instant>,
    histories: HashMap<(String, String), (std::time::Instant, History)>,
}

pub async fn run(state: AppState, shutdown: watch::Receiver<bool>) {
    let watcher = Arc::new(Mutex::new(Watcher::default()));
    super::every(
        INTERVAL,
        INTERVAL,
        state.maintenance.clone(),
        shutdown,
        || {
            let (state, watcher) = (state.clone(), watcher.clone());
            async move { watcher.lock().await.pass(&state).await }
        },
    )
    .await;
}

impl Watcher {
    async fn pass(&mut self, state: &AppState) {
        let now = Utc::now();
        let floor = now - LOOKBACK;
        let since = self.last_pass.map_or(floor, |last| last.max(floor)) - OVERLAP;
        let jobs = match state.store.deadline_runs(since).await {
            Ok(jobs) => jobs,
            Err(e) => {
                tracing::error!("deadlines: cannot read the runs to judge: {e}");
                return;
            }
        };
        let mut marks = Vec::new();
        let mut zones = HashMap::new();
        for DeadlineJob { job, runs } in jobs {
            let Some(spec) = job.spec.deadline.clone() else {
                continue;
            };
            let zone = zone_of(state, &job, &spec, &mut zones).await;
            for run in runs {
                if let Some(mark) = self.judge(state, &job, &spec, zone, &run, now).await {
                    marks.push(mark);
                }
            }
        }
        match state.store.mark_deadlines(&marks, now).await {
            Ok(added) => {
                for new in added {
                    let run = &new.run;
                    for kind in &new.missed {
                        state.metrics.deadline_missed(&run.namespace, *kind);
                        tracing::info!(
                            "run {} of {}/{} missed its {kind}",
                            run.id,
                            run.namespace,
                            run.job
                        );
                    }
                    if new.at_risk {
                        state.metrics.at_risk(&run.namespace);
                        tracing::info!(
                            "run {} of {}/{} is at risk of missing its finish_by",
                            run.id,
                            run.namespace,
                            run.job
                        );
                    }
                }
                self.last_pass = Some(now);
            }
            Err(e) => tracing::error!("deadlines: cannot record what was found: {e}"),
        }
    }

    /// What is new about `run` at `now`, if anything.
    async fn judge(
        &mut self,
        state: &AppState,
        job: &JobRecord,
        spec: &DeadlineSpec,
        zone: Zone,
        run: &RunRecord,
        now: Instant,
    ) -> Option<DeadlineMark> {
        let resolved = run
            .deadline
            .unwrap_or_else(|| spec.resolve(run.scheduled_for, zone));
        let progress = RunProgress {
            state: run.state,
            started_at: run.started_at,
            finished_at: run.finished_at,
        };
        let missed = deadline::missed(&resolved, &progress, now);
        let merged = deadline::merge_misses(&run.deadline_missed, &missed);
        // While the run is open only a newly missed kind is news: the amounts of those
        // already recorded grow every pass, and are written once, final, at its end.
        let kinds = |list: &[deadline::Miss]| list.iter().map(|m| m.kind).collect::<Vec<_>>();
        let missed_news = if run.state.is_terminal() {
            merged != run.deadline_missed
        } else {
            kinds(&merged) != kinds(&run.deadline_missed)
        };
        let finish_missed = merged
            .iter()
            .any(|m| m.kind == deadline::DeadlineKind::FinishBy);
        let at_risk = if run.at_risk.is_none() && !finish_missed && resolved.finish_by.is_some() {
            let estimated = if run.state.is_terminal() {
                None
            } else {
                self.estimate(state, job, run, now).await
            };
            deadline::at_risk(&resolved, &progress, estimated, now)
        } else {
            None
        };
        (run.deadline.is_none() || missed_news || at_risk.is_some()).then_some(DeadlineMark {
            run_id: run.id,
            deadline: resolved,
            missed,
            at_risk,
        })
    }

    /// When `run` is expected to end, from its job's history and its upstream chain.
    async fn estimate(
        &mut self,
        state: &AppState,
        job: &JobRecord,
        run: &RunRecord,
        now: Instant,
    ) -> Option<Instant> {
        let mut budget = MAX_STEPS;
        let step = self.step_of_run(state, job, run, 0, &mut budget).await;
        estimate::finish(&step, now, QUANTILE)
    }

    /// The step `run` (of `job`) is in a chain, with the steps it waits for.
    async fn step_of_run(
        &mut self,
        state: &AppState,
        job: &JobRecord,
        run: &RunRecord,
        depth: usize,
        budget: &mut usize,
    ) -> Step {
        let history = self.history(state, job).await;
        let stage = match run.state {
            RunState::Running => Stage::Running {
                started_at: run.started_at.unwrap_or(run.ready_at),
            },
            RunState::Queued => Stage::Queued {
                ready_at: run.ready_at,
            },
            RunState::Waiting => {
                let upstream = match run.waiting_reason {
                    Some(WaitReason::Dependencies) => {
                        Box::pin(self.upstream_steps(state, job, depth, budget)).await
                    }
                    Some(WaitReason::Overlap) => {
                        Box::pin(self.earlier_runs(state, job, run, depth, budget)).await
                    }
                    _ => Vec::new(),
                };
                Stage::Waiting { upstream }
            }
            _ => Stage::Ended,
        };
        Step { history, stage }
    }

    /// The steps for the jobs `job` depends on: each one's oldest run not ended, or, for a
    /// job that follows its own upstreams and has none, the run to come after them.
    async fn upstream_steps(
        &mut self,
        state: &AppState,
        job: &JobRecord,
        depth: usize,
        budget: &mut usize,
    ) -> Vec<Step> {
        let mut steps = Vec::new();
        if depth >= MAX_DEPTH {
            return steps;
        }
        for name in sked_core::dependency::upstreams(&job.spec.depends_on) {
            if *budget == 0 {
                break;
            }
            *budget -= 1;
            let upstream = match state.store.get_job(&job.namespace, &name).await {
                Ok(Some(upstream)) => upstream,
                // Deleted since: nothing of it is pending.
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(
                        "deadlines: cannot read upstream {}/{name}, left out of the estimate: {e}",
                        job.namespace
                    );
                    continue;
                }
            };
            let open = open_runs_of(state, &upstream).await;
            let step = match open.first() {
                Some(run) => {
                    self.step_of_run(state, &upstream, run, depth + 1, budget)
                        .await
                }
                None if upstream.spec.follows_upstreams() => {
                    let before =
                        Box::pin(self.upstream_steps(state, &upstream, depth + 1, budget)).await;
                    Step {
                        history: self.history(state, &upstream).await,
                        stage: Stage::Expected { upstream: before },
                    }
                }
                None => continue,
            };
            steps.push(step);
        }
        steps
    }

    /// The job's runs before `run` that hold it back (overlap `buffer_*`).
    async fn earlier_runs(
        &mut self,
        state: &AppState,
        job: &JobRecord,
        run: &RunRecord,
        depth: usize,
        budget: &mut usize,
    ) -> Vec<Step> {
        let mut steps = Vec::new();
        if depth >= MAX_DEPTH {
            return steps;
        }
        let open = open_runs_of(state, job).await;
        for earlier in open
            .iter()
            .filter(|r| r.scheduled_for < run.scheduled_for && r.state != RunState::Waiting)
        {
            if *budget == 0 {
                break;
            }
            *budget -= 1;
            steps.push(
                self.step_of_run(state, job, earlier, depth + 1, budget)
                    .await,
            );
        }
        steps
    }

    /// The job's recent durations, read again once [`HISTORY_TTL`] old.
    async fn history(&mut self, state: &AppState, job: &JobRecord) -> History {
        let (namespace, name) = (job.namespace.as_str(), job.name.as_str());
        let key = (namespace.to_string(), name.to_string());
        if let Some((read, history)) = self.histories.get(&key) {
            // A history too short to estimate from is read again at once: the runs that
            // lengthen it may just have ended.
            if read.elapsed() < HISTORY_TTL && history.len() >= estimate::MIN_HISTORY {
                return history.clone();
            }
        }
        let durations = match state
            .store
            .run_durations(namespace, name, HISTORY_RUNS as u32)
            .await
        {
            Ok(durations) => durations,
            Err(e) => {
                tracing::warn!("deadlines: cannot read the history of {namespace}/{name}: {e}");
                Vec::new()
            }
        };
        let history = History::new(durations);
        self.histories
            .insert(key, (std::time::Instant::now(), history.clone()));
        // Jobs come and go: a history not read for long is dropped rather than kept forever.
        self.histories
            .retain(|_, (read, _)| read.elapsed() < HISTORY_TTL * 10);
        history
    }
}

/// The runs of `job` not ended, the oldest first. A store error is said and leaves them out:
/// the estimate is then made of what could be read, and the next pass tries again.
async fn open_runs_of(state: &AppState, job: &JobRecord) -> Vec<RunRecord> {
    match state.store.open_runs(&[job.id]).await {
        Ok(runs) => runs,
        Err(e) => {
            tracing::warn!(
                "deadlines: cannot read the open runs of {}/{}: {e}",
                job.namespace,
                job.name
            );
            Vec::new()
        }
    }
}

/// The zone of a job's local deadlines ([`DeadlineSpec::zone`]); the zone of a calendar its
/// schedule names is read once a pass.
async fn zone_of(
    state: &AppState,
    job: &JobRecord,
    spec: &DeadlineSpec,
    calendars: &mut HashMap<(String, String), Option<String>>,
) -> Zone {
    let Some(calendar) = spec.zone_calendar(&job.spec) else {
        return spec.zone(&job.spec, None);
    };
    let key = (job.namespace.clone(), calendar.to_string());
    if !calendars.contains_key(&key) {
        let zone = match state.store.get_calendar(&key.0, &key.1).await {
            Ok(found) => found.and_then(|c| c.spec.timezone),
            Err(e) => {
                tracing::warn!("deadlines: cannot read calendar {}/{}: {e}", key.0, key.1);
                None
            }
        };
        calendars.insert(key.clone(), zone);
    }
    spec.zone(&job.spec, calendars.get(&key).cloned().flatten().as_deref())
}
