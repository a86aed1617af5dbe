//! Job definitions: create, replace, pause, delete, list, and the firing loop's view of them.

use super::rows::{self, micros, JOB_COLUMNS};
use super::{dependencies, events};
use crate::cursor::{self, page_size, Cursor};
use crate::shared::KEPT_VERSIONS;
use crate::{shared, DeletedJob, JobQuery, JobSort, Page, PutMode, PutOutcome, Result, StoreError};
use rusqlite::{params, Transaction};
use sked_core::dependency;
use sked_core::job::{JobSpec, JobState, Priority, ValidJob};
use sked_core::records::{JobRecord, JobVersion, ScheduledJob};
use sked_core::run::RunState;
use sked_core::schedule::ScheduleKind;
use sked_core::Instant;

pub fn get(tx: &Transaction<'_>, namespace: &str, name: &str) -> Result<Option<JobRecord>> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = ?1 AND name = ?2");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![namespace, name])?;
    rows.next()?.map(rows::job).transpose()
}

pub fn get_by_id(tx: &Transaction<'_>, id: i64) -> Result<Option<JobRecord>> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1");
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![id])?;
    rows.next()?.map(rows::job).transpose()
}

fn spec_json(spec: &JobSpec) -> Result<(String, String)> {
    let encode = |e: serde_json::Error| StoreError::Database(format!("cannot encode a job: {e}"));
    Ok((
        serde_json::to_string(spec).map_err(encode)?,
        serde_json::to_string(&spec.retry).map_err(encode)?,
    ))
}

pub fn put(
    tx: &Transaction<'_>,
    namespace: &str,
    job: &ValidJob,
    mode: PutMode,
    now: Instant,
) -> Result<(PutOutcome, JobRecord)> {
    let existing = get(tx, namespace, &job.name)?;
    if let Some(old) = &existing {
        if mode == PutMode::CreateOnly {
            return Err(StoreError::Conflict(format!(
                "job {:?} in namespace {namespace:?}",
                job.name
            )));
        }
        if old.spec == job.spec {
            return Ok((PutOutcome::Unchanged, old.clone()));
        }
    }
    super::namespaces::admit(tx, namespace, &job.spec.target, existing.is_none())?;
    dependencies::put_edges(tx, namespace, job)?;
    events::put_subscriptions(tx, namespace, job)?;
    let rank = match job.spec.priority {
        Priority::Fixed(n) => n,
        Priority::Auto => dependencies::graph(tx, namespace)?.rank(&job.name),
    };
    let has_dependencies = !job.spec.depends_on.is_empty();
    let firing = crate::shared::firing_after_put(existing.as_ref(), job, now)?;
    let (spec, retry) = spec_json(&job.spec)?;
    let description = job.spec.description.as_deref().unwrap_or("");
    let next = firing.next_fire_at.map(micros);
    let (notify, notify_late) = crate::shared::notify_columns(job.spec.notify.as_deref())?;
    let ping_grace = crate::shared::ping_grace(&job.spec);
    let id = match &existing {
        Some(old) => {
            tx.prepare_cached(
                "UPDATE jobs SET description = ?2, spec = ?3, overlap = ?4, priority = ?5, \
                 retry = ?6, state = ?7, next_fire_at = ?8, fired_count = ?9, \
                 schedule_epoch = ?10, updated_at = ?11, has_dependencies = ?12, emits = ?13, \
                 priority_auto = ?14, notify = ?15, notify_late = ?16, ping_grace = ?17, \
                 job_metrics = ?18, shards = ?19, broadcast = ?20, has_deadline = ?21, \
                 version = version + 1 WHERE id = ?1",
            )?
            .execute(params![
                old.id,
                description,
                spec,
                job.spec.overlap.as_str(),
                rank,
                retry,
                firing.state.as_str(),
                next,
                firing.fired_count as i64,
                micros(firing.schedule_epoch),
                micros(now),
                has_dependencies,
                job.spec.emits(),
                job.spec.priority.is_auto(),
                notify,
                notify_late,
                ping_grace,
                job.spec.job_metrics,
                sked_core::shard::count(&job.spec),
                job.spec.broadcast,
                job.spec.deadline.is_some(),
            ])?;
            old.id
        }
        None => {
            tx.prepare_cached(
                "INSERT INTO jobs (namespace, name, description, spec, overlap, priority, retry, \
                 state, next_fire_at, fired_count, schedule_epoch, created_at, updated_at, \
                 has_dependencies, emits, priority_auto, notify, notify_late, ping_grace, \
                 job_metrics, shards, broadcast, has_deadline) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?12, ?13, ?14, ?15, \
                 ?16, ?17, ?18, ?19, ?20, ?21, ?22)",
            )?
            .execute(params![
                namespace,
                job.name,
                description,
                spec,
                job.spec.overlap.as_str(),
                rank,
                retry,
                firing.state.as_str(),
                next,
                firing.fired_count as i64,
                micros(firing.schedule_epoch),
                micros(now),
                has_dependencies,
                job.spec.emits(),
                job.spec.priority.is_auto(),
                notify,
                notify_late,
                ping_grace,
                job.spec.job_metrics,
                sked_core::shard::count(&job.spec),
                job.spec.broadcast,
                job.spec.deadline.is_some(),
            ])?;
            tx.last_insert_rowid()
        }
    };
    // The jobs it waited for, and waits for now, have another number of jobs downstream.
    let mut changed = dependency::upstreams(&job.spec.depends_on);
    if let Some(old) = &existing {
        changed.extend(dependency::upstreams(&old.spec.depends_on));
    }
    dependencies::rerank_above(tx, namespace, &changed)?;
    keep_version(tx, id, &spec, now)?;
    let outcome = if existing.is_some() {
        PutOutcome::Updated
    } else {
        PutOutcome::Created
    };
    let record = get_by_id(tx, id)?
        .ok_or_else(|| StoreError::Database("a job vanished while it was written".into()))?;
    Ok((outcome, record))
}

/// Keeps the job's definition as written now under its current version, and forgets the
/// versions past the newest [`KEPT_VERSIONS`].
fn keep_version(tx: &Transaction<'_>, job_id: i64, spec: &str, now: Instant) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO job_versions (job_id, version, spec, created_at) \
         SELECT id, version, ?2, ?3 FROM jobs WHERE id = ?1",
    )?
    .execute(params![job_id, spec, micros(now)])?;
    tx.prepare_cached(
        "DELETE FROM job_versions WHERE job_id = ?1 \
         AND version <= (SELECT version FROM jobs WHERE id = ?1) - ?2",
    )?
    .execute(params![job_id, KEPT_VERSIONS])?;
    Ok(())
}

/// The kept definitions of a job, newest first; `None` when there is no such job.
pub fn versions(
    tx: &Transaction<'_>,
    namespace: &str,
    name: &str,
) -> Result<Option<Vec<JobVersion>>> {
    let Some(job) = get(tx, namespace, name)? else {
        return Ok(None);
    };
    let mut stmt = tx.prepare_cached(
        "SELECT version, spec, created_at FROM job_versions WHERE job_id = ?1 \
         ORDER BY version DESC",
    )?;
    let mut rows = stmt.query(params![job.id])?;
    let mut versions = Vec::new();
    while let Some(row) = rows.next()? {
        versions.push(JobVersion {
            version: row.get(0)?,
            spec: rows::spec(&row.get::<_, String>(1)?)?,
            created_at: rows::instant(row.get(2)?)?,
        });
    }
    Ok(Some(versions))
}

pub fn list(tx: &Transaction<'_>, query: &JobQuery) -> Result<Page<JobRecord>> {
    let limit = page_size(query.limit);
    let column = match query.sort {
        JobSort::Name => "name",
        JobSort::CreatedAt => "created_at",
        JobSort::UpdatedAt => "updated_at",
    };
    let (order, after) = if query.descending {
        ("DESC", "<")
    } else {
        ("ASC", ">")
    };
    let mut sql = format!(
        "SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = ?1 \
         AND (?2 IS NULL OR lower(name) LIKE ?2 ESCAPE '\\' \
              OR lower(description) LIKE ?2 ESCAPE '\\') \
         AND (?3 IS NULL OR state = ?3) \
         AND (?7 IS NULL OR schedule_kind = ?7) \
         AND (?8 IS NULL OR {LAST_RUN_STATE} = ?8) \
         AND (?9 IS NULL OR EXISTS (SELECT 1 FROM json_each(spec, '$.routing.labels') \
              WHERE key = ?9 AND value = ?10))",
        LAST_RUN_STATE = crate::shared::LAST_RUN_STATE
    );
    let mut key: Option<rusqlite::types::Value> = None;
    let mut after_id = 0i64;
    // The kind once more as a literal (one of a few fixed words, never the caller's text): a
    // plan made without the parameters' values still sees it and reads `jobs_by_kind`.
    if let Some(kind) = query.kind {
        sql.push_str(&format!(" AND schedule_kind = '{}'", kind.as_str()));
    }
    if let Some(raw) = &query.cursor {
        let cursor = Cursor::decode(raw)?;
        key = Some(match query.sort {
            JobSort::Name => cursor.text(raw)?.to_string().into(),
            JobSort::CreatedAt | JobSort::UpdatedAt => cursor.micros(raw)?.into(),
        });
        after_id = cursor.id;
        sql.push_str(&format!(" AND ({column}, id) {after} (?4, ?5)"));
    }
    sql.push_str(&format!(" ORDER BY {column} {order}, id {order} LIMIT ?6"));
    let pattern = query.search.as_ref().map(|s| {
        let escaped = s
            .to_lowercase()
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        format!("%{escaped}%")
    });
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![
        query.namespace,
        pattern,
        query.state.map(JobState::as_str),
        key,
        after_id,
        i64::from(limit) + 1,
        query.kind.map(ScheduleKind::as_str),
        query.last.map(RunState::as_str),
        query.label.as_ref().map(|(key, _)| key.as_str()),
        query.label.as_ref().map(|(_, value)| value.as_str()),
    ])?;
    let mut items = Vec::new();
    while let Some(row) = rows.next()? {
        items.push(rows::job(row)?);
    }
    Ok(cursor::page(items, limit, |job| {
        cursor::after_job(job, query.sort)
    }))
}

pub fn delete(
    tx: &Transaction<'_>,
    namespace: &str,
    name: &str,
    force: bool,
    now: Instant,
) -> Result<Option<DeletedJob>> {
    let Some(job) = get(tx, namespace, name)? else {
        return Ok(None);
    };
    let dependants = dependencies::dependants(tx, namespace, name)?;
    if !dependants.is_empty() && !force {
        return Err(StoreError::DependedOn {
            job: name.to_string(),
            dependants,
        });
    }
    let mut paused = Vec::with_capacity(dependants.len());
    for dependant in &dependants {
        paused.extend(set_paused(tx, namespace, dependant, true, now)?);
    }
    let mut ended = Vec::new();
    super::ledger::cancel_active(
        tx,
        job.id,
        "the job was deleted",
        true,
        None,
        now,
        &mut ended,
    )?;
    dependencies::remove_edges(tx, namespace, name)?;
    tx.prepare_cached("DELETE FROM jobs WHERE id = ?1")?
        .execute(params![job.id])?;
    dependencies::rerank_above(tx, namespace, &dependency::upstreams(&job.spec.depends_on))?;
    // Its dependants, paused now, learn that the runs they waited for will not come.
    events::remove_subscriptions(tx, namespace, name)?;
    let cancelled = ended.iter().map(|run| run.run_id).collect();
    dependencies::settle(tx, ended, Vec::new(), now)?;
    Ok(Some(DeletedJob {
        job,
        paused_dependants: paused,
        cancelled,
    }))
}

pub fn set_paused(
    tx: &Transaction<'_>,
    namespace: &str,
    name: &str,
    paused: bool,
    now: Instant,
) -> Result<Option<JobRecord>> {
    let Some(mut job) = get(tx, namespace, name)? else {
        return Ok(None);
    };
    if job.spec.paused == paused {
        return Ok(Some(job));
    }
    // `paused` is part of the definition: the change is a version of its own.
    job.spec.paused = paused;
    job.version += 1;
    if job.state != JobState::Completed {
        job.state = if paused {
            JobState::Paused
        } else {
            JobState::Active
        };
    }
    job.updated_at = now;
    let (spec, _) = spec_json(&job.spec)?;
    tx.prepare_cached(
        "UPDATE jobs SET spec = ?2, state = ?3, updated_at = ?4, version = ?5 WHERE id = ?1",
    )?
    .execute(params![
        job.id,
        spec,
        job.state.as_str(),
        micros(now),
        job.version
    ])?;
    keep_version(tx, job.id, &spec, now)?;
    Ok(Some(job))
}

/// A page of the jobs whose schedule owes an instant, by id after `after_id`: of `partitions`
/// when given.
pub fn scheduled(
    tx: &Transaction<'_>,
    partitions: Option<&[u32]>,
    after_id: i64,
    limit: u32,
) -> Result<Vec<ScheduledJob>> {
    // Partition numbers are integers, so they are written into the text (a load reads its
    // partitions in a few streams, so few distinct statements).
    let of_partitions = match partitions {
        None => String::new(),
        Some(partitions) => {
            let list: Vec<String> = partitions.iter().map(u32::to_string).collect();
            format!(
                " AND {} IN ({})",
                sked_core::cluster::PARTITION_SQL,
                list.join(", ")
            )
        }
    };
    let sql = format!(
        "SELECT id, spec, schedule_epoch, fired_count, next_fire_at, namespace FROM jobs \
         WHERE next_fire_at IS NOT NULL AND id > ?1{of_partitions} ORDER BY id LIMIT ?2"
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![after_id, limit])?;
    let mut jobs = Vec::new();
    while let Some(row) = rows.next()? {
        jobs.push(shared::scheduled_job(
            row.get(0)?,
            row.get(5)?,
            row.get_ref(1)?.as_str().map_err(rusqlite::Error::from)?,
            rows::instant(row.get(2)?)?,
            row.get::<_, i64>(3)? as u64,
            rows::instant(row.get(4)?)?,
        )?);
    }
    Ok(jobs)
}
