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

use super::ledger::{admit_by_overlap, skip_run, skip_runs};
use super::rows::{self, micros};
use super::{PgResult, Tx};
use crate::shared::{
    first_ended, timed_out_error, verdict_from, Ended, EventAdmission, Graph, Settled, WindowRuns,
};
use crate::{DependencyEdge, StoreError, Toward};
use sked_core::dependency::{self, Upstream, Verdict};
use sked_core::job::{JobSpec, ValidJob};
use sked_core::policy::OverlapPolicy;
use sked_core::records::{EventRecord, RunRecord};
use sked_core::run::{RunState, SkipReason, Trigger};
use sked_core::{Instant, SpecError};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

/// The jobs that depend on any of `ids` (some of `ids` among them, when one depends on
/// another): the jobs whose waiting runs a run of theirs ending may move, to be locked with
/// them. A completion locks only some of its own jobs, so a dependant in the batch itself must
/// be named too.
pub(super) async fn dependants_of(tx: &Tx<'_>, ids: &[i64]) -> PgResult<Vec<i64>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let stmt = tx
        .prepare_cached(
            "SELECT DISTINCT j.id FROM jobs u \
             JOIN job_dependencies e ON e.namespace = u.namespace AND e.upstream = u.name \
             JOIN jobs j ON j.namespace = e.namespace AND j.name = e.job \
             WHERE u.id = ANY($1)",
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

/// The namespace's dependency edges, for ranking `priority: auto` jobs.
pub(super) async fn graph(tx: &Tx<'_>, namespace: &str) -> PgResult<Graph> {
    let stmt = tx
        .prepare_cached("SELECT job, upstream FROM job_dependencies WHERE namespace = $1")
        .await?;
    let rows = tx.query(&stmt, &[&namespace]).await?;
    let edges = rows
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<PgResult<Vec<(String, String)>>>()?;
    Ok(Graph::new(edges))
}

/// Ranks again the `priority: auto` jobs at or above `changed`, as
/// `sqlite::dependencies::rerank_above` does, their rows updated in id order.
pub(super) async fn rerank_above(
    tx: &Tx<'_>,
    namespace: &str,
    changed: &BTreeSet<String>,
) -> PgResult<()> {
    if changed.is_empty() {
        return Ok(());
    }
    let stmt = tx
        .prepare_cached("SELECT name FROM jobs WHERE namespace = $1 AND priority_auto ORDER BY id")
        .await?;
    let autos: Vec<String> = tx
        .query(&stmt, &[&namespace])
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    if autos.is_empty() {
        return Ok(());
    }
    let graph = graph(tx, namespace).await?;
    let above = graph.at_or_above(changed);
    let stmt = tx
        .prepare_cached("UPDATE jobs SET priority = $3 WHERE namespace = $1 AND name = $2")
        .await?;
    for name in autos.iter().filter(|name| above.contains(*name)) {
        tx.execute(&stmt, &[&namespace, name, &graph.rank(name)])
            .await?;
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
        .map(edge)
        .collect()
}

/// The edge a `SELECT job, upstream` row names.
fn edge(row: &tokio_postgres::Row) -> PgResult<DependencyEdge> {
    Ok(DependencyEdge {
        job: row.try_get(0)?,
        upstream: row.try_get(1)?,
    })
}

/// Up to `limit` edges of `namespace`, by upstream then dependant (the primary key's order).
pub(super) async fn namespace_edges(
    tx: &Tx<'_>,
    namespace: &str,
    limit: u32,
) -> PgResult<Vec<DependencyEdge>> {
    let stmt = tx
        .prepare_cached(
            "SELECT job, upstream FROM job_dependencies WHERE namespace = $1 \
             ORDER BY upstream, job LIMIT $2",
        )
        .await?;
    tx.query(&stmt, &[&namespace, &i64::from(limit)])
        .await?
        .iter()
        .map(edge)
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

/// The verdict on a run at `instant` of a job of `namespace` whose definition is `spec`
/// ([`judge_all`] for one run).
pub(super) async fn judge(
    tx: &Tx<'_>,
    namespace: &str,
    spec: &JobSpec,
    instant: Instant,
) -> PgResult<Verdict> {
    judge_all(tx, &[(namespace, spec, instant)])
        .await?
        .pop()
        .ok_or_else(|| StoreError::Database("a run was judged without a verdict".into()).into())
}

/// The verdicts on runs, each given by its job's namespace and definition and its instant, in
/// their order. What every upstream of every run did in its window is read in one statement
/// (two when some wait for events), however many runs and upstreams: a level of a graph that
/// is released together costs the same round trips as one run. Each verdict is then core's
/// pure rule.
pub(super) async fn judge_all(
    tx: &Tx<'_>,
    runs: &[(&str, &JobSpec, Instant)],
) -> PgResult<Vec<Verdict>> {
    // Every requirement of every run, by its place in `slots`: (run, requirement).
    let mut slots: Vec<(usize, usize)> = Vec::new();
    let mut found: Vec<Vec<WindowRuns>> = Vec::with_capacity(runs.len());
    let mut ends: Vec<Vec<i64>> = Vec::with_capacity(runs.len());
    // Job windows and event windows, each with its slot.
    let (mut jobs, mut keys) = (WindowColumns::default(), WindowColumns::default());
    for (run, &(namespace, spec, instant)) in runs.iter().enumerate() {
        let requirements: Vec<_> = dependency::requirements(&spec.depends_on).collect();
        found.push(vec![WindowRuns::default(); requirements.len()]);
        let mut run_ends = Vec::with_capacity(requirements.len());
        for (place, requirement) in requirements.iter().enumerate() {
            let (from, to) = requirement.window.around(instant);
            run_ends.push(micros(to));
            let k = slots.len() as i64;
            slots.push((run, place));
            match requirement.upstream {
                Upstream::Job(job) => jobs.push(namespace, job, (from, to), k),
                Upstream::Event(key) => keys.push(namespace, key, (from, to), k),
            }
        }
        ends.push(run_ends);
    }
    // The window a row's slot names.
    fn window<'a>(
        found: &'a mut [Vec<WindowRuns>],
        slots: &[(usize, usize)],
        k: i64,
    ) -> Option<&'a mut WindowRuns> {
        let &(run, place) = slots.get(usize::try_from(k).ok()?)?;
        found.get_mut(run)?.get_mut(place)
    }
    if !jobs.slots.is_empty() {
        // Runs found by name, so those of a job deleted and created again count.
        let stmt = tx
            .prepare_cached(
                // Each instant first, all its shards together (`shared::InstantShards`): it
                // succeeded when every shard did, ended when every shard did.
                "SELECT q.k, coalesce(bool_or(i.succeeded), false), \
                        coalesce(bool_or(i.ended), false), \
                        coalesce(bool_or(i.active), false), \
                        min(i.first_unsucceeded) FILTER (WHERE NOT i.active), \
                        max(i.scheduled_for), \
                        (SELECT next_fire_at FROM jobs j WHERE j.namespace = q.ns \
                             AND j.name = q.job) \
                 FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[]) \
                     AS q(ns, job, lo, hi, k) \
                 LEFT JOIN LATERAL ( \
                     SELECT r.scheduled_for, bool_and(r.state = 'succeeded') AS succeeded, \
                         bool_and(r.state NOT IN ('waiting', 'queued', 'running')) AS ended, \
                         bool_or(r.state IN ('waiting', 'queued', 'running')) AS active, \
                         min(lpad(r.id::text, 20, '0') || ' ' || r.state) FILTER (WHERE r.state \
                             NOT IN ('waiting', 'queued', 'running', 'succeeded')) \
                             AS first_unsucceeded \
                     FROM runs r WHERE r.namespace = q.ns AND r.job = q.job COLLATE \"C\" \
                         AND r.scheduled_for >= q.lo AND r.scheduled_for <= q.hi \
                     GROUP BY r.scheduled_for) i ON true \
                 GROUP BY q.k, q.ns, q.job",
            )
            .await?;
        for row in tx.query(&stmt, &jobs.params()).await? {
            let Some(runs) = window(&mut found, &slots, row.try_get(0)?) else {
                continue;
            };
            *runs = WindowRuns {
                succeeded: row.try_get(1)?,
                ended: row.try_get(2)?,
                active: row.try_get(3)?,
                ended_unsucceeded: first_ended(row.try_get(4)?)?,
                latest: row.try_get(5)?,
                next_fire_at: row.try_get(6)?,
            };
        }
    }
    if !keys.slots.is_empty() {
        // An event in the window is an upstream that succeeded; one may come at any time.
        let stmt = tx
            .prepare_cached(
                "SELECT q.k FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], \
                     $5::bigint[]) AS q(ns, key, lo, hi, k) \
                 WHERE EXISTS (SELECT 1 FROM events e WHERE e.namespace = q.ns \
                     AND e.key = q.key COLLATE \"C\" AND e.occurred_at >= q.lo \
                     AND e.occurred_at <= q.hi)",
            )
            .await?;
        for row in tx.query(&stmt, &keys.params()).await? {
            if let Some(runs) = window(&mut found, &slots, row.try_get(0)?) {
                runs.succeeded = true;
                runs.ended = true;
            }
        }
    }
    Ok(runs
        .iter()
        .zip(found.iter().zip(&ends))
        .map(|(&(_, spec, instant), (found, ends))| verdict_from(spec, instant, found, ends))
        .collect())
}

/// The windows [`judge_all`] reads of one kind (upstream jobs, or event keys), as the columns
/// of its statement: namespace, name, instants from and to, and the window's slot.
#[derive(Default)]
struct WindowColumns<'a> {
    namespaces: Vec<&'a str>,
    names: Vec<&'a str>,
    from: Vec<i64>,
    to: Vec<i64>,
    slots: Vec<i64>,
}

impl<'a> WindowColumns<'a> {
    fn push(&mut self, namespace: &'a str, name: &'a str, (from, to): (Instant, Instant), k: i64) {
        self.namespaces.push(namespace);
        self.names.push(name);
        self.from.push(micros(from));
        self.to.push(micros(to));
        self.slots.push(k);
    }

    /// `$1` to `$5` of the statement.
    fn params(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.namespaces,
            &self.names,
            &self.from,
            &self.to,
            &self.slots,
        ]
    }
}

/// A job that depends on a job whose run just ended, or on an event just recorded.
struct Dependant {
    id: i64,
    name: String,
    spec: JobSpec,
    priority: i32,
}

fn dependant(row: &Row) -> PgResult<Dependant> {
    Ok(Dependant {
        id: row.try_get(0)?,
        name: row.try_get(1)?,
        spec: rows::spec(row.try_get(2)?)?,
        priority: row.try_get(3)?,
    })
}

/// The jobs depending on each of `upstreams` (namespace, job), by upstream, their rows locked
/// (the caller locked them already in the common case; a job further down a cascade, or a
/// dependant added since, is locked here). One statement for a whole generation of ended runs:
/// most jobs have no dependants, and asking job by job would cost a round trip each.
async fn dependant_jobs(
    tx: &Tx<'_>,
    upstreams: &[(String, String)],
) -> PgResult<HashMap<(String, String), Vec<Arc<Dependant>>>> {
    let mut found: HashMap<(String, String), Vec<Arc<Dependant>>> = HashMap::new();
    if upstreams.is_empty() {
        return Ok(found);
    }
    let (namespaces, jobs): (Vec<&str>, Vec<&str>) = upstreams
        .iter()
        .map(|(namespace, job)| (namespace.as_str(), job.as_str()))
        .unzip();
    let stmt = tx
        .prepare_cached(
            "SELECT j.id, j.name, j.spec, j.priority, e.namespace, e.upstream \
             FROM job_dependencies e JOIN jobs j ON j.namespace = e.namespace AND j.name = e.job \
             WHERE (e.namespace, e.upstream) IN \
                 (SELECT * FROM unnest($1::text[], $2::text[])) \
             ORDER BY j.id FOR UPDATE OF j",
        )
        .await?;
    for row in tx.query(&stmt, &[&namespaces, &jobs]).await? {
        let upstream = (row.try_get(4)?, row.try_get(5)?);
        found
            .entry(upstream)
            .or_default()
            .push(Arc::new(dependant(&row)?));
    }
    Ok(found)
}

const SUBSCRIBERS: &str = "SELECT j.id, j.name, j.spec, j.priority, \
     bool_or(s.role = 'schedule') FROM jobs j JOIN event_subscriptions s \
     ON s.namespace = j.namespace AND s.job = j.name \
     WHERE s.namespace = $1 AND s.key = $2 GROUP BY j.id ORDER BY j.id";

/// Locks the jobs event key `key` concerns, in id order, before anything else of an event's
/// transaction: a fire of one of them and the event are serialised.
pub(super) async fn lock_subscribers(tx: &Tx<'_>, namespace: &str, key: &str) -> PgResult<()> {
    let stmt = tx
        .prepare_cached(
            "SELECT j.id FROM jobs j WHERE (j.namespace, j.name) IN (SELECT namespace, job \
             FROM event_subscriptions WHERE namespace = $1 AND key = $2) \
             ORDER BY j.id FOR UPDATE",
        )
        .await?;
    tx.execute(&stmt, &[&namespace, &key]).await?;
    Ok(())
}

/// The jobs an event key concerns, locked: with whether it starts them (`schedule: {event}`)
/// — otherwise they wait for it in their `depends_on`.
async fn subscribers(tx: &Tx<'_>, namespace: &str, key: &str) -> PgResult<Vec<(bool, Dependant)>> {
    lock_subscribers(tx, namespace, key).await?;
    let stmt = tx.prepare_cached(SUBSCRIBERS).await?;
    tx.query(&stmt, &[&namespace, &key])
        .await?
        .iter()
        .map(|row| Ok((row.try_get(4)?, dependant(row)?)))
        .collect()
}

/// Waiting runs to judge, by id: the dependant and the run's instant and namespace.
type Candidates = BTreeMap<i64, (Arc<Dependant>, Instant, String)>;

/// Where to look for a dependant's waiting runs: the job, its namespace and the instants.
type Window = (Arc<Dependant>, String, (Instant, Instant));

/// Adds the runs waiting for their dependencies in each window (of its dependant's, at an
/// instant in it), locked in id order; one statement for them all.
async fn add_waiting(tx: &Tx<'_>, windows: &[Window], candidates: &mut Candidates) -> PgResult<()> {
    if windows.is_empty() {
        return Ok(());
    }
    let mut job_ids = Vec::with_capacity(windows.len());
    let (mut froms, mut tos) = (
        Vec::with_capacity(windows.len()),
        Vec::with_capacity(windows.len()),
    );
    for (dependant, _, (from, to)) in windows {
        job_ids.push(dependant.id);
        froms.push(micros(*from));
        tos.push(micros(*to));
    }
    let stmt = tx
        .prepare_cached(
            "SELECT r.id, r.scheduled_for, w.k FROM runs r \
             JOIN unnest($1::bigint[], $2::bigint[], $3::bigint[]) WITH ORDINALITY \
                 AS w(job_id, lo, hi, k) \
                 ON r.job_id = w.job_id AND r.scheduled_for >= w.lo AND r.scheduled_for <= w.hi \
             WHERE r.state = 'waiting' AND r.waiting_reason = 'dependencies' \
             ORDER BY r.id FOR UPDATE OF r",
        )
        .await?;
    for row in tx.query(&stmt, &[&job_ids, &froms, &tos]).await? {
        let k = usize::try_from(row.try_get::<_, i64>(2)? - 1).ok();
        let Some((dependant, namespace, _)) = k.and_then(|k| windows.get(k)) else {
            continue;
        };
        candidates.entry(row.try_get(0)?).or_insert((
            dependant.clone(),
            rows::instant(row.try_get(1)?)?,
            namespace.clone(),
        ));
    }
    Ok(())
}

/// Moves the dependants of the runs in `ended` and of the events in `events`, and of every
/// run that ends because of them, as `sqlite::dependencies::settle` does: what happens
/// together is settled together, each waiting run judged once after all of it.
pub(super) async fn settle(
    tx: &Tx<'_>,
    ended: Vec<Ended>,
    events: Vec<EventRecord>,
    now: Instant,
) -> PgResult<Settled> {
    settle_admitting(tx, ended, events, None, now).await
}

/// [`settle`], the runs the events start admitted against `backlog` (the server's queue), as
/// `sqlite::dependencies::settle_admitting` does.
pub(super) async fn settle_admitting(
    tx: &Tx<'_>,
    ended: Vec<Ended>,
    events: Vec<EventRecord>,
    backlog: Option<&dyn crate::BacklogSource>,
    now: Instant,
) -> PgResult<Settled> {
    let mut admission = EventAdmission::new(backlog);
    let mut settled = Settled::default();
    let mut generation = ended;
    let mut events = events;
    while !generation.is_empty() || !events.is_empty() {
        super::notifications::record_ended(tx, &generation, now).await?;
        let mut next = Vec::new();
        let upstreams: Vec<(String, String)> = generation
            .iter()
            .map(|run| (run.namespace.clone(), run.job.clone()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let dependants = dependant_jobs(tx, &upstreams).await?;
        // What the generation's runs start and where their dependants' runs wait, gathered
        // first and written and read in one statement each.
        let mut starts: Vec<(At, &Dependant)> = Vec::new();
        let mut windows: Vec<Window> = Vec::new();
        for run in &generation {
            let key = (run.namespace.clone(), run.job.clone());
            for dependant in dependants.get(&key).into_iter().flatten() {
                let Some(window) = dependency::dependant_instants(
                    &dependant.spec.depends_on,
                    Upstream::Job(&run.job),
                    run.scheduled_for,
                ) else {
                    continue;
                };
                if dependant.spec.follows_upstreams() {
                    let at = At {
                        namespace: &run.namespace,
                        instant: run.scheduled_for,
                        trigger: Trigger::Dependency,
                        event: None,
                        skip: None,
                        upstream: Some(run.run_id),
                    };
                    starts.push((at, dependant));
                }
                windows.push((dependant.clone(), run.namespace.clone(), window));
            }
        }
        let starts: Vec<(&At, &Dependant)> = starts.iter().map(|(at, d)| (at, *d)).collect();
        start_all(tx, &starts, now, &mut next).await?;
        let mut candidates = Candidates::new();
        for event in std::mem::take(&mut events) {
            for (starts, dependant) in subscribers(tx, &event.namespace, &event.key).await? {
                let dependant = Arc::new(dependant);
                if starts {
                    let keys = match super::triggers::event_went(
                        tx,
                        &event,
                        dependant.id,
                        &dependant.name,
                        &dependant.spec,
                        now,
                    )
                    .await?
                    {
                        Ok((went, queued)) => {
                            // An absorbed run's `ready_at` moved: the dispatcher reads it again.
                            if queued && went.outcome == crate::FlowOutcome::Absorbed {
                                settled.queued.push(went.run_id);
                            }
                            settled.flowed.push(went);
                            None
                        }
                        Err(keys) => Some(keys),
                    };
                    if let Some(keys) = keys {
                        let skip = admission.decide(dependant.id, &event.namespace);
                        let (runs, instant) =
                            start_by_event(tx, &event, &dependant, skip, now, &mut next).await?;
                        if skip.is_none() {
                            if let Some(&first) = runs.first() {
                                super::triggers::after_event_start(
                                    tx,
                                    dependant.id,
                                    first,
                                    &keys,
                                    now,
                                )
                                .await?;
                            }
                        }
                        settled.started.extend(&runs);
                        if !dependant.spec.paused && skip.is_none() {
                            for run_id in runs {
                                let judged = (dependant.clone(), instant, event.namespace.clone());
                                candidates.insert(run_id, judged);
                            }
                        }
                    }
                }
                if let Some(window) = dependency::dependant_instants(
                    &dependant.spec.depends_on,
                    Upstream::Event(&event.key),
                    event.occurred_at,
                ) {
                    windows.push((dependant.clone(), event.namespace.clone(), window));
                }
            }
        }
        add_waiting(tx, &windows, &mut candidates).await?;
        judge_candidates(tx, candidates, now, &mut settled, &mut next).await?;
        generation = next;
    }
    Ok(settled)
}

/// Judges the waiting runs of a generation together and moves each by its verdict: the
/// released and the still waiting ones of all jobs in a statement each, as are those skipped
/// because an upstream failed; only a release under an overlap policy other than `allow`
/// counts its job's active runs first, run by run in id order.
async fn judge_candidates(
    tx: &Tx<'_>,
    candidates: Candidates,
    now: Instant,
    settled: &mut Settled,
    next: &mut Vec<Ended>,
) -> PgResult<()> {
    let judged: Vec<(&str, &JobSpec, Instant)> = candidates
        .values()
        .map(|(dependant, instant, namespace)| (namespace.as_str(), &dependant.spec, *instant))
        .collect();
    let verdicts = judge_all(tx, &judged).await?;
    let (mut queued, mut waiting, mut missing) = (Vec::new(), Vec::new(), Vec::new());
    let (mut failed, mut why_failed) = (Vec::new(), Vec::new());
    let mut by_overlap = Vec::new();
    for ((&run_id, (dependant, instant, namespace)), verdict) in candidates.iter().zip(verdicts) {
        match verdict {
            Verdict::Ready if dependant.spec.overlap == OverlapPolicy::Allow => queued.push(run_id),
            Verdict::Ready => by_overlap.push((run_id, dependant, *instant, namespace)),
            Verdict::Waiting(unmet) => {
                waiting.push(run_id);
                missing.push(crate::shared::to_json("unmet dependencies", &unmet)?);
            }
            Verdict::UpstreamFailed(why) => {
                failed.push(run_id);
                why_failed.push(why);
                next.push(Ended {
                    namespace: namespace.clone(),
                    job: dependant.name.clone(),
                    scheduled_for: *instant,
                    run_id,
                    state: RunState::Skipped,
                });
            }
        }
    }
    if !queued.is_empty() {
        let stmt = tx
            .prepare_cached(
                "UPDATE runs SET state = 'queued', waiting_reason = NULL, waiting_for = NULL, \
                 waiting_until = NULL, ready_at = greatest(ready_at, $2) WHERE id = ANY($1)",
            )
            .await?;
        tx.execute(&stmt, &[&queued, &micros(now)]).await?;
        settled.queued.extend(&queued);
    }
    if !waiting.is_empty() {
        let stmt = tx
            .prepare_cached(
                "UPDATE runs SET waiting_for = u.missing \
                 FROM unnest($1::bigint[], $2::text[]) AS u(id, missing) WHERE runs.id = u.id",
            )
            .await?;
        tx.execute(&stmt, &[&waiting, &missing]).await?;
    }
    if !failed.is_empty() {
        let whys: Vec<&str> = why_failed.iter().map(String::as_str).collect();
        skip_runs(tx, &failed, &whys, SkipReason::UpstreamFailed, now).await?;
    }
    for (run_id, dependant, instant, namespace) in by_overlap {
        release(
            tx, run_id, dependant, instant, namespace, now, settled, next,
        )
        .await?;
    }
    Ok(())
}

/// Reopens the runs of `upstream`'s dependants skipped because it failed, now that it is
/// open again, as `sqlite::dependencies::reopen` does; their jobs are locked as they are
/// reached.
pub(super) async fn reopen(
    tx: &Tx<'_>,
    upstream: &RunRecord,
    now: Instant,
    settled: &mut Settled,
) -> PgResult<Vec<i64>> {
    let mut reopened = Vec::new();
    let mut ended = Vec::new();
    let mut generation = vec![(
        upstream.namespace.clone(),
        upstream.job.clone(),
        upstream.scheduled_for,
    )];
    while !generation.is_empty() {
        let mut next = Vec::new();
        // Skipped runs to judge, by id, with the deadline they reopen until.
        let mut candidates: BTreeMap<i64, (Arc<Dependant>, Instant, String, Instant)> =
            BTreeMap::new();
        let upstreams: Vec<(String, String)> = generation
            .iter()
            .map(|(namespace, job, _)| (namespace.clone(), job.clone()))
            .collect();
        let dependants = dependant_jobs(tx, &upstreams).await?;
        for (namespace, job, instant) in &generation {
            let key = (namespace.clone(), job.clone());
            for dependant in dependants.get(&key).into_iter().flatten() {
                let Some((from, to)) = dependency::dependant_instants(
                    &dependant.spec.depends_on,
                    Upstream::Job(job),
                    *instant,
                ) else {
                    continue;
                };
                let stmt = tx
                    .prepare_cached(
                        "SELECT id, scheduled_for, created_at FROM runs WHERE job_id = $1 \
                         AND state = 'skipped' AND skip_reason = 'upstream_failed' \
                         AND scheduled_for >= $2 AND scheduled_for <= $3 ORDER BY id FOR UPDATE",
                    )
                    .await?;
                let skipped = tx
                    .query(&stmt, &[&dependant.id, &micros(from), &micros(to)])
                    .await?;
                for row in skipped {
                    let timeout = dependant.spec.deps_timeout();
                    let recorded = rows::instant(row.try_get(2)?)?;
                    if let Some(deadline) = dependency::reopen_deadline(recorded, timeout, now) {
                        let at = rows::instant(row.try_get(1)?)?;
                        let judged = (dependant.clone(), at, namespace.clone(), deadline);
                        candidates.insert(row.try_get(0)?, judged);
                    }
                }
            }
        }
        for (run_id, (dependant, instant, namespace, deadline)) in candidates {
            let verdict = judge(tx, &namespace, &dependant.spec, instant).await?;
            let missing = match &verdict {
                Verdict::UpstreamFailed(_) => continue,
                Verdict::Waiting(missing) => missing.clone(),
                Verdict::Ready => Vec::new(),
            };
            let stmt = tx
                .prepare_cached(&crate::shared::reopen_run_sql('$'))
                .await?;
            let missing = crate::shared::to_json("unmet dependencies", &missing)?;
            tx.execute(
                &stmt,
                &[
                    &run_id,
                    &RunState::Waiting.as_str(),
                    &micros(now),
                    &"dependencies",
                    &missing,
                    &micros(deadline),
                ],
            )
            .await?;
            reopened.push(run_id);
            if verdict == Verdict::Ready {
                release(
                    tx, run_id, &dependant, instant, &namespace, now, settled, &mut ended,
                )
                .await?;
            }
            next.push((namespace, dependant.name.clone(), instant));
        }
        generation = next;
    }
    let more = settle(tx, ended, Vec::new(), now).await?;
    settled.queued.extend(more.queued);
    settled.cancel_requested.extend(more.cancel_requested);
    Ok(reopened)
}

/// Where and why a run is started by what happened (`sqlite::dependencies`).
struct At<'a> {
    namespace: &'a str,
    instant: Instant,
    trigger: Trigger,
    event: Option<&'a EventRecord>,
    /// Recorded skipped for this reason (admission's `backlog`) instead of waiting.
    skip: Option<SkipReason>,
    /// The upstream run whose end made it, at its instant: the run joins that run's trace, as
    /// a child of its root (`sked_core::trace::Joined`: the upstream's trace origin, kept when
    /// it joined one itself, and `r:<its id>`).
    upstream: Option<i64>,
}

/// Records the dependant's run `at` (one per shard of a sharded job), once, waiting for its
/// dependencies (the caller judges it next); a paused job's run, or one admission refused
/// (`at.skip`), is recorded skipped. Returns the new runs, none when the instant was recorded
/// already ([`start_all`] for one).
async fn start(
    tx: &Tx<'_>,
    at: &At<'_>,
    dependant: &Dependant,
    now: Instant,
    ended: &mut Vec<Ended>,
) -> PgResult<Vec<i64>> {
    Ok(start_all(tx, &[(at, dependant)], now, ended)
        .await?
        .pop()
        .unwrap_or_default())
}

/// [`start`] for each of `starts`, in one statement: the new runs of each, in its order. Two
/// starts of one job at one instant record it once, for the first.
async fn start_all(
    tx: &Tx<'_>,
    starts: &[(&At<'_>, &Dependant)],
    now: Instant,
    ended: &mut Vec<Ended>,
) -> PgResult<Vec<Vec<i64>>> {
    let mut written: Vec<Vec<i64>> = vec![Vec::new(); starts.len()];
    if starts.is_empty() {
        return Ok(written);
    }
    // One row per shard of each start.
    let mut columns = StartRows::default();
    let mut skipped = Vec::with_capacity(starts.len());
    for (at, dependant) in starts {
        let crate::shared::DependantStart {
            state,
            skip,
            waiting_reason,
        } = crate::shared::dependant_start(dependant.spec.paused, at.skip);
        skipped.push(skip.is_some().then_some(state));
        let (waiting_for, until) = crate::shared::waiting_columns(&dependant.spec, &[], now)?;
        let places = super::ledger::placements_of(tx, &dependant.spec, at.namespace).await?;
        // At most `sked_core::shard::MAX_SHARDS`.
        let count = i32::try_from(places.len()).unwrap_or(i32::MAX);
        for (shard, worker) in places.into_iter().enumerate() {
            columns.job_ids.push(dependant.id);
            columns.namespaces.push(at.namespace);
            columns.jobs.push(dependant.name.as_str());
            columns.instants.push(micros(at.instant));
            columns.triggers.push(at.trigger.as_str());
            columns.states.push(state.as_str());
            columns.skip_reasons.push(skip.map(SkipReason::as_str));
            columns.priorities.push(dependant.priority);
            columns.finished.push(skip.is_some().then(|| micros(now)));
            columns.waiting_reasons.push(waiting_reason);
            columns
                .waiting_for
                .push(waiting_reason.map(|_| waiting_for.clone()));
            columns.waiting_until.push(waiting_reason.map(|_| until));
            columns.event_keys.push(at.event.map(|e| e.key.as_str()));
            columns.event_ids.push(at.event.map(|e| e.id.as_str()));
            columns
                .shards
                .push(i32::try_from(shard).unwrap_or(i32::MAX));
            columns.shard_counts.push(count);
            columns.workers.push(worker);
            columns.upstreams.push(at.upstream);
            columns
                .event_traces
                .push(at.event.and_then(|e| e.trace_parent.as_deref()));
        }
    }
    let insert = format!(
        "INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, \
         skip_reason, priority, ready_at, created_at, finished_at, waiting_reason, \
         waiting_for, waiting_until, event_key, event_id, job_version, shard, shard_count, \
         pinned_worker, trace_parent) \
         SELECT p.job_id, p.namespace, p.job, p.instant, p.trigger, p.state, p.skip_reason, \
                p.priority, p.instant, $20, p.finished_at, p.waiting_reason, p.waiting_for, \
                p.waiting_until, p.event_key, p.event_id, \
                (SELECT version FROM jobs WHERE id = p.job_id), p.shard, p.shard_count, \
                p.worker, \
                coalesce(p.event_trace, \
                         (SELECT {} FROM runs u WHERE u.id = p.upstream \
                              AND u.scheduled_for = p.instant)) \
         FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[], \
                     $6::text[], $7::text[], $8::int[], $9::bigint[], $10::text[], $11::text[], \
                     $12::bigint[], $13::text[], $14::text[], $15::int[], $16::int[], \
                     $17::text[], $18::bigint[], $19::text[]) \
             WITH ORDINALITY AS p(job_id, namespace, job, instant, trigger, state, skip_reason, \
                 priority, finished_at, waiting_reason, waiting_for, waiting_until, event_key, \
                 event_id, shard, shard_count, worker, upstream, event_trace, place) \
         ORDER BY p.place \
         ON CONFLICT (job_id, scheduled_for, shard) DO NOTHING \
         RETURNING id, job_id, scheduled_for",
        super::traces::JOINED_UNDER
    );
    let stmt = tx.prepare_cached(&insert).await?;
    let params: [&(dyn ToSql + Sync); 20] = [
        &columns.job_ids,
        &columns.namespaces,
        &columns.jobs,
        &columns.instants,
        &columns.triggers,
        &columns.states,
        &columns.skip_reasons,
        &columns.priorities,
        &columns.finished,
        &columns.waiting_reasons,
        &columns.waiting_for,
        &columns.waiting_until,
        &columns.event_keys,
        &columns.event_ids,
        &columns.shards,
        &columns.shard_counts,
        &columns.workers,
        &columns.upstreams,
        &columns.event_traces,
        &micros(now),
    ];
    let mut new_runs: HashMap<(i64, i64), Vec<i64>> = HashMap::new();
    for row in tx.query(&stmt, &params).await? {
        new_runs
            .entry((row.try_get(1)?, row.try_get(2)?))
            .or_default()
            .push(row.try_get(0)?);
    }
    for (((at, dependant), skipped), runs) in starts.iter().zip(skipped).zip(&mut written) {
        // The first start of a job's instant takes its runs; a second finds none left.
        let Some(mut new) = new_runs.remove(&(dependant.id, micros(at.instant))) else {
            continue;
        };
        new.sort_unstable();
        if let Some(state) = skipped {
            for &run_id in &new {
                ended.push(Ended {
                    namespace: at.namespace.to_string(),
                    job: dependant.name.clone(),
                    scheduled_for: at.instant,
                    run_id,
                    state,
                });
            }
        }
        *runs = new;
    }
    Ok(written)
}

/// The columns of the runs [`start_all`] records, one entry per shard.
#[derive(Default)]
struct StartRows<'a> {
    job_ids: Vec<i64>,
    namespaces: Vec<&'a str>,
    jobs: Vec<&'a str>,
    instants: Vec<i64>,
    triggers: Vec<&'static str>,
    states: Vec<&'static str>,
    skip_reasons: Vec<Option<&'static str>>,
    priorities: Vec<i32>,
    finished: Vec<Option<i64>>,
    waiting_reasons: Vec<Option<&'static str>>,
    waiting_for: Vec<Option<String>>,
    waiting_until: Vec<Option<i64>>,
    event_keys: Vec<Option<&'a str>>,
    event_ids: Vec<Option<&'a str>>,
    shards: Vec<i32>,
    shard_counts: Vec<i32>,
    workers: Vec<Option<String>>,
    upstreams: Vec<Option<i64>>,
    event_traces: Vec<Option<&'a str>>,
}

/// Records the run `event` starts of `dependant` at the first free instant from the event's,
/// as `sqlite::dependencies::start_by_event` does.
async fn start_by_event(
    tx: &Tx<'_>,
    event: &EventRecord,
    dependant: &Dependant,
    skip: Option<SkipReason>,
    now: Instant,
    ended: &mut Vec<Ended>,
) -> PgResult<(Vec<i64>, Instant)> {
    for instant in sked_core::event::run_instants(event.occurred_at) {
        let at = At {
            namespace: &event.namespace,
            instant,
            trigger: Trigger::Event,
            event: Some(event),
            skip,
            upstream: None,
        };
        let runs = start(tx, &at, dependant, now, ended).await?;
        if !runs.is_empty() {
            return Ok((runs, instant));
        }
    }
    Err(crate::shared::no_free_instant(event, &dependant.name).into())
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
        let admitted = admit_by_overlap(tx, dependant.id, instant, overlap, now, ended).await?;
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
            run_id,
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
    let mut whys = Vec::with_capacity(overdue.len());
    let mut ended = Vec::with_capacity(overdue.len());
    for row in overdue {
        let run_id: i64 = row.try_get(0)?;
        let waiting_for: Option<&str> = row.try_get(4)?;
        whys.push(timed_out_error(waiting_for)?);
        skipped.push(run_id);
        ended.push(Ended {
            namespace: row.try_get(1)?,
            job: row.try_get(2)?,
            scheduled_for: rows::instant(row.try_get(3)?)?,
            run_id,
            state: RunState::Skipped,
        });
    }
    let whys: Vec<&str> = whys.iter().map(String::as_str).collect();
    skip_runs(tx, &skipped, &whys, SkipReason::DependenciesTimedOut, now).await?;
    let settled = settle(tx, ended, Vec::new(), now).await?;
    Ok((skipped, settled))
}
