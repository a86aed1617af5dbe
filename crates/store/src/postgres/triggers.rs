//! Debounce and dedup in the PostgreSQL ledger: a manual trigger recorded under its job's
//! keys (`trigger_run`), and the same keys met by the runs an event starts (`event_went`,
//! `after_event_start`). Several nodes may trigger with one key at once: each key's row is
//! written first if missing (`ON CONFLICT DO NOTHING` waits for a concurrent insert to commit)
//! and then locked (`FOR UPDATE`), so the triggers of one key are serialised and make one run.

use super::ledger::record_fires;
use super::rows::{self, micros};
use super::{PgResult, Tx};
use crate::shared::{self, later, FlowKeys};
use crate::{Fire, FiredRun, FlowOutcome, FlowedRun, ManualTrigger, StoreError, TriggeredRun};
use sked_core::flow::{AbsorbedTrigger, KeyContext};
use sked_core::job::JobSpec;
use sked_core::records::EventRecord;
use sked_core::run::{RunState, Trigger};
use sked_core::Instant;

/// Locks the row of `key` in `table` (`flow_dedup`, `flow_debounce`), writing an empty one
/// (run 0, expired) first when there is none.
async fn lock_key(tx: &Tx<'_>, table: &str, job_id: i64, key: &str) -> PgResult<()> {
    let columns = if table == "flow_dedup" {
        "(job_id, key, run_id, recorded_at, expires_at) VALUES ($1, $2, 0, 0, 0)"
    } else {
        "(job_id, key, run_id, expires_at) VALUES ($1, $2, 0, 0)"
    };
    let stmt = tx
        .prepare_cached(&format!(
            "INSERT INTO {table} {columns} ON CONFLICT (job_id, key) DO NOTHING"
        ))
        .await?;
    tx.execute(&stmt, &[&job_id, &key]).await?;
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT 1 FROM {table} WHERE job_id = $1 AND key = $2 FOR UPDATE"
        ))
        .await?;
    tx.query_opt(&stmt, &[&job_id, &key]).await?;
    Ok(())
}

/// The run a dedup key names within its window.
async fn deduplicated(
    tx: &Tx<'_>,
    job_id: i64,
    key: &str,
    now: Instant,
) -> PgResult<Option<(i64, RunState)>> {
    lock_key(tx, "flow_dedup", job_id, key).await?;
    let stmt = tx
        .prepare_cached(
            "SELECT r.id, r.state FROM flow_dedup d JOIN runs r ON r.id = d.run_id \
             WHERE d.job_id = $1 AND d.key = $2 AND d.expires_at > $3",
        )
        .await?;
    let found = tx.query_opt(&stmt, &[&job_id, &key, &micros(now)]).await?;
    found
        .map(|row| Ok((row.try_get(0)?, rows::run_state(row.try_get(1)?)?)))
        .transpose()
}

/// What a trigger or event brings to the debounced run it is absorbed into.
enum Newest<'a> {
    Params(Option<&'a sked_core::flow::Params>),
    Event(&'a EventRecord),
}

/// Absorbs a trigger into the debounced run pending for `key`, if there is one: its
/// `ready_at` moved, the newest parameters or event kept, the trigger counted. The run is
/// locked first, so a start of it on another node either comes first (and the trigger makes
/// a new run) or after (and meets the new `ready_at`). The run and its state.
async fn absorbed_into(
    tx: &Tx<'_>,
    job_id: i64,
    key: &str,
    spec: &sked_core::flow::DebounceSpec,
    newest: Newest<'_>,
    now: Instant,
) -> PgResult<Option<(i64, RunState)>> {
    lock_key(tx, "flow_debounce", job_id, key).await?;
    let stmt = tx
        .prepare_cached(
            "SELECT r.id, r.state, r.absorbed, r.scheduled_for FROM runs r \
             WHERE r.id = (SELECT run_id FROM flow_debounce WHERE job_id = $1 AND key = $2) \
             AND r.state IN ('queued', 'waiting') AND r.absorbed IS NOT NULL FOR UPDATE",
        )
        .await?;
    let Some(row) = tx.query_opt(&stmt, &[&job_id, &key]).await? else {
        return Ok(None);
    };
    let run_id: i64 = row.try_get(0)?;
    let state = rows::run_state(row.try_get(1)?)?;
    let stored: Option<String> = row.try_get(2)?;
    let instant: i64 = row.try_get(3)?;
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
    let same_instant = "job_id = $1 AND scheduled_for = $2 AND state IN ('queued', 'waiting')";
    match newest {
        Newest::Params(params) => {
            let stmt = tx
                .prepare_cached(&format!(
                    "UPDATE runs SET absorbed = $3, ready_at = $4, params = $5 \
                     WHERE {same_instant}"
                ))
                .await?;
            tx.execute(
                &stmt,
                &[
                    &job_id,
                    &instant,
                    &absorbed,
                    &micros(ready_at),
                    &shared::params_column(params)?,
                ],
            )
            .await?;
        }
        Newest::Event(event) => {
            let stmt = tx
                .prepare_cached(&format!(
                    "UPDATE runs SET absorbed = $3, ready_at = $4, event_key = $5, \
                     event_id = $6 WHERE {same_instant}"
                ))
                .await?;
            tx.execute(
                &stmt,
                &[
                    &job_id,
                    &instant,
                    &absorbed,
                    &micros(ready_at),
                    &event.key,
                    &event.id,
                ],
            )
            .await?;
        }
    }
    Ok(Some((run_id, state)))
}

/// What a new run of the job writes beside itself: its parameters and, when debounced, an
/// empty absorbed record and its `ready_at`; its keys' rows (locked already) name it.
async fn recorded(
    tx: &Tx<'_>,
    job_id: i64,
    run_id: i64,
    keys: &FlowKeys,
    params: Option<&sked_core::flow::Params>,
    now: Instant,
) -> PgResult<()> {
    let absorbed = keys
        .debounce
        .as_ref()
        .map(|_| shared::to_json("absorbed triggers", &sked_core::flow::Absorbed::begun(now)))
        .transpose()?;
    let ready_at = keys
        .debounce
        .as_ref()
        .map(|(_, spec)| micros(sked_core::flow::trigger::debounced_ready_at(spec, now, now)));
    let stmt = tx
        .prepare_cached(
            "UPDATE runs SET params = $3, absorbed = $4, \
             ready_at = greatest(ready_at, coalesce($5::bigint, 0)) \
             WHERE job_id = $1 AND scheduled_for = (SELECT scheduled_for FROM runs WHERE id = $2)",
        )
        .await?;
    tx.execute(
        &stmt,
        &[
            &job_id,
            &run_id,
            &shared::params_column(params)?,
            &absorbed,
            &ready_at,
        ],
    )
    .await?;
    if let Some((key, window)) = &keys.dedup {
        let stmt = tx
            .prepare_cached(
                "INSERT INTO flow_dedup (job_id, key, run_id, recorded_at, expires_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (job_id, key) DO UPDATE SET \
                 run_id = excluded.run_id, recorded_at = excluded.recorded_at, \
                 expires_at = excluded.expires_at",
            )
            .await?;
        tx.execute(
            &stmt,
            &[
                &job_id,
                key,
                &run_id,
                &micros(now),
                &micros(later(now, *window)),
            ],
        )
        .await?;
    }
    if let Some((key, spec)) = &keys.debounce {
        let until = later(
            now,
            chrono::Duration::from_std(spec.max_wait()).unwrap_or(chrono::Duration::MAX),
        );
        let stmt = tx
            .prepare_cached(
                "INSERT INTO flow_debounce (job_id, key, run_id, expires_at) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (job_id, key) DO UPDATE SET \
                 run_id = excluded.run_id, expires_at = excluded.expires_at",
            )
            .await?;
        tx.execute(&stmt, &[&job_id, key, &run_id, &micros(until)])
            .await?;
    }
    Ok(())
}

/// The job's namespace, name and definition.
async fn job_of(tx: &Tx<'_>, job_id: i64) -> PgResult<Option<(String, String, JobSpec)>> {
    let stmt = tx
        .prepare_cached("SELECT namespace, name, spec FROM jobs WHERE id = $1")
        .await?;
    let found = tx.query_opt(&stmt, &[&job_id]).await?;
    found
        .map(|row| {
            Ok((
                row.try_get(0)?,
                row.try_get(1)?,
                rows::spec(row.try_get(2)?)?,
            ))
        })
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

pub(super) async fn trigger_run(
    tx: &Tx<'_>,
    trigger: &ManualTrigger,
    now: Instant,
) -> PgResult<TriggeredRun> {
    // Instants are kept to the microsecond: what a run shows must compare with its ready_at.
    let now = sked_core::ledger_instant(now);
    let Some((namespace, name, spec)) = job_of(tx, trigger.job_id).await? else {
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
        if let Some((run_id, state)) = deduplicated(tx, trigger.job_id, key, now).await? {
            return Ok(existing(run_id, state, FlowOutcome::Deduplicated));
        }
    }
    if let Some((key, debounce)) = &keys.debounce {
        let newest = Newest::Params(trigger.params.as_ref());
        if let Some((run_id, state)) =
            absorbed_into(tx, trigger.job_id, key, debounce, newest, now).await?
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
        let outcome = record_fires(tx, std::slice::from_ref(&fire), now).await?;
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
            )
            .await?;
            if let Some(joined) = &trigger.trace_parent {
                let ids: Vec<i64> = run.all_runs().collect();
                let join = tx
                    .prepare_cached(
                        "UPDATE runs SET trace_parent = $3 \
                         WHERE id = ANY($1) AND scheduled_for = $2",
                    )
                    .await?;
                tx.execute(&join, &[&ids, &micros(instant), &joined])
                    .await?;
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
    ))
    .into())
}

/// For a job an event would start a run of: the run the event goes to instead under the
/// job's dedup or debounce (whether it is queued, for the dispatcher), or the keys the new
/// run is to carry.
pub(super) async fn event_went(
    tx: &Tx<'_>,
    event: &EventRecord,
    job_id: i64,
    job: &str,
    spec: &JobSpec,
    now: Instant,
) -> PgResult<Result<(FlowedRun, bool), FlowKeys>> {
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
        (
            FlowedRun {
                job: job.to_string(),
                run_id,
                outcome,
            },
            state == RunState::Queued,
        )
    };
    if let Some((key, _)) = &keys.dedup {
        if let Some((run_id, state)) = deduplicated(tx, job_id, key, now).await? {
            return Ok(Ok(went(run_id, state, FlowOutcome::Deduplicated)));
        }
    }
    if let Some((key, debounce)) = &keys.debounce {
        if let Some((run_id, state)) =
            absorbed_into(tx, job_id, key, debounce, Newest::Event(event), now).await?
        {
            return Ok(Ok(went(run_id, state, FlowOutcome::Absorbed)));
        }
    }
    Ok(Err(keys))
}

/// Writes what a run an event just started carries under its job's keys.
pub(super) async fn after_event_start(
    tx: &Tx<'_>,
    job_id: i64,
    run_id: i64,
    keys: &FlowKeys,
    now: Instant,
) -> PgResult<()> {
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
    .await
}

/// Deletes up to `limit` dedup and debounce rows of each table expired before `before`.
pub(super) async fn delete_expired(tx: &Tx<'_>, before: Instant, limit: u32) -> PgResult<u64> {
    let mut deleted = 0;
    for table in ["flow_dedup", "flow_debounce"] {
        let stmt = tx
            .prepare_cached(&format!(
                "DELETE FROM {table} WHERE (job_id, key) IN (SELECT job_id, key FROM {table} \
                 WHERE expires_at < $1 LIMIT $2)"
            ))
            .await?;
        deleted += tx
            .execute(&stmt, &[&micros(before), &i64::from(limit)])
            .await?;
    }
    Ok(deleted)
}
