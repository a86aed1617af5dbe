//! Reading rows back into records, and the conversions between sked's values and PostgreSQL's.
//! The column lists and their order are SQLite's (`sqlite/rows.rs`).

use super::PgResult;
use crate::shared;
pub use crate::shared::{
    attempt_state, instant, job_state, micros, opt_instant, run_state, skip_reason, spec, trigger,
};
use crate::StoreError;
use sked_core::auth::{Grant, TokenRecord};
use sked_core::records::{
    AttemptRecord, AuditEntry, AuditRecord, JobRecord, RunRecord, WorkerRecord, WorkerState,
};
use sked_core::shard::Shard;
use tokio_postgres::Row;

/// A stored count (attempts, slots, ...) as the record's unsigned number.
pub fn count<T: TryInto<u32> + Copy + std::fmt::Display>(
    what: &str,
    value: T,
) -> Result<u32, StoreError> {
    value
        .try_into()
        .map_err(|_| StoreError::Corrupt(format!("{what} {value} is out of range")))
}

/// A count on its way into an INTEGER column.
pub fn int(what: &str, value: u32) -> Result<i32, StoreError> {
    i32::try_from(value).map_err(|_| StoreError::Database(format!("{what} {value} is too large")))
}

pub const JOB_COLUMNS: &str =
    "id, namespace, name, spec, state, next_fire_at, fired_count, schedule_epoch, created_at, \
     updated_at, priority, version";

pub fn job(row: &Row) -> PgResult<JobRecord> {
    let fired_count: i64 = row.try_get(6)?;
    Ok(JobRecord {
        id: row.try_get(0)?,
        namespace: row.try_get(1)?,
        name: row.try_get(2)?,
        spec: spec(row.try_get(3)?)?,
        rank: row.try_get(10)?,
        state: job_state(row.try_get(4)?)?,
        next_fire_at: opt_instant(row.try_get(5)?)?,
        fired_count: u64::try_from(fired_count).map_err(|_| {
            StoreError::Corrupt(format!("fired count {fired_count} is out of range"))
        })?,
        schedule_epoch: instant(row.try_get(7)?)?,
        created_at: instant(row.try_get(8)?)?,
        updated_at: instant(row.try_get(9)?)?,
        version: count("version", row.try_get::<_, i32>(11)?)?,
    })
}

pub const RUN_COLUMNS: &str = "id, namespace, job, job_id, scheduled_for, trigger, state, \
     skip_reason, priority, ready_at, created_at, started_at, finished_at, attempts, failures, \
     cancel_requested, error, waiting_reason, waiting_for, waiting_until, event_key, event_id, \
     job_version, shard, shard_count, pinned_worker, nominal_for, deadline, deadline_missed, at_risk, \
     params, absorbed, trace_parent";

pub fn run(row: &Row) -> PgResult<RunRecord> {
    let skip_reason: Option<&str> = row.try_get(7)?;
    let record = RunRecord {
        id: row.try_get(0)?,
        namespace: row.try_get(1)?,
        job: row.try_get(2)?,
        job_id: row.try_get(3)?,
        scheduled_for: instant(row.try_get(4)?)?,
        nominal_for: opt_instant(row.try_get(26)?)?,
        trigger: trigger(row.try_get(5)?)?,
        state: run_state(row.try_get(6)?)?,
        skip_reason: skip_reason.map(self::skip_reason).transpose()?,
        waiting_reason: None,
        waiting_for: Vec::new(),
        waiting_until: None,
        event_key: row.try_get(20)?,
        event_id: row.try_get(21)?,
        priority: row.try_get(8)?,
        ready_at: instant(row.try_get(9)?)?,
        created_at: instant(row.try_get(10)?)?,
        started_at: opt_instant(row.try_get(11)?)?,
        finished_at: opt_instant(row.try_get(12)?)?,
        attempts: count("attempts", row.try_get::<_, i32>(13)?)?,
        failures: count("failures", row.try_get::<_, i32>(14)?)?,
        cancel_requested: row.try_get(15)?,
        error: row.try_get(16)?,
        job_version: row
            .try_get::<_, Option<i32>>(22)?
            .map(|v| count("job_version", v))
            .transpose()?,
        shard: Shard::of_run(
            i64::from(row.try_get::<_, i32>(23)?),
            i64::from(row.try_get::<_, i32>(24)?),
        ),
        pinned_worker: row.try_get(25)?,
        deadline: crate::shared::json_column("a run's deadline", row.try_get(27)?)?,
        deadline_missed: crate::shared::json_column("a run's missed deadlines", row.try_get(28)?)?
            .unwrap_or_default(),
        at_risk: crate::shared::json_column("a run's risk", row.try_get(29)?)?,
        params: crate::shared::json_column("a run's parameters", row.try_get(30)?)?,
        trace_parent: row.try_get(32)?,
        absorbed: crate::shared::json_column("a run's absorbed triggers", row.try_get(31)?)?,
    };
    Ok(crate::shared::with_waiting(
        record,
        row.try_get(17)?,
        row.try_get(18)?,
        row.try_get(19)?,
    )?)
}

pub const ATTEMPT_COLUMNS: &str = "id, run_id, number, worker_id, token, state, started_at, \
     finished_at, lease_expires_at, exit_code, http_status, error, output_bytes, output_truncated";

pub fn attempt(row: &Row) -> PgResult<AttemptRecord> {
    let http_status: Option<i32> = row.try_get(10)?;
    let output_bytes: i64 = row.try_get(12)?;
    Ok(AttemptRecord {
        id: row.try_get(0)?,
        run_id: row.try_get(1)?,
        number: count("attempt number", row.try_get::<_, i32>(2)?)?,
        worker_id: row.try_get(3)?,
        token: row.try_get(4)?,
        state: attempt_state(row.try_get(5)?)?,
        started_at: instant(row.try_get(6)?)?,
        finished_at: opt_instant(row.try_get(7)?)?,
        lease_expires_at: instant(row.try_get(8)?)?,
        exit_code: row.try_get(9)?,
        http_status: http_status
            .map(|s| {
                u16::try_from(s)
                    .map_err(|_| StoreError::Corrupt(format!("HTTP status {s} is out of range")))
            })
            .transpose()?,
        error: row.try_get(11)?,
        output_bytes: u64::try_from(output_bytes).map_err(|_| {
            StoreError::Corrupt(format!("output size {output_bytes} is out of range"))
        })?,
        output_truncated: row.try_get(13)?,
    })
}

pub const WORKER_COLUMNS: &str = "w.id, w.name, w.labels, w.slots, w.registered_at, \
     w.last_heartbeat_at, w.alive, \
     (SELECT count(*) FROM attempts a WHERE a.worker_id = w.id AND a.state = 'running'), \
     w.namespaces, w.token_id, w.draining, w.stopped, w.publisher";

pub fn worker(row: &Row) -> PgResult<WorkerRecord> {
    let labels: &str = row.try_get(2)?;
    Ok(WorkerRecord {
        id: row.try_get(0)?,
        name: row.try_get(1)?,
        labels: serde_json::from_str(labels)
            .map_err(|e| StoreError::Corrupt(format!("worker labels do not parse: {e}")))?,
        slots: count("slots", row.try_get::<_, i64>(3)?)?,
        registered_at: instant(row.try_get(4)?)?,
        last_heartbeat_at: instant(row.try_get(5)?)?,
        alive: row.try_get(6)?,
        running: count("running attempts", row.try_get::<_, i64>(7)?)?,
        namespaces: shared::namespaces("worker namespaces", row.try_get(8)?)?,
        token_id: row.try_get(9)?,
        draining: row.try_get(10)?,
        state: WorkerState::of(row.try_get(6)?, row.try_get(10)?, row.try_get(11)?),
        publisher: row.try_get(12)?,
    })
}

pub const TOKEN_COLUMNS: &str =
    "id, name, role, namespaces, shell, labels, created_at, expires_at, last_used_at, \
     sessions_ended_at";

pub fn token(row: &Row) -> PgResult<TokenRecord> {
    Ok(TokenRecord {
        id: row.try_get(0)?,
        name: row.try_get(1)?,
        grant: Grant {
            role: shared::role(row.try_get(2)?)?,
            namespaces: shared::namespaces("token namespaces", row.try_get(3)?)?,
            shell: row.try_get(4)?,
            labels: shared::label_rules(row.try_get(5)?)?,
        },
        created_at: instant(row.try_get(6)?)?,
        expires_at: opt_instant(row.try_get(7)?)?,
        last_used_at: opt_instant(row.try_get(8)?)?,
        sessions_ended_at: opt_instant(row.try_get(9)?)?,
    })
}

pub const AUDIT_COLUMNS: &str =
    "id, at, actor, actor_id, peer, action, namespace, object, before, after";

pub fn audit(row: &Row) -> PgResult<AuditRecord> {
    Ok(AuditRecord {
        id: row.try_get(0)?,
        entry: AuditEntry {
            at: instant(row.try_get(1)?)?,
            actor: row.try_get(2)?,
            actor_id: row.try_get(3)?,
            peer: row.try_get(4)?,
            action: row.try_get(5)?,
            namespace: row.try_get(6)?,
            object: row.try_get(7)?,
            before: shared::snapshot(row.try_get(8)?)?,
            after: shared::snapshot(row.try_get(9)?)?,
        },
    })
}
