//! Reading rows back into records, and the conversions between sked's values and SQLite's.

use crate::shared;
pub use crate::shared::{
    attempt_state, instant, job_state, micros, opt_instant, run_state, skip_reason, spec, trigger,
};
use crate::StoreError;
use rusqlite::Row;
use sked_core::auth::{Grant, TokenRecord};
use sked_core::records::{
    AttemptRecord, AuditEntry, AuditRecord, JobRecord, RunRecord, WorkerRecord, WorkerState,
};
use sked_core::shard::Shard;

pub const JOB_COLUMNS: &str =
    "id, namespace, name, spec, state, next_fire_at, fired_count, schedule_epoch, created_at, \
     updated_at, priority, version";

pub fn job(row: &Row<'_>) -> Result<JobRecord, StoreError> {
    Ok(JobRecord {
        id: row.get(0)?,
        namespace: row.get(1)?,
        name: row.get(2)?,
        spec: spec(&row.get::<_, String>(3)?)?,
        rank: row.get(10)?,
        state: job_state(&row.get::<_, String>(4)?)?,
        next_fire_at: opt_instant(row.get(5)?)?,
        fired_count: row.get::<_, i64>(6)? as u64,
        schedule_epoch: instant(row.get(7)?)?,
        created_at: instant(row.get(8)?)?,
        updated_at: instant(row.get(9)?)?,
        version: row.get(11)?,
    })
}

pub const RUN_COLUMNS: &str = "id, namespace, job, job_id, scheduled_for, trigger, state, \
     skip_reason, priority, ready_at, created_at, started_at, finished_at, attempts, failures, \
     cancel_requested, error, waiting_reason, waiting_for, waiting_until, event_key, event_id, \
     job_version, shard, shard_count, pinned_worker, nominal_for, deadline, deadline_missed, at_risk, \
     params, absorbed, trace_parent";

pub fn run(row: &Row<'_>) -> Result<RunRecord, StoreError> {
    let skip_reason: Option<String> = row.get(7)?;
    let record = RunRecord {
        id: row.get(0)?,
        namespace: row.get(1)?,
        job: row.get(2)?,
        job_id: row.get(3)?,
        scheduled_for: instant(row.get(4)?)?,
        nominal_for: opt_instant(row.get(26)?)?,
        trigger: trigger(&row.get::<_, String>(5)?)?,
        state: run_state(&row.get::<_, String>(6)?)?,
        skip_reason: skip_reason.as_deref().map(self::skip_reason).transpose()?,
        waiting_reason: None,
        waiting_for: Vec::new(),
        waiting_until: None,
        event_key: row.get(20)?,
        event_id: row.get(21)?,
        priority: row.get(8)?,
        ready_at: instant(row.get(9)?)?,
        created_at: instant(row.get(10)?)?,
        started_at: opt_instant(row.get(11)?)?,
        finished_at: opt_instant(row.get(12)?)?,
        attempts: row.get(13)?,
        failures: row.get(14)?,
        cancel_requested: row.get(15)?,
        error: row.get(16)?,
        job_version: row.get(22)?,
        shard: Shard::of_run(row.get::<_, i64>(23)?, row.get::<_, i64>(24)?),
        pinned_worker: row.get(25)?,
        deadline: crate::shared::json_column("a run's deadline", row.get(27)?)?,
        deadline_missed: crate::shared::json_column("a run's missed deadlines", row.get(28)?)?
            .unwrap_or_default(),
        at_risk: crate::shared::json_column("a run's risk", row.get(29)?)?,
        params: crate::shared::json_column("a run's parameters", row.get(30)?)?,
        trace_parent: row.get(32)?,
        absorbed: crate::shared::json_column("a run's absorbed triggers", row.get(31)?)?,
    };
    crate::shared::with_waiting(
        record,
        row.get::<_, Option<String>>(17)?.as_deref(),
        row.get::<_, Option<String>>(18)?.as_deref(),
        row.get(19)?,
    )
}

pub const ATTEMPT_COLUMNS: &str = "id, run_id, number, worker_id, token, state, started_at, \
     finished_at, lease_expires_at, exit_code, http_status, error, output_bytes, output_truncated";

pub fn attempt(row: &Row<'_>) -> Result<AttemptRecord, StoreError> {
    Ok(AttemptRecord {
        id: row.get(0)?,
        run_id: row.get(1)?,
        number: row.get(2)?,
        worker_id: row.get(3)?,
        token: row.get(4)?,
        state: attempt_state(&row.get::<_, String>(5)?)?,
        started_at: instant(row.get(6)?)?,
        finished_at: opt_instant(row.get(7)?)?,
        lease_expires_at: instant(row.get(8)?)?,
        exit_code: row.get(9)?,
        http_status: row.get(10)?,
        error: row.get(11)?,
        output_bytes: row.get::<_, i64>(12)? as u64,
        output_truncated: row.get(13)?,
    })
}

pub const WORKER_COLUMNS: &str = "w.id, w.name, w.labels, w.slots, w.registered_at, \
     w.last_heartbeat_at, w.alive, \
     (SELECT count(*) FROM attempts a WHERE a.worker_id = w.id AND a.state = 'running'), \
     w.namespaces, w.token_id, w.draining, w.stopped, w.publisher";

pub fn worker(row: &Row<'_>) -> Result<WorkerRecord, StoreError> {
    let labels: String = row.get(2)?;
    Ok(WorkerRecord {
        id: row.get(0)?,
        name: row.get(1)?,
        labels: serde_json::from_str(&labels)
            .map_err(|e| StoreError::Corrupt(format!("worker labels do not parse: {e}")))?,
        slots: row.get(3)?,
        registered_at: instant(row.get(4)?)?,
        last_heartbeat_at: instant(row.get(5)?)?,
        alive: row.get(6)?,
        running: row.get(7)?,
        namespaces: shared::namespaces("worker namespaces", &row.get::<_, String>(8)?)?,
        token_id: row.get(9)?,
        draining: row.get(10)?,
        state: WorkerState::of(row.get(6)?, row.get(10)?, row.get(11)?),
        publisher: row.get(12)?,
    })
}

pub const TOKEN_COLUMNS: &str =
    "id, name, role, namespaces, shell, labels, created_at, expires_at, last_used_at, \
     sessions_ended_at";

pub fn token(row: &Row<'_>) -> Result<TokenRecord, StoreError> {
    Ok(TokenRecord {
        id: row.get(0)?,
        name: row.get(1)?,
        grant: Grant {
            role: shared::role(&row.get::<_, String>(2)?)?,
            namespaces: shared::namespaces("token namespaces", &row.get::<_, String>(3)?)?,
            shell: row.get(4)?,
            labels: shared::label_rules(row.get::<_, Option<String>>(5)?.as_deref())?,
        },
        created_at: instant(row.get(6)?)?,
        expires_at: opt_instant(row.get(7)?)?,
        last_used_at: opt_instant(row.get(8)?)?,
        sessions_ended_at: opt_instant(row.get(9)?)?,
    })
}

pub const AUDIT_COLUMNS: &str =
    "id, at, actor, actor_id, peer, action, namespace, object, before, after";

pub fn audit(row: &Row<'_>) -> Result<AuditRecord, StoreError> {
    Ok(AuditRecord {
        id: row.get(0)?,
        entry: AuditEntry {
            at: instant(row.get(1)?)?,
            actor: row.get(2)?,
            actor_id: row.get(3)?,
            peer: row.get(4)?,
            action: row.get(5)?,
            namespace: row.get(6)?,
            object: row.get(7)?,
            before: shared::snapshot(row.get::<_, Option<String>>(8)?.as_deref())?,
            after: shared::snapshot(row.get::<_, Option<String>>(9)?.as_deref())?,
        },
    })
}
