//! Job definitions: create, replace, pause, delete, list, and the firing loop's view of them.
//!
//! Every write locks the job's row first (`FOR UPDATE`); a create that finds no row inserts with
//! `ON CONFLICT DO NOTHING` and, when a concurrent create won, looks again.

use super::rows::{self, micros, JOB_COLUMNS};
use super::{PgResult, Tx};
use crate::cursor::{self, page_size, Cursor};
use crate::shared::KEPT_VERSIONS;
use crate::{shared, DeletedJob, JobQuery, JobSort, Page, PutMode, PutOutcome, StoreError};
use sked_core::dependency;
use sked_core::job::{JobSpec, JobState, Priority, ValidJob};
use sked_core::records::{JobRecord, JobVersion, ScheduledJob};
use sked_core::run::RunState;
use sked_core::schedule::ScheduleKind;
use sked_core::Instant;
use tokio_postgres::types::ToSql;

/// How often a create that lost a race to a concurrent one looks again.
const PUT_TRIES: usize = 3;

pub async fn get(tx: &Tx<'_>, namespace: &str, name: &str) -> PgResult<Option<JobRecord>> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = $1 AND name = $2");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query_opt(&stmt, &[&namespace, &name])
        .await?
        .as_ref()
        .map(rows::job)
        .transpose()
}

/// The job, its row locked until the transaction ends.
async fn get_for_update(tx: &Tx<'_>, namespace: &str, name: &str) -> PgResult<Option<JobRecord>> {
    let sql =
        format!("SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = $1 AND name = $2 FOR UPDATE");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query_opt(&stmt, &[&namespace, &name])
        .await?
        .as_ref()
        .map(rows::job)
        .transpose()
}

pub async fn get_by_id(tx: &Tx<'_>, id: i64) -> PgResult<Option<JobRecord>> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1");
    let stmt = tx.prepare_cached(&sql).await?;
    tx.query_opt(&stmt, &[&id])
        .await?
        .as_ref()
        .map(rows::job)
        .transpose()
}

/// Locks the rows of jobs `ids`, in id order (deleted ones are simply absent).
pub async fn lock(tx: &Tx<'_>, ids: &[i64]) -> PgResult<()> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(());
    }
    let stmt = tx
        .prepare_cached("SELECT id FROM jobs WHERE id = ANY($1) ORDER BY id FOR UPDATE")
        .await?;
    tx.execute(&stmt, &[&ids]).await?;
    Ok(())
}

fn spec_json(spec: &JobSpec) -> Result<(String, String), StoreError> {
    let encode = |e: serde_json::Error| StoreError::Database(format!("cannot encode a job: {e}"));
    Ok((
        serde_json::to_string(spec).map_err(encode)?,
        serde_json::to_string(&spec.retry).map_err(encode)?,
    ))
}

pub async fn put(
    tx: &Tx<'_>,
    namespace: &str,
    job: &ValidJob,
    mode: PutMode,
    now: Instant,
) -> PgResult<(PutOutcome, JobRecord)> {
    for _ in 0..PUT_TRIES {
        let existing = get_for_update(tx, namespace, &job.name).await?;
        if let Some(old) = &existing {
            if mode == PutMode::CreateOnly {
                return Err(StoreError::Conflict(format!(
                    "job {:?} in namespace {namespace:?}",
                    job.name
                ))
                .into());
            }
            if old.spec == job.spec {
                return Ok((PutOutcome::Unchanged, old.clone()));
            }
        }
        super::namespaces::admit(tx, namespace, &job.spec.target, existing.is_none()).await?;
        let had_dependencies = existing
            .as_ref()
            .is_some_and(|old| !old.spec.depends_on.is_empty());
        let has_dependencies = !job.spec.depends_on.is_empty();
        let auto = job.spec.priority.is_auto()
            || existing
                .as_ref()
                .is_some_and(|old| old.spec.priority.is_auto());
        if has_dependencies || had_dependencies || auto {
            super::namespaces::lock_dependencies(tx, namespace).await?;
        }
        if has_dependencies || had_dependencies {
            super::dependencies::put_edges(tx, namespace, job).await?;
        }
        let rank = match job.spec.priority {
            Priority::Fixed(n) => n,
            Priority::Auto => super::dependencies::graph(tx, namespace)
                .await?
                .rank(&job.name),
        };
        // The jobs it waited for, and waits for now, have another number of jobs downstream.
        let mut changed = dependency::upstreams(&job.spec.depends_on);
        if let Some(old) = &existing {
            changed.extend(dependency::upstreams(&old.spec.depends_on));
        }
        let subscribes =
            |spec: &JobSpec| spec.triggering_event().is_some() || !spec.depends_on.is_empty();
        if subscribes(&job.spec) || existing.as_ref().is_some_and(|old| subscribes(&old.spec)) {
            super::events::put_subscriptions(tx, namespace, job).await?;
        }
        let firing = crate::shared::firing_after_put(existing.as_ref(), job, now)?;
        let (spec, retry) = spec_json(&job.spec)?;
        let description = job.spec.description.as_deref().unwrap_or("");
        let next = firing.next_fire_at.map(micros);
        let fired_count = i64::try_from(firing.fired_count)
            .map_err(|_| StoreError::Database("fired count out of range".into()))?;
        let (overlap, state) = (job.spec.overlap.as_str(), firing.state.as_str());
        let epoch = micros(firing.schedule_epoch);
        let (notify, notify_late) = crate::shared::notify_columns(job.spec.notify.as_deref())?;
        let ping_grace = crate::shared::ping_grace(&job.spec);
        let shards = i32::from(sked_core::shard::count(&job.spec));
        match &existing {
            Some(old) => {
                let sql = format!(
                    "UPDATE jobs SET description = $2, spec = $3, overlap = $4, priority = $5, \
                     retry = $6, state = $7, next_fire_at = $8, fired_count = $9, \
                     schedule_epoch = $10, updated_at = $11, has_dependencies = $12, \
                     emits = $13, priority_auto = $14, notify = $15, notify_late = $16, \
                     ping_grace = $17, job_metrics = $18, shards = $19, broadcast = $20, \
                     has_deadline = $21, version = version + 1 WHERE id = $1 \
                     RETURNING {JOB_COLUMNS}"
                );
                let stmt = tx.prepare_cached(&sql).await?;
                let row = tx
                    .query_one(
                        &stmt,
                        &[
                            &old.id,
                            &description,
                            &spec,
                            &overlap,
                            &rank,
                            &retry,
                            &state,
                            &next,
                            &fired_count,
                            &epoch,
                            &micros(now),
                            &has_dependencies,
                            &job.spec.emits(),
                            &job.spec.priority.is_auto(),
                            &notify,
                            &notify_late,
                            &ping_grace,
                            &job.spec.job_metrics,
                            &shards,
                            &job.spec.broadcast,
                            &job.spec.deadline.is_some(),
                        ],
                    )
                    .await?;
                super::dependencies::rerank_above(tx, namespace, &changed).await?;
                let record = rows::job(&row)?;
                keep_version(tx, &record, &spec, now).await?;
                return Ok((PutOutcome::Updated, record));
            }
            None => {
                let sql = format!(
                    "INSERT INTO jobs (namespace, name, description, spec, overlap, priority, \
                     retry, state, next_fire_at, fired_count, schedule_epoch, created_at, \
                     updated_at, has_dependencies, emits, priority_auto, notify, notify_late, \
                     ping_grace, job_metrics, shards, broadcast, has_deadline) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12, $13, $14, \
                     $15, $16, $17, $18, $19, $20, $21, $22) \
                     ON CONFLICT (namespace, name) DO NOTHING RETURNING {JOB_COLUMNS}"
                );
                let stmt = tx.prepare_cached(&sql).await?;
                let row = tx
                    .query_opt(
                        &stmt,
                        &[
                            &namespace,
                            &job.name,
                            &description,
                            &spec,
                            &overlap,
                            &rank,
                            &retry,
                            &state,
                            &next,
                            &fired_count,
                            &epoch,
                            &micros(now),
                            &has_dependencies,
                            &job.spec.emits(),
                            &job.spec.priority.is_auto(),
                            &notify,
                            &notify_late,
                            &ping_grace,
                            &job.spec.job_metrics,
                            &shards,
                            &job.spec.broadcast,
                            &job.spec.deadline.is_some(),
                        ],
                    )
                    .await?;
                if let Some(row) = row {
                    super::dependencies::rerank_above(tx, namespace, &changed).await?;
                    let record = rows::job(&row)?;
                    keep_version(tx, &record, &spec, now).await?;
                    return Ok((PutOutcome::Created, record));
                }
                // A concurrent create committed the name first: decide again against it.
            }
        }
    }
    Err(StoreError::Database(format!(
        "job {:?} in namespace {namespace:?} keeps being created and deleted concurrently",
        job.name
    ))
    .into())
}

/// Keeps `record`'s definition, as written now, under its version, and forgets the versions
/// past the newest [`KEPT_VERSIONS`].
async fn keep_version(tx: &Tx<'_>, record: &JobRecord, spec: &str, now: Instant) -> PgResult<()> {
    let version = i32::try_from(record.version)
        .map_err(|_| StoreError::Database("job version out of range".into()))?;
    let stmt = tx
        .prepare_cached(
            "INSERT INTO job_versions (job_id, version, spec, created_at) \
             VALUES ($1, $2, $3, $4)",
        )
        .await?;
    tx.execute(&stmt, &[&record.id, &version, &spec, &micros(now)])
        .await?;
    let stmt = tx
        .prepare_cached("DELETE FROM job_versions WHERE job_id = $1 AND version <= $2")
        .await?;
    let forgotten = version - KEPT_VERSIONS as i32;
    tx.execute(&stmt, &[&record.id, &forgotten]).await?;
    Ok(())
}

/// The kept definitions of a job, newest first; `None` when there is no such job.
pub async fn versions(
    tx: &Tx<'_>,
    namespace: &str,
    name: &str,
) -> PgResult<Option<Vec<JobVersion>>> {
    let Some(job) = get(tx, namespace, name).await? else {
        return Ok(None);
    };
    let stmt = tx
        .prepare_cached(
            "SELECT version, spec, created_at FROM job_versions WHERE job_id = $1 \
             ORDER BY version DESC",
        )
        .await?;
    let mut versions = Vec::new();
    for row in tx.query(&stmt, &[&job.id]).await? {
        versions.push(JobVersion {
            version: rows::count("version", row.try_get::<_, i32>(0)?)?,
            spec: rows::spec(row.try_get(1)?)?,
            created_at: rows::instant(row.try_get(2)?)?,
        });
    }
    Ok(Some(versions))
}

pub async fn list(tx: &Tx<'_>, query: &JobQuery) -> PgResult<Page<JobRecord>> {
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
    let pattern = query.search.as_ref().map(|s| {
        let escaped = s
            .to_lowercase()
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        format!("%{escaped}%")
    });
    let state = query.state.map(JobState::as_str);
    let mut sql = format!(
        "SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = $1 \
         AND ($2::text IS NULL OR lower(name) LIKE $2 ESCAPE E'\\\\' \
              OR lower(description) LIKE $2 ESCAPE E'\\\\') \
         AND ($3::text IS NULL OR state = $3) \
         AND ($4::text IS NULL OR schedule_kind = $4) \
         AND ($5::text IS NULL OR {LAST_RUN_STATE} = $5) \
         AND ($6::text IS NULL OR spec::jsonb -> 'routing' -> 'labels' ->> $6 = $7::text)",
        LAST_RUN_STATE = crate::shared::LAST_RUN_STATE
    );
    let (mut text_key, mut micros_key, mut after_id) = (String::new(), 0i64, 0i64);
    let fetch = i64::from(limit) + 1;
    let kind = query.kind.map(ScheduleKind::as_str);
    let last = query.last.map(RunState::as_str);
    let label_key = query.label.as_ref().map(|(key, _)| key.as_str());
    let label_value = query.label.as_ref().map(|(_, value)| value.as_str());
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![
        &query.namespace,
        &pattern,
        &state,
        &kind,
        &last,
        &label_key,
        &label_value,
    ];
    // The kind once more as a literal (one of a few fixed words, never the caller's text): a
    // plan made without the parameters' values still sees it and reads `jobs_by_kind`.
    if let Some(kind) = query.kind {
        sql.push_str(&format!(" AND schedule_kind = '{}'", kind.as_str()));
    }
    if let Some(raw) = &query.cursor {
        let cursor = Cursor::decode(raw)?;
        after_id = cursor.id;
        match query.sort {
            JobSort::Name => text_key = cursor.text(raw)?.to_string(),
            JobSort::CreatedAt | JobSort::UpdatedAt => micros_key = cursor.micros(raw)?,
        }
        sql.push_str(&format!(" AND ({column}, id) {after} ($8, $9)"));
    }
    if query.cursor.is_some() {
        match query.sort {
            JobSort::Name => params.push(&text_key),
            JobSort::CreatedAt | JobSort::UpdatedAt => params.push(&micros_key),
        }
        params.push(&after_id);
    }
    sql.push_str(&format!(
        " ORDER BY {column} {order}, id {order} LIMIT ${}",
        params.len() + 1
    ));
    params.push(&fetch);
    let stmt = tx.prepare_cached(&sql).await?;
    let items = tx
        .query(&stmt, &params)
        .await?
        .iter()
        .map(rows::job)
        .collect::<PgResult<Vec<_>>>()?;
    Ok(cursor::page(items, limit, |job| {
        cursor::after_job(job, query.sort)
    }))
}

pub async fn delete(
    tx: &Tx<'_>,
    namespace: &str,
    name: &str,
    force: bool,
    now: Instant,
) -> PgResult<Option<DeletedJob>> {
    // The job and its dependants, locked together in id order.
    let stmt = tx
        .prepare_cached("SELECT id FROM jobs WHERE namespace = $1 AND name = $2")
        .await?;
    let Some(row) = tx.query_opt(&stmt, &[&namespace, &name]).await? else {
        return Ok(None);
    };
    let id: i64 = row.try_get(0)?;
    let below = super::dependencies::dependants_of(tx, &[id]).await?;
    lock(tx, &below.iter().copied().chain([id]).collect::<Vec<_>>()).await?;
    let Some(job) = get_for_update(tx, namespace, name).await? else {
        return Ok(None);
    };
    super::namespaces::lock_dependencies(tx, namespace).await?;
    let dependants = super::dependencies::dependants(tx, namespace, name).await?;
    if !dependants.is_empty() && !force {
        return Err(StoreError::DependedOn {
            job: name.to_string(),
            dependants,
        }
        .into());
    }
    let mut paused = Vec::with_capacity(dependants.len());
    for dependant in &dependants {
        paused.extend(set_paused(tx, namespace, dependant, true, now).await?);
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
    )
    .await?;
    super::dependencies::remove_edges(tx, namespace, name).await?;
    let stmt = tx.prepare_cached("DELETE FROM jobs WHERE id = $1").await?;
    tx.execute(&stmt, &[&job.id]).await?;
    let above = dependency::upstreams(&job.spec.depends_on);
    super::dependencies::rerank_above(tx, namespace, &above).await?;
    // Its dependants, paused now, learn that the runs they waited for will not come.
    super::events::remove_subscriptions(tx, namespace, name).await?;
    let cancelled = ended.iter().map(|run| run.run_id).collect();
    super::dependencies::settle(tx, ended, Vec::new(), now).await?;
    Ok(Some(DeletedJob {
        job,
        paused_dependants: paused,
        cancelled,
    }))
}

pub async fn set_paused(
    tx: &Tx<'_>,
    namespace: &str,
    name: &str,
    paused: bool,
    now: Instant,
) -> PgResult<Option<JobRecord>> {
    let Some(mut job) = get_for_update(tx, namespace, name).await? else {
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
    let stmt = tx
        .prepare_cached(
            "UPDATE jobs SET spec = $2, state = $3, updated_at = $4, version = version + 1 \
             WHERE id = $1",
        )
        .await?;
    tx.execute(&stmt, &[&job.id, &spec, &job.state.as_str(), &micros(now)])
        .await?;
    keep_version(tx, &job, &spec, now).await?;
    Ok(Some(job))
}

/// A page of the jobs whose schedule owes an instant, by id after `after_id`: of `partitions`
/// when given.
pub async fn scheduled(
    tx: &Tx<'_>,
    partitions: Option<&[u32]>,
    after_id: i64,
    limit: u32,
) -> PgResult<Vec<ScheduledJob>> {
    const COLUMNS: &str = "id, spec, schedule_epoch, fired_count, next_fire_at, namespace";
    let limit = i64::from(limit);
    let rows = match partitions {
        None => {
            let sql = format!(
                "SELECT {COLUMNS} FROM jobs WHERE next_fire_at IS NOT NULL AND id > $1 \
                 ORDER BY id LIMIT $2"
            );
            tx.query(&tx.prepare_cached(&sql).await?, &[&after_id, &limit])
                .await?
        }
        Some(partitions) => {
            let sql = format!(
                "SELECT {COLUMNS} FROM jobs \
                 WHERE next_fire_at IS NOT NULL AND id > $1 AND {} = ANY($3) \
                 ORDER BY id LIMIT $2",
                sked_core::cluster::PARTITION_SQL
            );
            let partitions: Vec<i64> = partitions.iter().map(|p| i64::from(*p)).collect();
            tx.query(
                &tx.prepare_cached(&sql).await?,
                &[&after_id, &limit, &partitions],
            )
            .await?
        }
    };
    rows.iter()
        .map(|row| {
            let fired_count: i64 = row.try_get(3)?;
            Ok(shared::scheduled_job(
                row.try_get(0)?,
                row.try_get(5)?,
                row.try_get(1)?,
                rows::instant(row.try_get(2)?)?,
                u64::try_from(fired_count).map_err(|_| {
                    StoreError::Corrupt(format!("fired count {fired_count} is out of range"))
                })?,
                rows::instant(row.try_get(4)?)?,
            )?)
        })
        .collect()
}
