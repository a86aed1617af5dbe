//! Debounce and dedup in the SQLite ledger: a manual trigger recorded under its job's keys
//! (`trigger_run`), and the same keys met by the runs an event starts (`event_went`,
//! `after_event_start`). One writer serialises every trigger, so a key's row is read and
//! written in one transaction with the run it names.

use super::ledger::record_fires;
use super::rows::{self, micros};
use crate::shared::{self, later, FlowKeys};
use crate::{
    Fire, FiredRun, FlowOutcome, FlowedRun, ManualTrigger, Result, StoreError, TriggeredRun,
};
use rusqlite::{params, OptionalExtension, Transaction};
use sked_core::flow::{AbsorbedTrigger, KeyContext};
use sked_core::job::JobSpec;
use sked_core::records::EventRecord;
use sked_core::run::{RunState, Trigger};
use sked_core::Instant;

/// The run a dedup key names within its window.
fn deduplicated(
    tx: &Transaction<'_>,
    job_id: i64,
    key: &str,
    now: Instant,
) -> Result<Option<(i64, RunState)>> {
    let found: Option<(i64, String)> = tx
        .prepare_cached(
            "SELECT r.id, r.state FROM flow_dedup d JOIN runs r ON r.id = d.run_id \
             WHERE d.job_id = ?1 AND d.key = ?2 AND d.expires_at > ?3",
        )?
        .query_row(params![job_id, key, micros(now)], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    found
        .map(|(id, state)| Ok((id, rows::run_state(&state)?)))
        .transpose()
}

/// What a trigger or event brings to the debounced run it is absorbed into.
enum Newest<'a> {
    Params(Option<&'a sked_core::flow::Params>),
    Event(&'a EventRecord),
}

/// Absorbs a trigger into the debounced run pending for `key`, if there is one: its
/// `ready_at` moved, the newest parameters or event kept, the trigger counted. The run and
/// its state.
fn absorbed_into(
    tx: &Transaction<'_>,
    job_id: i64,
    key: &str,
    spec: &sked_core::flow::DebounceSpec,
    newest: Newest<'_>,
    now: Instant,
) -> Result<Option<(i64, RunState)>> {
    let pending: Option<(i64, String, Option<String>)> = tx
        .prepare_cached(
            "SELECT r.id, r.state, r.absorbed FROM flow_debounce d JOIN runs r ON r.id = d.run_id \
             WHERE d.job_id = ?1 AND d.key = ?2 AND r.state IN ('queued', 'waiting') \
             AND r.absorbed IS NOT NULL",
        )?
        .query_row(params![job_id, key], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    let Some((run_id, state, stored)) = pending else {
        return Ok(None);
    };
    let trigger = match &newest {
        Newest::Params(params) => AbsorbedTrigger {
            at: now,
            params: params.cloned(),
            event_id: None,
        },
        Newest::Event(event) => AbsorbedTrigger {
            at: now,
            params: None,
            event_id: Some(event.id.clone()),
        },
    };
    let (absorbed, ready_at) = shared::absorb(stored.as_deref(), spec, trigger, now)?;
    // Every shard of the run's instant absorbs it alike.
    let same_instant = "job_id = ?1 AND scheduled_for = (SELECT scheduled_for FROM runs \
         WHERE id = ?2) AND state IN ('queued', 'waiting')";
    match newest {
        Newest::Params(params) => {
            tx.prepare_cached(&format!(
                "UPDATE runs SET absorbed = ?3, ready_at = ?4, params = ?5 WHERE {same_instant}"
            ))?
            .execute(params![
                job_id,
                run_id,
                absorbed,
                micros(ready_at),
                shared::params_column(params)?
            ])?;
        }
        Newest::Event(event) => {
            tx.prepare_cached(&format!(
                "UPDATE runs SET absorbed = ?3, ready_at = ?4, event_key = ?5, event_id = ?6 \
                 WHERE {same_instant}"
            ))?
            .execute(params![
                job_id,
                run_id,
                absorbed,
                micros(ready_at),
                event.key,
                event.id
            ])?;
        }
    }
    Ok(Some((run_id, rows::run_state(&state)?)))
}

/// What a new run of the job writes beside itself: its parameters and, when debounced, an
/// empty absorbed record and its `ready_at`; its keys' rows name it.
fn recorded(
    tx: &Transaction<'_>,
    job_id: i64,
    run_id: i64,
    keys: &FlowKeys,
    params: Option<&sked_core::flow::Params>,
    now: Instant,
) -> Result<()> {
    let absorbed = keys
        .debounce
        .as_ref()
        .map(|_| shared::to_json("absorbed triggers", &sked_core::flow::Absorbed::begun(now)))
        .transpose()?;
    let ready_at = keys
        .debounce
        .as_ref()
        .map(|(_, spec)| micros(sked_core::flow::trigger::debounced_ready_at(spec, now, now)));
    tx.prepare_cached(
        "UPDATE runs SET params = ?3, absorbed = ?4, ready_at = max(ready_at, coalesce(?5, 0)) \
         WHERE job_id = ?1 AND scheduled_for = (SELECT scheduled_for FROM runs WHERE id = ?2)",
    )?
    .execute(params![
        job_id,
        run_id,
        shared::params_column(params)?,
        absorbed,
        ready_at
    ])?;
    if let Some((key, window)) = &keys.dedup {
        tx.prepare_cached(
            "INSERT INTO flow_dedup (job_id, key, run_id, recorded_at, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (job_id, key) DO UPDATE SET \
             run_id = excluded.run_id, recorded_at = excluded.recorded_at, \
             expires_at = excluded.expires_at",
        )?
        .execute(params![
            job_id,
            key,
            run_id,
            micros(now),
            micros(later(now, *window))
        ])?;
    }
    if let Some((key, spec)) = &keys.debounce {
        let until = later(
            now,
            chrono::Duration::from_std(spec.max_wait()).unwrap_or(chrono::Duration::MAX),
        );
        tx.prepare_cached(
            "INSERT INTO flow_debounce (job_id, key, run_id, expires_at) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (job_id, key) DO UPDATE SET run_id = excluded.run_id, \
             expires_at = excluded.expires_at",
        )?
        .execute(params![job_id, key, run_id, micros(until)])?;
    }
    Ok(())
}

/// The job's name, namespace and definition.
fn job_of(tx: &Transaction<'_>, job_id: i64) -> Result<Option<(String, String, JobSpec)>> {
    let found: Option<(String, String, String)> = tx
        .prepare_cached("SELECT namespace, name, spec FROM jobs WHERE id = ?1")?
        .query_row(params![job_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    found
        .map(|(namespace, name, spec)| Ok((namespace, name, rows::spec(&spec)?)))
        .transpose()
}

fn existing(run_id: i64, state: RunState, outcome: FlowOutcome) -> TriggeredRun {
    TriggeredRun {
        run: FiredRun {
            run_id,
            state,
            inserted: false,
            advanced: false,
            other_shards: Vec::new(),
            placed: false,
        },
        outcome,
    }
}

pub(super) fn trigger_run(
    tx: &Transaction<'_>,
    trigger: &ManualTrigger,
    now: Instant,
) -> Result<TriggeredRun> {
    // Instants are kept to the microsecond: what a run shows must compare with its ready_at.
    let now = sked_core::ledger_instant(now);
    let Some((namespace, name, spec)) = job_of(tx, trigger.job_id)? else {
        return Ok(existing(0, RunState::Cancelled, FlowOutcome::Recorded));
    };
    let keys = FlowKeys::of(
        &spec,
        &KeyContext {
            namespace: &namespace,
            job: &name,
            params: trigger.params.as_ref(),
            ..KeyContext::default()
        },
    );
    if let Some((key, _)) = &keys.dedup {
        if let Some((run_id, state)) = deduplicated(tx, trigger.job_id, key, now)? {
            return Ok(existing(run_id, state, FlowOutcome::Deduplicated));
        }
    }
    if let Some((key, debounce)) = &keys.debounce {
        let newest = Newest::Params(trigger.params.as_ref());
        if let Some((run_id, state)) =
            absorbed_into(tx, trigger.job_id, key, debounce, newest, now)?
        {
            return Ok(existing(run_id, state, FlowOutcome::Absorbed));
        }
    }
    // Two triggers within the same microsecond are two runs: move the second one on.
    let mut instant = trigger.scheduled_for;
    for _ in 0..100 {
        let fire = Fire {
            job_id: trigger.job_id,
            scheduled_for: instant,
            trigger: Trigger::Manual,
            skip: None,
            ready_at: instant,
            advance: None,
            nominal_for: None,
            why: None,
        };
        let outcome = record_fires(tx, std::slice::from_ref(&fire), now)?;
        let Some(run) = outcome.runs.into_iter().next() else {
            break;
        };
        if run.inserted {
            recorded(
                tx,
                trigger.job_id,
                run.run_id,
                &keys,
                trigger.params.as_ref(),
                now,
            )?;
            if let Some(joined) = &trigger.trace_parent {
                let mut join =
                    tx.prepare_cached("UPDATE runs SET trace_parent = ?2 WHERE id = ?1")?;
                for id in run.all_runs() {
                    join.execute(params![id, joined])?;
                }
            }
            return Ok(TriggeredRun {
                run,
                outcome: FlowOutcome::Recorded,
            });
        }
        instant += chrono::Duration::microseconds(1);
    }
    Err(StoreError::Conflict(format!(
        "a manual run of job {name:?} near {}",
        trigger.scheduled_for
    )))
}

/// For a job an event would start a run of: the run the event goes to instead under the
/// job's dedup or debounce (whether it is queued, for the dispatcher), or the keys the new
/// run is to carry.
pub(super) fn event_went(
    tx: &Transaction<'_>,
    event: &EventRecord,
    job_id: i64,
    job: &str,
    spec: &JobSpec,
    now: Instant,
) -> Result<Result<(FlowedRun, bool), FlowKeys>> {
    if spec.dedup.is_none() && spec.debounce.is_none() {
        return Ok(Err(FlowKeys::default()));
    }
    let now = sked_core::ledger_instant(now);
    let run_event = sked_core::event::RunEvent {
        key: event.key.clone(),
        id: event.id.clone(),
        payload: event.payload.clone(),
    };
    let keys = FlowKeys::of(
        spec,
        &KeyContext {
            namespace: &event.namespace,
            job,
            event: Some(&run_event),
            ..KeyContext::default()
        },
    );
    let went = |run_id, state: RunState, outcome| {
        Ok(Ok((
            FlowedRun {
                job: job.to_string(),
                run_id,
                outcome,
            },
            state == RunState::Queued,
        )))
    };
    if let Some((key, _)) = &keys.dedup {
        if let Some((run_id, state)) = deduplicated(tx, job_id, key, now)? {
            return went(run_id, state, FlowOutcome::Deduplicated);
        }
    }
    if let Some((key, debounce)) = &keys.debounce {
        if let Some((run_id, state)) =
            absorbed_into(tx, job_id, key, debounce, Newest::Event(event), now)?
        {
            return went(run_id, state, FlowOutcome::Absorbed);
        }
    }
    Ok(Err(keys))
}

/// Writes what a run an event just started carries under its job's keys.
pub(super) fn after_event_start(
    tx: &Transaction<'_>,
    job_id: i64,
    run_id: i64,
    keys: &FlowKeys,
    now: Instant,
) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    recorded(
        tx,
        job_id,
        run_id,
        keys,
        None,
        sked_core::ledger_instant(now),
    )
}

/// Deletes up to `limit` dedup and debounce rows expired before `before`; how many.
pub(super) fn delete_expired(tx: &Transaction<'_>, before: Instant, limit: u32) -> Result<u64> {
    let mut deleted = 0;
    for table in ["flow_dedup", "flow_debounce"] {
        deleted += tx
            .prepare_cached(&format!(
                "DELETE FROM {table} WHERE (job_id, key) IN (SELECT job_id, key FROM {table} \
                 WHERE expires_at < ?1 LIMIT ?2)"
            ))?
            .execute(params![micros(before), limit])? as u64;
    }
    Ok(deleted)
}
