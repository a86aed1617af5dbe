//! Dependencies in the ledger, as on SQLite (`sqlite/dependencies.rs`): the edges between jobs,
//! the verdict on a run that waits for its upstreams, and what follows when a run ends, inside
//! the transaction that ended it.
//!
//! A dependant's waiting runs change only under its job's lock, like every change to how many
//! of a job's runs are active. A transaction that may end runs therefore locks, with the jobs
//! it touches and in the same id-ordered statement, the jobs that depend on them
//! ([`dependants_of`]); a dependant's fire (which judges its new run) holds the dependant's
//! lock too, so the two are serialised and neither misses the other's write. A skip that
//! cascades further down locks each next level as it reaches it (out of the usual order, so
//! a rare deadlock is possible there, and the transaction is run again); locking the whole
//! graph below up front would make every step of a long pipeline lock all the steps after it.

use super::ledger::{admit_by_overlap, skip_run};
use super::rows::{self, micros};
use super::{PgResult, Tx};
use crate::shared::{first_ended, timed_out_error, verdict_from, Ended, Settled, WindowRuns};
use crate::{DependencyEdge, StoreError, Toward};
use sked_core::dependency::{self, Verdict};
use sked_core::job::{JobSpec, ValidJob};
use sked_core::policy::OverlapPolicy;
use sked_core::run::{RunState, SkipReason, Trigger};
use sked_core::{Instant, SpecError};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// The jobs that depend on any of `ids`, without `ids`: the jobs whose waiting runs a run of
/// theirs ending may move, to be locked with them.
pub(super) async fn dependants_of(tx: &Tx<'_>, ids: &[i64]) -> PgResult<Vec<i64>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let stmt = tx
        .prepare_cached(
            "SELECT DISTINCT j.id FROM jobs u \
             JOIN job_dependencies e ON e.namespace = u.namespace AND e.upstream = u.name \
             JOIN jobs j ON j.namespace = e.namespace AND j.name = e.job \
             WHERE u.id = ANY($1) AND NOT j.id = ANY($1)",
        )
        .await?;
    tx.query(&stmt, &[&ids])
        .await?
        .iter()
        .map(|r| Ok(r.try_get(0)?))
        .collect()
}

/// Keeps the job's edges in step with its definition: every upstream must exist in the
/// namespace, and none may (transitively) wait for this job. The caller holds the namespace's
/// rules lock exclusively, so two definitions cannot close a cycle side by side.
pub(super) async fn put_edges(tx: &Tx<'_>, namespace: &str, job: &ValidJob) -> PgResult<()> {
    let depends_on = &job.spec.depends_on;
    let upstreams = dependency::upstreams(depends_on);
    let stmt = tx
        .prepare_cached("SELECT 1 FROM jobs WHERE namespace = $1 AND name = $2")
        .await?;
    for upstream in &upstreams {
        if tx
            .query_opt(&stmt, &[&namespace, upstream])
            .await?
            .is_none()
        {
            return Err(StoreError::from(SpecError::new(
                dependency::field_naming(depends_on, upstream),
                format!("there is no job {upstream:?} in namespace {namespace:?}"),
            ))
            .into());
        }
    }
    // A cycle through this job needs a job that waits for it; most writes (a graph created
    // upstream first) have none, and skip reading their ancestors.
    if upstreams.is_empty() || dependants(tx, namespace, &job.name).await?.is_empty() {
        return write_edges(tx, namespace, &job.name, &upstreams).await;
    }
    // The ancestors, read in one statement; the cycle is then found (and named) in memory.
    let stmt = tx
        .prepare_cached(
            "WITH RECURSIVE up (name) AS ( \
                 SELECT unnest($2::text[]) COLLATE \"C\" \
                 UNION \
                 SELECT e.upstream FROM job_dependencies e \
                 JOIN up ON e.namespace = $1 AND e.job = up.name) \
             SELECT e.job, e.upstream FROM job_dependencies e \
             WHERE e.namespace = $1 AND e.job IN (SELECT name FROM up)",
        )
        .await?;
    let names: Vec<&str> = upstreams.iter().map(String::as_str).collect();
    let mut edges: std::collections::HashMap<String, BTreeSet<String>> =
        std::collections::HashMap::new();
    for row in tx.query(&stmt, &[&namespace, &names]).await? {
        edges
            .entry(row.try_get(0)?)
            .or_default()
            .insert(row.try_get(1)?);
    }
    let cycle = dependency::find_cycle::<()>(&job.name, &upstreams, |name| {
        Ok(edges.get(name).cloned().unwrap_or_default())
    })
    .unwrap_or_default();
    if let Some(cycle) = cycle {
        let first = cycle.get(1).map(String::as_str).unwrap_or_default();
        return Err(StoreError::from(SpecError::new(
            dependency::field_naming(depends_on, first),
            format!(
                "a cycle of dependencies: {} (each waits for the next)",
                cycle.join(" -> ")
            ),
        ))
        .into());
    }
    write_edges(tx, namespace, &job.name, &upstreams).await
}

/// Replaces the edges of `job` by one to each of `upstreams`.
async fn write_edges(
    tx: &Tx<'_>,
    namespace: &str,
    job: &str,
    upstreams: &BTreeSet<String>,
) -> PgResult<()> {
    remove_edges(tx, namespace, job).await?;
    if !upstreams.is_empty() {
        let names: Vec<&str> = upstreams.iter().map(String::as_str).collect();
        let stmt = tx
            .prepare_cached(
                "INSERT INTO job_dependencies (namespace, job, upstream) \
                 SELECT $1, $2, unnest($3::text[])",
            )
            .await?;
        tx.execute(&stmt, &[&namespace, &job, &names]).await?;
    }
    Ok(())
}

/// The names of the jobs that depend on `upstream`.
pub(super) async fn dependants(
    tx: &Tx<'_>,
    namespace: &str,
    upstream: &str,
) -> PgResult<Vec<String>> {
    let stmt = tx
        .prepare_cached(
            "SELECT job FROM job_dependencies WHERE namespace = $1 AND upstream = $2 ORDER BY job",
        )
        .await?;
    tx.query(&stmt, &[&namespace, &upstream])
        .await?
        .iter()
        .map(|r| Ok(r.try_get(0)?))
        .collect()
}

/// The edges on the `toward` side of `jobs`, sorted.
pub(super) async fn edges(
    tx: &Tx<'_>,
    namespace: &str,
    jobs: &[String],
    toward: Toward,
) -> PgResult<Vec<DependencyEdge>> {
    let sql = match toward {
        Toward::Upstream => {
            "SELECT job, upstream FROM job_dependencies WHERE namespace = $1 AND job = ANY($2) \
             ORDER BY job, upstream"
        }
        Toward::Downstream => {
            "SELECT job, upstream FROM job_dependencies WHERE namespace = $1 \
             AND upstream = ANY($2) ORDER BY job, upstream"
        }
    };
    let stmt = tx.prepare_cached(sql).await?;
    tx.query(&stmt, &[&namespace, &jobs])
        .await?
        .iter()
        .map(|r| {
            Ok(DependencyEdge {
                job: r.try_get(0)?,
                upstream: r.try_get(1)?,
            })
        })
        .collect()
}

/// Forgets what a job depended on (what depends on it stays, by name).
pub(super) async fn remove_edges(tx: &Tx<'_>, namespace: &str, job: &str) -> PgResult<()> {
    let stmt = tx
        .prepare_cached("DELETE FROM job_dependencies WHERE namespace = $1 AND job = $2")
        .await?;
    tx.execute(&stmt, &[&namespace, &job]).await?;
    Ok(())
}

/// The verdict on a run at `instant` of a job of `namespace` whose definition is `spec`. What
/// every upstream did in its window is read in one statement (one round trip, however many
/// upstreams), then judged by core's pure rule.
pub(super) async fn judge(
    tx: &Tx<'_>,
    namespace: &str,
    spec: &JobSpec,
    instant: Instant,
) -> PgResult<Verdict> {
    let requirements: Vec<_> = dependency::requirements(&spec.depends_on).collect();
    let (mut jobs, mut froms, mut ends) = (Vec::new(), Vec::new(), Vec::new());
    for requirement in &requirements {
        let (from, to) = requirement.window.around(instant);
        jobs.push(requirement.job);
        froms.push(micros(from));
        ends.push(micros(to));
    }
    // Runs found by name, so those of a job deleted and created again count.
    let stmt = tx
        .prepare_cached(
            "SELECT q.k, coalesce(bool_or(r.state = 'succeeded'), false), \
                    coalesce(bool_or(r.state NOT IN ('waiting', 'queued', 'running')), false), \
                    coalesce(bool_or(r.state IN ('waiting', 'queued', 'running')), false), \
                    min(lpad(r.id::text, 20, '0') || ' ' || r.state) FILTER (WHERE r.state \
                        NOT IN ('waiting', 'queued', 'running', 'succeeded')), \
                    max(r.scheduled_for), \
                    (SELECT next_fire_at FROM jobs j WHERE j.namespace = $1 AND j.name = q.job) \
             FROM unnest($2::text[], $3::bigint[], $4::bigint[]) WITH ORDINALITY \
                 AS q(job, lo, hi, k) \
             LEFT JOIN runs r ON r.namespace = $1 AND r.job = q.job COLLATE \"C\" \
                 AND r.scheduled_for >= q.lo AND r.scheduled_for <= q.hi \
             GROUP BY q.k, q.job",
        )
        .await?;
    let mut found: Vec<WindowRuns> = vec![WindowRuns::default(); requirements.len()];
    for row in tx.query(&stmt, &[&namespace, &jobs, &froms, &ends]).await? {
        let k: i64 = row.try_get(0)?;
        let Some(slot) = usize::try_from(k - 1).ok().and_then(|k| found.get_mut(k)) else {
            continue;
        };
        *slot = WindowRuns {
            succeeded: row.try_get(1)?,
            ended: row.try_get(2)?,
            active: row.try_get(3)?,
            ended_unsucceeded: first_ended(row.try_get(4)?)?,
            latest: row.try_get(5)?,
            next_fire_at: row.try_get(6)?,
        };
    }
    Ok(verdict_from(spec, instant, &found, &ends))
}

/// A job that depends on a job whose run just ended.
struct Dependant {
    id: i64,
    name: String,
    spec: JobSpec,
    priority: i32,
}

/// The jobs depending on `upstream`, their rows locked (the caller locked them already in the
/// common case; a job further down a cascade, or a dependant added since, is locked here).
async fn dependant_jobs(tx: &Tx<'_>, namespace: &str, upstream: &str) -> PgResult<Vec<Dependant>> {
    let stmt = tx
        .prepare_cached(
            "SELECT j.id, j.name, j.spec, j.priority FROM jobs j \
             WHERE (j.namespace, j.name) IN (SELECT namespace, job FROM job_dependencies \
                 WHERE namespace = $1 AND upstream = $2) \
             ORDER BY j.id FOR UPDATE",
        )
        .await?;
    tx.query(&stmt, &[&namespace, &upstream])
        .await?
        .iter()
        .map(|row| {
            Ok(Dependant {
                id: row.try_get(0)?,
                name: row.try_get(1)?,
                spec: rows::spec(row.try_get(2)?)?,
                priority: row.try_get(3)?,
            })
        })
        .collect()
}

/// Moves the dependants of the runs in `ended`, and of every run that ends because of them,
/// as `sqlite::dependencies::settle` does: the runs that end together are settled together,
/// each waiting run judged once after all of them.
pub(super) async fn settle(tx: &Tx<'_>, ended: Vec<Ended>, now: Instant) -> PgResult<Settled> {
    let mut settled = Settled::default();
    let mut generation = ended;
    while !generation.is_empty() {
        let mut next = Vec::new();
        let mut dependants: HashMap<(String, String), Vec<Arc<Dependant>>> = HashMap::new();
        // Waiting runs to judge, by id: the dependant and the run's instant and namespace.
        let mut candidates: BTreeMap<i64, (Arc<Dependant>, Instant, String)> = BTreeMap::new();
        for run in &generation {
            let key = (run.namespace.clone(), run.job.clone());
            if !dependants.contains_key(&key) {
                let found = dependant_jobs(tx, &run.namespace, &run.job).await?;
                dependants.insert(key.clone(), found.into_iter().map(Arc::new).collect());
            }
            for dependant in dependants.get(&key).into_iter().flatten() {
                let Some((from, to)) = dependency::dependant_instants(
                    &dependant.spec.depends_on,
                    &run.job,
                    run.scheduled_for,
                ) else {
                    continue;
                };
                if dependant.spec.follows_upstreams() {
                    follow(tx, run, dependant, now, &mut next).await?;
                }
                let stmt = tx
                    .prepare_cached(
                        "SELECT id, scheduled_for FROM runs WHERE job_id = $1 \
                         AND state = 'waiting' AND waiting_reason = 'dependencies' \
                         AND scheduled_for >= $2 AND scheduled_for <= $3 ORDER BY id FOR UPDATE",
                    )
                    .await?;
                let waiting = tx
                    .query(&stmt, &[&dependant.id, &micros(from), &micros(to)])
                    .await?;
                for row in waiting {
                    candidates.entry(row.try_get(0)?).or_insert((
                        dependant.clone(),
                        rows::instant(row.try_get(1)?)?,
                        run.namespace.clone(),
                    ));
                }
            }
        }
        for (run_id, (dependant, instant, namespace)) in candidates {
            match judge(tx, &namespace, &dependant.spec, instant).await? {
                Verdict::Ready => {
                    release(
                        tx,
                        run_id,
                        &dependant,
                        instant,
                        &namespace,
                        now,
                        &mut settled,
                        &mut next,
                    )
                    .await?
                }
                Verdict::Waiting(missing) => {
                    let stmt = tx
                        .prepare_cached("UPDATE runs SET waiting_for = $2 WHERE id = $1")
                        .await?;
                    let missing = crate::shared::to_json("unmet dependencies", &missing)?;
                    tx.execute(&stmt, &[&run_id, &missing]).await?;
                }
                Verdict::UpstreamFailed(why) => {
                    skip_run(tx, run_id, SkipReason::UpstreamFailed, &why, now).await?;
                    next.push(Ended {
                        namespace,
                        job: dependant.name.clone(),
                        scheduled_for: instant,
                        state: RunState::Skipped,
                    });
                }
            }
        }
        generation = next;
    }
    Ok(settled)
}

/// Records the run of a job without a schedule at its upstream run's instant, once; a paused
/// job's run is recorded skipped.
async fn follow(
    tx: &Tx<'_>,
    upstream: &Ended,
    dependant: &Dependant,
    now: Instant,
    ended: &mut Vec<Ended>,
) -> PgResult<()> {
    let paused = dependant.spec.paused;
    let (state, skip, waiting_reason) = if paused {
        (RunState::Skipped, Some(SkipReason::Paused), None)
    } else {
        (RunState::Waiting, None, Some("dependencies"))
    };
    let (waiting_for, until) = crate::shared::waiting_columns(&dependant.spec, &[], now)?;
    let stmt = tx
        .prepare_cached(
            "INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, \
             skip_reason, priority, ready_at, created_at, finished_at, waiting_reason, \
             waiting_for, waiting_until) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $4, $9, $10, $11, $12, $13) \
             ON CONFLICT (job_id, scheduled_for) DO NOTHING",
        )
        .await?;
    let written = tx
        .execute(
            &stmt,
            &[
                &dependant.id,
                &upstream.namespace,
                &dependant.name,
                &micros(upstream.scheduled_for),
                &Trigger::Dependency.as_str(),
                &state.as_str(),
                &skip.map(SkipReason::as_str),
                &dependant.priority,
                &micros(now),
                &paused.then(|| micros(now)),
                &waiting_reason,
                &waiting_reason.map(|_| waiting_for),
                &waiting_reason.map(|_| until),
            ],
        )
        .await?;
    if written == 1 && paused {
        ended.push(Ended {
            namespace: upstream.namespace.clone(),
            job: dependant.name.clone(),
            scheduled_for: upstream.scheduled_for,
            state,
        });
    }
    Ok(())
}

/// A waiting run whose dependencies are met: now its job's overlap policy decides.
#[allow(clippy::too_many_arguments)]
async fn release(
    tx: &Tx<'_>,
    run_id: i64,
    dependant: &Dependant,
    instant: Instant,
    namespace: &str,
    now: Instant,
    settled: &mut Settled,
    ended: &mut Vec<Ended>,
) -> PgResult<()> {
    let overlap = dependant.spec.overlap;
    let (state, skip) = if overlap == OverlapPolicy::Allow {
        (RunState::Queued, None)
    } else {
        // The run still waits for its dependencies here, so the overlap count leaves it out.
        let admitted = admit_by_overlap(tx, dependant.id, overlap, now, ended).await?;
        settled.cancel_requested.extend(admitted.cancel_requested);
        (admitted.state, admitted.skip)
    };
    if state == RunState::Skipped {
        let reason = skip.unwrap_or(SkipReason::Overlap);
        skip_run(
            tx,
            run_id,
            reason,
            "an earlier run of the job was still active",
            now,
        )
        .await?;
        ended.push(Ended {
            namespace: namespace.to_string(),
            job: dependant.name.clone(),
            scheduled_for: instant,
            state,
        });
        return Ok(());
    }
    let reason = (state == RunState::Waiting).then_some("overlap");
    let stmt = tx
        .prepare_cached(
            "UPDATE runs SET state = $2, waiting_reason = $3, waiting_for = NULL, \
             waiting_until = NULL, ready_at = greatest(ready_at, $4) WHERE id = $1",
        )
        .await?;
    tx.execute(&stmt, &[&run_id, &state.as_str(), &reason, &micros(now)])
        .await?;
    if state == RunState::Queued {
        settled.queued.push(run_id);
    }
    Ok(())
}

/// Skips the runs whose dependencies were not met within their job's `deps_timeout`, at most
/// `limit`, and settles their dependants. Returns the skipped runs and what settling did.
pub(super) async fn expire_waits(
    tx: &Tx<'_>,
    now: Instant,
    limit: u32,
) -> PgResult<(Vec<i64>, Settled)> {
    // Find them, lock their jobs and their dependants, then look again under the locks.
    const OVERDUE: &str = "state = 'waiting' AND waiting_reason = 'dependencies' \
         AND waiting_until < $1";
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT id, job_id FROM runs WHERE {OVERDUE} ORDER BY waiting_until LIMIT $2"
        ))
        .await?;
    let candidates = tx.query(&stmt, &[&micros(now), &i64::from(limit)]).await?;
    if candidates.is_empty() {
        return Ok((Vec::new(), Settled::default()));
    }
    let mut run_ids = Vec::with_capacity(candidates.len());
    let mut job_ids = Vec::with_capacity(candidates.len());
    for row in &candidates {
        run_ids.push(row.try_get::<_, i64>(0)?);
        job_ids.push(row.try_get::<_, i64>(1)?);
    }
    job_ids.extend(dependants_of(tx, &job_ids).await?);
    super::jobs::lock(tx, &job_ids).await?;
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT id, namespace, job, scheduled_for, waiting_for FROM runs \
             WHERE id = ANY($2) AND {OVERDUE} ORDER BY id FOR UPDATE"
        ))
        .await?;
    let overdue = tx.query(&stmt, &[&micros(now), &run_ids]).await?;
    let mut skipped = Vec::with_capacity(overdue.len());
    let mut ended = Vec::with_capacity(overdue.len());
    for row in overdue {
        let run_id: i64 = row.try_get(0)?;
        let waiting_for: Option<&str> = row.try_get(4)?;
        let why = timed_out_error(waiting_for)?;
        skip_run(tx, run_id, SkipReason::DependenciesTimedOut, &why, now).await?;
        skipped.push(run_id);
        ended.push(Ended {
            namespace: row.try_get(1)?,
            job: row.try_get(2)?,
            scheduled_for: rows::instant(row.try_get(3)?)?,
            state: RunState::Skipped,
        });
    }
    let settled = settle(tx, ended, now).await?;
    Ok((skipped, settled))
}
