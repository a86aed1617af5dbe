//! Dependencies in the ledger: the edges between jobs kept beside their definitions, the
//! verdict on a run that waits for its upstreams (`sked_core::dependency`), and what follows
//! when a run ends — its dependants' runs created, released or skipped — inside the
//! transaction that ended it, so that no dependant misses its release.

use super::ledger::{admit_by_overlap, skip_run};
use super::rows::{self, micros};
use crate::shared::{
    timed_out_error, verdict_from, Ended, EventAdmission, Graph, InstantShards, Settled, WindowRuns,
};
use crate::{DependencyEdge, Result, Toward};
use rusqlite::{params, OptionalExtension, Transaction};
use sked_core::dependency::{self, Upstream, Verdict};
use sked_core::job::{JobSpec, ValidJob};
use sked_core::policy::OverlapPolicy;
use sked_core::records::{EventRecord, RunRecord};
use sked_core::run::{RunState, SkipReason, Trigger};
use sked_core::{Instant, SpecError};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;

/// Keeps the job's edges in step with its definition: every upstream must exist in the
/// namespace, and none may (transitively) wait for this job.
pub(super) fn put_edges(tx: &Transaction<'_>, namespace: &str, job: &ValidJob) -> Result<()> {
    let depends_on = &job.spec.depends_on;
    let upstreams = dependency::upstreams(depends_on);
    let mut exists = tx.prepare_cached("SELECT 1 FROM jobs WHERE namespace = ?1 AND name = ?2")?;
    for upstream in &upstreams {
        if !exists.exists(params![namespace, upstream])? {
            return Err(SpecError::new(
                dependency::field_naming(depends_on, upstream),
                format!("there is no job {upstream:?} in namespace {namespace:?}"),
            )
            .into());
        }
    }
    // A cycle through this job needs a job that waits for it; most writes (a graph created
    // upstream first) have none, and skip the walk up their ancestors.
    let cycle = if upstreams.is_empty() || dependants(tx, namespace, &job.name)?.is_empty() {
        None
    } else {
        let mut upstreams_of = tx.prepare_cached(
            "SELECT upstream FROM job_dependencies WHERE namespace = ?1 AND job = ?2",
        )?;
        dependency::find_cycle(&job.name, &upstreams, |name| {
            upstreams_of
                .query_map(params![namespace, name], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<BTreeSet<String>>>()
        })?
    };
    if let Some(cycle) = cycle {
        let first = cycle.get(1).map(String::as_str).unwrap_or_default();
        return Err(SpecError::new(
            dependency::field_naming(depends_on, first),
            format!(
                "a cycle of dependencies: {} (each waits for the next)",
                cycle.join(" -> ")
            ),
        )
        .into());
    }
    remove_edges(tx, namespace, &job.name)?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO job_dependencies (namespace, job, upstream) VALUES (?1, ?2, ?3)",
    )?;
    for upstream in &upstreams {
        insert.execute(params![namespace, job.name, upstream])?;
    }
    Ok(())
}

/// The namespace's dependency edges, for ranking `priority: auto` jobs.
pub(super) fn graph(tx: &Transaction<'_>, namespace: &str) -> Result<Graph> {
    let mut stmt =
        tx.prepare_cached("SELECT job, upstream FROM job_dependencies WHERE namespace = ?1")?;
    let edges = stmt.query_map(params![namespace], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(Graph::new(edges.collect::<rusqlite::Result<Vec<_>>>()?))
}

/// Ranks again the `priority: auto` jobs at or above `changed` (jobs whose downstream just
/// changed): each by the jobs downstream of it now. A namespace without such jobs costs one
/// read.
pub(super) fn rerank_above(
    tx: &Transaction<'_>,
    namespace: &str,
    changed: &BTreeSet<String>,
) -> Result<()> {
    if changed.is_empty() {
        return Ok(());
    }
    let autos: BTreeSet<String> = tx
        .prepare_cached("SELECT name FROM jobs WHERE namespace = ?1 AND priority_auto = 1")?
        .query_map(params![namespace], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if autos.is_empty() {
        return Ok(());
    }
    let graph = graph(tx, namespace)?;
    let mut update =
        tx.prepare_cached("UPDATE jobs SET priority = ?3 WHERE namespace = ?1 AND name = ?2")?;
    for name in graph.at_or_above(changed).intersection(&autos) {
        update.execute(params![namespace, name, graph.rank(name)])?;
    }
    Ok(())
}

/// The names of the jobs that depend on `upstream`.
pub(super) fn dependants(
    tx: &Transaction<'_>,
    namespace: &str,
    upstream: &str,
) -> Result<Vec<String>> {
    let mut stmt = tx.prepare_cached(
        "SELECT job FROM job_dependencies WHERE namespace = ?1 AND upstream = ?2 ORDER BY job",
    )?;
    let names = stmt.query_map(params![namespace, upstream], |r| r.get(0))?;
    Ok(names.collect::<rusqlite::Result<_>>()?)
}

/// The edges on the `toward` side of `jobs`, sorted.
pub(super) fn edges(
    tx: &Transaction<'_>,
    namespace: &str,
    jobs: &[String],
    toward: Toward,
) -> Result<Vec<DependencyEdge>> {
    let sql = match toward {
        Toward::Upstream => {
            "SELECT job, upstream FROM job_dependencies WHERE namespace = ?1 AND job = ?2"
        }
        Toward::Downstream => {
            "SELECT job, upstream FROM job_dependencies WHERE namespace = ?1 AND upstream = ?2"
        }
    };
    let mut stmt = tx.prepare_cached(sql)?;
    let mut edges = Vec::new();
    for name in jobs {
        let found = stmt.query_map(params![namespace, name], |r| {
            Ok(DependencyEdge {
                job: r.get(0)?,
                upstream: r.get(1)?,
            })
        })?;
        edges.extend(found.collect::<rusqlite::Result<Vec<_>>>()?);
    }
    edges.sort();
    edges.dedup();
    Ok(edges)
}

/// Up to `limit` edges of `namespace`, by upstream then dependant (the primary key's order).
pub(super) fn namespace_edges(
    tx: &Transaction<'_>,
    namespace: &str,
    limit: u32,
) -> Result<Vec<DependencyEdge>> {
    let mut stmt = tx.prepare_cached(
        "SELECT job, upstream FROM job_dependencies WHERE namespace = ?1 \
         ORDER BY upstream, job LIMIT ?2",
    )?;
    let found = stmt.query_map(params![namespace, limit], |r| {
        Ok(DependencyEdge {
            job: r.get(0)?,
            upstream: r.get(1)?,
        })
    })?;
    Ok(found.collect::<rusqlite::Result<Vec<_>>>()?)
}

#[async_trait::async_trait]
impl crate::GraphStore for super::SqliteStore {
    async fn namespace_edges(&self, namespace: &str, limit: u32) -> Result<Vec<DependencyEdge>> {
        let namespace = namespace.to_string();
        let limit = limit.min(crate::MAX_NAMESPACE_EDGES);
        self.read(move |tx| namespace_edges(tx, &namespace, limit))
            .await
    }
}

/// Forgets what a deleted job depended on (what depends on it stays, by name: a job created
/// again under that name is its dependants' upstream again).
pub(super) fn remove_edges(tx: &Transaction<'_>, namespace: &str, job: &str) -> Result<()> {
    tx.prepare_cached("DELETE FROM job_dependencies WHERE namespace = ?1 AND job = ?2")?
        .execute(params![namespace, job])?;
    Ok(())
}

/// The verdict on a run at `instant` of a job of `namespace` whose definition is `spec`. The
/// runs of every upstream's window are read in one statement: a fan-in judged at each of its
/// upstreams' ends must not cost a query per upstream each time. (Plain rows, aggregated
/// here: SQLite's aggregates over `IN` lists cost more than the rows.)
pub(super) fn judge(
    tx: &Transaction<'_>,
    namespace: &str,
    spec: &JobSpec,
    instant: Instant,
) -> Result<Verdict> {
    let requirements: Vec<_> = dependency::requirements(&spec.depends_on).collect();
    let mut ends = Vec::with_capacity(requirements.len());
    let mut terms = Vec::with_capacity(requirements.len());
    let mut values: Vec<rusqlite::types::Value> = vec![namespace.to_string().into()];
    for (k, requirement) in requirements.iter().enumerate() {
        let (from, to) = requirement.window.around(instant);
        ends.push(micros(to));
        let n = values.len();
        let (source, name) = match requirement.upstream {
            // Runs found by name, so those of a job deleted and created again count.
            Upstream::Job(job) => (
                "SELECT {k}, id, state, scheduled_for FROM runs WHERE namespace = ?1 \
                 AND job = ?{a} AND scheduled_for >= ?{b} AND scheduled_for <= ?{c}",
                job,
            ),
            // An event in the window is an upstream that succeeded.
            Upstream::Event(key) => (
                "SELECT {k}, id, 'succeeded', occurred_at FROM events WHERE namespace = ?1 \
                 AND key = ?{a} AND occurred_at >= ?{b} AND occurred_at <= ?{c}",
                key,
            ),
        };
        terms.push(
            source
                .replace("{k}", &k.to_string())
                .replace("{a}", &(n + 1).to_string())
                .replace("{b}", &(n + 2).to_string())
                .replace("{c}", &(n + 3).to_string()),
        );
        values.push(name.to_string().into());
        values.push(micros(from).into());
        values.push(micros(to).into());
    }
    let mut found: Vec<WindowRuns> = vec![WindowRuns::default(); requirements.len()];
    if !terms.is_empty() {
        // A sharded upstream's instant counts once, as all its shards together.
        let mut instants: BTreeMap<(usize, i64), InstantShards> = BTreeMap::new();
        let mut stmt = tx.prepare_cached(&terms.join(" UNION ALL "))?;
        let mut rows = stmt.query(rusqlite::params_from_iter(values))?;
        while let Some(row) = rows.next()? {
            let state = rows::run_state(&row.get::<_, String>(2)?)?;
            instants
                .entry((row.get(0)?, row.get(3)?))
                .or_default()
                .add(row.get(1)?, state);
        }
        for ((k, instant), shards) in instants {
            if let Some(window) = found.get_mut(k) {
                let (id, state) = shards.folded();
                window.add(id, state, instant);
            }
        }
    }
    let mut next_fire =
        tx.prepare_cached("SELECT next_fire_at FROM jobs WHERE namespace = ?1 AND name = ?2")?;
    for (window, requirement) in found.iter_mut().zip(&requirements) {
        // An event may come at any time: no schedule says whether one is owed.
        let Upstream::Job(job) = requirement.upstream else {
            continue;
        };
        if window.needs_next_fire(requirement.state) {
            window.next_fire_at = next_fire
                .query_row(params![namespace, job], |r| r.get(0))
                .optional()?
                .flatten();
        }
    }
    Ok(verdict_from(spec, instant, &found, &ends))
}

/// A job that depends on a job whose run just ended, or on an event just recorded.
struct Dependant {
    id: i64,
    name: String,
    spec: JobSpec,
    priority: i32,
}

fn dependant(row: &rusqlite::Row<'_>) -> Result<Dependant> {
    Ok(Dependant {
        id: row.get(0)?,
        name: row.get(1)?,
        spec: rows::spec(&row.get::<_, String>(2)?)?,
        priority: row.get(3)?,
    })
}

fn dependant_jobs(tx: &Transaction<'_>, namespace: &str, upstream: &str) -> Result<Vec<Dependant>> {
    let mut stmt = tx.prepare_cached(
        "SELECT j.id, j.name, j.spec, j.priority FROM job_dependencies e \
         JOIN jobs j ON j.namespace = e.namespace AND j.name = e.job \
         WHERE e.namespace = ?1 AND e.upstream = ?2",
    )?;
    let mut found = stmt.query(params![namespace, upstream])?;
    let mut jobs = Vec::new();
    while let Some(row) = found.next()? {
        jobs.push(dependant(row)?);
    }
    Ok(jobs)
}

/// The jobs an event key concerns: those it starts (`schedule: {event}`, true) and those
/// waiting for it in their `depends_on` (false).
fn subscribers(tx: &Transaction<'_>, namespace: &str, key: &str) -> Result<Vec<(bool, Dependant)>> {
    let mut stmt = tx.prepare_cached(
        "SELECT j.id, j.name, j.spec, j.priority, max(s.role = 'schedule') \
         FROM event_subscriptions s JOIN jobs j ON j.namespace = s.namespace AND j.name = s.job \
         WHERE s.namespace = ?1 AND s.key = ?2 GROUP BY j.id ORDER BY j.id",
    )?;
    let mut found = stmt.query(params![namespace, key])?;
    let mut jobs = Vec::new();
    while let Some(row) = found.next()? {
        jobs.push((row.get(4)?, dependant(row)?));
    }
    Ok(jobs)
}

/// Waiting runs to judge, by id: the dependant and the run's instant and namespace.
type Candidates = BTreeMap<i64, (Rc<Dependant>, Instant, String)>;

/// Adds the runs of `dependant` waiting for their dependencies at an instant in `[from, to]`.
fn add_waiting(
    tx: &Transaction<'_>,
    dependant: &Rc<Dependant>,
    namespace: &str,
    (from, to): (Instant, Instant),
    candidates: &mut Candidates,
) -> Result<()> {
    let mut stmt = tx.prepare_cached(
        "SELECT id, scheduled_for FROM runs WHERE job_id = ?1 AND state = 'waiting' \
         AND scheduled_for >= ?2 AND scheduled_for <= ?3 \
         AND waiting_reason = 'dependencies'",
    )?;
    let waiting = stmt.query_map(params![dependant.id, micros(from), micros(to)], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
    })?;
    for found in waiting {
        let (run_id, instant) = found?;
        candidates.entry(run_id).or_insert((
            dependant.clone(),
            rows::instant(instant)?,
            namespace.to_string(),
        ));
    }
    Ok(())
}

/// Moves the dependants of the runs in `ended` and of the events in `events` (just
/// recorded), and of every run that ends because of them (a skip cascades down a pipeline): a
/// job without a schedule gets its run at the upstream run's instant, a job whose schedule
/// names an event's key gets its run at the event's instant; every waiting run whose window
/// holds that instant is judged again, and is released (then subject to its job's overlap
/// policy), skipped (`upstream_failed`), or left waiting with what it still misses. What
/// happens together is settled together: each waiting run is judged once, after all of it,
/// so a fan-in whose upstreams end in one batch is judged once rather than once per upstream.
pub(super) fn settle(
    tx: &Transaction<'_>,
    ended: Vec<Ended>,
    events: Vec<EventRecord>,
    now: Instant,
) -> Result<Settled> {
    settle_admitting(tx, ended, events, None, now)
}

/// [`settle`], the runs the events start admitted against `backlog` (the server's queue): past
/// a cap, such a run is recorded skipped (`backlog`) and settled as ended.
pub(super) fn settle_admitting(
    tx: &Transaction<'_>,
    ended: Vec<Ended>,
    events: Vec<EventRecord>,
    backlog: Option<&dyn crate::BacklogSource>,
    now: Instant,
) -> Result<Settled> {
    let mut admission = EventAdmission::new(backlog);
    let mut settled = Settled::default();
    let mut generation = ended;
    let mut events = events;
    while !generation.is_empty() || !events.is_empty() {
        super::notifications::record_ended(tx, &generation, now)?;
        let mut next = Vec::new();
        let mut dependants: HashMap<(String, String), Vec<Rc<Dependant>>> = HashMap::new();
        let mut candidates = Candidates::new();
        for run in &generation {
            let key = (run.namespace.clone(), run.job.clone());
            if !dependants.contains_key(&key) {
                let found = dependant_jobs(tx, &run.namespace, &run.job)?;
                dependants.insert(key.clone(), found.into_iter().map(Rc::new).collect());
            }
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
                    start(tx, &at, dependant, now, &mut next)?;
                }
                add_waiting(tx, dependant, &run.namespace, window, &mut candidates)?;
            }
        }
        for event in std::mem::take(&mut events) {
            for (starts, dependant) in subscribers(tx, &event.namespace, &event.key)? {
                let dependant = Rc::new(dependant);
                if starts {
                    let keys = match super::triggers::event_went(
                        tx,
                        &event,
                        dependant.id,
                        &dependant.name,
                        &dependant.spec,
                        now,
                    )? {
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
                            start_by_event(tx, &event, &dependant, skip, now, &mut next)?;
                        if skip.is_none() {
                            if let Some(&first) = runs.first() {
                                super::triggers::after_event_start(
                                    tx,
                                    dependant.id,
                                    first,
                                    &keys,
                                    now,
                                )?;
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
                    add_waiting(tx, &dependant, &event.namespace, window, &mut candidates)?;
                }
            }
        }
        for (run_id, (dependant, instant, namespace)) in candidates {
            match judge(tx, &namespace, &dependant.spec, instant)? {
                Verdict::Ready => release(
                    tx,
                    run_id,
                    &dependant,
                    instant,
                    &namespace,
                    now,
                    &mut settled,
                    &mut next,
                )?,
                Verdict::Waiting(missing) => {
                    tx.prepare_cached("UPDATE runs SET waiting_for = ?2 WHERE id = ?1")?
                        .execute(params![
                            run_id,
                            crate::shared::to_json("unmet dependencies", &missing)?
                        ])?;
                }
                Verdict::UpstreamFailed(why) => {
                    skip_run(tx, run_id, SkipReason::UpstreamFailed, &why, now)?;
                    next.push(Ended {
                        namespace,
                        job: dependant.name.clone(),
                        scheduled_for: instant,
                        run_id,
                        state: RunState::Skipped,
                    });
                }
            }
        }
        generation = next;
    }
    Ok(settled)
}

/// A dependant's runs skipped because an upstream failed, with instants in a window. By
/// name as well as id, so the by-name index bounds the scan to this job's window: the ledger
/// key is in time order and would walk every job's runs in it.
const SKIPPED_FOR_UPSTREAMS: &str = "SELECT id, scheduled_for, created_at FROM runs \
     WHERE namespace = ?4 AND job = ?5 AND scheduled_for >= ?2 AND scheduled_for <= ?3 \
     AND job_id = ?1 AND state = 'skipped' AND skip_reason = 'upstream_failed'";

/// Reopens the runs of `upstream`'s dependants that were skipped because it failed
/// (`upstream_failed`) and whose window holds its instant, now that it is open again: each
/// waits for its dependencies while its `deps_timeout`, counted from when it was recorded,
/// lasts, and theirs in turn down a pipeline. A run one of whose other upstreams still failed
/// for good stays skipped. Returns the runs reopened; runs released at once go to `settled`.
pub(super) fn reopen(
    tx: &Transaction<'_>,
    upstream: &RunRecord,
    now: Instant,
    settled: &mut Settled,
) -> Result<Vec<i64>> {
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
        let mut candidates: BTreeMap<i64, (Rc<Dependant>, Instant, String, Instant)> =
            BTreeMap::new();
        for (namespace, job, instant) in &generation {
            for dependant in dependant_jobs(tx, namespace, job)? {
                let Some((from, to)) = dependency::dependant_instants(
                    &dependant.spec.depends_on,
                    Upstream::Job(job),
                    *instant,
                ) else {
                    continue;
                };
                let dependant = Rc::new(dependant);
                let mut stmt = tx.prepare_cached(SKIPPED_FOR_UPSTREAMS)?;
                let skipped = stmt.query_map(
                    params![
                        dependant.id,
                        micros(from),
                        micros(to),
                        namespace,
                        dependant.name
                    ],
                    |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, i64>(2)?,
                        ))
                    },
                )?;
                for found in skipped {
                    let (run_id, at, recorded) = found?;
                    let timeout = dependant.spec.deps_timeout();
                    if let Some(deadline) =
                        dependency::reopen_deadline(rows::instant(recorded)?, timeout, now)
                    {
                        let judged = (dependant.clone(), rows::instant(at)?, namespace.clone());
                        candidates.insert(run_id, (judged.0, judged.1, judged.2, deadline));
                    }
                }
            }
        }
        for (run_id, (dependant, instant, namespace, deadline)) in candidates {
            let verdict = judge(tx, &namespace, &dependant.spec, instant)?;
            let missing = match &verdict {
                Verdict::UpstreamFailed(_) => continue,
                Verdict::Waiting(missing) => missing.clone(),
                Verdict::Ready => Vec::new(),
            };
            tx.prepare_cached(&crate::shared::reopen_run_sql('?'))?
                .execute(params![
                    run_id,
                    RunState::Waiting.as_str(),
                    micros(now),
                    "dependencies",
                    crate::shared::to_json("unmet dependencies", &missing)?,
                    micros(deadline),
                ])?;
            reopened.push(run_id);
            if verdict == Verdict::Ready {
                release(
                    tx, run_id, &dependant, instant, &namespace, now, settled, &mut ended,
                )?;
            }
            next.push((namespace, dependant.name.clone(), instant));
        }
        generation = next;
    }
    let more = settle(tx, ended, Vec::new(), now)?;
    settled.queued.extend(more.queued);
    settled.cancel_requested.extend(more.cancel_requested);
    Ok(reopened)
}

/// Where and why a run is started by what happened: an upstream run's instant (a job without
/// a schedule following its upstreams) or an event's (a job whose schedule names its key).
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

/// Records the dependant's run `at` (one per shard of a sharded job), once: a second upstream
/// at the same instant finds it recorded. It waits for its dependencies (the caller judges it
/// next; with none, it is released at once); a paused job's run, or one admission refused
/// (`at.skip`), is recorded skipped. Returns the new runs, none when the instant was recorded
/// already.
fn start(
    tx: &Transaction<'_>,
    at: &At<'_>,
    dependant: &Dependant,
    now: Instant,
    ended: &mut Vec<Ended>,
) -> Result<Vec<i64>> {
    let crate::shared::DependantStart {
        state,
        skip,
        waiting_reason,
    } = crate::shared::dependant_start(dependant.spec.paused, at.skip);
    let skipped = skip.is_some();
    let (waiting_for, until) = crate::shared::waiting_columns(&dependant.spec, &[], now)?;
    let places = super::ledger::placements_of(tx, &dependant.spec, at.namespace)?;
    let count = places.len();
    let mut runs = Vec::new();
    let insert = format!(
        "INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, \
         skip_reason, priority, ready_at, created_at, finished_at, waiting_reason, \
         waiting_for, waiting_until, event_key, event_id, job_version, shard, \
         shard_count, pinned_worker, trace_parent) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?4, ?9, ?10, ?11, ?12, ?13, ?14, ?15, \
                 (SELECT version FROM jobs WHERE id = ?1), ?16, ?17, ?18, \
                 coalesce(?20, (SELECT {} FROM runs u WHERE u.id = ?19))) \
         ON CONFLICT (job_id, scheduled_for, shard) DO NOTHING",
        super::traces::JOINED_UNDER
    );
    for (shard, pinned) in places.into_iter().enumerate() {
        let written = tx.prepare_cached(&insert)?.execute(params![
            dependant.id,
            at.namespace,
            dependant.name,
            micros(at.instant),
            at.trigger.as_str(),
            state.as_str(),
            skip.map(SkipReason::as_str),
            dependant.priority,
            micros(now),
            skipped.then(|| micros(now)),
            waiting_reason,
            waiting_reason.map(|_| &waiting_for),
            waiting_reason.map(|_| until),
            at.event.map(|e| &e.key),
            at.event.map(|e| &e.id),
            shard,
            count,
            pinned,
            at.upstream,
            at.event.and_then(|e| e.trace_parent.as_deref()),
        ])?;
        if written == 0 {
            // Shard 0 recorded already: the instant is.
            break;
        }
        let run_id = tx.last_insert_rowid();
        runs.push(run_id);
        if skipped {
            ended.push(Ended {
                namespace: at.namespace.to_string(),
                job: dependant.name.clone(),
                scheduled_for: at.instant,
                run_id,
                state,
            });
        }
    }
    Ok(runs)
}

/// Records the run `event` starts of `dependant` (its shards, when sharded), at the event's
/// instant or the first free one after it (`event::run_instants`); returns them and their
/// instant. Never drops it: with no free instant the transaction fails, and the event with it.
fn start_by_event(
    tx: &Transaction<'_>,
    event: &EventRecord,
    dependant: &Dependant,
    skip: Option<SkipReason>,
    now: Instant,
    ended: &mut Vec<Ended>,
) -> Result<(Vec<i64>, Instant)> {
    for instant in sked_core::event::run_instants(event.occurred_at) {
        let at = At {
            namespace: &event.namespace,
            instant,
            trigger: Trigger::Event,
            event: Some(event),
            skip,
            upstream: None,
        };
        let runs = start(tx, &at, dependant, now, ended)?;
        if !runs.is_empty() {
            return Ok((runs, instant));
        }
    }
    Err(crate::shared::no_free_instant(event, &dependant.name))
}

/// A waiting run whose dependencies are met: now its job's overlap policy decides.
#[allow(clippy::too_many_arguments)]
fn release(
    tx: &Transaction<'_>,
    run_id: i64,
    dependant: &Dependant,
    instant: Instant,
    namespace: &str,
    now: Instant,
    settled: &mut Settled,
    ended: &mut Vec<Ended>,
) -> Result<()> {
    let overlap = dependant.spec.overlap;
    let (state, skip) = if overlap == OverlapPolicy::Allow {
        (RunState::Queued, None)
    } else {
        // The run still waits for its dependencies here, so the overlap count leaves it out.
        let admitted = admit_by_overlap(tx, dependant.id, instant, overlap, now, ended)?;
        settled.cancel_requested.extend(admitted.cancel_requested);
        (admitted.state, admitted.skip)
    };
    match state {
        RunState::Skipped => {
            let reason = skip.unwrap_or(SkipReason::Overlap);
            skip_run(
                tx,
                run_id,
                reason,
                "an earlier run of the job was still active",
                now,
            )?;
            ended.push(Ended {
                namespace: namespace.to_string(),
                job: dependant.name.clone(),
                scheduled_for: instant,
                run_id,
                state,
            });
        }
        _ => {
            let reason = (state == RunState::Waiting).then_some("overlap");
            tx.prepare_cached(
                "UPDATE runs SET state = ?2, waiting_reason = ?3, waiting_for = NULL, \
                 waiting_until = NULL, ready_at = max(ready_at, ?4) WHERE id = ?1",
            )?
            .execute(params![run_id, state.as_str(), reason, micros(now)])?;
            if state == RunState::Queued {
                settled.queued.push(run_id);
            }
        }
    }
    Ok(())
}

/// Skips the runs whose dependencies were not met within their job's `deps_timeout`, at most
/// `limit`, and settles their dependants. Returns the skipped runs and what settling did.
pub(super) fn expire_waits(
    tx: &Transaction<'_>,
    now: Instant,
    limit: u32,
) -> Result<(Vec<i64>, Settled)> {
    let overdue: Vec<(i64, String, String, i64, Option<String>)> = {
        let mut stmt = tx.prepare_cached(
            "SELECT id, namespace, job, scheduled_for, waiting_for FROM runs \
             WHERE state = 'waiting' AND waiting_reason = 'dependencies' AND waiting_until < ?1 \
             ORDER BY waiting_until LIMIT ?2",
        )?;
        let found = stmt.query_map(params![micros(now), limit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?;
        found.collect::<rusqlite::Result<_>>()?
    };
    let mut skipped = Vec::with_capacity(overdue.len());
    let mut ended = Vec::with_capacity(overdue.len());
    for (run_id, namespace, job, instant, waiting_for) in overdue {
        let why = timed_out_error(waiting_for.as_deref())?;
        skip_run(tx, run_id, SkipReason::DependenciesTimedOut, &why, now)?;
        skipped.push(run_id);
        ended.push(Ended {
            namespace,
            job,
            scheduled_for: rows::instant(instant)?,
            run_id,
            state: RunState::Skipped,
        });
    }
    let settled = settle(tx, ended, Vec::new(), now)?;
    Ok((skipped, settled))
}

#[cfg(test)]
mod tests {
    #[test]
    fn skipped_runs_are_found_through_the_by_name_index() {
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        let plan = super::super::query_plan(&conn, super::SKIPPED_FOR_UPSTREAMS).join("; ");
        assert!(plan.contains("INDEX runs_by_job_name"), "{plan}");
    }
}
