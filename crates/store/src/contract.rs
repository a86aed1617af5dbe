//! The contract every [`Store`](crate::Store) implementation passes.
//!
//! Each check is a function over a fresh, empty store that panics when the store breaks a
//! promise of the trait. [`store_contract_tests!`](crate::store_contract_tests) turns the whole
//! list into named tests for one implementation, so SQLite and PostgreSQL run the same suite.
//! This module is test support: it is compiled into the library so other crates' tests can
//! use it, and nothing in production calls it.

use crate::*;
use chrono::{Duration as Span, TimeZone, Utc};
use sked_core::auth::{LabelRule, Role};
use sked_core::calendar::CalendarRecord;
use sked_core::job::JobSpec;
use sked_core::records::WorkerState;
use sked_core::run::{AttemptOutcome, AttemptState, WaitReason};
use sked_core::JobState;

/// Generates one `#[tokio::test]` per contract check. `$open` is an async function returning
/// `(store, guard)`: a fresh, empty store and whatever must live as long as it (a temporary
/// directory, a database handle).
///
/// `store_contract_tests!(postgres $open)` is for the PostgreSQL store, which needs a server
/// the machine may not have: the tests are reported as ignored unless the calling package was
/// built with the `sked_pg_tests` cfg (its build script sets it when `SKED_TEST_DATABASE_URL`
/// or `CI` is set), so a missing database never passes for green.
#[macro_export]
macro_rules! store_contract_tests {
    (postgres $open:path) => {
        $crate::store_contract_tests!(@checks postgres $open);
    };
    ($open:path) => {
        $crate::store_contract_tests!(@checks required $open);
    };
    (@checks $mode:ident $open:path) => {
        $crate::store_contract_tests!(@each $mode $open;
            put_creates_replaces_and_detects_no_change,
            every_change_keeps_a_version_and_runs_name_theirs,
            create_only_conflicts_and_writes_nothing,
            a_batch_of_jobs_is_written_whole_or_not_at_all,
            list_jobs_pages_searches_and_filters,
            a_bad_cursor_is_an_error,
            jobs_filter_by_schedule_kind_and_newest_run,
            pause_and_resume_keep_the_firing_state,
            each_instant_has_one_run,
            advances_apply_only_to_the_state_they_started_from,
            several_instants_of_a_job_in_one_batch_advance_in_their_order,
            a_used_up_schedule_completes_the_job,
            overlap_skip_and_buffers,
            overlap_cancel_running,
            the_runs_a_window_may_stop_are_found_and_asked_once_with_its_reason,
            runs_held_back_by_a_policy_since_allowed_are_released_by_the_reaper,
            a_sharded_instant_is_its_shards_decided_together,
            cancel_running_spares_the_shards_of_its_own_instant,
            a_dependant_waits_for_every_shard_of_its_upstream_instant,
            a_broadcast_is_one_pinned_run_per_live_worker_and_fails_where_its_worker_is_lost,
            manual_runs_ignore_overlap,
            skipped_runs_are_finished_with_their_reason,
            attempts_are_fenced_by_token_and_state,
            a_start_of_a_key_is_recorded_no_earlier_than_the_end_of_its_last_holder,
            a_batch_of_starts_is_answered_start_by_start,
            a_concurrency_key_holds_runs_at_its_limit_until_a_holder_ends,
            retries_follow_the_policy_then_fail,
            lost_attempts_are_requeued_without_spending_retries,
            heartbeats_extend_leases_and_relay_cancels,
            heartbeats_rewrite_only_the_leases_that_are_due,
            heartbeats_give_up_attempts_the_worker_never_got,
            a_drained_worker_learns_it_at_its_heartbeat_and_keeps_its_leases,
            workers_page_by_id_and_dead_ones_are_deleted,
            cancelling_queued_runs_releases_waiting_ones,
            output_is_capped_and_read_from_offsets,
            deleting_a_job_keeps_its_runs,
            runs_page_newest_first,
            stats_count_outcomes_and_lateness,
            retention_deletes_only_finished_runs,
            queued_runs_carry_dispatch_details,
            a_sweep_pages_through_the_runs_queued_before_an_instant,
            racing_writers_decide_once,
            scheduled_jobs_come_by_partition,
            tokens_are_found_by_hash_listed_by_name_and_revoked,
            token_use_is_recorded_and_never_goes_back,
            a_tokens_sessions_end_at_a_logout_and_never_come_back,
            audit_entries_list_newest_first_and_filter,
            audit_pages_reach_each_entry_once,
            audit_retention_deletes_the_oldest_first,
            workers_keep_their_namespaces_and_token,
            a_clean_stop_is_stopped_not_lost_and_takes_back_its_attempts,
            an_audited_write_commits_its_entries_with_it,
            namespace_settings_are_kept_listed_and_forgotten,
            namespace_settings_refuse_jobs_inside_the_write,
            namespace_secrets_are_kept_sealed_and_listed_without_values,
            calendars_are_versioned_listed_and_kept_per_namespace,
            a_calendar_in_use_is_deleted_only_when_forced,
            a_namespace_keeps_at_most_so_many_calendars,
            calendar_changes_are_audited_with_them_and_no_change_is_not,
            a_batch_writes_its_calendars_and_jobs_together_or_nothing,
            runs_remember_a_moved_instant_and_a_calendars_skip,
            dependencies_are_checked_when_written_and_deleted,
            a_namespaces_edges_are_read_whole_up_to_a_bound,
            a_dependant_waits_and_is_released_by_its_upstreams_outcome,
            a_window_counts_upstream_runs_around_the_instant,
            a_pipeline_runs_at_its_upstreams_instants,
            a_failed_upstream_skips_its_dependants_down_the_pipeline,
            any_of_waits_until_every_alternative_failed,
            dependency_waits_time_out,
            manual_runs_ignore_dependencies,
            racing_upstreams_create_one_dependant_run,
            one_completion_batch_moves_each_dependant_by_its_own_verdict,
            an_event_starts_one_run_per_event_of_its_key,
            triggers_meet_dedup_within_its_window,
            a_debounced_run_absorbs_triggers_and_starts_at_its_moved_ready_at,
            racing_triggers_with_one_dedup_key_make_one_run,
            events_meet_dedup_and_debounce,
            events_release_waits_and_succeeded_runs_emit_them,
            event_retention_deletes_the_oldest_first,
            an_events_run_is_not_lost_to_a_run_at_its_instant,
            backfilled_instants_each_run_once_in_turn,
            a_retried_run_reopens_with_its_skipped_dependants,
            auto_priority_ranks_by_the_jobs_downstream,
            a_runs_end_records_each_notification_once,
            recovered_follows_a_failure_and_a_namespace_default_applies,
            late_runs_are_found_waiting_and_at_their_end,
            a_namespaces_late_rule_reaches_only_the_jobs_that_follow_it,
            deadline_marks_are_merged_listed_and_told_once,
            a_keys_limit_holds_across_batches_and_frees_when_an_attempt_ends,
            rate_keys_and_named_limits_are_read_at_each_start,
            claims_are_exclusive_and_reports_under_a_lapsed_claim_change_nothing,
            a_heartbeat_run_waits_for_a_ping_and_fails_without_one,
            a_job_that_asks_is_named_in_its_completions,
            jobs_filter_by_a_routing_label,
            the_grid_reads_each_jobs_newest_runs_in_its_window,
            ended_runs_are_walked_in_the_order_they_ended,
            a_pipelines_runs_join_the_trace_of_the_run_that_made_them,
            a_triggered_run_joins_the_callers_trace,
            a_posted_events_runs_join_its_posters_trace,
        );
    };
    (@each required $open:path; $($check:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                let (store, _guard) = $open().await;
                $crate::contract::$check(&store).await;
            }
        )+
    };
    (@each postgres $open:path; $($check:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            #[cfg_attr(
                not(sked_pg_tests),
                ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
            )]
            async fn $check() {
                let (store, _guard) = $open().await;
                $crate::contract::$check(&store).await;
            }
        )+
    };
}

fn t0() -> Instant {
    Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap()
}

fn secs(n: i64) -> Span {
    Span::seconds(n)
}

/// A valid job from JSON, its schedule set at `epoch`.
pub fn job(name: &str, json: serde_json::Value, epoch: Instant) -> ValidJob {
    let spec: JobSpec = serde_json::from_value(json).expect("contract job JSON");
    spec.validate(Some(name), epoch)
        .expect("contract job is valid")
}

/// A batch of jobs and no calendar.
fn jobs_only(jobs: &[ValidJob]) -> Batch {
    Batch {
        calendars: Vec::new(),
        jobs: jobs.to_vec(),
    }
}

fn every_second(extra: serde_json::Value) -> serde_json::Value {
    let mut base = serde_json::json!({
        "schedule": {"every": "1s"},
        "target": {"shell": {"command": "true"}},
    });
    if let (Some(base), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            base.insert(k.clone(), v.clone());
        }
    }
    base
}

async fn put(store: &dyn Store, name: &str, json: serde_json::Value) -> JobRecord {
    store
        .put_job(
            "default",
            &job(name, json, t0()),
            PutMode::Upsert,
            t0(),
            Audit::none(),
        )
        .await
        .expect("put_job")
        .1
}

fn fire(job_id: i64, at: Instant) -> Fire {
    Fire {
        job_id,
        scheduled_for: at,
        trigger: Trigger::Schedule,
        skip: None,
        ready_at: at,
        advance: None,
        nominal_for: None,
        why: None,
    }
}

async fn fire_one(store: &dyn Store, f: Fire) -> FiredRun {
    let now = f.scheduled_for;
    let mut out = store
        .record_fires(&[f], now, Audit::none())
        .await
        .expect("record_fires");
    assert_eq!(out.runs.len(), 1);
    out.runs.remove(0)
}

async fn start(store: &dyn Store, run_id: i64, worker: &str, token: i64, now: Instant) -> i64 {
    let started = store
        .start_attempts(
            &[AttemptStart {
                run_id,
                worker_id: worker.to_string(),
                token,
                lease_expires_at: now + secs(10),
                flow: None,
            }],
            now,
        )
        .await
        .expect("start_attempts");
    started[0].as_ref().expect("the run was queued").attempt_id
}

/// A report by worker `w`, the worker most checks start their attempts on.
fn report(attempt_id: i64, token: i64, outcome: AttemptOutcome) -> AttemptReport {
    report_as("w", attempt_id, token, outcome)
}

fn report_as(worker: &str, attempt_id: i64, token: i64, outcome: AttemptOutcome) -> AttemptReport {
    AttemptReport {
        attempt_id,
        token,
        worker_id: worker.to_string(),
        outcome,
        exit_code: None,
        http_status: None,
        error: None,
    }
}

async fn complete(store: &dyn Store, r: AttemptReport, now: Instant) -> CompletionEffect {
    store
        .complete_attempts(&[r], now)
        .await
        .expect("complete_attempts")
        .remove(0)
}

async fn run(store: &dyn Store, run_id: i64) -> (RunRecord, Vec<AttemptRecord>) {
    store
        .get_run(run_id)
        .await
        .expect("get_run")
        .expect("the run exists")
}

async fn worker(store: &dyn Store, id: &str, now: Instant) {
    let w = NewWorker {
        id: id.to_string(),
        name: id.to_string(),
        labels: [("zone".to_string(), "eu".to_string())].into(),
        slots: 4,
        namespaces: vec!["*".into()],
        token_id: None,
        publisher: false,
    };
    store.register_worker(&w, now).await.expect("register");
}

pub async fn put_creates_replaces_and_detects_no_change(store: &dyn Store) {
    let v1 = job("a", every_second(serde_json::json!({})), t0());
    let (outcome, created) = store
        .put_job("default", &v1, PutMode::Upsert, t0(), Audit::none())
        .await
        .unwrap();
    assert_eq!(outcome, PutOutcome::Created);
    assert_eq!(created.name, "a");
    assert_eq!(created.state, JobState::Active);
    assert_eq!(created.next_fire_at, Some(t0() + secs(1)));
    assert_eq!(created.fired_count, 0);

    let later = t0() + secs(30);
    let (outcome, same) = store
        .put_job("default", &v1, PutMode::Upsert, later, Audit::none())
        .await
        .unwrap();
    assert_eq!(outcome, PutOutcome::Unchanged);
    assert_eq!(same, created, "an unchanged definition writes nothing");

    let v2 = job(
        "a",
        every_second(serde_json::json!({"description": "now described"})),
        later,
    );
    let (outcome, updated) = store
        .put_job("default", &v2, PutMode::Upsert, later, Audit::none())
        .await
        .unwrap();
    assert_eq!(outcome, PutOutcome::Updated);
    assert_eq!(updated.id, created.id);
    assert_eq!(updated.spec.description.as_deref(), Some("now described"));
    assert_eq!(
        (updated.schedule_epoch, updated.next_fire_at),
        (created.schedule_epoch, created.next_fire_at),
        "the same schedule keeps its place"
    );
    assert_eq!(updated.updated_at, later);

    let v3 = job(
        "a",
        serde_json::json!({"schedule": {"every": "1m"}, "target": {"shell": {"command": "true"}}}),
        later,
    );
    let (_, rescheduled) = store
        .put_job("default", &v3, PutMode::Upsert, later, Audit::none())
        .await
        .unwrap();
    assert_eq!(rescheduled.schedule_epoch, later);
    assert_eq!(rescheduled.next_fire_at, Some(later + secs(60)));

    assert_eq!(
        store.get_job("default", "a").await.unwrap(),
        Some(rescheduled.clone())
    );
    assert_eq!(
        store.get_job_by_id(created.id).await.unwrap(),
        Some(rescheduled)
    );
    assert_eq!(store.get_job("other", "a").await.unwrap(), None);
}

pub async fn every_change_keeps_a_version_and_runs_name_theirs(store: &dyn Store) {
    let at = |n: i64| t0() + secs(n);
    let command = |c: &str| serde_json::json!({"schedule": {"every": "1s"}, "target": {"shell": {"command": c}}});
    let (_, v1) = store
        .put_job(
            "default",
            &job("v", command("one"), at(0)),
            PutMode::Upsert,
            at(0),
            Audit::none(),
        )
        .await
        .unwrap();
    assert_eq!(v1.version, 1);
    let first = fire_one(store, fire(v1.id, at(1))).await;
    let (outcome, same) = store
        .put_job(
            "default",
            &job("v", command("one"), at(2)),
            PutMode::Upsert,
            at(2),
            Audit::none(),
        )
        .await
        .unwrap();
    assert_eq!(
        (outcome, same.version),
        (PutOutcome::Unchanged, 1),
        "no change, no version"
    );
    let (_, v2) = store
        .put_job(
            "default",
            &job("v", command("two"), at(3)),
            PutMode::Upsert,
            at(3),
            Audit::none(),
        )
        .await
        .unwrap();
    assert_eq!(v2.version, 2);
    let second = fire_one(store, fire(v2.id, at(4))).await;
    assert_eq!(run(store, first.run_id).await.0.job_version, Some(1));
    assert_eq!(run(store, second.run_id).await.0.job_version, Some(2));

    let versions = store.job_versions("default", "v").await.unwrap().unwrap();
    let kept: Vec<(u32, Instant)> = versions.iter().map(|v| (v.version, v.created_at)).collect();
    assert_eq!(
        kept,
        vec![(2, at(3)), (1, at(0))],
        "newest first, each when written"
    );
    assert_eq!(versions[0].spec, v2.spec);
    assert_eq!(versions[1].spec, v1.spec);
    assert_eq!(store.job_versions("default", "nope").await.unwrap(), None);
    assert_eq!(store.job_versions("other", "v").await.unwrap(), None);

    // `paused` is part of the definition: pausing is a version; pausing again is none.
    for _ in 0..2 {
        let paused = store
            .set_paused("default", "v", true, at(5), Audit::none())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((paused.version, paused.spec.paused), (3, true));
    }
    let versions = store.job_versions("default", "v").await.unwrap().unwrap();
    assert_eq!(versions.len(), 3);
    assert!(versions[0].spec.paused && !versions[1].spec.paused);

    // Only the newest KEPT_VERSIONS are kept.
    let kept_versions = crate::shared::KEPT_VERSIONS;
    for n in 4..=kept_versions + 5 {
        let (_, record) = store
            .put_job(
                "default",
                &job("v", command(&format!("v{n}")), at(10)),
                PutMode::Upsert,
                at(10),
                Audit::none(),
            )
            .await
            .unwrap();
        assert_eq!(record.version, n);
    }
    let versions = store.job_versions("default", "v").await.unwrap().unwrap();
    assert_eq!(versions.len() as u32, kept_versions);
    assert_eq!(versions[0].version, kept_versions + 5);
    assert_eq!(versions.last().unwrap().version, 6);

    // A job deleted and created again starts over.
    store
        .delete_job("default", "v", false, at(20), Audit::none())
        .await
        .unwrap();
    let (_, again) = store
        .put_job(
            "default",
            &job("v", command("new"), at(21)),
            PutMode::Upsert,
            at(21),
            Audit::none(),
        )
        .await
        .unwrap();
    assert_eq!(again.version, 1);
    let versions = store.job_versions("default", "v").await.unwrap().unwrap();
    assert_eq!(versions.len(), 1);
}

pub async fn create_only_conflicts_and_writes_nothing(store: &dyn Store) {
    let first = job("a", every_second(serde_json::json!({})), t0());
    store
        .put_job("default", &first, PutMode::CreateOnly, t0(), Audit::none())
        .await
        .unwrap();
    let second = job(
        "a",
        every_second(serde_json::json!({"description": "x"})),
        t0(),
    );
    let err = store
        .put_job("default", &second, PutMode::CreateOnly, t0(), Audit::none())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    let kept = store.get_job("default", "a").await.unwrap().unwrap();
    assert_eq!(kept.spec.description, None);
    // The same name in another namespace is another job.
    store
        .put_job("team-b", &second, PutMode::CreateOnly, t0(), Audit::none())
        .await
        .unwrap();
}

pub async fn a_batch_of_jobs_is_written_whole_or_not_at_all(store: &dyn Store) {
    let shell = |extra: serde_json::Value| every_second(extra);
    let extract = job("extract", shell(serde_json::json!({})), t0());
    let load = job(
        "load",
        serde_json::json!({"target": {"shell": {"command": "true"}}, "depends_on": [{"job": "extract"}]}),
        t0(),
    );
    let orphan = job(
        "orphan",
        serde_json::json!({"target": {"shell": {"command": "true"}}, "depends_on": [{"job": "missing"}]}),
        t0(),
    );
    // The second job is refused, so the first is not written either.
    let refused = store
        .apply(
            "default",
            &jobs_only(&[extract.clone(), orphan]),
            t0(),
            false,
            Audit::none(),
        )
        .await
        .expect_err("an unknown upstream");
    assert_eq!(refused.at, Some(BatchItem::Job(1)), "{refused:?}");
    assert!(
        matches!(refused.error, StoreError::Invalid(_)),
        "{refused:?}"
    );
    assert_eq!(store.get_job("default", "extract").await.unwrap(), None);
    assert!(store.job_namespaces(10).await.unwrap().is_empty());

    // A dry run answers what would happen, upstreams first, and writes nothing.
    let batch = jobs_only(&[extract.clone(), load.clone()]);
    let planned = store
        .apply("default", &batch, t0(), true, Audit::none())
        .await
        .unwrap()
        .jobs;
    let outcomes: Vec<PutOutcome> = planned.iter().map(|(o, _)| *o).collect();
    assert_eq!(outcomes, [PutOutcome::Created, PutOutcome::Created]);
    assert_eq!(store.get_job("default", "extract").await.unwrap(), None);

    let written = store
        .apply("default", &batch, t0(), false, Audit::none())
        .await
        .unwrap()
        .jobs;
    assert_eq!(written.len(), 2);
    assert_eq!(
        store.get_job("default", "load").await.unwrap(),
        Some(written[1].1.clone())
    );
    let again = store
        .apply("default", &batch, t0(), true, Audit::none())
        .await
        .unwrap()
        .jobs;
    assert!(again.iter().all(|(o, _)| *o == PutOutcome::Unchanged));

    // The namespaces that hold jobs, each once, in order.
    store
        .put_job("team-b", &extract, PutMode::Upsert, t0(), Audit::none())
        .await
        .unwrap();
    store
        .put_job("a-team", &extract, PutMode::Upsert, t0(), Audit::none())
        .await
        .unwrap();
    assert_eq!(
        store.job_namespaces(10).await.unwrap(),
        ["a-team", "default", "team-b"]
    );
    assert_eq!(
        store.job_namespaces(2).await.unwrap(),
        ["a-team", "default"]
    );
}

pub async fn list_jobs_pages_searches_and_filters(store: &dyn Store) {
    for i in 0..25 {
        let extra = if i % 5 == 0 {
            serde_json::json!({"description": "Nightly 100% report"})
        } else {
            serde_json::json!({})
        };
        put(store, &format!("job-{i:02}"), every_second(extra)).await;
    }
    put(store, "under_score", every_second(serde_json::json!({}))).await;
    store
        .set_paused("default", "job-03", true, t0(), Audit::none())
        .await
        .unwrap();

    let mut names = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list_jobs(&JobQuery {
                namespace: "default".into(),
                limit: 10,
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(page.items.len() <= 10);
        names.extend(page.items.into_iter().map(|j| j.name));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let mut expected: Vec<String> = (0..25).map(|i| format!("job-{i:02}")).collect();
    expected.push("under_score".into());
    assert_eq!(names, expected, "every job once, in name order");

    let desc = store
        .list_jobs(&JobQuery {
            namespace: "default".into(),
            descending: true,
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let first_two: Vec<_> = desc.items.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(first_two, ["under_score", "job-24"]);

    let by_created = store
        .list_jobs(&JobQuery {
            namespace: "default".into(),
            sort: JobSort::CreatedAt,
            limit: 20,
            ..Default::default()
        })
        .await
        .unwrap();
    let rest = store
        .list_jobs(&JobQuery {
            namespace: "default".into(),
            sort: JobSort::CreatedAt,
            limit: 20,
            cursor: by_created.next_cursor.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_created.items.len() + rest.items.len(), 26);
    assert!(rest.next_cursor.is_none());

    let search = |text: &str| JobQuery {
        namespace: "default".into(),
        search: Some(text.into()),
        limit: 100,
        ..Default::default()
    };
    let nightly = store.list_jobs(&search("NIGHTLY 100%")).await.unwrap();
    assert_eq!(nightly.items.len(), 5, "case-insensitive, in descriptions");
    let underscore = store.list_jobs(&search("_")).await.unwrap();
    assert_eq!(underscore.items.len(), 1, "'_' is literal, not a wildcard");
    let paused = store
        .list_jobs(&JobQuery {
            namespace: "default".into(),
            state: Some(JobState::Paused),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(paused.items.len(), 1);
    assert_eq!(paused.items[0].name, "job-03");
    let other = store
        .list_jobs(&JobQuery {
            namespace: "other".into(),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(other.items.is_empty());
}

pub async fn jobs_filter_by_schedule_kind_and_newest_run(store: &dyn Store) {
    let every = put(store, "every", every_second(serde_json::json!({}))).await;
    let cron =
        serde_json::json!({"schedule": {"cron": "0 0 * * * *", "timezone": "Europe/London"}});
    let cron = put(store, "cron", every_second(cron)).await;
    let manual = serde_json::json!({"target": {"shell": {"command": "true"}}});
    put(store, "manual", manual).await;
    let at = serde_json::json!({"schedule": {"at": "2030-01-01T00:00:00Z"}});
    put(store, "at", every_second(at)).await;
    let month_end =
        serde_json::json!({"schedule": {"business_day": {"nth": -1}, "calendar": "ny"}});
    put(store, "month-end", every_second(month_end)).await;
    // `every` ends with a queued run after a cancelled one; `cron` with a cancelled run after
    // a queued one (instants decide which is newest, not ids); `manual` has none.
    let older = fire_one(store, fire(every.id, t0() + secs(1))).await;
    store
        .cancel_run(older.run_id, t0() + secs(2), Audit::none())
        .await
        .unwrap();
    fire_one(store, fire(every.id, t0() + secs(3))).await;
    let newer = fire_one(store, fire(cron.id, t0() + secs(3))).await;
    fire_one(store, fire(cron.id, t0() + secs(1))).await;
    store
        .cancel_run(newer.run_id, t0() + secs(4), Audit::none())
        .await
        .unwrap();

    let names = |query: JobQuery| async move {
        let page = store.list_jobs(&query).await.unwrap();
        page.items.into_iter().map(|j| j.name).collect::<Vec<_>>()
    };
    let of_kind = |kind| JobQuery {
        namespace: "default".into(),
        kind: Some(kind),
        limit: 100,
        ..Default::default()
    };
    assert_eq!(names(of_kind(ScheduleKind::Every)).await, ["every"]);
    assert_eq!(names(of_kind(ScheduleKind::Cron)).await, ["cron"]);
    assert_eq!(names(of_kind(ScheduleKind::At)).await, ["at"]);
    assert_eq!(
        names(of_kind(ScheduleKind::BusinessDay)).await,
        ["month-end"]
    );
    assert!(names(of_kind(ScheduleKind::EveryBusinessDays))
        .await
        .is_empty());
    assert_eq!(names(of_kind(ScheduleKind::Manual)).await, ["manual"]);
    assert!(names(of_kind(ScheduleKind::Event)).await.is_empty());
    let last = |state| JobQuery {
        namespace: "default".into(),
        last: Some(state),
        limit: 100,
        ..Default::default()
    };
    assert_eq!(names(last(RunState::Queued)).await, ["every"]);
    assert_eq!(names(last(RunState::Cancelled)).await, ["cron"]);
    assert!(names(last(RunState::Succeeded)).await.is_empty());
    // Both at once, with paging.
    let both = JobQuery {
        namespace: "default".into(),
        kind: Some(ScheduleKind::Every),
        last: Some(RunState::Queued),
        limit: 1,
        ..Default::default()
    };
    let page = store.list_jobs(&both).await.unwrap();
    assert_eq!(page.items.len(), 1);
    assert!(page.next_cursor.is_none());
}

pub async fn a_bad_cursor_is_an_error(store: &dyn Store) {
    let err = store
        .list_jobs(&JobQuery {
            namespace: "default".into(),
            cursor: Some("not-a-cursor".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidCursor(_)), "{err:?}");
    let err = store
        .list_runs(&RunQuery {
            namespace: "default".into(),
            cursor: Some("t.1.61".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidCursor(_)), "{err:?}");
}

pub async fn pause_and_resume_keep_the_firing_state(store: &dyn Store) {
    let created = put(store, "p", every_second(serde_json::json!({}))).await;
    let paused = store
        .set_paused("default", "p", true, t0() + secs(5), Audit::none())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(paused.state, JobState::Paused);
    assert!(paused.spec.paused);
    assert_eq!(paused.next_fire_at, created.next_fire_at);
    let stored = store.get_job("default", "p").await.unwrap().unwrap();
    assert_eq!(stored.state, JobState::Paused);
    let resumed = store
        .set_paused("default", "p", false, t0() + secs(6), Audit::none())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resumed.state, JobState::Active);
    assert!(!resumed.spec.paused);
    assert_eq!(
        store
            .set_paused("default", "nope", true, t0(), Audit::none())
            .await
            .unwrap(),
        None
    );
    let scheduled = store.scheduled_jobs(None, 0, 100).await.unwrap();
    assert_eq!(scheduled.len(), 1);
}

pub async fn each_instant_has_one_run(store: &dyn Store) {
    let j = put(store, "once", every_second(serde_json::json!({}))).await;
    let at = t0() + secs(1);
    let first = fire_one(store, fire(j.id, at)).await;
    assert!(first.inserted);
    assert_eq!(first.state, RunState::Queued);
    let again = fire_one(store, fire(j.id, at)).await;
    assert!(!again.inserted, "a second write of an instant is a no-op");
    assert_eq!(again.run_id, first.run_id);
    // Twice in one batch, too.
    let next = t0() + secs(2);
    let out = store
        .record_fires(&[fire(j.id, next), fire(j.id, next)], next, Audit::none())
        .await
        .unwrap();
    assert!(out.runs[0].inserted && !out.runs[1].inserted);
    assert_eq!(out.runs[0].run_id, out.runs[1].run_id);
    let page = store
        .list_runs(&RunQuery {
            namespace: "default".into(),
            job: Some("once".into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 2);
    let (r, attempts) = run(store, first.run_id).await;
    assert_eq!(
        (r.scheduled_for, r.job_id, r.job.as_str()),
        (at, j.id, "once")
    );
    assert_eq!(r.trigger, Trigger::Schedule);
    assert!(attempts.is_empty());
}

pub async fn advances_apply_only_to_the_state_they_started_from(store: &dyn Store) {
    let j = put(store, "adv", every_second(serde_json::json!({}))).await;
    let at = t0() + secs(1);
    let advance = Advance {
        epoch: j.schedule_epoch,
        fired_before: 0,
        next_fire_at: Some(at + secs(1)),
    };
    let mut f = fire(j.id, at);
    f.advance = Some(advance);
    let applied = fire_one(store, f.clone()).await;
    assert!(applied.advanced);
    let after = store.get_job_by_id(j.id).await.unwrap().unwrap();
    assert_eq!(
        (after.fired_count, after.next_fire_at),
        (1, Some(at + secs(1)))
    );
    // The same advance again (a second node, a stale loop) changes nothing.
    let stale = fire_one(store, f).await;
    assert!(!stale.advanced && !stale.inserted);
    let still = store.get_job_by_id(j.id).await.unwrap().unwrap();
    assert_eq!(still.fired_count, 1);
    // A changed definition restarts the schedule; the old loop's advance no longer applies.
    let changed = job(
        "adv",
        serde_json::json!({"schedule": {"every": "5s"}, "target": {"shell": {"command": "true"}}}),
        t0() + secs(3),
    );
    store
        .put_job(
            "default",
            &changed,
            PutMode::Upsert,
            t0() + secs(3),
            Audit::none(),
        )
        .await
        .unwrap();
    let mut old_loop = fire(j.id, at + secs(1));
    old_loop.advance = Some(Advance {
        epoch: j.schedule_epoch,
        fired_before: 1,
        next_fire_at: Some(at + secs(2)),
    });
    assert!(!fire_one(store, old_loop).await.advanced);
    let fresh = store.get_job_by_id(j.id).await.unwrap().unwrap();
    assert_eq!(fresh.fired_count, 0);
    assert_eq!(fresh.next_fire_at, Some(t0() + secs(8)));
}

/// A catch-up batch: several instants of each job in one `record_fires`. Each fire's advance
/// applies in the batch's order, only while the job's firing state is the one that fire
/// started from, exactly as one batch per fire would.
pub async fn several_instants_of_a_job_in_one_batch_advance_in_their_order(store: &dyn Store) {
    let (a, b, c) = (
        put(store, "catch-a", every_second(serde_json::json!({}))).await,
        put(store, "catch-b", every_second(serde_json::json!({}))).await,
        put(store, "catch-c", every_second(serde_json::json!({}))).await,
    );
    let at = |i: i64| t0() + secs(i);
    let advancing = |j: &JobRecord, i: i64, fired_before: u64| {
        let mut f = fire(j.id, at(i));
        f.advance = Some(Advance {
            epoch: j.schedule_epoch,
            fired_before,
            next_fire_at: Some(at(i + 1)),
        });
        f
    };
    // c's first instant is in the ledger already (another node's fire): it is not written
    // again, but its advance still applies.
    fire_one(store, fire(c.id, at(1))).await;
    let batch = vec![
        advancing(&a, 1, 0),
        advancing(&b, 1, 0),
        advancing(&c, 1, 0),
        advancing(&a, 2, 1),
        // A stale loop's instant of b: not advanced, and the next one still is.
        advancing(&b, 2, 7),
        advancing(&c, 2, 1),
        advancing(&a, 3, 2),
        advancing(&b, 3, 1),
    ];
    let out = store
        .record_fires(&batch, at(4), Audit::none())
        .await
        .expect("record_fires");
    let seen: Vec<(bool, bool)> = out.runs.iter().map(|r| (r.inserted, r.advanced)).collect();
    assert_eq!(
        seen,
        vec![
            (true, true),
            (true, true),
            (false, true),
            (true, true),
            (true, false),
            (true, true),
            (true, true),
            (true, true),
        ]
    );
    assert!(out.runs.iter().all(|r| r.state == RunState::Queued));
    for (j, fired, next) in [(&a, 3, at(4)), (&b, 2, at(4)), (&c, 2, at(3))] {
        let after = store.get_job_by_id(j.id).await.unwrap().unwrap();
        assert_eq!(
            (after.fired_count, after.next_fire_at),
            (fired, Some(next)),
            "{}",
            j.name
        );
    }
    // Each run is its own instant's, and each instant has one.
    for (f, r) in batch.iter().zip(&out.runs) {
        let (run, _) = run(store, r.run_id).await;
        assert_eq!((run.job_id, run.scheduled_for), (f.job_id, f.scheduled_for));
    }
    let page = store
        .list_runs(&RunQuery {
            namespace: "default".into(),
            job: Some("catch-a".into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 3);
}

pub async fn a_used_up_schedule_completes_the_job(store: &dyn Store) {
    let at = t0() + secs(10);
    let j = put(
        store,
        "one-off",
        serde_json::json!({"schedule": {"at": at}, "target": {"shell": {"command": "true"}}}),
    )
    .await;
    assert_eq!(j.next_fire_at, Some(at));
    let mut f = fire(j.id, at);
    f.advance = Some(Advance {
        epoch: j.schedule_epoch,
        fired_before: 0,
        next_fire_at: None,
    });
    assert!(fire_one(store, f).await.advanced);
    let done = store.get_job_by_id(j.id).await.unwrap().unwrap();
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.next_fire_at, None);
    assert!(store.scheduled_jobs(None, 0, 100).await.unwrap().is_empty());
    // Pausing a completed job keeps it completed.
    let paused = store
        .set_paused("default", "one-off", true, at, Audit::none())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(paused.state, JobState::Completed);
}

pub async fn overlap_skip_and_buffers(store: &dyn Store) {
    for (policy, expected) in [
        ("allow", [RunState::Queued, RunState::Queued]),
        ("skip", [RunState::Skipped, RunState::Skipped]),
        ("buffer_one", [RunState::Waiting, RunState::Skipped]),
        ("buffer_all", [RunState::Waiting, RunState::Waiting]),
    ] {
        let j = put(
            store,
            &format!("ov-{policy}"),
            every_second(serde_json::json!({"overlap": policy})),
        )
        .await;
        let first = fire_one(store, fire(j.id, t0() + secs(1))).await;
        assert_eq!(first.state, RunState::Queued, "{policy}: idle job");
        start(store, first.run_id, "w", 7, t0() + secs(1)).await;
        let second = fire_one(store, fire(j.id, t0() + secs(2))).await;
        let third = fire_one(store, fire(j.id, t0() + secs(3))).await;
        assert_eq!([second.state, third.state], expected, "{policy}");
        if policy == "skip" {
            let (r, _) = run(store, second.run_id).await;
            assert_eq!(r.skip_reason, Some(SkipReason::Overlap));
        }
        if policy == "buffer_all" {
            // Finishing the active run releases the waiting ones one at a time, oldest first.
            let (_, attempts) = run(store, first.run_id).await;
            let effect = complete(
                store,
                report(attempts[0].id, 7, AttemptOutcome::Succeeded),
                t0() + secs(4),
            )
            .await;
            assert!(
                matches!(
                    &effect,
                    CompletionEffect::Accepted { run_id, run_state: RunState::Succeeded, requeued, .. }
                        if *run_id == first.run_id && *requeued == vec![second.run_id]
                ),
                "{effect:?}"
            );
            assert_eq!(run(store, third.run_id).await.0.state, RunState::Waiting);
        }
    }
}

/// A completion releases runs held back by overlap only for a job whose policy holds runs back
/// (`allow` holds none, and its completions read and lock nothing for it); runs left waiting
/// when the policy became `allow` are released by the reaper's next pass.
pub async fn runs_held_back_by_a_policy_since_allowed_are_released_by_the_reaper(
    store: &dyn Store,
) {
    let j = put(
        store,
        "became-allow",
        every_second(serde_json::json!({"overlap": "buffer_all"})),
    )
    .await;
    worker(store, "held", t0()).await;
    let first = fire_one(store, fire(j.id, t0() + secs(1))).await;
    let attempt = start(store, first.run_id, "held", 5, t0() + secs(1)).await;
    let second = fire_one(store, fire(j.id, t0() + secs(2))).await;
    assert_eq!(second.state, RunState::Waiting);
    // Nothing held back, nothing to release: the reaper's pass leaves a waiting run alone
    // while its job has a run active.
    let quiet = store.reap(t0(), t0() + secs(2)).await.unwrap();
    assert!(quiet.requeued.is_empty(), "{quiet:?}");
    put(
        store,
        "became-allow",
        every_second(serde_json::json!({"overlap": "allow"})),
    )
    .await;
    let effect = complete(
        store,
        report_as("held", attempt, 5, AttemptOutcome::Succeeded),
        t0() + secs(3),
    )
    .await;
    assert!(
        matches!(
            &effect,
            CompletionEffect::Accepted { run_state: RunState::Succeeded, requeued, .. }
                if requeued.is_empty()
        ),
        "{effect:?}"
    );
    assert_eq!(run(store, second.run_id).await.0.state, RunState::Waiting);
    let reaped = store.reap(t0(), t0() + secs(4)).await.unwrap();
    assert_eq!(reaped.requeued, vec![second.run_id]);
    assert_eq!(run(store, second.run_id).await.0.state, RunState::Queued);
    let again = store.reap(t0(), t0() + secs(5)).await.unwrap();
    assert!(again.requeued.is_empty(), "{again:?}");
}

pub async fn overlap_cancel_running(store: &dyn Store) {
    let j = put(
        store,
        "cr",
        every_second(serde_json::json!({"overlap": "cancel_running"})),
    )
    .await;
    let first = fire_one(store, fire(j.id, t0() + secs(1))).await;
    let attempt = start(store, first.run_id, "w", 9, t0() + secs(1)).await;
    let second = fire_one(store, fire(j.id, t0() + secs(2))).await;
    let out = store
        .record_fires(&[fire(j.id, t0() + secs(3))], t0() + secs(3), Audit::none())
        .await
        .unwrap();
    assert_eq!(out.runs[0].state, RunState::Queued);
    assert_eq!(out.cancel_requested, vec![first.run_id]);
    assert_eq!(second.state, RunState::Queued);
    assert_eq!(
        run(store, second.run_id).await.0.state,
        RunState::Cancelled,
        "a queued run is cancelled by the newer one"
    );
    let (r, _) = run(store, first.run_id).await;
    assert!(r.cancel_requested);
    // The stopped attempt reports failure; the run still ends cancelled.
    let effect = complete(
        store,
        report(attempt, 9, AttemptOutcome::Failed),
        t0() + secs(4),
    )
    .await;
    assert!(matches!(
        effect,
        CompletionEffect::Accepted {
            run_state: RunState::Cancelled,
            ..
        }
    ));
}

/// Running runs of jobs with a `cancel_running` window, or of the namespaces given, are found
/// (not those started by hand, not queued ones, not one already asked to stop); `stop_runs`
/// asks each once, and the run ends cancelled with the reason it was asked with. A user's
/// cancel still ends with the worker's word.
pub async fn the_runs_a_window_may_stop_are_found_and_asked_once_with_its_reason(
    store: &dyn Store,
) {
    let window = serde_json::json!({"blackouts": [{
        "from": "2030-01-01T00:00:00Z", "to": "2030-01-02T00:00:00Z",
        "reason": "Freeze", "cancel_running": true,
    }]});
    let stopping = put(store, "stopping", every_second(window)).await;
    let quiet = put(store, "quiet", every_second(serde_json::json!({}))).await;
    let elsewhere = store
        .put_job(
            "paused",
            &job("elsewhere", every_second(serde_json::json!({})), t0()),
            PutMode::Upsert,
            t0(),
            Audit::none(),
        )
        .await
        .unwrap()
        .1;
    let at = t0() + secs(1);
    let mut running = Vec::new();
    for (i, job_id) in [stopping.id, quiet.id, elsewhere.id]
        .into_iter()
        .enumerate()
    {
        let fired = fire_one(store, fire(job_id, at)).await;
        let token = i64::try_from(i).unwrap() + 1;
        running.push((
            fired.run_id,
            start(store, fired.run_id, "w", token, at).await,
            token,
        ));
    }
    let mut manual = fire(stopping.id, at + Span::milliseconds(500));
    manual.trigger = Trigger::Manual;
    let by_hand = fire_one(store, manual).await;
    start(store, by_hand.run_id, "w", 9, at).await;
    fire_one(store, fire(stopping.id, at + secs(1))).await;

    let namespaces = vec!["paused".to_string()];
    let found = store.runs_under_windows(&namespaces, 0, 100).await.unwrap();
    let ids: Vec<i64> = found.iter().map(|r| r.run_id).collect();
    assert_eq!(ids, [running[0].0, running[2].0], "{found:?}");
    assert_eq!(
        (&found[0].job, found[0].trigger, found[0].started_at),
        (&"stopping".to_string(), Trigger::Schedule, at)
    );
    assert!(found[0].blackouts[0].cancel_running);
    assert_eq!(
        (found[1].namespace.as_str(), found[1].blackouts.len()),
        ("paused", 0)
    );
    // A page at a time, and without the namespace only the job with the window.
    let first = store.runs_under_windows(&namespaces, 0, 1).await.unwrap();
    let next = store
        .runs_under_windows(&namespaces, first[0].run_id, 1)
        .await
        .unwrap();
    assert_eq!((first[0].run_id, next[0].run_id), (ids[0], ids[1]));
    let alone = store.runs_under_windows(&[], 0, 100).await.unwrap();
    assert_eq!(alone.len(), 1);

    // Asked once; then no longer found.
    let reason = "cancelled by a blackout window: Freeze".to_string();
    let stops = [
        (ids[0], reason.clone()),
        (by_hand.run_id + 1000, reason.clone()),
    ];
    assert_eq!(store.stop_runs(&stops).await.unwrap(), [ids[0]]);
    assert!(store.stop_runs(&stops).await.unwrap().is_empty());
    assert!(run(store, ids[0]).await.0.cancel_requested);
    let left = store.runs_under_windows(&namespaces, 0, 100).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].run_id, ids[1]);

    // The worker stops it: cancelled, with the window's reason.
    let (run_id, attempt, token) = running[0];
    let effect = complete(
        store,
        report(attempt, token, AttemptOutcome::Cancelled),
        at + secs(2),
    )
    .await;
    assert!(matches!(
        effect,
        CompletionEffect::Accepted {
            run_state: RunState::Cancelled,
            ..
        }
    ));
    let (stopped, _) = run(store, run_id).await;
    assert_eq!(stopped.error.as_deref(), Some(reason.as_str()));

    // A user's cancel of a running run ends with what the worker says, as before.
    let (run_id, attempt, token) = running[1];
    store
        .cancel_run(run_id, at + secs(2), Audit::none())
        .await
        .unwrap();
    complete(
        store,
        report(attempt, token, AttemptOutcome::Cancelled),
        at + secs(3),
    )
    .await;
    let (cancelled, _) = run(store, run_id).await;
    assert_eq!(
        (cancelled.state, cancelled.error.as_deref()),
        (RunState::Cancelled, Some("cancelled"))
    );
}

/// The shard each of `runs` is, in order.
async fn shards_of(store: &dyn Store, runs: impl Iterator<Item = i64>) -> Vec<(RunState, u16)> {
    let mut found = Vec::new();
    for id in runs {
        let (r, _) = run(store, id).await;
        let shard = r.shard.expect("a sharded job's run knows its shard");
        assert_eq!(shard.count, 3, "run {id}");
        found.push((r.state, shard.index));
    }
    found
}

pub async fn a_sharded_instant_is_its_shards_decided_together(store: &dyn Store) {
    let j = put(
        store,
        "sharded",
        every_second(serde_json::json!({"shards": 3, "overlap": "buffer_one"})),
    )
    .await;
    let first = fire_one(store, fire(j.id, t0() + secs(1))).await;
    let queued = RunState::Queued;
    assert_eq!(
        shards_of(store, first.all_runs()).await,
        [(queued, 0), (queued, 1), (queued, 2)]
    );
    // The instant again: nothing is written, the first shard answers for it.
    let again = fire_one(store, fire(j.id, t0() + secs(1))).await;
    assert_eq!((again.inserted, again.run_id), (false, first.run_id));
    assert!(again.other_shards.is_empty());
    let ids: Vec<i64> = first.all_runs().collect();
    let dispatched = store.queued_runs(Some(&ids)).await.unwrap();
    let places: Vec<Option<u16>> = dispatched
        .iter()
        .map(|q| q.shard.map(|s| s.index))
        .collect();
    assert_eq!(places, [Some(0), Some(1), Some(2)]);
    let mut attempts = Vec::new();
    for id in &ids {
        attempts.push(start(store, *id, "w", 5, t0() + secs(1)).await);
    }
    // The next instant waits behind the running one, every shard of it; the one after is
    // skipped whole (buffer_one holds a single instant).
    let second = fire_one(store, fire(j.id, t0() + secs(2))).await;
    let waiting = RunState::Waiting;
    assert_eq!(
        shards_of(store, second.all_runs()).await,
        [(waiting, 0), (waiting, 1), (waiting, 2)]
    );
    let third = fire_one(store, fire(j.id, t0() + secs(3))).await;
    let skipped = RunState::Skipped;
    assert_eq!(
        shards_of(store, third.all_runs()).await,
        [(skipped, 0), (skipped, 1), (skipped, 2)]
    );
    // Shards ending one by one release nothing until the whole instant has ended; then the
    // waiting instant is queued whole.
    let mut released = Vec::new();
    for attempt in attempts {
        let effect = complete(
            store,
            report(attempt, 5, AttemptOutcome::Succeeded),
            t0() + secs(4),
        )
        .await;
        let CompletionEffect::Accepted { requeued, .. } = effect else {
            panic!("refused: {effect:?}");
        };
        released.push(requeued);
    }
    let second_runs: Vec<i64> = second.all_runs().collect();
    assert_eq!(released, [vec![], vec![], second_runs.clone()]);
    assert_eq!(
        shards_of(store, second.all_runs()).await,
        [(queued, 0), (queued, 1), (queued, 2)]
    );
}

pub async fn cancel_running_spares_the_shards_of_its_own_instant(store: &dyn Store) {
    let j = put(
        store,
        "sharded-cr",
        every_second(serde_json::json!({"shards": 3, "overlap": "cancel_running"})),
    )
    .await;
    let first = fire_one(store, fire(j.id, t0() + secs(1))).await;
    start(store, first.run_id, "w", 3, t0() + secs(1)).await;
    let out = store
        .record_fires(&[fire(j.id, t0() + secs(2))], t0() + secs(2), Audit::none())
        .await
        .unwrap();
    let second = &out.runs[0];
    assert_eq!(out.cancel_requested, vec![first.run_id]);
    let (cancelled, queued) = (RunState::Cancelled, RunState::Queued);
    assert_eq!(
        shards_of(store, first.other_shards.iter().copied()).await,
        [(cancelled, 1), (cancelled, 2)],
        "the older instant's unstarted shards are cancelled"
    );
    assert_eq!(
        shards_of(store, second.all_runs()).await,
        [(queued, 0), (queued, 1), (queued, 2)],
        "none of the new instant's shards is in its own way"
    );
}

pub async fn a_dependant_waits_for_every_shard_of_its_upstream_instant(store: &dyn Store) {
    let extract = put(
        store,
        "extract",
        every_second(serde_json::json!({"shards": 2})),
    )
    .await;
    // A dependant without a schedule, itself split in three.
    let mut transform = step(serde_json::json!([{ "job": "extract" }]));
    transform["shards"] = serde_json::json!(3);
    put(store, "transform", transform).await;
    let at = t0() + secs(1);
    let e = fire_one(store, fire(extract.id, at)).await;
    let (_, requeued) = finish(store, e.run_id, AttemptOutcome::Succeeded, at).await;
    assert!(requeued.is_empty(), "one shard of two is not the instant");
    let waiting: Vec<(RunState, u16)> = runs_of(store, "transform")
        .await
        .iter()
        .map(|r| (r.state, r.shard.map_or(99, |s| s.index)))
        .collect();
    let w = RunState::Waiting;
    assert_eq!(waiting, [(w, 0), (w, 1), (w, 2)]);
    let (_, requeued) = finish(store, e.other_shards[0], AttemptOutcome::Succeeded, at).await;
    let transform_runs: Vec<i64> = runs_of(store, "transform")
        .await
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(
        requeued, transform_runs,
        "every shard succeeded: all three go"
    );
    // One shard failing dooms the instant, but only once its other shards have ended.
    let later = t0() + secs(2);
    let e = fire_one(store, fire(extract.id, later)).await;
    finish(store, e.run_id, AttemptOutcome::Failed, later).await;
    let at_later = |runs: Vec<RunRecord>| -> Vec<RunState> {
        runs.into_iter()
            .filter(|r| r.scheduled_for == later)
            .map(|r| r.state)
            .collect()
    };
    assert_eq!(at_later(runs_of(store, "transform").await), [w, w, w]);
    finish(store, e.other_shards[0], AttemptOutcome::Succeeded, later).await;
    let runs = runs_of(store, "transform").await;
    let skipped: Vec<_> = runs
        .iter()
        .filter(|r| r.scheduled_for == later)
        .map(|r| (r.state, r.skip_reason))
        .collect();
    let s = (RunState::Skipped, Some(SkipReason::UpstreamFailed));
    assert_eq!(skipped, [s, s, s]);
}

pub async fn a_broadcast_is_one_pinned_run_per_live_worker_and_fails_where_its_worker_is_lost(
    store: &dyn Store,
) {
    let j = put(
        store,
        "everywhere",
        every_second(serde_json::json!({"broadcast": true, "routing": {"labels": {"zone": "eu"}}})),
    )
    .await;
    // Nobody yet: the instant is one run, for whoever comes first.
    let alone = fire_one(store, fire(j.id, t0() + secs(1))).await;
    assert!(alone.placed && alone.other_shards.is_empty());
    let (r, _) = run(store, alone.run_id).await;
    assert_eq!(
        (r.state, r.shard, r.pinned_worker),
        (RunState::Queued, None, None)
    );
    // w-a and w-b (zone eu) are live; w-c is elsewhere, w-d draining.
    worker(store, "w-a", t0() + secs(10)).await;
    worker(store, "w-b", t0()).await;
    worker(store, "w-d", t0() + secs(10)).await;
    store.drain_worker("w-d", Audit::none()).await.unwrap();
    let us = NewWorker {
        id: "w-c".into(),
        name: "w-c".into(),
        labels: [("zone".to_string(), "us".to_string())].into(),
        slots: 4,
        namespaces: vec!["*".into()],
        token_id: None,
        publisher: false,
    };
    store.register_worker(&us, t0() + secs(10)).await.unwrap();
    let fired = fire_one(store, fire(j.id, t0() + secs(2))).await;
    let ids: Vec<i64> = fired.all_runs().collect();
    let dispatched = store.queued_runs(Some(&ids)).await.unwrap();
    let places: Vec<(Option<u16>, Option<&str>)> = dispatched
        .iter()
        .map(|q| (q.shard.map(|s| s.index), q.pinned_worker.as_deref()))
        .collect();
    assert_eq!(places, [(Some(0), Some("w-a")), (Some(1), Some("w-b"))]);
    // w-a runs its share; w-b goes silent before it ran its own.
    let attempt = start(store, ids[0], "w-a", 4, t0() + secs(11)).await;
    let reaped = store.reap(t0() + secs(5), t0() + secs(12)).await.unwrap();
    assert_eq!(reaped.dead_workers, ["w-b"]);
    assert_eq!(reaped.failed, [ids[1]]);
    let (lost_share, _) = run(store, ids[1]).await;
    assert_eq!(lost_share.state, RunState::Failed);
    assert_eq!(
        lost_share.error.as_deref(),
        Some("worker w-b was lost before it ran its share of the broadcast")
    );
    let effect = complete(
        store,
        report_as("w-a", attempt, 4, AttemptOutcome::Succeeded),
        t0() + secs(12),
    )
    .await;
    assert!(matches!(
        effect,
        CompletionEffect::Accepted {
            run_state: RunState::Succeeded,
            ..
        }
    ));
    // A second pass finds nothing more to fail.
    let again = store.reap(t0() + secs(5), t0() + secs(13)).await.unwrap();
    assert!(again.failed.is_empty(), "{again:?}");
}

pub async fn manual_runs_ignore_overlap(store: &dyn Store) {
    let j = put(
        store,
        "m",
        every_second(serde_json::json!({"overlap": "skip"})),
    )
    .await;
    let first = fire_one(store, fire(j.id, t0() + secs(1))).await;
    start(store, first.run_id, "w", 1, t0() + secs(1)).await;
    let mut manual = fire(j.id, t0() + secs(1) + Span::milliseconds(500));
    manual.trigger = Trigger::Manual;
    let fired = fire_one(store, manual).await;
    assert_eq!(fired.state, RunState::Queued);
    assert_eq!(run(store, fired.run_id).await.0.trigger, Trigger::Manual);
}

pub async fn skipped_runs_are_finished_with_their_reason(store: &dyn Store) {
    let j = put(store, "s", every_second(serde_json::json!({}))).await;
    for (i, reason) in [SkipReason::Paused, SkipReason::Misfire]
        .into_iter()
        .enumerate()
    {
        let mut f = fire(j.id, t0() + secs(i as i64 + 1));
        f.skip = Some(reason);
        let fired = fire_one(store, f).await;
        assert_eq!(fired.state, RunState::Skipped);
        let (r, _) = run(store, fired.run_id).await;
        assert_eq!(r.skip_reason, Some(reason));
        assert!(r.finished_at.is_some(), "a skipped run has ended");
    }
    assert!(store.queued_runs(None).await.unwrap().is_empty());
}

/// A concurrency key admits runs in the batch's order up to its limit and holds the rest; a
/// run no longer queued spends nothing of it; a holder that ended frees its place for the
/// next batch.
pub async fn a_concurrency_key_holds_runs_at_its_limit_until_a_holder_ends(store: &dyn Store) {
    let j = put(store, "keyed", every_second(serde_json::json!({}))).await;
    let now = t0() + secs(5);
    let [a, b, c] = [1, 2, 3].map(|n| t0() + secs(n));
    let (a, b, c) = (
        fire_one(store, fire(j.id, a)).await.run_id,
        fire_one(store, fire(j.id, b)).await.run_id,
        fire_one(store, fire(j.id, c)).await.run_id,
    );
    let mut skipped = fire(j.id, t0() + secs(4));
    skipped.skip = Some(SkipReason::Paused);
    let ended = fire_one(store, skipped).await.run_id;
    let gates = sked_core::flow::Gates {
        concurrency: vec![sked_core::flow::ConcurrencyGate {
            key: "k".into(),
            limit: sked_core::flow::Bound::Own(2),
        }],
        rate: Vec::new(),
    };
    let start_as = |run_id: i64, token: i64| AttemptStart {
        run_id,
        worker_id: "w1".to_string(),
        token,
        lease_expires_at: now + secs(10),
        flow: Some(FlowClaim {
            namespace: "default".into(),
            job: "keyed".into(),
            gates: gates.clone(),
        }),
    };
    let batch = [
        start_as(a, 1),
        start_as(ended, 2),
        start_as(a, 3),
        start_as(b, 4),
        start_as(c, 5),
    ];
    let answers = store.start_attempts(&batch, now).await.unwrap();
    assert!(answers[0].is_ok() && answers[3].is_ok(), "{answers:?}");
    assert_eq!(answers[1], Err(NotStarted::NotQueued));
    assert_eq!(answers[2], Err(NotStarted::NotQueued));
    assert_eq!(
        answers[4],
        Err(NotStarted::Held(sked_core::flow::Hold::Concurrency {
            key: "k".into(),
            holding: 2,
            limit: 2,
        }))
    );
    let holders = store.key_holders(None).await.unwrap();
    assert_eq!(holders.iter().map(|h| h.run_id).collect::<Vec<_>>(), [a, b]);
    // Held again while both hold it; once a's attempt ends, c takes its place.
    let again = store.start_attempts(&[start_as(c, 6)], now).await.unwrap();
    assert!(matches!(again[0], Err(NotStarted::Held(_))), "{again:?}");
    let first = *answers[0].as_ref().unwrap();
    let done = now + secs(1);
    complete(
        store,
        report_as("w1", first.attempt_id, 1, AttemptOutcome::Succeeded),
        done,
    )
    .await;
    let freed = store.start_attempts(&[start_as(c, 7)], done).await.unwrap();
    assert!(freed[0].is_ok(), "{freed:?}");
    let mut holding: Vec<i64> = store
        .key_holders(None)
        .await
        .unwrap()
        .iter()
        .map(|h| h.run_id)
        .collect();
    holding.sort_unstable();
    assert_eq!(holding, [b, c]);
}

/// A batch of starts is answered in its own order: each queued run's first start gets the
/// run's attempt; a second start of it in the same batch, a run already ended and a run that
/// does not exist get none.
pub async fn a_batch_of_starts_is_answered_start_by_start(store: &dyn Store) {
    let j = put(store, "batch", every_second(serde_json::json!({}))).await;
    let now = t0() + secs(3);
    let a = fire_one(store, fire(j.id, t0() + secs(1))).await.run_id;
    let b = fire_one(store, fire(j.id, t0() + secs(2))).await.run_id;
    let mut skipped = fire(j.id, t0() + secs(3));
    skipped.skip = Some(SkipReason::Paused);
    let ended = fire_one(store, skipped).await.run_id;
    let start_as = |run_id: i64, worker: &str, token: i64| AttemptStart {
        run_id,
        worker_id: worker.to_string(),
        token,
        lease_expires_at: now + secs(10),
        flow: None,
    };
    let batch = [
        start_as(a, "w1", 1),
        start_as(b, "w2", 2),
        start_as(a, "w3", 3),
        start_as(ended, "w4", 4),
        start_as(b.max(a).max(ended) + 1000, "w5", 5),
    ];
    let answers = store.start_attempts(&batch, now).await.unwrap();
    let numbers: Vec<Option<u32>> = answers
        .iter()
        .map(|s| s.as_ref().ok().map(|s| s.number))
        .collect();
    assert_eq!(numbers, [Some(1), Some(1), None, None, None]);
    let (first, second) = (*answers[0].as_ref().unwrap(), *answers[1].as_ref().unwrap());
    assert_ne!(first.attempt_id, second.attempt_id);
    for (run_id, started, worker, token) in [(a, first, "w1", 1), (b, second, "w2", 2)] {
        let (r, attempts) = run(store, run_id).await;
        assert_eq!(
            (r.state, r.attempts, r.started_at),
            (RunState::Running, 1, Some(now))
        );
        assert_eq!(attempts.len(), 1, "one attempt for run {run_id}");
        assert_eq!(attempts[0].id, started.attempt_id);
        assert_eq!(
            (attempts[0].worker_id.as_str(), attempts[0].token),
            (worker, token)
        );
        assert_eq!(attempts[0].lease_expires_at, now + secs(10));
    }
    let (r, attempts) = run(store, ended).await;
    assert_eq!((r.state, r.attempts), (RunState::Skipped, 0));
    assert!(attempts.is_empty());
}

/// A start batch reads "now" before it waits for its keys, and an attempt of its key may end
/// meanwhile: the batch counts it as ended, so the start is recorded at that end, never
/// before it, or the ledger would show more attempts of the key at once than its limit. The
/// end counts even when a batch that started nothing on the key read it in between.
pub async fn a_start_of_a_key_is_recorded_no_earlier_than_the_end_of_its_last_holder(
    store: &dyn Store,
) {
    use crate::flow::FlowClaim;
    use sked_core::flow::{Bound, ConcurrencyGate, Gates};
    let j = put(store, "keyed", every_second(serde_json::json!({}))).await;
    let mut runs = Vec::new();
    for n in 1..=3 {
        runs.push(fire_one(store, fire(j.id, t0() + secs(n))).await.run_id);
    }
    let claim = FlowClaim {
        namespace: j.namespace.clone(),
        job: j.name.clone(),
        gates: Gates {
            concurrency: vec![ConcurrencyGate {
                key: "customer-7".into(),
                limit: Bound::Own(1),
            }],
            rate: Vec::new(),
        },
    };
    let start_keyed = |run_id: i64, token: i64, now: Instant| {
        let claim = claim.clone();
        async move {
            store
                .start_attempts(
                    &[AttemptStart {
                        run_id,
                        worker_id: "w".into(),
                        token,
                        lease_expires_at: now + secs(60),
                        flow: Some(claim),
                    }],
                    now,
                )
                .await
                .expect("start_attempts")
                .remove(0)
        }
    };
    let first = start_keyed(runs[0], 1, t0() + secs(10))
        .await
        .expect("the key is free");
    let held = start_keyed(runs[1], 2, t0() + secs(11)).await;
    assert!(
        matches!(held, Err(crate::NotStarted::Held(_))),
        "the key's limit is 1: {held:?}"
    );
    let ended = t0() + secs(20);
    complete(
        store,
        report(first.attempt_id, 1, AttemptOutcome::Succeeded),
        ended,
    )
    .await;
    // A batch that reads the key and starts nothing on it: its run is no longer queued.
    let nothing = start_keyed(runs[0], 3, t0() + secs(21)).await;
    assert_eq!(nothing, Err(crate::NotStarted::NotQueued));
    // This batch read "now" before the attempt ended, and the key after.
    let second = start_keyed(runs[1], 4, t0() + secs(15))
        .await
        .expect("the key's holder ended");
    let (r, attempts) = run(store, runs[1]).await;
    assert_eq!(attempts[0].id, second.attempt_id);
    assert_eq!(
        (attempts[0].started_at, r.started_at),
        (ended, Some(ended)),
        "recorded at the end of the key's last holder"
    );
    // A start whose "now" is later is recorded at it.
    complete(
        store,
        report(second.attempt_id, 4, AttemptOutcome::Succeeded),
        t0() + secs(30),
    )
    .await;
    let third = start_keyed(runs[2], 5, t0() + secs(40))
        .await
        .expect("the key's holder ended");
    let (_, attempts) = run(store, runs[2]).await;
    assert_eq!(attempts[0].id, third.attempt_id);
    assert_eq!(attempts[0].started_at, t0() + secs(40));
}

pub async fn attempts_are_fenced_by_token_and_state(store: &dyn Store) {
    let j = put(store, "f", every_second(serde_json::json!({}))).await;
    let fired = fire_one(store, fire(j.id, t0() + secs(1))).await;
    let now = t0() + secs(1);
    let attempt = start(store, fired.run_id, "w", 42, now).await;
    let again = store
        .start_attempts(
            &[AttemptStart {
                run_id: fired.run_id,
                worker_id: "w2".into(),
                token: 43,
                lease_expires_at: now + secs(10),
                flow: None,
            }],
            now,
        )
        .await
        .unwrap();
    assert_eq!(
        again,
        vec![Err(crate::NotStarted::NotQueued)],
        "a running run gets no second attempt"
    );
    let (r, attempts) = run(store, fired.run_id).await;
    assert_eq!((r.state, r.attempts), (RunState::Running, 1));
    assert_eq!(r.started_at, Some(now));
    assert_eq!(attempts[0].number, 1);
    assert_eq!(attempts[0].worker_id, "w");

    let wrong = complete(store, report(attempt, 41, AttemptOutcome::Succeeded), now).await;
    assert_eq!(
        wrong,
        CompletionEffect::Rejected {
            reason: "fenced".into()
        }
    );
    assert_eq!(run(store, fired.run_id).await.0.state, RunState::Running);
    // Another worker, even with the right token, is not the attempt's holder.
    let impostor = complete(
        store,
        report_as("w-other", attempt, 42, AttemptOutcome::Failed),
        now,
    )
    .await;
    assert_eq!(
        impostor,
        CompletionEffect::Rejected {
            reason: "another_worker".into()
        }
    );
    assert_eq!(
        store
            .append_output(attempt, 42, "w-other", b"forged", 1024)
            .await
            .unwrap(),
        AppendOutcome::Rejected
    );
    assert_eq!(run(store, fired.run_id).await.0.state, RunState::Running);
    let unknown = complete(
        store,
        report(attempt + 1000, 42, AttemptOutcome::Succeeded),
        now,
    )
    .await;
    assert!(matches!(unknown, CompletionEffect::Rejected { .. }));

    let mut ok = report(attempt, 42, AttemptOutcome::Succeeded);
    ok.exit_code = Some(0);
    let accepted = complete(store, ok.clone(), now + secs(1)).await;
    assert_eq!(
        accepted,
        CompletionEffect::Accepted {
            run_id: fired.run_id,
            run_state: RunState::Succeeded,
            requeued: vec![],
            namespace: "default".into(),
            started_at: now,
            job_label: None,
        },
        "the effect names the run's namespace and when its attempt started; no job label \
         unless the job asks for one"
    );
    let twice = complete(store, ok, now + secs(2)).await;
    assert_eq!(
        twice,
        CompletionEffect::Rejected {
            reason: "already_reported".into()
        },
        "reported once, and a report sent again is told so"
    );
    let (r, attempts) = run(store, fired.run_id).await;
    assert_eq!(r.state, RunState::Succeeded);
    assert_eq!(r.finished_at, Some(now + secs(1)));
    assert_eq!(attempts[0].state, AttemptState::Succeeded);
    assert_eq!(attempts[0].exit_code, Some(0));
}

pub async fn retries_follow_the_policy_then_fail(store: &dyn Store) {
    let j = put(
        store,
        "r",
        every_second(serde_json::json!({
            "retry": {"max_attempts": 3, "backoff": {"initial": "1s", "multiplier": 2.0, "jitter": false}}
        })),
    )
    .await;
    let fired = fire_one(store, fire(j.id, t0() + secs(1))).await;
    let mut now = t0() + secs(1);
    let mut delays = Vec::new();
    for n in 1..=3u32 {
        let attempt = start(store, fired.run_id, "w", i64::from(n), now).await;
        let mut r = report(attempt, i64::from(n), AttemptOutcome::Failed);
        r.exit_code = Some(1);
        let effect = complete(store, r, now).await;
        let (record, _) = run(store, fired.run_id).await;
        assert_eq!(record.failures, n);
        if n < 3 {
            assert!(
                matches!(
                    &effect,
                    CompletionEffect::Accepted { run_id, run_state: RunState::Queued, requeued, .. }
                        if *run_id == fired.run_id && *requeued == vec![fired.run_id]
                ),
                "{effect:?}"
            );
            delays.push(record.ready_at - now);
            now = record.ready_at;
        } else {
            assert!(matches!(
                effect,
                CompletionEffect::Accepted {
                    run_state: RunState::Failed,
                    ..
                }
            ));
        }
    }
    assert_eq!(delays, vec![secs(1), secs(2)], "exponential backoff");
    let (record, attempts) = run(store, fired.run_id).await;
    assert_eq!((record.state, record.attempts), (RunState::Failed, 3));
    assert_eq!(record.error.as_deref(), Some("exited with code 1"));
    let numbers: Vec<u32> = attempts.iter().map(|a| a.number).collect();
    assert_eq!(numbers, vec![1, 2, 3]);
}

pub async fn lost_attempts_are_requeued_without_spending_retries(store: &dyn Store) {
    let j = put(
        store,
        "lost",
        every_second(serde_json::json!({"retry": {"max_attempts": 2}})),
    )
    .await;
    let now = t0() + secs(1);
    worker(store, "w1", now).await;
    worker(store, "w2", now).await;
    let fired = fire_one(store, fire(j.id, now)).await;
    let attempt = start(store, fired.run_id, "w1", 5, now).await;
    // w2 keeps heartbeating, w1 goes silent.
    let later = now + secs(20);
    let hb = store
        .heartbeat("w2", &[], later, LeaseRenewal::all(later + secs(10)), t0())
        .await
        .unwrap();
    assert!(hb.known);
    let outcome = store.reap(later - secs(10), later).await.unwrap();
    assert_eq!(outcome.dead_workers, vec!["w1".to_string()]);
    assert_eq!(outcome.requeued, vec![fired.run_id]);
    let (r, attempts) = run(store, fired.run_id).await;
    assert_eq!(r.state, RunState::Queued);
    assert_eq!((r.attempts, r.failures), (1, 0), "no retry spent");
    assert_eq!(attempts[0].state, AttemptState::Lost);
    // The lost attempt's late report is fenced off, and its worker must register again.
    let late = complete(
        store,
        report_as("w1", attempt, 5, AttemptOutcome::Succeeded),
        later,
    )
    .await;
    assert_eq!(
        late,
        CompletionEffect::Rejected {
            reason: "fenced".into()
        }
    );
    let hb = store
        .heartbeat(
            "w1",
            &[attempt],
            later,
            LeaseRenewal::all(later + secs(10)),
            t0(),
        )
        .await
        .unwrap();
    assert!(!hb.known);
    assert_eq!(hb.stop, vec![attempt]);
    let workers = store.list_workers(100, None).await.unwrap().items;
    let alive: Vec<(&str, bool)> = workers.iter().map(|w| (w.id.as_str(), w.alive)).collect();
    assert!(alive.contains(&("w1", false)) && alive.contains(&("w2", true)));
    // The second attempt runs elsewhere and numbers on.
    let second = start(store, fired.run_id, "w2", 6, later).await;
    let (_, attempts) = run(store, fired.run_id).await;
    assert_eq!(attempts[1].number, 2);
    assert_eq!(attempts[1].id, second);
    // Nothing else is reaped while w2 heartbeats.
    let quiet = store.reap(later - secs(10), later + secs(1)).await.unwrap();
    assert!(quiet.dead_workers.is_empty() && quiet.requeued.is_empty());
    // The second attempt fails: the third is a retry, spent from the budget; the second was
    // not (it followed a lost attempt). Stats count each kind once.
    let failed_at = later + secs(2);
    complete(
        store,
        report_as("w2", second, 6, AttemptOutcome::Failed),
        failed_at,
    )
    .await;
    let (r, _) = run(store, fired.run_id).await;
    assert_eq!((r.state, r.failures), (RunState::Queued, 1));
    let third = start(store, fired.run_id, "w2", 7, r.ready_at).await;
    complete(
        store,
        report_as("w2", third, 7, AttemptOutcome::Succeeded),
        r.ready_at,
    )
    .await;
    let stats = store.job_stats("default", "lost").await.unwrap().unwrap();
    assert_eq!(
        (stats.succeeded, stats.failed, stats.retries, stats.lost),
        (1, 0, 1, 1)
    );
}

pub async fn workers_page_by_id_and_dead_ones_are_deleted(store: &dyn Store) {
    let now = t0() + secs(1);
    for i in 0..5 {
        worker(store, &format!("w{i}"), now).await;
    }
    let first = store.list_workers(2, None).await.unwrap();
    let ids: Vec<&str> = first.items.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(ids, ["w0", "w1"]);
    let mut all = first.items.clone();
    let mut cursor = first.next_cursor;
    while let Some(c) = cursor {
        let page = store.list_workers(2, Some(&c)).await.unwrap();
        all.extend(page.items);
        cursor = page.next_cursor;
    }
    assert_eq!(all.len(), 5);
    assert!(store.list_workers(2, Some("bogus")).await.is_err());
    assert_eq!(
        store.get_worker("w3").await.unwrap().map(|w| w.id),
        Some("w3".to_string())
    );
    assert_eq!(store.get_worker("nope").await.unwrap(), None);
    // w0 and w1 keep heartbeating; the others fall silent and are declared dead.
    let later = now + secs(60);
    for id in ["w0", "w1"] {
        store
            .heartbeat(id, &[], later, LeaseRenewal::all(later + secs(10)), t0())
            .await
            .unwrap();
    }
    let reaped = store.reap(later - secs(10), later).await.unwrap();
    assert_eq!(reaped.dead_workers.len(), 3);
    // Only dead workers silent since before the cut are deleted, a batch at a time.
    assert_eq!(store.delete_dead_workers(now, 10).await.unwrap(), 0);
    assert_eq!(store.delete_dead_workers(later, 2).await.unwrap(), 2);
    assert_eq!(store.delete_dead_workers(later, 2).await.unwrap(), 1);
    let left: Vec<String> = store
        .list_workers(10, None)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(left, ["w0", "w1"]);
}

pub async fn heartbeats_give_up_attempts_the_worker_never_got(store: &dyn Store) {
    let now = t0() + secs(1);
    worker(store, "w", now).await;
    let mut runs = Vec::new();
    for name in ["known", "never-got", "young"] {
        let j = put(store, name, every_second(serde_json::json!({}))).await;
        runs.push(fire_one(store, fire(j.id, now)).await.run_id);
    }
    let known = start(store, runs[0], "w", 1, now).await;
    let never_got = start(store, runs[1], "w", 2, now).await;
    // Started while the heartbeat was on its way: too young to be judged.
    let later = now + secs(5);
    start(store, runs[2], "w", 3, later).await;
    let hb = store
        .heartbeat(
            "w",
            &[known],
            later,
            LeaseRenewal::all(later + secs(10)),
            now + secs(2),
        )
        .await
        .unwrap();
    assert!(hb.known);
    assert_eq!(hb.forgotten, vec![never_got]);
    // Its lease has ended: the reaper re-queues its run, without spending a retry.
    let reaped = store.reap(t0(), later + secs(1)).await.unwrap();
    assert!(reaped.dead_workers.is_empty());
    assert_eq!(reaped.requeued, vec![runs[1]]);
    let (r, attempts) = run(store, runs[1]).await;
    assert_eq!((r.state, r.failures), (RunState::Queued, 0));
    assert_eq!(attempts[0].state, AttemptState::Lost);
    for other in [runs[0], runs[2]] {
        assert_eq!(run(store, other).await.0.state, RunState::Running);
    }
}

pub async fn heartbeats_extend_leases_and_relay_cancels(store: &dyn Store) {
    let j = put(store, "hb", every_second(serde_json::json!({}))).await;
    let now = t0() + secs(1);
    worker(store, "w", now).await;
    let fired = fire_one(store, fire(j.id, now)).await;
    let attempt = start(store, fired.run_id, "w", 3, now).await;
    // Heartbeats keep the lease alive past its first expiry.
    let mut at = now;
    for _ in 0..4 {
        at += secs(5);
        let hb = store
            .heartbeat("w", &[attempt], at, LeaseRenewal::all(at + secs(10)), t0())
            .await
            .unwrap();
        assert_eq!(
            hb,
            HeartbeatOutcome {
                known: true,
                stop: vec![],
                forgotten: vec![],
                draining: false,
            }
        );
        let reaped = store.reap(at - secs(10), at).await.unwrap();
        assert!(reaped.requeued.is_empty());
    }
    let (_, attempts) = run(store, fired.run_id).await;
    assert_eq!(attempts[0].lease_expires_at, at + secs(10));
    let workers = store.list_workers(100, None).await.unwrap().items;
    assert_eq!(workers[0].running, 1);
    assert_eq!(workers[0].last_heartbeat_at, at);
    // An attempt the worker does not hold is to be stopped.
    let hb = store
        .heartbeat(
            "w",
            &[attempt, attempt + 99],
            at,
            LeaseRenewal::all(at + secs(10)),
            t0(),
        )
        .await
        .unwrap();
    assert_eq!(hb.stop, vec![attempt + 99]);
    // A cancel reaches the worker through its heartbeat.
    let outcome = store
        .cancel_run(fired.run_id, at, Audit::none())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(outcome, CancelOutcome::Requested(ref r) if r.cancel_requested));
    let hb = store
        .heartbeat("w", &[attempt], at, LeaseRenewal::all(at + secs(10)), t0())
        .await
        .unwrap();
    assert_eq!(hb.stop, vec![attempt]);
    let effect = complete(store, report(attempt, 3, AttemptOutcome::Cancelled), at).await;
    assert!(matches!(
        effect,
        CompletionEffect::Accepted {
            run_state: RunState::Cancelled,
            ..
        }
    ));
    let finished = store
        .cancel_run(fired.run_id, at, Audit::none())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(finished, CancelOutcome::AlreadyFinished(_)));
    assert_eq!(
        store
            .cancel_run(fired.run_id + 1000, at, Audit::none())
            .await
            .unwrap(),
        None
    );
}

pub async fn heartbeats_rewrite_only_the_leases_that_are_due(store: &dyn Store) {
    let now = t0() + secs(1);
    worker(store, "w", now).await;
    let mut runs = Vec::new();
    let mut attempts = Vec::new();
    for name in ["due-a", "due-b", "due-c"] {
        let j = put(store, name, every_second(serde_json::json!({}))).await;
        let fired = fire_one(store, fire(j.id, now)).await;
        attempts.push(start(store, fired.run_id, "w", 3, now).await);
        runs.push(fired.run_id);
    }
    let all_runs = &runs;
    // Leases that end within 5 s are due.
    let due_within_5s = |at: Instant| LeaseRenewal {
        until: at + secs(10),
        renew_before: at + secs(5),
    };
    let leases = |expected: Instant| async move {
        for &run_id in all_runs {
            let (_, attempts) = run(store, run_id).await;
            assert_eq!(attempts[0].lease_expires_at, expected, "run {run_id}");
        }
    };
    // Leases that end after `renew_before` are left as they are, and still held.
    let at = now + secs(2);
    let hb = store
        .heartbeat("w", &attempts, at, due_within_5s(at), t0())
        .await
        .unwrap();
    assert!(
        hb.known && hb.stop.is_empty() && hb.forgotten.is_empty(),
        "{hb:?}"
    );
    leases(now + secs(10)).await;
    // Once due, every one is extended.
    let at = now + secs(6);
    let hb = store
        .heartbeat("w", &attempts, at, due_within_5s(at), t0())
        .await
        .unwrap();
    assert!(hb.stop.is_empty(), "{hb:?}");
    leases(at + secs(10)).await;
    // A lease not due still relays a cancel, and an attempt the worker does not hold (one it
    // never had, one already ended) is to stop, whether or not its lease would be due.
    store
        .cancel_run(runs[0], at, Audit::none())
        .await
        .unwrap()
        .expect("the run exists");
    complete(store, report(attempts[1], 3, AttemptOutcome::Succeeded), at).await;
    let later = at + secs(1);
    let reported = [attempts[0], attempts[1], attempts[2], attempts[2] + 99];
    let hb = store
        .heartbeat("w", &reported, later, due_within_5s(later), t0())
        .await
        .unwrap();
    assert_eq!(hb.stop, vec![attempts[0], attempts[1], attempts[2] + 99]);
    let (_, third) = run(store, runs[2]).await;
    assert_eq!(third[0].lease_expires_at, at + secs(10));
    // The reaper finds nothing expired while the untouched leases run.
    let reaped = store.reap(later - secs(10), later).await.unwrap();
    assert!(reaped.requeued.is_empty(), "{reaped:?}");
}

pub async fn a_drained_worker_learns_it_at_its_heartbeat_and_keeps_its_leases(store: &dyn Store) {
    let j = put(store, "drain", every_second(serde_json::json!({}))).await;
    let now = t0() + secs(1);
    worker(store, "w", now).await;
    worker(store, "other", now).await;
    let fired = fire_one(store, fire(j.id, now)).await;
    let attempt = start(store, fired.run_id, "w", 3, now).await;

    let drained = store
        .drain_worker("w", Audit::none())
        .await
        .unwrap()
        .expect("a live worker");
    assert!(drained.newly);
    assert!(drained.worker.draining && drained.worker.alive);
    assert_eq!(drained.worker.running, 1);
    // Asking again changes nothing; another worker is not touched.
    let again = store
        .drain_worker("w", Audit::none())
        .await
        .unwrap()
        .unwrap();
    assert!(again.worker.draining && !again.newly);
    assert!(!store.get_worker("other").await.unwrap().unwrap().draining);
    // The worker hears it at its heartbeat, and its running attempt keeps its lease.
    let at = now + secs(5);
    let hb = store
        .heartbeat("w", &[attempt], at, LeaseRenewal::all(at + secs(10)), t0())
        .await
        .unwrap();
    assert!(hb.known && hb.draining && hb.stop.is_empty(), "{hb:?}");
    let (_, attempts) = run(store, fired.run_id).await;
    assert_eq!(attempts[0].lease_expires_at, at + secs(10));
    let effect = complete(store, report(attempt, 3, AttemptOutcome::Succeeded), at).await;
    assert!(matches!(
        effect,
        CompletionEffect::Accepted {
            run_state: RunState::Succeeded,
            ..
        }
    ));
    let hb = store
        .heartbeat("other", &[], at, LeaseRenewal::all(at), t0())
        .await
        .unwrap();
    assert!(!hb.draining);
    // A worker unknown or declared dead cannot be drained.
    assert_eq!(
        store.drain_worker("nobody", Audit::none()).await.unwrap(),
        None
    );
    store.reap(at + secs(60), at + secs(60)).await.unwrap();
    assert_eq!(
        store.drain_worker("other", Audit::none()).await.unwrap(),
        None
    );
}

pub async fn cancelling_queued_runs_releases_waiting_ones(store: &dyn Store) {
    let j = put(
        store,
        "cq",
        every_second(serde_json::json!({"overlap": "buffer_all"})),
    )
    .await;
    let first = fire_one(store, fire(j.id, t0() + secs(1))).await;
    let second = fire_one(store, fire(j.id, t0() + secs(2))).await;
    assert_eq!(second.state, RunState::Waiting);
    let outcome = store
        .cancel_run(first.run_id, t0() + secs(3), Audit::none())
        .await
        .unwrap()
        .unwrap();
    match outcome {
        CancelOutcome::Cancelled { run, released } => {
            assert_eq!(run.state, RunState::Cancelled);
            assert!(run.finished_at.is_some());
            assert_eq!(released, vec![second.run_id]);
        }
        other => panic!("expected cancelled, got {other:?}"),
    }
    let queued = store.queued_runs(None).await.unwrap();
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].run_id, second.run_id);
}

pub async fn output_is_capped_and_read_from_offsets(store: &dyn Store) {
    let j = put(store, "out", every_second(serde_json::json!({}))).await;
    let fired = fire_one(store, fire(j.id, t0() + secs(1))).await;
    let attempt = start(store, fired.run_id, "w", 11, t0() + secs(1)).await;
    let append =
        |bytes: &'static [u8], token: i64| store.append_output(attempt, token, "w", bytes, 10);
    assert_eq!(
        append(b"hello ", 11).await.unwrap(),
        AppendOutcome::Accepted {
            kept: 6,
            truncated: false
        }
    );
    assert_eq!(append(b"x", 12).await.unwrap(), AppendOutcome::Rejected);
    assert_eq!(
        append(b"world!", 11).await.unwrap(),
        AppendOutcome::Accepted {
            kept: 4,
            truncated: true
        }
    );
    assert_eq!(
        append(b"more", 11).await.unwrap(),
        AppendOutcome::Accepted {
            kept: 0,
            truncated: true
        }
    );
    assert_eq!(store.read_output(attempt, 0).await.unwrap(), b"hello worl");
    assert_eq!(store.read_output(attempt, 3).await.unwrap(), b"lo worl");
    assert_eq!(store.read_output(attempt, 8).await.unwrap(), b"rl");
    assert!(store.read_output(attempt, 10).await.unwrap().is_empty());
    let (_, attempts) = run(store, fired.run_id).await;
    assert_eq!(attempts[0].output_bytes, 10);
    assert!(attempts[0].output_truncated);
    complete(
        store,
        report(attempt, 11, AttemptOutcome::Succeeded),
        t0() + secs(2),
    )
    .await;
    assert_eq!(
        append(b"late", 11).await.unwrap(),
        AppendOutcome::Rejected,
        "no output after the report"
    );
}

pub async fn deleting_a_job_keeps_its_runs(store: &dyn Store) {
    let j = put(store, "gone", every_second(serde_json::json!({}))).await;
    let running = fire_one(store, fire(j.id, t0() + secs(1))).await;
    start(store, running.run_id, "w", 1, t0() + secs(1)).await;
    let queued = fire_one(store, fire(j.id, t0() + secs(2))).await;
    let deleted = store
        .delete_job("default", "gone", false, t0() + secs(3), Audit::none())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(deleted.job.id, j.id);
    assert!(deleted.paused_dependants.is_empty());
    assert_eq!(
        deleted.cancelled,
        vec![queued.run_id],
        "the runs every dispatcher lets go"
    );
    assert_eq!(store.get_job("default", "gone").await.unwrap(), None);
    assert_eq!(
        store
            .delete_job("default", "gone", false, t0(), Audit::none())
            .await
            .unwrap(),
        None
    );
    assert_eq!(run(store, queued.run_id).await.0.state, RunState::Cancelled);
    let (r, _) = run(store, running.run_id).await;
    assert!(r.cancel_requested, "its running run is asked to stop");
    // A fire computed before the delete writes nothing.
    let late = fire_one(store, fire(j.id, t0() + secs(4))).await;
    assert!(!late.inserted);
    let page = store
        .list_runs(&RunQuery {
            namespace: "default".into(),
            job: Some("gone".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 2);
    assert!(store.job_stats("default", "gone").await.unwrap().is_some());
    // A new job of the same name is a new job; both histories stay readable by name.
    let again = put(store, "gone", every_second(serde_json::json!({}))).await;
    assert_ne!(again.id, j.id);
    fire_one(store, fire(again.id, t0() + secs(1))).await;
    let page = store
        .list_runs(&RunQuery {
            namespace: "default".into(),
            job: Some("gone".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 3);
}

pub async fn runs_page_newest_first(store: &dyn Store) {
    let j = put(store, "pg", every_second(serde_json::json!({}))).await;
    let fires: Vec<Fire> = (1..=25).map(|i| fire(j.id, t0() + secs(i))).collect();
    store
        .record_fires(&fires, t0() + secs(30), Audit::none())
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list_runs(&RunQuery {
                namespace: "default".into(),
                job: Some("pg".into()),
                limit: 7,
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        seen.extend(page.items.iter().map(|r| r.scheduled_for));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let expected: Vec<Instant> = (1..=25).rev().map(|i| t0() + secs(i)).collect();
    assert_eq!(seen, expected);
    let queued = store
        .list_runs(&RunQuery {
            namespace: "default".into(),
            state: Some(RunState::Succeeded),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(queued.items.is_empty(), "filtered by state");
}

pub async fn stats_count_outcomes_and_lateness(store: &dyn Store) {
    let j = put(store, "st", every_second(serde_json::json!({}))).await;
    for i in 1..=4 {
        let at = t0() + secs(i);
        // Written 2 ms after its instant.
        let out = store
            .record_fires(&[fire(j.id, at)], at + Span::milliseconds(2), Audit::none())
            .await
            .unwrap();
        let attempt = start(store, out.runs[0].run_id, "w", i, at + secs(0)).await;
        let outcome = if i == 4 {
            AttemptOutcome::Failed
        } else {
            AttemptOutcome::Succeeded
        };
        complete(store, report(attempt, i, outcome), at + secs(0)).await;
    }
    let stats = store.job_stats("default", "st").await.unwrap().unwrap();
    assert_eq!((stats.runs, stats.succeeded, stats.failed), (4, 3, 1));
    assert_eq!(stats.by_state.get("succeeded"), Some(&3));
    assert_eq!((stats.retries, stats.lost), (0, 0));
    assert_eq!(stats.lateness_ms.count, 4);
    assert!((stats.lateness_ms.p99 - 2.0).abs() < 1e-9);
    assert_eq!(
        stats.last_run.map(|r| r.scheduled_for),
        Some(t0() + secs(4))
    );
    assert_eq!(store.job_stats("default", "nope").await.unwrap(), None);
    // Skipped runs are counted by their reason.
    for (i, reason) in [
        (5, SkipReason::Backlog),
        (6, SkipReason::Backlog),
        (7, SkipReason::Paused),
    ] {
        let mut skipped = fire(j.id, t0() + secs(i));
        skipped.skip = Some(reason);
        fire_one(store, skipped).await;
    }
    let stats = store.job_stats("default", "st").await.unwrap().unwrap();
    assert_eq!(stats.by_state.get("skipped"), Some(&3));
    assert_eq!(
        stats.skipped_by_reason,
        [("backlog".to_string(), 2), ("paused".to_string(), 1)].into()
    );
}

/// A run of `job_id` at `at` that wrote some output and succeeded a second later: its id and
/// its attempt's.
async fn succeeded_with_output(store: &dyn Store, job_id: i64, at: Instant) -> (i64, i64) {
    let fired = fire_one(store, fire(job_id, at)).await;
    let attempt = start(store, fired.run_id, "w", 1, at).await;
    store
        .append_output(attempt, 1, "w", b"some output", 1024)
        .await
        .unwrap();
    complete(
        store,
        report(attempt, 1, AttemptOutcome::Succeeded),
        at + secs(1),
    )
    .await;
    (fired.run_id, attempt)
}

pub async fn retention_deletes_only_finished_runs(store: &dyn Store) {
    let j = put(store, "ret", every_second(serde_json::json!({}))).await;
    let (done, attempt) = succeeded_with_output(store, j.id, t0() + secs(1)).await;
    let queued = fire_one(store, fire(j.id, t0() + secs(2))).await;
    let deleted = store
        .delete_finished_runs(t0() + secs(100), 1000)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(store.get_run(done).await.unwrap().is_none());
    assert!(store.read_output(attempt, 0).await.unwrap().is_empty());
    assert!(store.get_run(queued.run_id).await.unwrap().is_some());
}

/// For a store that partitions runs by instant (PostgreSQL): retention leaves the runs of a
/// partition still within retention alone, drops an expired partition whole once its runs have
/// all finished, and deletes row by row what sits outside any time partition or in one that
/// cannot go yet; an instant backfilled into a dropped span is recorded all the same.
pub async fn expired_partitions_of_runs_go_whole(store: &dyn Store) {
    let hour = Duration::from_secs(3600);
    let minutes = |n: i64| Span::minutes(n);
    let base = Utc::now();
    // Partitions from a minute ahead of `base` to at least two hours past it, then a third.
    assert!(store.prepare_run_partitions(base, hour).await.unwrap() >= 2);
    assert!(
        store
            .prepare_run_partitions(base + minutes(60), hour)
            .await
            .unwrap()
            >= 1
    );
    assert_eq!(store.prepare_run_partitions(base, hour).await.unwrap(), 0);
    let j = put(store, "parts", every_second(serde_json::json!({}))).await;
    let finished = |at: Instant| succeeded_with_output(store, j.id, at);
    // In the first time partition, which ends at least half an hour after `base`: one run
    // finished, one still queued.
    let (early, early_attempt) = finished(base + minutes(2)).await;
    let queued = fire_one(store, fire(j.id, base + minutes(3))).await.run_id;
    // In a later time partition.
    let (later, later_attempt) = finished(base + minutes(150)).await;
    // Before the legacy partition's end, and in the default partition (ahead of the legacy
    // one, before the first time partition).
    let (legacy, _) = finished(base - Span::days(1)).await;
    let (default, _) = finished(base + secs(5)).await;

    // Ten minutes on, the first partition is still within retention: none of its runs goes.
    // The legacy partition ended before `base` and its run has finished: it goes whole.
    let soon = base + minutes(10);
    assert_eq!(store.drop_expired_run_partitions(soon).await.unwrap(), 1);
    assert_eq!(store.delete_finished_runs(soon, 1000).await.unwrap(), 1);
    assert!(store.get_run(early).await.unwrap().is_some());
    assert!(store.get_run(legacy).await.unwrap().is_none());
    assert!(store.get_run(default).await.unwrap().is_none());

    // Hours on, every partition has expired: the later one goes whole, the first stays for its
    // queued run and its finished one is deleted as a row.
    let gone = base + minutes(300);
    assert_eq!(store.drop_expired_run_partitions(gone).await.unwrap(), 1);
    assert!(store.get_run(later).await.unwrap().is_none());
    assert!(store
        .read_output(later_attempt, 0)
        .await
        .unwrap()
        .is_empty());
    assert!(store.get_run(early).await.unwrap().is_some());
    assert_eq!(store.delete_finished_runs(gone, 1000).await.unwrap(), 1);
    assert!(store.get_run(early).await.unwrap().is_none());
    assert!(store
        .read_output(early_attempt, 0)
        .await
        .unwrap()
        .is_empty());
    assert!(store.get_run(queued).await.unwrap().is_some());
    assert_eq!(store.drop_expired_run_partitions(gone).await.unwrap(), 0);

    // An instant in the span of the dropped partition is recorded in the default one.
    let backfilled = fire_one(store, fire(j.id, base + minutes(151))).await;
    assert!(store.get_run(backfilled.run_id).await.unwrap().is_some());
}

/// For a store that partitions runs by instant (PostgreSQL): a run recorded ahead of the
/// clock, before any partition covered its instant, does not stop partitions being made.
pub async fn a_run_ahead_of_the_partitions_does_not_stop_them(store: &dyn Store) {
    let hour = Duration::from_secs(3600);
    let base = Utc::now();
    let j = put(store, "ahead", every_second(serde_json::json!({}))).await;
    let ahead = fire_one(store, fire(j.id, base + Span::minutes(30))).await;
    assert!(store.prepare_run_partitions(base, hour).await.unwrap() >= 1);
    assert!(store.get_run(ahead.run_id).await.unwrap().is_some());
    let next = fire_one(store, fire(j.id, base + Span::minutes(100))).await;
    assert!(store.get_run(next.run_id).await.unwrap().is_some());
}

pub async fn queued_runs_carry_dispatch_details(store: &dyn Store) {
    let j = put(
        store,
        "qd",
        every_second(serde_json::json!({
            "priority": 7,
            "timeout": "30s",
            "routing": {"labels": {"zone": "eu"}},
        })),
    )
    .await;
    let a = fire_one(store, fire(j.id, t0() + secs(1))).await;
    let b = fire_one(store, fire(j.id, t0() + secs(2))).await;
    let all = store.queued_runs(None).await.unwrap();
    assert_eq!(all.len(), 2);
    let one = store.queued_runs(Some(&[b.run_id])).await.unwrap();
    assert_eq!(one.len(), 1);
    let q = &one[0];
    assert_eq!((q.run_id, q.job_id, q.priority), (b.run_id, j.id, 7));
    assert_eq!(q.timeout, Some(std::time::Duration::from_secs(30)));
    assert_eq!(q.routing.labels.get("zone").map(String::as_str), Some("eu"));
    assert_eq!((q.namespace.as_str(), q.job.as_str()), ("default", "qd"));
    assert_eq!(q.target, j.spec.target);
    start(store, a.run_id, "w", 1, t0() + secs(3)).await;
    let left = store
        .queued_runs(Some(&[a.run_id, b.run_id]))
        .await
        .unwrap();
    assert_eq!(left.len(), 1, "a running run is not queued");
}

/// A sweep's pages: only queued runs, only those ready before the instant, ascending ids after
/// the cursor, at most the page's size.
pub async fn a_sweep_pages_through_the_runs_queued_before_an_instant(store: &dyn Store) {
    let j = put(store, "sweep", every_second(serde_json::json!({}))).await;
    let mut ids = Vec::new();
    for n in 1..=5 {
        ids.push(fire_one(store, fire(j.id, t0() + secs(n))).await.run_id);
    }
    // The second has started: no longer queued. The fifth is ready at t0 + 5 s, not before it.
    start(store, ids[1], "w", 1, t0() + secs(6)).await;
    let before = t0() + secs(5);
    let first = store.queued_before(before, 0, 2).await.unwrap();
    assert_eq!(first, vec![ids[0], ids[2]]);
    let second = store.queued_before(before, ids[2], 2).await.unwrap();
    assert_eq!(second, vec![ids[3]]);
    let last = store.queued_before(before, ids[3], 2).await.unwrap();
    assert!(last.is_empty(), "nothing after the last page: {last:?}");
    let later = store.queued_before(t0() + secs(6), 0, 10).await.unwrap();
    assert_eq!(later, vec![ids[0], ids[2], ids[3], ids[4]]);
}

/// Calls that race (several server nodes, or one node's concurrent requests) decide as if they
/// had come one after the other: one run per instant, one attempt per queued run, one accepted
/// report, one cancel, and a run held back by overlap is released exactly once, never lost.
pub async fn racing_writers_decide_once(store: &dyn Store) {
    let j = put(
        store,
        "race",
        every_second(serde_json::json!({"overlap": "buffer_all"})),
    )
    .await;
    let now = t0() + secs(1);
    let (one, two) = ([fire(j.id, now)], [fire(j.id, now)]);
    let (a, b) = tokio::join!(
        store.record_fires(&one, now, Audit::none()),
        store.record_fires(&two, now, Audit::none())
    );
    let (a, b) = (a.unwrap().runs.remove(0), b.unwrap().runs.remove(0));
    assert!(
        a.inserted != b.inserted,
        "one run for the instant: {a:?} {b:?}"
    );
    assert_eq!(a.run_id, b.run_id);
    let run_id = a.run_id;

    let start_as = |worker: &str, token: i64| {
        [AttemptStart {
            run_id,
            worker_id: worker.to_string(),
            token,
            lease_expires_at: now + secs(10),
            flow: None,
        }]
    };
    let (first, second) = (start_as("w1", 1), start_as("w2", 2));
    let (s1, s2) = tokio::join!(
        store.start_attempts(&first, now),
        store.start_attempts(&second, now)
    );
    let started: Vec<StartedAttempt> = s1
        .unwrap()
        .into_iter()
        .chain(s2.unwrap())
        .flatten()
        .collect();
    assert_eq!(started.len(), 1, "one attempt for a queued run");
    let (_, attempts) = run(store, run_id).await;
    assert_eq!(attempts.len(), 1);
    let (attempt, token, holder) = (attempts[0].id, attempts[0].token, &attempts[0].worker_id);

    // A manual run beside it, and a scheduled run waiting behind both.
    let mut manual = fire(j.id, now + Span::milliseconds(500));
    manual.trigger = Trigger::Manual;
    let manual = fire_one(store, manual).await;
    let manual_attempt = start(store, manual.run_id, "w3", 3, now).await;
    let waiting = fire_one(store, fire(j.id, now + secs(1))).await;
    assert_eq!(waiting.state, RunState::Waiting);

    // The same report twice at once, and the other active run's report beside them.
    let done = now + secs(2);
    let twice = [report_as(holder, attempt, token, AttemptOutcome::Succeeded)];
    let other = [report_as(
        "w3",
        manual_attempt,
        3,
        AttemptOutcome::Succeeded,
    )];
    let (c1, c2, c3) = tokio::join!(
        store.complete_attempts(&twice, done),
        store.complete_attempts(&twice, done),
        store.complete_attempts(&other, done),
    );
    let effects: Vec<CompletionEffect> = [c1, c2, c3]
        .into_iter()
        .flat_map(|c| c.expect("complete_attempts"))
        .collect();
    let mut released = Vec::new();
    let mut accepted = 0;
    for effect in &effects {
        if let CompletionEffect::Accepted { requeued, .. } = effect {
            accepted += 1;
            released.extend(requeued.iter().copied());
        }
    }
    assert_eq!(
        accepted, 2,
        "each attempt's report accepted once: {effects:?}"
    );
    assert_eq!(released, vec![waiting.run_id], "released exactly once");
    assert_eq!(run(store, waiting.run_id).await.0.state, RunState::Queued);

    // Two cancels of one queued run: one cancels it, the other finds it finished.
    let (x, y) = tokio::join!(
        store.cancel_run(waiting.run_id, done, Audit::none()),
        store.cancel_run(waiting.run_id, done, Audit::none())
    );
    let outcomes = [x.unwrap().unwrap(), y.unwrap().unwrap()];
    let cancelled = outcomes
        .iter()
        .filter(|o| matches!(o, CancelOutcome::Cancelled { .. }))
        .count();
    let finished = outcomes
        .iter()
        .filter(|o| matches!(o, CancelOutcome::AlreadyFinished(_)))
        .count();
    assert_eq!((cancelled, finished), (1, 1), "{outcomes:?}");

    // An instant recorded while the only active run ends: the new run is queued, either at once
    // or released by the completion; it never stays waiting behind nothing.
    let mut at = now + secs(10);
    for round in 0..10 {
        let active = fire_one(store, fire(j.id, at)).await;
        assert_eq!(active.state, RunState::Queued, "round {round}");
        let token = 100 + round;
        let attempt = start(store, active.run_id, "w1", token, at).await;
        let next = [fire(j.id, at + secs(1))];
        let ends = [report_as("w1", attempt, token, AttemptOutcome::Succeeded)];
        let (fired, completed) = tokio::join!(
            store.record_fires(&next, at + secs(1), Audit::none()),
            store.complete_attempts(&ends, at + secs(1)),
        );
        let fired = fired.unwrap().runs.remove(0);
        assert!(matches!(
            completed.unwrap()[0],
            CompletionEffect::Accepted { .. }
        ));
        assert_eq!(
            run(store, fired.run_id).await.0.state,
            RunState::Queued,
            "round {round}: the new run is not stranded"
        );
        let (_, attempts) = run(store, fired.run_id).await;
        assert!(attempts.is_empty());
        // Clear it for the next round.
        store
            .cancel_run(fired.run_id, at + secs(1), Audit::none())
            .await
            .unwrap();
        at += secs(10);
    }
}

pub async fn scheduled_jobs_come_by_partition(store: &dyn Store) {
    use sked_core::cluster::partition_of;
    let mut ids = Vec::new();
    for i in 0..40 {
        let misfire = if i % 2 == 0 { "skip" } else { "run_all" };
        let spec = every_second(serde_json::json!({
            "misfire": {"policy": misfire},
            "paused": i % 3 == 0,
        }));
        ids.push(put(store, &format!("p{i:02}"), spec).await.id);
    }
    let some: Vec<u32> = ids.iter().take(10).map(|id| partition_of(*id)).collect();
    let mut expected: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| some.contains(&partition_of(*id)))
        .collect();
    expected.sort_unstable();
    let found: Vec<i64> = scheduled_in_pages(store, Some(&some), 3)
        .await
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(
        found, expected,
        "pages in id order, of the given partitions"
    );
    assert!(store
        .scheduled_jobs(Some(&[]), 0, 100)
        .await
        .unwrap()
        .is_empty());
    // Every page size gives each job once, and each as the full record says.
    for size in [1, 7, 40, 100] {
        let all = scheduled_in_pages(store, None, size).await;
        assert_eq!(all.len(), ids.len(), "page size {size}");
        for job in all {
            let record = store.get_job_by_id(job.id).await.unwrap().unwrap();
            assert_eq!(ScheduledJob::of(record), Some(job));
        }
    }
}

/// Every scheduled job, `size` at a time.
async fn scheduled_in_pages(
    store: &dyn Store,
    partitions: Option<&[u32]>,
    size: u32,
) -> Vec<ScheduledJob> {
    let mut all: Vec<ScheduledJob> = Vec::new();
    loop {
        let after = all.last().map_or(0, |j| j.id);
        let page = store.scheduled_jobs(partitions, after, size).await.unwrap();
        assert!(page.len() <= size as usize);
        let done = page.len() < size as usize;
        all.extend(page);
        if done {
            return all;
        }
    }
}

fn grant(role: Role, namespaces: &[&str]) -> Grant {
    Grant {
        role,
        namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
        shell: false,
        labels: None,
    }
}

fn new_token(name: &str, grant: Grant) -> NewToken {
    NewToken {
        name: name.to_string(),
        grant,
        // Stands in for the SHA-256 hex of a secret: unique per name.
        hash: format!("hash-of-{name}"),
        expires_at: None,
    }
}

async fn token_named(store: &dyn Store, name: &str) -> Option<TokenRecord> {
    store
        .token_by_hash(&format!("hash-of-{name}"))
        .await
        .expect("token_by_hash")
}

pub async fn tokens_are_found_by_hash_listed_by_name_and_revoked(store: &dyn Store) {
    let label = |text: &str| LabelRule::try_from(text.to_string()).expect("label rule");
    let mut editor = grant(Role::Editor, &["team-a", "team-b"]);
    editor.shell = true;
    let mut worker = grant(Role::Worker, &["team-a"]);
    worker.labels = Some(vec![label("pool=general"), label("zone=*")]);
    let mut expiring = new_token("ci-deploy", editor.clone());
    expiring.expires_at = Some(t0() + Span::days(30));
    let mut expired = new_token("old", grant(Role::Viewer, &["*"]));
    expired.expires_at = Some(t0() - Span::days(1));
    let wanted = [
        expiring,
        new_token("worker-eu", worker.clone()),
        new_token("admin", grant(Role::Admin, &["*"])),
        // Upper case sorts first, by byte, on every store.
        new_token("Zed", grant(Role::Viewer, &["team-b"])),
        expired,
    ];
    let mut created = Vec::new();
    for token in &wanted {
        let record = store
            .create_token(token, t0(), Audit::none())
            .await
            .unwrap();
        assert_eq!(record.name, token.name);
        assert_eq!(record.grant, token.grant, "the grant round-trips");
        assert_eq!(record.created_at, t0());
        assert_eq!(record.expires_at, token.expires_at);
        assert_eq!(record.last_used_at, None);
        created.push(record);
    }
    let mut ids: Vec<i64> = created.iter().map(|t| t.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), created.len(), "one id per token");

    // Found by hash, exactly, expired or not; the store does not judge expiry.
    for record in &created {
        assert_eq!(
            token_named(store, &record.name).await.as_ref(),
            Some(record)
        );
    }
    assert_eq!(store.token_by_hash("hash-of-").await.unwrap(), None);
    assert_eq!(store.token_by_hash("HASH-OF-ADMIN").await.unwrap(), None);
    let old = token_named(store, "old").await.unwrap();
    assert!(old.expired(t0()));
    assert_eq!(old.grant.labels, None);
    let eu = token_named(store, "worker-eu").await.unwrap();
    assert_eq!(eu.grant.labels, worker.labels);
    assert!(token_named(store, "ci-deploy").await.unwrap().grant.shell);

    let names: Vec<String> = store
        .list_tokens()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["Zed", "admin", "ci-deploy", "old", "worker-eu"]);

    // A taken name is a conflict, and nothing of the second token is kept.
    let mut again = new_token("admin", grant(Role::Viewer, &["team-a"]));
    again.hash = "another-secret".into();
    let err = store
        .create_token(&again, t0(), Audit::none())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Conflict(m) if m.contains("admin")),
        "{err:?}"
    );
    assert_eq!(store.token_by_hash("another-secret").await.unwrap(), None);
    assert_eq!(
        token_named(store, "admin").await.unwrap().grant.role,
        Role::Admin
    );
    // Two creates of one name at once: one token.
    let (one, two) = (
        new_token("racer", grant(Role::Viewer, &["*"])),
        NewToken {
            hash: "racer-2".into(),
            ..new_token("racer", grant(Role::Editor, &["*"]))
        },
    );
    let (a, b) = tokio::join!(
        store.create_token(&one, t0(), Audit::none()),
        store.create_token(&two, t0(), Audit::none())
    );
    assert!(a.is_ok() != b.is_ok(), "{a:?} {b:?}");
    assert!(matches!(a.err().or(b.err()), Some(StoreError::Conflict(_))));

    // Revoked: gone from lookups and the list; the record deleted is returned once.
    let revoked = store
        .revoke_token("ci-deploy", Audit::none())
        .await
        .unwrap();
    assert_eq!(revoked.as_ref(), Some(&created[0]));
    assert_eq!(token_named(store, "ci-deploy").await, None);
    assert_eq!(
        store
            .revoke_token("ci-deploy", Audit::none())
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .revoke_token("never-was", Audit::none())
            .await
            .unwrap(),
        None
    );
    let left: Vec<String> = store
        .list_tokens()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(left, ["Zed", "admin", "old", "racer", "worker-eu"]);
    // A token of a revoked token's name is a new token, with an id never used before (workers
    // keep the id of the token they registered with).
    let highest = store
        .list_tokens()
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .max()
        .unwrap();
    store
        .revoke_token("racer", Audit::none())
        .await
        .unwrap()
        .unwrap();
    let renewed = store
        .create_token(
            &new_token("ci-deploy", editor),
            t0() + secs(1),
            Audit::none(),
        )
        .await
        .unwrap();
    assert!(renewed.id > highest, "{} after {highest}", renewed.id);
    assert_eq!(renewed.created_at, t0() + secs(1));
}

pub async fn token_use_is_recorded_and_never_goes_back(store: &dyn Store) {
    let a = store
        .create_token(
            &new_token("a", grant(Role::Viewer, &["*"])),
            t0(),
            Audit::none(),
        )
        .await
        .unwrap();
    let b = store
        .create_token(
            &new_token("b", grant(Role::Viewer, &["*"])),
            t0(),
            Audit::none(),
        )
        .await
        .unwrap();
    let used =
        |name: &'static str| async move { token_named(store, name).await.unwrap().last_used_at };
    store.touch_tokens(&[]).await.unwrap();
    store
        .touch_tokens(&[(a.id, t0() + secs(10))])
        .await
        .unwrap();
    assert_eq!(used("a").await, Some(t0() + secs(10)));
    assert_eq!(used("b").await, None, "only the tokens named");
    // An earlier instant (a node whose batch was slower) is ignored.
    store.touch_tokens(&[(a.id, t0() + secs(5))]).await.unwrap();
    assert_eq!(used("a").await, Some(t0() + secs(10)));
    // Later wins, within one batch too; unknown ids are ignored.
    store
        .touch_tokens(&[
            (a.id, t0() + secs(30)),
            (b.id, t0() + secs(7)),
            (a.id, t0() + secs(20)),
            (a.id.max(b.id) + 1000, t0() + secs(40)),
        ])
        .await
        .unwrap();
    assert_eq!(used("a").await, Some(t0() + secs(30)));
    assert_eq!(used("b").await, Some(t0() + secs(7)));
    let listed: Vec<Option<Instant>> = store
        .list_tokens()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.last_used_at)
        .collect();
    assert_eq!(listed, [Some(t0() + secs(30)), Some(t0() + secs(7))]);
}

pub async fn a_tokens_sessions_end_at_a_logout_and_never_come_back(store: &dyn Store) {
    let a = store
        .create_token(
            &new_token("a", grant(Role::Viewer, &["*"])),
            t0(),
            Audit::none(),
        )
        .await
        .unwrap();
    let b = store
        .create_token(
            &new_token("b", grant(Role::Viewer, &["*"])),
            t0(),
            Audit::none(),
        )
        .await
        .unwrap();
    assert_eq!(a.sessions_ended_at, None);
    let ended = |name: &'static str| async move {
        token_named(store, name).await.unwrap().sessions_ended_at
    };
    assert!(store.end_sessions(a.id, t0() + secs(10)).await.unwrap());
    assert_eq!(ended("a").await, Some(t0() + secs(10)));
    assert_eq!(ended("b").await, None, "only the token named");
    // An earlier logout (a node whose clock is behind) does not bring sessions back.
    assert!(store.end_sessions(a.id, t0() + secs(5)).await.unwrap());
    assert_eq!(ended("a").await, Some(t0() + secs(10)));
    assert!(store.end_sessions(a.id, t0() + secs(20)).await.unwrap());
    assert_eq!(ended("a").await, Some(t0() + secs(20)));
    assert!(!store
        .end_sessions(a.id.max(b.id) + 1000, t0())
        .await
        .unwrap());
}

fn entry(at: i64, actor: &str, action: &str, namespace: Option<&str>, object: &str) -> AuditEntry {
    AuditEntry {
        at: t0() + secs(at),
        actor: actor.to_string(),
        actor_id: None,
        peer: None,
        action: action.to_string(),
        namespace: namespace.map(str::to_string),
        object: Some(object.to_string()),
        before: None,
        after: None,
    }
}

async fn audit_page(store: &dyn Store, query: AuditQuery) -> Vec<AuditRecord> {
    let page = store.list_audit(&query).await.expect("list_audit");
    assert_eq!(page.next_cursor, None, "one page");
    page.items
}

pub async fn audit_entries_list_newest_first_and_filter(store: &dyn Store) {
    let mut token = entry(1, "admin", "token.create", None, "ci");
    token.actor_id = Some(1);
    token.after = Some(serde_json::json!({"role": "editor", "namespaces": ["a"]}));
    let mut put_a = entry(2, "ci", "job.put", Some("a"), "nightly");
    put_a.actor_id = Some(2);
    put_a.peer = Some("10.0.0.7:51234".into());
    put_a.after = Some(serde_json::json!({"schedule": {"cron": "0 3 * * *"}, "env": {"K": "***"}}));
    let mut put_b = entry(3, "ci", "job.put", Some("b"), "nightly");
    put_b.before = Some(serde_json::json!({"priority": 1}));
    put_b.after = Some(serde_json::json!({"priority": 2}));
    let cancel = entry(4, "ops", "run.cancel", Some("a"), "17");
    let mut refused = entry(5, "anonymous", "auth.failed", None, "x");
    refused.object = None;
    refused.peer = Some("[::1]:4000".into());
    let entries = vec![token, put_a, put_b, cancel, refused];
    store.append_audit(&[]).await.unwrap();
    store.append_audit(&entries).await.unwrap();

    let all = audit_page(store, AuditQuery::default()).await;
    let got: Vec<AuditEntry> = all.iter().map(|r| r.entry.clone()).collect();
    let newest_first: Vec<AuditEntry> = entries.iter().rev().cloned().collect();
    assert_eq!(got, newest_first, "every field round-trips, newest first");
    assert!(all.windows(2).all(|w| w[0].id > w[1].id), "ids descend");

    // Which entries (by their `at` second) a query returns.
    let seconds = |query: AuditQuery| async move {
        audit_page(store, query)
            .await
            .iter()
            .map(|r| (r.entry.at - t0()).num_seconds())
            .collect::<Vec<_>>()
    };
    let visible = |names: &[&str]| Some(names.iter().map(|n| n.to_string()).collect());
    let q = AuditQuery::default;
    assert_eq!(
        seconds(AuditQuery {
            visible: visible(&["a"]),
            ..q()
        })
        .await,
        [4, 2]
    );
    assert_eq!(
        seconds(AuditQuery {
            visible: visible(&["a", "b"]),
            ..q()
        })
        .await,
        [4, 3, 2],
        "entries without a namespace are hidden from a namespace view"
    );
    assert!(seconds(AuditQuery {
        visible: visible(&[]),
        ..q()
    })
    .await
    .is_empty());
    assert!(seconds(AuditQuery {
        visible: visible(&["c"]),
        ..q()
    })
    .await
    .is_empty());
    let namespace = |n: &str| Some(n.to_string());
    assert_eq!(
        seconds(AuditQuery {
            namespace: namespace("a"),
            ..q()
        })
        .await,
        [4, 2]
    );
    assert_eq!(
        seconds(AuditQuery {
            object: namespace("nightly"),
            ..q()
        })
        .await,
        [3, 2]
    );
    assert_eq!(
        seconds(AuditQuery {
            object: namespace("night"),
            ..q()
        })
        .await,
        [0i64; 0],
        "exact"
    );
    assert_eq!(
        seconds(AuditQuery {
            actor: namespace("ci"),
            ..q()
        })
        .await,
        [3, 2]
    );
    assert_eq!(
        seconds(AuditQuery {
            since: Some(t0() + secs(3)),
            ..q()
        })
        .await,
        [5, 4, 3],
        "at or after"
    );
    assert_eq!(
        seconds(AuditQuery {
            since: Some(t0() + secs(2)),
            until: Some(t0() + secs(4)),
            ..q()
        })
        .await,
        [3, 2],
        "before, with at or after"
    );
    assert_eq!(
        seconds(AuditQuery {
            visible: visible(&["b"]),
            actor: namespace("ci"),
            ..q()
        })
        .await,
        [3]
    );
    assert!(seconds(AuditQuery {
        visible: visible(&["b"]),
        namespace: namespace("a"),
        ..q()
    })
    .await
    .is_empty());
    assert_eq!(
        seconds(AuditQuery {
            namespace: namespace("a"),
            actor: namespace("ops"),
            object: namespace("17"),
            since: Some(t0() + secs(4)),
            ..q()
        })
        .await,
        [4]
    );
}

pub async fn audit_pages_reach_each_entry_once(store: &dyn Store) {
    let entries: Vec<AuditEntry> = (1..=25)
        .map(|i| {
            let ns = if i % 2 == 0 { "even" } else { "odd" };
            entry(i, "ci", "job.put", Some(ns), &format!("job-{i}"))
        })
        .collect();
    // Appended in two calls: ids keep rising across them.
    store.append_audit(&entries[..10]).await.unwrap();
    store.append_audit(&entries[10..]).await.unwrap();
    let walk = |query: AuditQuery| async move {
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = store
                .list_audit(&AuditQuery {
                    limit: 7,
                    cursor: cursor.clone(),
                    ..query.clone()
                })
                .await
                .unwrap();
            assert!(page.items.len() <= 7);
            seen.extend(page.items.iter().map(|r| (r.entry.at - t0()).num_seconds()));
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        seen
    };
    let all = walk(AuditQuery::default()).await;
    assert_eq!(all, (1..=25).rev().collect::<Vec<_>>());
    let even = walk(AuditQuery {
        visible: Some(vec!["even".into()]),
        ..Default::default()
    })
    .await;
    assert_eq!(even, (1..=12).rev().map(|i| i * 2).collect::<Vec<_>>());
    // Exactly a page's worth: no cursor for an empty page after it.
    let page = store
        .list_audit(&AuditQuery {
            limit: 25,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((page.items.len(), page.next_cursor), (25, None));

    for bad in ["not-a-cursor", "t.1.61", "m.x.1"] {
        let err = store
            .list_audit(&AuditQuery {
                cursor: Some(bad.into()),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidCursor(_)),
            "{bad}: {err:?}"
        );
    }
}

pub async fn audit_retention_deletes_the_oldest_first(store: &dyn Store) {
    let entries: Vec<AuditEntry> = (1..=10)
        .map(|i| entry(i, "ci", "job.put", Some("a"), "j"))
        .collect();
    store.append_audit(&entries).await.unwrap();
    let cut = t0() + secs(6);
    assert_eq!(store.delete_audit_before(t0(), 100).await.unwrap(), 0);
    assert_eq!(store.delete_audit_before(cut, 3).await.unwrap(), 3);
    let kept = |items: Vec<AuditRecord>| -> Vec<i64> {
        items
            .iter()
            .map(|r| (r.entry.at - t0()).num_seconds())
            .collect()
    };
    assert_eq!(
        kept(audit_page(store, AuditQuery::default()).await),
        [10, 9, 8, 7, 6, 5, 4],
        "the oldest went first"
    );
    assert_eq!(store.delete_audit_before(cut, 100).await.unwrap(), 2);
    assert_eq!(store.delete_audit_before(cut, 100).await.unwrap(), 0);
    assert_eq!(
        kept(audit_page(store, AuditQuery::default()).await),
        [10, 9, 8, 7, 6],
        "an entry at the cut is kept"
    );
}

pub async fn workers_keep_their_namespaces_and_token(store: &dyn Store) {
    let now = t0() + secs(1);
    let registered = [
        NewWorker {
            id: "w-all".into(),
            name: "anywhere".into(),
            labels: BTreeMap::new(),
            slots: 2,
            namespaces: vec!["*".into()],
            token_id: None,
            publisher: false,
        },
        NewWorker {
            id: "w-ab".into(),
            name: "team workers".into(),
            labels: [("pool".to_string(), "general".to_string())].into(),
            slots: 8,
            namespaces: vec!["team-a".into(), "team-b".into()],
            token_id: Some(42),
            publisher: false,
        },
    ];
    for w in &registered {
        store.register_worker(w, now).await.unwrap();
    }
    let listed = store.list_workers(10, None).await.unwrap().items;
    assert_eq!(listed.len(), 2);
    for w in &registered {
        let got = store.get_worker(&w.id).await.unwrap().expect("registered");
        assert_eq!(
            (&got.namespaces, got.token_id, &got.labels, got.slots),
            (&w.namespaces, w.token_id, &w.labels, w.slots)
        );
        let in_list = listed.iter().find(|l| l.id == w.id).expect("listed");
        assert_eq!(in_list, &got);
    }
}

pub async fn a_clean_stop_is_stopped_not_lost_and_takes_back_its_attempts(store: &dyn Store) {
    let now = t0() + secs(1);
    let leaving = NewWorker {
        id: "w-leaving".into(),
        name: "leaving".into(),
        labels: BTreeMap::new(),
        slots: 2,
        namespaces: vec!["*".into()],
        token_id: None,
        publisher: false,
    };
    let publisher = NewWorker {
        id: "publisher-n1".into(),
        name: "publisher of n1".into(),
        publisher: true,
        ..leaving.clone()
    };
    for w in [&leaving, &publisher] {
        store.register_worker(w, now).await.unwrap();
    }
    let got = store
        .get_worker("publisher-n1")
        .await
        .unwrap()
        .expect("registered");
    assert_eq!((got.publisher, got.state), (true, WorkerState::Active));
    let job = job(
        "j",
        serde_json::json!({"target": {"shell": {"command": "true"}}}),
        now,
    );
    let (_, job) = store
        .put_job("default", &job, PutMode::Upsert, now, Audit::none())
        .await
        .unwrap();
    let fire = Fire {
        job_id: job.id,
        scheduled_for: now,
        trigger: Trigger::Manual,
        skip: None,
        ready_at: now,
        advance: None,
        nominal_for: None,
        why: None,
    };
    let fired = store
        .record_fires(&[fire], now, Audit::none())
        .await
        .unwrap();
    let run_id = fired.runs[0].run_id;
    let start = AttemptStart {
        run_id,
        worker_id: "w-leaving".into(),
        token: 1,
        lease_expires_at: now + secs(60),
        flow: None,
    };
    store.start_attempts(&[start], now).await.unwrap();

    let stopped = store
        .deregister_worker("w-leaving", now + secs(2))
        .await
        .unwrap()
        .expect("a live worker");
    assert_eq!(
        (stopped.alive, stopped.state, stopped.publisher),
        (false, WorkerState::Stopped, false)
    );
    // Once only; an unknown worker is none.
    assert_eq!(
        store
            .deregister_worker("w-leaving", now + secs(3))
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.deregister_worker("nobody", now).await.unwrap(), None);
    // Its attempt's lease ended with it: the reaper queues the run again at once, without
    // declaring the worker dead, and it stays stopped.
    let reaped = store.reap(now - secs(60), now + secs(3)).await.unwrap();
    assert_eq!(reaped.requeued, [run_id]);
    assert!(reaped.dead_workers.is_empty(), "{reaped:?}");
    let got = store.get_worker("w-leaving").await.unwrap().expect("kept");
    assert_eq!(got.state, WorkerState::Stopped);
    let beat = store
        .heartbeat(
            "w-leaving",
            &[],
            now + secs(4),
            LeaseRenewal::all(now + secs(60)),
            now,
        )
        .await
        .unwrap();
    assert!(!beat.known, "a stopped worker must register again");
}

/// An audit entry of the `deploy` token about `object` of namespace `default`.
fn deploy_entry(at: Instant, action: &str, object: &str) -> AuditEntry {
    AuditEntry {
        at,
        actor: "deploy".into(),
        actor_id: Some(7),
        peer: None,
        action: action.into(),
        namespace: Some("default".into()),
        object: Some(object.into()),
        before: None,
        after: None,
    }
}

pub async fn an_audited_write_commits_its_entries_with_it(store: &dyn Store) {
    let now = t0();
    let entry = move |action: &str, object: &str| deploy_entry(now, action, object);
    let audit = Audit::new(move |(outcome, record): &(PutOutcome, JobRecord)| {
        if *outcome == PutOutcome::Unchanged {
            Vec::new()
        } else {
            vec![entry("job.put", &record.name)]
        }
    });
    let spec = job(
        "audited",
        serde_json::json!({"target": {"shell": {"command": "true"}}}),
        now,
    );
    store
        .put_job("default", &spec, PutMode::Upsert, now, audit.clone())
        .await
        .unwrap();
    // Nothing changed: the audit says no entry, and none is written.
    let (outcome, _) = store
        .put_job("default", &spec, PutMode::Upsert, now, audit)
        .await
        .unwrap();
    assert_eq!(outcome, PutOutcome::Unchanged);
    let trail = store
        .list_audit(&AuditQuery {
            limit: 10,
            ..AuditQuery::default()
        })
        .await
        .unwrap()
        .items;
    let written: Vec<(&str, Option<&str>)> = trail
        .iter()
        .map(|r| (r.entry.action.as_str(), r.entry.object.as_deref()))
        .collect();
    assert_eq!(written, [("job.put", Some("audited"))]);
    assert_eq!(trail[0].entry.actor_id, Some(7));
}

// --- namespaces and their secrets -------------------------------------------------------------

fn settings(json: serde_json::Value) -> NamespaceSpec {
    serde_json::from_value(json).expect("contract namespace settings")
}

pub async fn namespace_settings_are_kept_listed_and_forgotten(store: &dyn Store) {
    assert_eq!(store.get_namespace("team-a").await.unwrap(), None);
    let capped = settings(serde_json::json!({"max_jobs": 10, "max_queued_runs": 50}));
    let (before, first) = store
        .put_namespace("team-a", &capped, t0(), Audit::none())
        .await
        .unwrap();
    assert_eq!(before, None);
    assert_eq!((first.name.as_str(), &first.spec), ("team-a", &capped));
    assert_eq!((first.created_at, first.updated_at), (t0(), t0()));

    let strict = settings(serde_json::json!({"allow_shell": false}));
    let (before, second) = store
        .put_namespace("team-a", &strict, t0() + secs(5), Audit::none())
        .await
        .unwrap();
    assert_eq!(before.as_ref(), Some(&first));
    assert_eq!(second.spec, strict);
    assert_eq!(
        (second.created_at, second.updated_at),
        (t0(), t0() + secs(5))
    );
    assert_eq!(
        store.get_namespace("team-a").await.unwrap(),
        Some(second.clone())
    );

    store
        .put_namespace("Billing", &NamespaceSpec::default(), t0(), Audit::none())
        .await
        .unwrap();
    let names: Vec<String> = store
        .list_namespaces()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, ["Billing", "team-a"]);

    assert_eq!(
        store
            .delete_namespace("team-a", Audit::none())
            .await
            .unwrap(),
        Some(second)
    );
    assert_eq!(
        store
            .delete_namespace("team-a", Audit::none())
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.get_namespace("team-a").await.unwrap(), None);
}

async fn put_in(
    store: &dyn Store,
    namespace: &str,
    name: &str,
    target: serde_json::Value,
) -> Result<PutOutcome> {
    let json = serde_json::json!({"schedule": {"every": "1s"}, "target": target});
    store
        .put_job(
            namespace,
            &job(name, json, t0()),
            PutMode::Upsert,
            t0(),
            Audit::none(),
        )
        .await
        .map(|(outcome, _)| outcome)
}

pub async fn namespace_settings_refuse_jobs_inside_the_write(store: &dyn Store) {
    let shell = serde_json::json!({"shell": {"command": "true"}});
    let http = serde_json::json!({"http": {"url": "https://example.com/"}});

    // A cap on jobs stops creations, not updates, and a refused write leaves nothing behind.
    store
        .put_namespace(
            "capped",
            &settings(serde_json::json!({"max_jobs": 2})),
            t0(),
            Audit::none(),
        )
        .await
        .unwrap();
    put_in(store, "capped", "one", http.clone()).await.unwrap();
    put_in(store, "capped", "two", http.clone()).await.unwrap();
    let err = put_in(store, "capped", "three", http.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Refused(NamespaceRefusal::TooManyJobs { max: 2, .. })
        ),
        "{err:?}"
    );
    assert_eq!(store.get_job("capped", "three").await.unwrap(), None);
    assert_eq!(
        put_in(store, "capped", "two", shell.clone()).await.unwrap(),
        PutOutcome::Updated
    );
    // Other namespaces are not counted against it.
    put_in(store, "elsewhere", "three", http.clone())
        .await
        .unwrap();

    // Eight creates racing for the last three places: three win.
    store
        .put_namespace(
            "race",
            &settings(serde_json::json!({"max_jobs": 3})),
            t0(),
            Audit::none(),
        )
        .await
        .unwrap();
    let names: Vec<String> = (0..8).map(|i| format!("racer-{i}")).collect();
    let racing = names
        .iter()
        .map(|name| put_in(store, "race", name, http.clone()));
    let outcomes = futures_util::future::join_all(racing).await;
    let created = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(created, 3, "{outcomes:?}");

    // Forbidding shell targets waits until the namespace has no shell job, and then refuses
    // new ones.
    let no_shell = settings(serde_json::json!({"allow_shell": false}));
    let err = store
        .put_namespace("capped", &no_shell, t0(), Audit::none())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Refused(NamespaceRefusal::ShellJobsExist { jobs, .. }) if jobs == &["two"]),
        "{err:?}"
    );
    assert_eq!(
        store
            .get_namespace("capped")
            .await
            .unwrap()
            .unwrap()
            .spec
            .max_jobs,
        Some(2)
    );
    put_in(store, "capped", "two", http.clone()).await.unwrap();
    store
        .put_namespace("capped", &no_shell, t0(), Audit::none())
        .await
        .unwrap();
    let err = put_in(store, "capped", "two", shell.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Refused(NamespaceRefusal::ShellForbidden { .. })
        ),
        "{err:?}"
    );
    put_in(store, "elsewhere", "four", shell).await.unwrap();
}

pub async fn namespace_secrets_are_kept_sealed_and_listed_without_values(store: &dyn Store) {
    let (created, first) = store
        .put_secret("team-a", "db-password", "v1:sealed-1", t0(), Audit::none())
        .await
        .unwrap();
    assert!(created);
    assert_eq!(
        (
            first.namespace.as_str(),
            first.name.as_str(),
            first.created_at
        ),
        ("team-a", "db-password", t0())
    );
    let (created, again) = store
        .put_secret(
            "team-a",
            "db-password",
            "v1:sealed-2",
            t0() + secs(1),
            Audit::none(),
        )
        .await
        .unwrap();
    assert!(!created);
    assert_eq!((again.created_at, again.updated_at), (t0(), t0() + secs(1)));
    store
        .put_secret("team-a", "api-key", "v1:sealed-3", t0(), Audit::none())
        .await
        .unwrap();
    store
        .put_secret("team-b", "db-password", "v1:sealed-b", t0(), Audit::none())
        .await
        .unwrap();

    let listed: Vec<String> = store
        .list_secrets("team-a")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(listed, ["api-key", "db-password"]);

    let key = |ns: &str, name: &str| (ns.to_string(), name.to_string());
    let found = store
        .sealed_secrets(&[
            key("team-a", "db-password"),
            key("team-b", "db-password"),
            key("team-a", "missing"),
        ])
        .await
        .unwrap();
    assert_eq!(found.len(), 2);
    assert_eq!(found[&key("team-a", "db-password")], "v1:sealed-2");
    assert_eq!(found[&key("team-b", "db-password")], "v1:sealed-b");
    assert!(store.sealed_secrets(&[]).await.unwrap().is_empty());

    // Sealed again in place (a newer format): only while the text is still the one read.
    let stored = store.sealed_texts("v1:sealed-b").await.unwrap();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(
        stored[0].column,
        crate::SealedColumn::Secret("team-b".into(), "db-password".into())
    );
    assert_eq!(
        (stored[0].namespace.as_str(), stored[0].job.as_deref()),
        ("team-b", None)
    );
    assert!(store
        .replace_sealed(&stored[0], "v2:sealed-b")
        .await
        .unwrap());
    assert!(!store.replace_sealed(&stored[0], "v2:stale").await.unwrap());
    let found = store
        .sealed_secrets(&[key("team-b", "db-password")])
        .await
        .unwrap();
    assert_eq!(found[&key("team-b", "db-password")], "v2:sealed-b");

    assert_eq!(
        store
            .delete_secret("team-a", "db-password", Audit::none())
            .await
            .unwrap(),
        Some(again)
    );
    assert_eq!(
        store
            .delete_secret("team-a", "db-password", Audit::none())
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.list_secrets("team-a").await.unwrap().len(), 1);

    // A namespace keeps at most so many secrets; replacing one of them is still possible.
    for i in 0..sked_core::namespace::MAX_SECRETS_PER_NAMESPACE {
        store
            .put_secret("full", &format!("s{i}"), "v1:x", t0(), Audit::none())
            .await
            .unwrap();
    }
    let err = store
        .put_secret("full", "one-more", "v1:x", t0(), Audit::none())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Refused(NamespaceRefusal::TooManySecrets { .. })
        ),
        "{err:?}"
    );
    store
        .put_secret("full", "s0", "v1:y", t0(), Audit::none())
        .await
        .unwrap();
}

// --- calendars ---------------------------------------------------------------------------

/// A calendar from JSON.
fn calendar_spec(json: serde_json::Value) -> sked_core::calendar::CalendarSpec {
    serde_json::from_value(json).expect("contract calendar JSON")
}

/// Asserts that the audit entries `query` finds are `expected`, as (action, object), newest
/// first.
async fn assert_trail(store: &dyn Store, query: AuditQuery, expected: &[(&str, Option<&str>)]) {
    let trail = audit_page(store, query).await;
    let written: Vec<(&str, Option<&str>)> = trail
        .iter()
        .map(|r| (r.entry.action.as_str(), r.entry.object.as_deref()))
        .collect();
    assert_eq!(written, expected);
}

pub async fn calendars_are_versioned_listed_and_kept_per_namespace(store: &dyn Store) {
    let first = calendar_spec(serde_json::json!({
        "timezone": "Europe/London",
        "holidays": [{"date": "2026-12-25", "label": "Christmas Day"}],
    }));
    let (outcome, created) = store
        .put_calendar("team-a", "uk", &first, t0(), Audit::none())
        .await
        .unwrap();
    assert_eq!(outcome, PutOutcome::Created);
    assert_eq!(
        (
            created.namespace.as_str(),
            created.name.as_str(),
            created.version,
            created.created_at,
            created.updated_at,
        ),
        ("team-a", "uk", 1, t0(), t0())
    );
    assert_eq!(created.spec, first);

    // The same definition again changes nothing, not even the instant it was written.
    let (outcome, same) = store
        .put_calendar("team-a", "uk", &first, t0() + secs(1), Audit::none())
        .await
        .unwrap();
    assert_eq!(outcome, PutOutcome::Unchanged);
    assert_eq!(same, created);

    let mut second = first.clone();
    second.weekdays = Some(vec!["mon".into(), "tue".into()]);
    let (outcome, updated) = store
        .put_calendar("team-a", "uk", &second, t0() + secs(2), Audit::none())
        .await
        .unwrap();
    assert_eq!(outcome, PutOutcome::Updated);
    assert_eq!(
        (updated.version, updated.created_at, updated.updated_at),
        (2, t0(), t0() + secs(2))
    );
    let (outcome, again) = store
        .put_calendar("team-a", "uk", &first, t0() + secs(3), Audit::none())
        .await
        .unwrap();
    assert_eq!((outcome, again.version), (PutOutcome::Updated, 3));
    assert_eq!(
        store.get_calendar("team-a", "uk").await.unwrap(),
        Some(again.clone())
    );

    for name in ["weekends", "eu", "us"] {
        store
            .put_calendar("team-a", name, &second, t0(), Audit::none())
            .await
            .unwrap();
    }
    let names: Vec<String> = store
        .list_calendars("team-a")
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["eu", "uk", "us", "weekends"]);

    // Another namespace sees none of them, and has its own of the same name.
    assert_eq!(store.get_calendar("team-b", "uk").await.unwrap(), None);
    assert!(store.list_calendars("team-b").await.unwrap().is_empty());
    let (outcome, theirs) = store
        .put_calendar("team-b", "uk", &second, t0(), Audit::none())
        .await
        .unwrap();
    assert_eq!((outcome, theirs.version), (PutOutcome::Created, 1));
    assert_eq!(
        store.get_calendar("team-a", "uk").await.unwrap(),
        Some(again)
    );
}

pub async fn a_calendar_in_use_is_deleted_only_when_forced(store: &dyn Store) {
    let plain = calendar_spec(serde_json::json!({}));
    for name in ["uk", "spare"] {
        store
            .put_calendar("default", name, &plain, t0(), Audit::none())
            .await
            .unwrap();
    }
    let including = calendar_spec(serde_json::json!({"include": ["uk"]}));
    let excepting = calendar_spec(serde_json::json!({"include": ["spare"], "except": ["uk"]}));
    store
        .put_calendar("default", "london", &including, t0(), Audit::none())
        .await
        .unwrap();
    store
        .put_calendar("default", "bank", &excepting, t0(), Audit::none())
        .await
        .unwrap();
    let on_uk = serde_json::json!({
        "schedule": {"cron": "0 9 * * *", "calendar": "uk"},
        "target": {"shell": {"command": "true"}},
    });
    put(store, "report", on_uk.clone()).await;
    put(store, "payroll", on_uk.clone()).await;
    put(store, "other", every_second(serde_json::json!({}))).await;
    // The same names elsewhere are not users.
    store
        .put_calendar("elsewhere", "london", &including, t0(), Audit::none())
        .await
        .unwrap();
    store
        .put_job(
            "elsewhere",
            &job("report", on_uk, t0()),
            PutMode::Upsert,
            t0(),
            Audit::none(),
        )
        .await
        .unwrap();

    let users = store.calendar_users("default", "uk").await.unwrap();
    let expected = sked_core::calendar::CalendarUsers {
        jobs: vec!["payroll".into(), "report".into()],
        calendars: vec!["bank".into(), "london".into()],
    };
    assert_eq!(users, expected);
    assert_eq!(
        store.calendar_users("default", "spare").await.unwrap(),
        sked_core::calendar::CalendarUsers {
            jobs: vec![],
            calendars: vec!["bank".into()],
        }
    );
    assert!(store
        .calendar_users("default", "london")
        .await
        .unwrap()
        .is_empty());

    // Named: refused, and nothing is deleted.
    assert_eq!(
        store
            .delete_calendar("default", "uk", false, Audit::none())
            .await
            .unwrap(),
        CalendarDeletion::InUse(expected.clone())
    );
    let kept = store.get_calendar("default", "uk").await.unwrap();
    assert!(kept.is_some());
    // Forced: deleted, and its users are said.
    assert_eq!(
        store
            .delete_calendar("default", "uk", true, Audit::none())
            .await
            .unwrap(),
        CalendarDeletion::Deleted(kept.unwrap(), expected)
    );
    assert_eq!(store.get_calendar("default", "uk").await.unwrap(), None);
    assert_eq!(
        store
            .delete_calendar("default", "uk", true, Audit::none())
            .await
            .unwrap(),
        CalendarDeletion::Missing
    );
    // One nothing names goes without force.
    let london = store.get_calendar("default", "london").await.unwrap();
    assert_eq!(
        store
            .delete_calendar("default", "london", false, Audit::none())
            .await
            .unwrap(),
        CalendarDeletion::Deleted(
            london.unwrap(),
            sked_core::calendar::CalendarUsers {
                jobs: vec![],
                calendars: vec![],
            }
        )
    );
    assert!(store
        .get_calendar("elsewhere", "london")
        .await
        .unwrap()
        .is_some());
}

pub async fn a_namespace_keeps_at_most_so_many_calendars(store: &dyn Store) {
    let plain = calendar_spec(serde_json::json!({}));
    for i in 0..sked_core::calendar::MAX_CALENDARS_PER_NAMESPACE {
        store
            .put_calendar("full", &format!("c{i}"), &plain, t0(), Audit::none())
            .await
            .unwrap();
    }
    let err = store
        .put_calendar("full", "one-more", &plain, t0(), Audit::none())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Refused(NamespaceRefusal::TooManyCalendars { .. })
        ),
        "{err:?}"
    );
    assert_eq!(store.get_calendar("full", "one-more").await.unwrap(), None);
    // Replacing one of them is still possible, and another namespace is not full.
    let changed = calendar_spec(serde_json::json!({"weekdays": ["mon"]}));
    let (outcome, _) = store
        .put_calendar("full", "c0", &changed, t0(), Audit::none())
        .await
        .unwrap();
    assert_eq!(outcome, PutOutcome::Updated);
    store
        .put_calendar("roomy", "one-more", &plain, t0(), Audit::none())
        .await
        .unwrap();
}

pub async fn calendar_changes_are_audited_with_them_and_no_change_is_not(store: &dyn Store) {
    let now = t0();
    let entry = move |action: &str, object: &str| deploy_entry(now, action, object);
    // Entries for every outcome: the store writes none for a put that changed nothing.
    let put_audit = Audit::new(move |(_, record): &(PutOutcome, CalendarRecord)| {
        vec![entry("calendar.put", &record.name)]
    });
    let delete_audit = Audit::new(move |deletion: &CalendarDeletion| match deletion {
        CalendarDeletion::Deleted(record, _) => vec![entry("calendar.delete", &record.name)],
        _ => Vec::new(),
    });
    let spec = calendar_spec(serde_json::json!({}));
    store
        .put_calendar("default", "uk", &spec, now, put_audit.clone())
        .await
        .unwrap();
    let (outcome, _) = store
        .put_calendar("default", "uk", &spec, now, put_audit.clone())
        .await
        .unwrap();
    assert_eq!(outcome, PutOutcome::Unchanged);
    store
        .delete_calendar("default", "uk", false, delete_audit)
        .await
        .unwrap();
    let query = AuditQuery {
        limit: 10,
        ..AuditQuery::default()
    };
    assert_trail(
        store,
        query,
        &[
            ("calendar.delete", Some("uk")),
            ("calendar.put", Some("uk")),
        ],
    )
    .await;
}

/// A batch's calendars are written with its jobs in one transaction: a refused job leaves
/// no calendar behind, a refused calendar no job; a dry run answers both and writes neither;
/// the audit entries of both commit with them.
pub async fn a_batch_writes_its_calendars_and_jobs_together_or_nothing(store: &dyn Store) {
    let named = |name: &str, json: serde_json::Value| NamedCalendar {
        name: name.to_string(),
        spec: calendar_spec(json),
    };
    let uk = named("uk", serde_json::json!({"timezone": "Europe/London"}));
    let payroll = job(
        "payroll",
        serde_json::json!({
            "schedule": {"cron": "0 9 * * *", "calendar": "uk"},
            "target": {"shell": {"command": "true"}},
        }),
        t0(),
    );
    let orphan = job(
        "orphan",
        serde_json::json!({"target": {"shell": {"command": "true"}}, "depends_on": [{"job": "missing"}]}),
        t0(),
    );
    // A refused job: the calendar before it is not written either.
    let refused = store
        .apply(
            "default",
            &Batch {
                calendars: vec![uk.clone()],
                jobs: vec![payroll.clone(), orphan],
            },
            t0(),
            false,
            Audit::none(),
        )
        .await
        .expect_err("an unknown upstream");
    assert_eq!(refused.at, Some(BatchItem::Job(1)), "{refused:?}");
    assert_eq!(store.get_calendar("default", "uk").await.unwrap(), None);
    assert_eq!(store.get_job("default", "payroll").await.unwrap(), None);

    // A refused calendar (the namespace holds as many as it may): no job is written.
    for i in 0..sked_core::calendar::MAX_CALENDARS_PER_NAMESPACE {
        store
            .put_calendar("full", &format!("c{i}"), &uk.spec, t0(), Audit::none())
            .await
            .unwrap();
    }
    let refused = store
        .apply(
            "full",
            &Batch {
                calendars: vec![named("c0", serde_json::json!({})), uk.clone()],
                jobs: vec![payroll.clone()],
            },
            t0(),
            false,
            Audit::none(),
        )
        .await
        .expect_err("one calendar too many");
    assert_eq!(refused.at, Some(BatchItem::Calendar(1)), "{refused:?}");
    assert!(
        matches!(refused.error, StoreError::Refused(_)),
        "{refused:?}"
    );
    assert_eq!(store.get_job("full", "payroll").await.unwrap(), None);
    let c0 = store.get_calendar("full", "c0").await.unwrap().unwrap();
    assert_eq!((c0.version, &c0.spec), (1, &uk.spec));

    // A dry run answers both and writes neither.
    let batch = Batch {
        calendars: vec![uk.clone()],
        jobs: vec![payroll.clone()],
    };
    let planned = store
        .apply("default", &batch, t0(), true, Audit::none())
        .await
        .unwrap();
    assert_eq!(planned.calendars[0].0, PutOutcome::Created);
    assert_eq!(planned.jobs[0].0, PutOutcome::Created);
    assert!(planned.calendars_changed());
    assert_eq!(store.get_calendar("default", "uk").await.unwrap(), None);
    assert_eq!(store.get_job("default", "payroll").await.unwrap(), None);

    // Written, with an audit entry for each change, in the batch's transaction.
    let now = t0();
    let audit = Audit::new(move |applied: &Applied| {
        let calendars = applied
            .calendars
            .iter()
            .filter(|(outcome, _)| *outcome != PutOutcome::Unchanged)
            .map(|(_, c)| deploy_entry(now, "calendar.put", &c.name));
        let jobs = applied
            .jobs
            .iter()
            .filter(|(outcome, _)| *outcome != PutOutcome::Unchanged)
            .map(|(_, j)| deploy_entry(now, "job.put", &j.name));
        calendars.chain(jobs).collect()
    });
    let written = store
        .apply("default", &batch, now, false, audit.clone())
        .await
        .unwrap();
    assert_eq!(
        store.get_calendar("default", "uk").await.unwrap(),
        Some(written.calendars[0].1.clone())
    );
    assert_eq!(written.calendars[0].1.version, 1);
    assert_eq!(
        store.calendar_users("default", "uk").await.unwrap().jobs,
        ["payroll"]
    );
    // Again: nothing changes, nothing is audited; a changed calendar is versioned.
    let again = store
        .apply("default", &batch, now, false, audit.clone())
        .await
        .unwrap();
    assert!(!again.calendars_changed());
    assert_eq!(again.jobs[0].0, PutOutcome::Unchanged);
    let changed = Batch {
        calendars: vec![named("uk", serde_json::json!({"timezone": "Europe/Paris"}))],
        jobs: Vec::new(),
    };
    let updated = store
        .apply("default", &changed, now, false, audit)
        .await
        .unwrap();
    assert_eq!(updated.calendars[0].0, PutOutcome::Updated);
    assert_eq!(updated.calendars[0].1.version, 2);
    let query = AuditQuery {
        namespace: Some("default".into()),
        limit: 10,
        ..AuditQuery::default()
    };
    assert_trail(
        store,
        query,
        &[
            ("calendar.put", Some("uk")),
            ("job.put", Some("payroll")),
            ("calendar.put", Some("uk")),
        ],
    )
    .await;
}

/// A run a calendar moved keeps the instant its schedule named; one a calendar skipped is
/// skipped with the holiday as its error. Both as one fire of a job at a time and as several
/// of one job in a batch, which a store may write by different paths.
pub async fn runs_remember_a_moved_instant_and_a_calendars_skip(store: &dyn Store) {
    let alone = put(store, "alone", every_second(serde_json::json!({}))).await;
    let batched = put(
        store,
        "batched",
        every_second(serde_json::json!({"overlap": "buffer_all"})),
    )
    .await;
    let moved = |job_id: i64, at: Instant| Fire {
        nominal_for: Some(at - secs(86_400)),
        ..fire(job_id, at)
    };
    let holiday = |job_id: i64, at: Instant| Fire {
        skip: Some(SkipReason::Calendar),
        why: Some("holiday: Christmas Day".into()),
        ..fire(job_id, at)
    };
    let at = t0() + secs(10);
    let one = fire_one(store, moved(alone.id, at)).await.run_id;
    let two = fire_one(store, holiday(alone.id, at + secs(1)))
        .await
        .run_id;
    let plain = fire_one(store, fire(alone.id, at + secs(2))).await.run_id;
    let batch = store
        .record_fires(
            &[moved(batched.id, at), holiday(batched.id, at + secs(1))],
            at,
            Audit::none(),
        )
        .await
        .unwrap();
    let (three, four) = (batch.runs[0].run_id, batch.runs[1].run_id);

    let run = |id: i64| async move { store.get_run(id).await.unwrap().unwrap().0 };
    for id in [one, three] {
        let r = run(id).await;
        assert_eq!(
            (r.scheduled_for, r.nominal_for, r.state),
            (at, Some(at - secs(86_400)), RunState::Queued),
            "{r:?}"
        );
        assert_eq!(r.error, None);
    }
    for id in [two, four] {
        let r = run(id).await;
        assert_eq!(
            (r.state, r.skip_reason, r.error.as_deref(), r.nominal_for),
            (
                RunState::Skipped,
                Some(SkipReason::Calendar),
                Some("holiday: Christmas Day"),
                None
            ),
            "{r:?}"
        );
    }
    assert_eq!(run(plain).await.nominal_for, None);
    // Listed as they are read one by one.
    let listed = store
        .list_runs(&RunQuery {
            namespace: "default".into(),
            job: Some("batched".into()),
            limit: 10,
            ..RunQuery::default()
        })
        .await
        .unwrap()
        .items;
    let seen: Vec<(Option<Instant>, Option<&str>)> = listed
        .iter()
        .map(|r| (r.nominal_for, r.error.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [
            (None, Some("holiday: Christmas Day")),
            (Some(at - secs(86_400)), None)
        ]
    );
}

// --- dependencies ------------------------------------------------------------------------

/// A job without a schedule (a pipeline step), depending on `depends_on`.
fn step(depends_on: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "target": {"shell": {"command": "true"}},
        "depends_on": depends_on,
    })
}

/// extract (every second) -> transform -> load (no schedule); returns extract.
async fn pipeline(store: &dyn Store) -> JobRecord {
    let extract = put(store, "extract", every_second(serde_json::json!({}))).await;
    for (name, upstream) in [("transform", "extract"), ("load", "transform")] {
        put(store, name, step(serde_json::json!([{ "job": upstream }]))).await;
    }
    extract
}

/// Starts the run and reports `outcome`; returns what the completion did.
async fn finish(
    store: &dyn Store,
    run_id: i64,
    outcome: AttemptOutcome,
    now: Instant,
) -> (RunState, Vec<i64>) {
    let attempt = start(store, run_id, "w", 1, now).await;
    match complete(store, report(attempt, 1, outcome), now).await {
        CompletionEffect::Accepted {
            run_state,
            requeued,
            ..
        } => (run_state, requeued),
        refused => panic!("the report was refused: {refused:?}"),
    }
}

/// The runs of job `name`, oldest instant first.
async fn runs_of(store: &dyn Store, name: &str) -> Vec<RunRecord> {
    let mut runs = store
        .list_runs(&RunQuery {
            namespace: "default".into(),
            job: Some(name.into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .items;
    runs.reverse();
    runs
}

pub async fn a_namespaces_edges_are_read_whole_up_to_a_bound(store: &dyn Store) {
    assert!(store
        .namespace_edges("default", 100)
        .await
        .unwrap()
        .is_empty());
    pipeline(store).await;
    put(
        store,
        "report",
        step(serde_json::json!([{"job": "extract"}])),
    )
    .await;
    let edge = |job: &str, upstream: &str| DependencyEdge {
        job: job.into(),
        upstream: upstream.into(),
    };
    // By upstream, then dependant.
    let all = [
        edge("report", "extract"),
        edge("transform", "extract"),
        edge("load", "transform"),
    ];
    assert_eq!(store.namespace_edges("default", 100).await.unwrap(), all);
    assert_eq!(
        store.namespace_edges("default", 2).await.unwrap(),
        all[..2],
        "the bound holds, from the start of the order"
    );
    assert!(
        store
            .namespace_edges("other", 100)
            .await
            .unwrap()
            .is_empty(),
        "edges stay in their namespace"
    );
    // A deleted job's own edges go; the edges naming it stay, by name.
    store
        .delete_job("default", "load", false, t0(), Audit::none())
        .await
        .unwrap();
    assert_eq!(
        store.namespace_edges("default", 100).await.unwrap(),
        all[..2]
    );
}

pub async fn dependencies_are_checked_when_written_and_deleted(store: &dyn Store) {
    let unknown = store
        .put_job(
            "default",
            &job("load", step(serde_json::json!([{"job": "extract"}])), t0()),
            PutMode::Upsert,
            t0(),
            Audit::none(),
        )
        .await
        .unwrap_err();
    let StoreError::Invalid(e) = unknown else {
        panic!("an unknown upstream is refused: {unknown:?}")
    };
    assert_eq!(e.field, "depends_on[0].job");
    assert!(store.get_job("default", "load").await.unwrap().is_none());

    pipeline(store).await;
    let edge = |job: &str, upstream: &str| DependencyEdge {
        job: job.into(),
        upstream: upstream.into(),
    };
    let names = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let up = store
        .dependency_edges("default", &names(&["load", "transform"]), Toward::Upstream)
        .await
        .unwrap();
    assert_eq!(
        up,
        [edge("load", "transform"), edge("transform", "extract")]
    );
    let down = store
        .dependency_edges("default", &names(&["extract"]), Toward::Downstream)
        .await
        .unwrap();
    assert_eq!(down, [edge("transform", "extract")]);
    let elsewhere = store
        .dependency_edges("other", &names(&["extract"]), Toward::Downstream)
        .await
        .unwrap();
    assert!(elsewhere.is_empty(), "edges stay in their namespace");
    // extract waiting for load closes a cycle: refused, named, and nothing written.
    let before = store.get_job("default", "extract").await.unwrap();
    let cycle = store
        .put_job(
            "default",
            &job(
                "extract",
                every_second(serde_json::json!({"depends_on": [{"job": "load"}]})),
                t0(),
            ),
            PutMode::Upsert,
            t0() + secs(1),
            Audit::none(),
        )
        .await
        .unwrap_err();
    let StoreError::Invalid(e) = cycle else {
        panic!("a cycle is refused: {cycle:?}")
    };
    assert_eq!(e.field, "depends_on[0].job");
    assert!(
        e.message
            .contains("extract -> load -> transform -> extract"),
        "{}",
        e.message
    );
    assert_eq!(store.get_job("default", "extract").await.unwrap(), before);

    // A job others depend on is deleted only with force, which pauses them.
    let refused = store
        .delete_job("default", "extract", false, t0() + secs(2), Audit::none())
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, StoreError::DependedOn { dependants, .. } if dependants == &["transform"]),
        "{refused:?}"
    );
    assert!(store.get_job("default", "extract").await.unwrap().is_some());
    let deleted = store
        .delete_job("default", "extract", true, t0() + secs(2), Audit::none())
        .await
        .unwrap()
        .unwrap();
    let transform = store
        .get_job("default", "transform")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(deleted.paused_dependants, std::slice::from_ref(&transform));
    assert_eq!(transform.state, JobState::Paused);
    // Dropping a dependency lets the job be deleted after all.
    put(store, "load", step(serde_json::json!([]))).await;
    let deleted = store
        .delete_job("default", "transform", false, t0() + secs(3), Audit::none())
        .await
        .unwrap()
        .unwrap();
    assert!(deleted.paused_dependants.is_empty());
}

pub async fn a_dependant_waits_and_is_released_by_its_upstreams_outcome(store: &dyn Store) {
    let up = put(store, "up", every_second(serde_json::json!({}))).await;
    let down = put(
        store,
        "down",
        every_second(serde_json::json!({"depends_on": [{"job": "up"}]})),
    )
    .await;
    let at = t0() + secs(1);
    let up_run = fire_one(store, fire(up.id, at)).await;
    let down_run = fire_one(store, fire(down.id, at)).await;
    assert_eq!(down_run.state, RunState::Waiting);
    let (waiting, _) = run(store, down_run.run_id).await;
    assert_eq!(
        waiting.waiting_reason,
        Some(sked_core::run::WaitReason::Dependencies)
    );
    assert_eq!(
        waiting.waiting_for,
        ["up succeeded at 2026-03-01T12:00:01Z"]
    );
    assert!(waiting.waiting_until.is_some());
    assert!(store
        .queued_runs(Some(&[down_run.run_id]))
        .await
        .unwrap()
        .is_empty());

    let (state, requeued) = finish(store, up_run.run_id, AttemptOutcome::Succeeded, at).await;
    assert_eq!(state, RunState::Succeeded);
    assert_eq!(
        requeued,
        [down_run.run_id],
        "released in the upstream's transaction"
    );
    let (released, _) = run(store, down_run.run_id).await;
    assert_eq!(released.state, RunState::Queued);
    assert_eq!(released.waiting_reason, None);
    assert!(released.waiting_for.is_empty());
    assert_eq!(
        store
            .queued_runs(Some(&[down_run.run_id]))
            .await
            .unwrap()
            .len(),
        1
    );

    // The next instant finds its upstream succeeded already: queued at once.
    let next = t0() + secs(2);
    let up_next = fire_one(store, fire(up.id, next)).await;
    finish(store, up_next.run_id, AttemptOutcome::Succeeded, next).await;
    assert_eq!(
        fire_one(store, fire(down.id, next)).await.state,
        RunState::Queued
    );
}

pub async fn a_window_counts_upstream_runs_around_the_instant(store: &dyn Store) {
    let up = put(store, "hourly", every_second(serde_json::json!({}))).await;
    put(
        store,
        "report",
        every_second(serde_json::json!({
            "depends_on": [{"job": "hourly", "window": {"before": "1h", "after": "10m"}}],
        })),
    )
    .await;
    let report = store.get_job("default", "report").await.unwrap().unwrap();
    let at = t0() + Span::hours(3);
    // Two hours before: outside the window.
    let early = fire_one(store, fire(up.id, at - Span::hours(2))).await;
    finish(
        store,
        early.run_id,
        AttemptOutcome::Succeeded,
        at - Span::hours(2),
    )
    .await;
    let waiting = fire_one(store, fire(report.id, at)).await;
    assert_eq!(waiting.state, RunState::Waiting);
    // Five minutes after the instant: inside, so it releases the run.
    let late = fire_one(store, fire(up.id, at + Span::minutes(5))).await;
    let (_, requeued) = finish(
        store,
        late.run_id,
        AttemptOutcome::Succeeded,
        at + Span::minutes(5),
    )
    .await;
    assert_eq!(requeued, [waiting.run_id]);
    // An instant whose window already holds a success is queued at once.
    let next = fire_one(store, fire(report.id, at + Span::minutes(30))).await;
    assert_eq!(next.state, RunState::Queued);
}

pub async fn a_pipeline_runs_at_its_upstreams_instants(store: &dyn Store) {
    let extract = put(store, "extract", every_second(serde_json::json!({}))).await;
    let other = put(store, "other", every_second(serde_json::json!({}))).await;
    put(
        store,
        "transform",
        step(serde_json::json!([{"job": "extract"}])),
    )
    .await;
    put(
        store,
        "load",
        step(serde_json::json!([{"job": "transform"}, {"job": "other"}])),
    )
    .await;
    let at = t0() + secs(1);
    let e = fire_one(store, fire(extract.id, at)).await;
    let o = fire_one(store, fire(other.id, at)).await;
    let (_, requeued) = finish(store, e.run_id, AttemptOutcome::Succeeded, at).await;
    let transform = runs_of(store, "transform").await;
    assert_eq!(transform.len(), 1);
    assert_eq!(
        (
            transform[0].scheduled_for,
            transform[0].trigger,
            transform[0].state
        ),
        (at, Trigger::Dependency, RunState::Queued)
    );
    assert_eq!(requeued, [transform[0].id]);
    // Fan-in: load waits for both of its upstreams at the instant.
    let (_, requeued) = finish(store, transform[0].id, AttemptOutcome::Succeeded, at).await;
    assert!(requeued.is_empty());
    let load = runs_of(store, "load").await;
    assert_eq!(load.len(), 1);
    assert_eq!(load[0].state, RunState::Waiting);
    assert_eq!(
        load[0].waiting_for,
        ["other succeeded at 2026-03-01T12:00:01Z"]
    );
    let (_, requeued) = finish(store, o.run_id, AttemptOutcome::Succeeded, at).await;
    assert_eq!(requeued, [load[0].id]);
    assert_eq!(runs_of(store, "load").await.len(), 1, "one run per instant");
}

pub async fn a_failed_upstream_skips_its_dependants_down_the_pipeline(store: &dyn Store) {
    let extract = pipeline(store).await;
    // A scheduled dependant that waits for extract, and one that accepts any outcome.
    let report = put(
        store,
        "report",
        every_second(serde_json::json!({"depends_on": [{"job": "extract"}]})),
    )
    .await;
    let audit = put(
        store,
        "audit",
        every_second(serde_json::json!({"depends_on": [{"job": "extract", "state": "finished"}]})),
    )
    .await;
    let at = t0() + secs(1);
    let e = fire_one(store, fire(extract.id, at)).await;
    let r = fire_one(store, fire(report.id, at)).await;
    let a = fire_one(store, fire(audit.id, at)).await;
    assert_eq!((r.state, a.state), (RunState::Waiting, RunState::Waiting));
    let (state, requeued) = finish(store, e.run_id, AttemptOutcome::Failed, at).await;
    assert_eq!(state, RunState::Failed);
    assert_eq!(requeued, [a.run_id], "a wait for any outcome is released");
    for name in ["transform", "load"] {
        let runs = runs_of(store, name).await;
        assert_eq!(runs.len(), 1, "{name}");
        assert_eq!(
            (runs[0].state, runs[0].skip_reason, runs[0].scheduled_for),
            (RunState::Skipped, Some(SkipReason::UpstreamFailed), at),
            "{name}"
        );
    }
    let (skipped, _) = run(store, r.run_id).await;
    assert_eq!(skipped.skip_reason, Some(SkipReason::UpstreamFailed));
    let why = skipped.error.unwrap_or_default();
    assert!(
        why.contains(&format!("run {} ended failed", e.run_id)),
        "{why}"
    );
}

pub async fn any_of_waits_until_every_alternative_failed(store: &dyn Store) {
    let a = put(store, "a", every_second(serde_json::json!({}))).await;
    let b = put(store, "b", every_second(serde_json::json!({}))).await;
    let c = put(store, "c", every_second(serde_json::json!({}))).await;
    let d = put(
        store,
        "either",
        every_second(serde_json::json!({"depends_on": [
            {"any_of": [{"job": "a"}, {"job": "b"}]},
            {"job": "c"},
        ]})),
    )
    .await;
    let at = t0() + secs(1);
    for instant in [at, t0() + secs(2)] {
        let rc = fire_one(store, fire(c.id, instant)).await;
        finish(store, rc.run_id, AttemptOutcome::Succeeded, instant).await;
    }
    let ra = fire_one(store, fire(a.id, at)).await;
    let rb = fire_one(store, fire(b.id, at)).await;
    let rd = fire_one(store, fire(d.id, at)).await;
    assert_eq!(rd.state, RunState::Waiting);
    finish(store, ra.run_id, AttemptOutcome::Failed, at).await;
    assert_eq!(
        run(store, rd.run_id).await.0.state,
        RunState::Waiting,
        "b may still succeed"
    );
    finish(store, rb.run_id, AttemptOutcome::TimedOut, at).await;
    let (skipped, _) = run(store, rd.run_id).await;
    assert_eq!(skipped.skip_reason, Some(SkipReason::UpstreamFailed));

    // The next instant: one alternative succeeding is enough (with c, the other entry).
    let next = t0() + secs(2);
    let ra = fire_one(store, fire(a.id, next)).await;
    let rd = fire_one(store, fire(d.id, next)).await;
    let (_, requeued) = finish(store, ra.run_id, AttemptOutcome::Succeeded, next).await;
    assert_eq!(requeued, [rd.run_id]);
}

pub async fn dependency_waits_time_out(store: &dyn Store) {
    put(store, "up", every_second(serde_json::json!({}))).await;
    let down = put(
        store,
        "down",
        every_second(serde_json::json!({"depends_on": [{"job": "up"}], "deps_timeout": "1m"})),
    )
    .await;
    let at = t0() + secs(1);
    let waiting = fire_one(store, fire(down.id, at)).await;
    assert_eq!(waiting.state, RunState::Waiting);
    let early = store
        .expire_dependency_waits(at + secs(30), 100)
        .await
        .unwrap();
    assert!(early.skipped.is_empty());
    let expired = store
        .expire_dependency_waits(at + secs(61), 100)
        .await
        .unwrap();
    assert_eq!(expired.skipped, [waiting.run_id]);
    let (skipped, _) = run(store, waiting.run_id).await;
    assert_eq!(skipped.state, RunState::Skipped);
    assert_eq!(skipped.skip_reason, Some(SkipReason::DependenciesTimedOut));
    let why = skipped.error.unwrap_or_default();
    assert!(
        why.contains("up succeeded at 2026-03-01T12:00:01Z"),
        "{why}"
    );
    let again = store
        .expire_dependency_waits(at + secs(120), 100)
        .await
        .unwrap();
    assert!(again.skipped.is_empty(), "skipped once");
}

pub async fn manual_runs_ignore_dependencies(store: &dyn Store) {
    put(store, "up", every_second(serde_json::json!({}))).await;
    let down = put(
        store,
        "down",
        every_second(serde_json::json!({"depends_on": [{"job": "up"}]})),
    )
    .await;
    let manual = Fire {
        trigger: Trigger::Manual,
        ..fire(down.id, t0() + secs(1))
    };
    assert_eq!(fire_one(store, manual).await.state, RunState::Queued);
}

/// The runs that end in one batch of reports are settled together: every dependant's waiting
/// run is judged once, after all of them, and each moves by its own verdict, whichever
/// dependants share the batch.
pub async fn one_completion_batch_moves_each_dependant_by_its_own_verdict(store: &dyn Store) {
    let plain = || every_second(serde_json::json!({}));
    let needs = |upstreams: &[&str], extra: serde_json::Value| {
        let mut spec = every_second(extra);
        spec["depends_on"] = upstreams
            .iter()
            .map(|u| serde_json::json!({"job": u}))
            .collect();
        spec
    };
    let a = put(store, "a", plain()).await;
    let b = put(store, "b", plain()).await;
    let c = put(store, "c", plain()).await;
    let ready = put(store, "ready", needs(&["a"], serde_json::json!({}))).await;
    let waits = put(store, "waits", needs(&["a", "b"], serde_json::json!({}))).await;
    let failed = put(store, "failed", needs(&["c"], serde_json::json!({}))).await;
    let held = needs(&["a"], serde_json::json!({"overlap": "skip"}));
    let by_overlap = put(store, "by-overlap", held).await;
    let mut follows = needs(&["a"], serde_json::json!({}));
    if let Some(spec) = follows.as_object_mut() {
        spec.remove("schedule");
    }
    put(store, "follows", follows).await;

    let at = t0() + secs(1);
    let a_run = fire_one(store, fire(a.id, at)).await.run_id;
    fire_one(store, fire(b.id, at)).await;
    let c_run = fire_one(store, fire(c.id, at)).await.run_id;
    let mut dependants = Vec::new();
    for job in [&ready, &waits, &failed, &by_overlap] {
        let fired = fire_one(store, fire(job.id, at)).await;
        assert_eq!(fired.state, RunState::Waiting, "{}", job.name);
        dependants.push(fired.run_id);
    }
    let [ready_run, waits_run, failed_run, by_overlap_run] = dependants[..] else {
        unreachable!("four dependants were fired");
    };
    let a_attempt = start(store, a_run, "w", 1, at).await;
    let c_attempt = start(store, c_run, "w", 2, at).await;
    let effects = store
        .complete_attempts(
            &[
                report(a_attempt, 1, AttemptOutcome::Succeeded),
                report(c_attempt, 2, AttemptOutcome::Failed),
            ],
            at,
        )
        .await
        .unwrap();
    let mut released: Vec<i64> = effects
        .into_iter()
        .flat_map(|effect| match effect {
            CompletionEffect::Accepted { requeued, .. } => requeued,
            refused => panic!("a report was refused: {refused:?}"),
        })
        .collect();
    released.sort_unstable();

    let follows_runs = runs_of(store, "follows").await;
    assert_eq!(follows_runs.len(), 1, "a's end starts one run of follows");
    assert_eq!(follows_runs[0].scheduled_for, at);
    assert_eq!(follows_runs[0].state, RunState::Queued);
    let mut expected = vec![ready_run, by_overlap_run, follows_runs[0].id];
    expected.sort_unstable();
    assert_eq!(released, expected, "the released runs, and only them");
    for run_id in [ready_run, by_overlap_run] {
        let (run, _) = run(store, run_id).await;
        assert_eq!(run.state, RunState::Queued, "{}", run.job);
        assert!(run.waiting_for.is_empty());
    }
    let (waiting, _) = run(store, waits_run).await;
    assert_eq!(waiting.state, RunState::Waiting);
    assert_eq!(waiting.waiting_for, ["b succeeded at 2026-03-01T12:00:01Z"]);
    let (skipped, _) = run(store, failed_run).await;
    assert_eq!(skipped.state, RunState::Skipped);
    assert_eq!(skipped.skip_reason, Some(SkipReason::UpstreamFailed));
    assert!(skipped.error.is_some_and(|e| e.contains('c')));
}

pub async fn racing_upstreams_create_one_dependant_run(store: &dyn Store) {
    let a = put(store, "a", every_second(serde_json::json!({}))).await;
    let b = put(store, "b", every_second(serde_json::json!({}))).await;
    put(
        store,
        "both",
        step(serde_json::json!([{"job": "a"}, {"job": "b"}])),
    )
    .await;
    // Instants 1 to 5: the two upstreams report side by side; instant 6: in one batch.
    for i in 1..=6 {
        let at = t0() + secs(i);
        let ra = fire_one(store, fire(a.id, at)).await;
        let rb = fire_one(store, fire(b.id, at)).await;
        let aa = start(store, ra.run_id, "w", 1, at).await;
        let ab = start(store, rb.run_id, "w", 1, at).await;
        let (one, two) = (
            report(aa, 1, AttemptOutcome::Succeeded),
            report(ab, 1, AttemptOutcome::Succeeded),
        );
        let effects: Vec<CompletionEffect> = if i <= 5 {
            let (one, two) = ([one], [two]);
            let (x, y) = tokio::join!(
                store.complete_attempts(&one, at),
                store.complete_attempts(&two, at)
            );
            x.unwrap().into_iter().chain(y.unwrap()).collect()
        } else {
            store.complete_attempts(&[one, two], at).await.unwrap()
        };
        let released: Vec<i64> = effects
            .into_iter()
            .flat_map(|effect| match effect {
                CompletionEffect::Accepted { requeued, .. } => requeued,
                CompletionEffect::Rejected { reason } => panic!("refused: {reason}"),
            })
            .collect();
        let runs: Vec<RunRecord> = runs_of(store, "both")
            .await
            .into_iter()
            .filter(|r| r.scheduled_for == at)
            .collect();
        assert_eq!(runs.len(), 1, "one run at instant {i}");
        assert_eq!(runs[0].state, RunState::Queued, "instant {i}");
        assert_eq!(released, [runs[0].id], "released once, at instant {i}");
    }
}

// --- events -------------------------------------------------------------------------------

fn event(key: &str, id: &str, payload: serde_json::Value) -> sked_core::event::EventSpec {
    sked_core::event::EventSpec {
        key: key.into(),
        id: id.into(),
        payload,
        trace_parent: None,
    }
}

async fn post(
    store: &dyn Store,
    namespace: &str,
    key: &str,
    id: &str,
    now: Instant,
) -> PostedEvent {
    let payload = serde_json::json!({"id": id});
    store
        .post_event(namespace, &event(key, id, payload), now, Audit::none())
        .await
        .unwrap()
}

pub async fn an_event_starts_one_run_per_event_of_its_key(store: &dyn Store) {
    let on_sales = put(
        store,
        "on-sales",
        serde_json::json!({
            "schedule": {"event": "sales.ready"},
            "target": {"shell": {"command": "true"}},
        }),
    )
    .await;
    assert_eq!(on_sales.next_fire_at, None, "no timer");
    let at = t0();
    let first = post(store, "default", "sales.ready", "2026-11-24", at).await;
    assert!(first.created);
    assert_eq!(first.event.occurred_at, at);
    assert_eq!(first.started.len(), 1);
    assert_eq!(
        first.queued, first.started,
        "no dependencies: queued at once"
    );
    let (run_record, _) = run(store, first.started[0]).await;
    assert_eq!(
        (
            run_record.trigger,
            run_record.scheduled_for,
            run_record.event_key.as_deref(),
            run_record.event_id.as_deref()
        ),
        (Trigger::Event, at, Some("sales.ready"), Some("2026-11-24"))
    );
    let queued = store.queued_runs(Some(&first.queued)).await.unwrap();
    let carried = queued[0].event.clone().expect("the run carries its event");
    assert_eq!(carried.payload, serde_json::json!({"id": "2026-11-24"}));

    // The same event again is the same event: nothing more happens.
    let again = post(store, "default", "sales.ready", "2026-11-24", at + secs(5)).await;
    assert!(!again.created);
    assert_eq!(again.event, first.event);
    assert!(again.started.is_empty() && again.queued.is_empty());
    // Another event in the same microsecond still gets an instant, and a run, of its own.
    let second = post(store, "default", "sales.ready", "2026-11-25", at).await;
    assert!(second.event.occurred_at > first.event.occurred_at);
    assert_eq!(second.started.len(), 1);
    // Other keys and other namespaces start nothing.
    assert!(post(store, "default", "other.key", "1", at)
        .await
        .started
        .is_empty());
    assert!(post(store, "elsewhere", "sales.ready", "1", at)
        .await
        .started
        .is_empty());
    assert_eq!(runs_of(store, "on-sales").await.len(), 2);

    // A paused job's run is recorded skipped, not queued.
    store
        .set_paused("default", "on-sales", true, at, Audit::none())
        .await
        .unwrap();
    let paused = post(store, "default", "sales.ready", "2026-11-26", at).await;
    assert_eq!(paused.started.len(), 1);
    assert!(paused.queued.is_empty());
    let (skipped, _) = run(store, paused.started[0]).await;
    assert_eq!(
        (skipped.state, skipped.skip_reason),
        (RunState::Skipped, Some(SkipReason::Paused))
    );
    // A deleted job no longer listens.
    store
        .delete_job("default", "on-sales", false, at, Audit::none())
        .await
        .unwrap();
    let after = post(store, "default", "sales.ready", "2026-11-27", at).await;
    assert!(after.created && after.started.is_empty());

    // Listed newest first, by key, in pages.
    let listed = |key: Option<&str>, before: Option<Instant>| EventQuery {
        namespace: "default".into(),
        key: key.map(str::to_string),
        before,
        limit: 2,
    };
    let page = store
        .list_events(&listed(Some("sales.ready"), None))
        .await
        .unwrap();
    let ids: Vec<&str> = page.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["2026-11-27", "2026-11-26"]);
    let rest = store
        .list_events(&listed(Some("sales.ready"), Some(page[1].occurred_at)))
        .await
        .unwrap();
    let ids: Vec<&str> = rest.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["2026-11-25", "2026-11-24"]);
    let all = store.list_events(&listed(None, None)).await.unwrap();
    assert_eq!(all.len(), 2);
}

pub async fn events_release_waits_and_succeeded_runs_emit_them(store: &dyn Store) {
    // A scheduled job waiting for an event up to an hour before, or a minute after, its
    // instant.
    let load = put(
        store,
        "load",
        every_second(serde_json::json!({
            "depends_on": [{"event": "dataset.ready", "window": {"before": "1h", "after": "1m"}}],
        })),
    )
    .await;
    let at = t0() + secs(1);
    let waiting = fire_one(store, fire(load.id, at)).await;
    assert_eq!(waiting.state, RunState::Waiting);
    let (record, _) = run(store, waiting.run_id).await;
    assert_eq!(
        record.waiting_for,
        ["event dataset.ready between 2026-03-01T11:00:01Z and 2026-03-01T12:01:01Z"]
    );
    let released = post(store, "default", "dataset.ready", "on-time", at + secs(30)).await;
    assert_eq!(released.queued, [waiting.run_id]);
    // An event already recorded in the window counts at the fire.
    let later = fire_one(store, fire(load.id, at + secs(200))).await;
    assert_eq!(later.state, RunState::Queued);
    // One outside the window does not.
    let strict = put(
        store,
        "strict",
        every_second(serde_json::json!({
            "depends_on": [{"event": "dataset.ready", "window": {"after": "1m"}}],
        })),
    )
    .await;
    let strict_run = fire_one(store, fire(strict.id, at + secs(300))).await;
    assert_eq!(strict_run.state, RunState::Waiting);
    let outside = post(store, "default", "dataset.ready", "late", at + secs(400)).await;
    assert!(outside.queued.is_empty());
    assert_eq!(
        run(store, strict_run.run_id).await.0.state,
        RunState::Waiting
    );

    // on_success: a succeeded run emits its event once, which starts the listening job's run
    // in the same completion; a failed run emits nothing.
    let extract = put(
        store,
        "extract",
        every_second(serde_json::json!({"on_success": {"emit": "extract.done"}})),
    )
    .await;
    put(
        store,
        "report",
        serde_json::json!({
            "schedule": {"event": "extract.done"},
            "target": {"shell": {"command": "true"}},
        }),
    )
    .await;
    let failed = fire_one(store, fire(extract.id, at)).await;
    finish(store, failed.run_id, AttemptOutcome::Failed, at).await;
    assert!(runs_of(store, "report").await.is_empty());
    let ok = fire_one(store, fire(extract.id, at + secs(1))).await;
    let (_, requeued) = finish(store, ok.run_id, AttemptOutcome::Succeeded, at + secs(1)).await;
    let report_runs = runs_of(store, "report").await;
    assert_eq!(report_runs.len(), 1);
    assert_eq!(
        requeued,
        [report_runs[0].id],
        "released with the completion"
    );
    assert_eq!(report_runs[0].trigger, Trigger::Event);
    let emitted = store
        .list_events(&EventQuery {
            namespace: "default".into(),
            key: Some("extract.done".into()),
            before: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(emitted.len(), 1);
    assert_eq!(emitted[0].id, "extract@2026-03-01T12:00:02.000000Z");
    assert_eq!(emitted[0].emitted_by_run, Some(ok.run_id));
    assert_eq!(emitted[0].payload["run_id"], ok.run_id);
    assert_eq!(
        report_runs[0].event_id.as_deref(),
        Some(emitted[0].id.as_str())
    );
    // The run the event started joins the emitting run's trace, as a child of its root.
    let joined = format!("r:{}/r:{}", ok.run_id, ok.run_id);
    assert_eq!(
        report_runs[0].trace_parent.as_deref(),
        Some(joined.as_str())
    );
}

pub async fn an_events_run_is_not_lost_to_a_run_at_its_instant(store: &dyn Store) {
    let listener = put(
        store,
        "listener",
        serde_json::json!({
            "schedule": {"event": "ready"},
            "target": {"shell": {"command": "true"}},
        }),
    )
    .await;
    // A manual run in the very microsecond the event is recorded.
    let manual = Fire {
        trigger: Trigger::Manual,
        ..fire(listener.id, t0())
    };
    fire_one(store, manual).await;
    let posted = post(store, "default", "ready", "1", t0()).await;
    assert_eq!(posted.event.occurred_at, t0());
    assert_eq!(posted.started.len(), 1, "the event's run is recorded");
    let (started, _) = run(store, posted.started[0]).await;
    assert_eq!(
        (
            started.trigger,
            started.scheduled_for,
            started.event_id.as_deref()
        ),
        (Trigger::Event, t0() + Span::microseconds(1), Some("1"))
    );
    assert_eq!(runs_of(store, "listener").await.len(), 2);
}

pub async fn event_retention_deletes_the_oldest_first(store: &dyn Store) {
    for i in 0..5 {
        post(store, "default", "k", &i.to_string(), t0() + secs(i)).await;
    }
    let deleted = store.delete_events_before(t0() + secs(3), 2).await.unwrap();
    assert_eq!(deleted, 2);
    let left = store
        .list_events(&EventQuery {
            namespace: "default".into(),
            key: None,
            before: None,
            limit: 10,
        })
        .await
        .unwrap();
    let ids: Vec<&str> = left.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["4", "3", "2"]);
}

// --- backfill -----------------------------------------------------------------------------

pub async fn backfilled_instants_each_run_once_in_turn(store: &dyn Store) {
    // A job whose overlap policy would skip instants that come together, and a pipeline step
    // after it.
    let daily = put(
        store,
        "daily",
        every_second(serde_json::json!({"overlap": "skip"})),
    )
    .await;
    put(store, "after", step(serde_json::json!([{"job": "daily"}]))).await;
    let now = t0();
    let backfill: Vec<Fire> = (1..=3)
        .map(|i| Fire {
            trigger: Trigger::Backfill,
            ready_at: now,
            ..fire(daily.id, t0() - secs(100 - i))
        })
        .collect();
    let outcome = store
        .record_fires(&backfill, now, Audit::none())
        .await
        .unwrap();
    let states: Vec<RunState> = outcome.runs.iter().map(|r| r.state).collect();
    assert_eq!(
        states,
        [RunState::Queued, RunState::Waiting, RunState::Waiting],
        "none skipped: they wait their turn"
    );
    assert!(outcome.runs.iter().all(|r| r.inserted));
    let again = store
        .record_fires(&backfill, now, Audit::none())
        .await
        .unwrap();
    assert!(again.runs.iter().all(|r| !r.inserted), "each instant once");
    let (record, _) = run(store, outcome.runs[0].run_id).await;
    assert_eq!(record.trigger, Trigger::Backfill);
    // The first one's success releases the next, and its dependant follows at its instant.
    let (_, requeued) = finish(
        store,
        outcome.runs[0].run_id,
        AttemptOutcome::Succeeded,
        now,
    )
    .await;
    assert!(requeued.contains(&outcome.runs[1].run_id), "{requeued:?}");
    let after = runs_of(store, "after").await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].scheduled_for, t0() - secs(99));
    assert!(requeued.contains(&after[0].id), "{requeued:?}");
    // A scheduled instant still meets the job's own policy.
    let scheduled = fire_one(store, fire(daily.id, t0() + secs(1))).await;
    assert_eq!(
        (
            scheduled.state,
            run(store, scheduled.run_id).await.0.skip_reason
        ),
        (RunState::Skipped, Some(SkipReason::Overlap))
    );
}

// --- retry --------------------------------------------------------------------------------

async fn retry(store: &dyn Store, run_id: i64, now: Instant) -> RetryOutcome {
    store
        .retry_run(run_id, now, Audit::none())
        .await
        .unwrap()
        .expect("the run exists")
}

pub async fn a_retried_run_reopens_with_its_skipped_dependants(store: &dyn Store) {
    let extract = pipeline(store).await;
    // A step that gives up on its upstream after a minute.
    put(
        store,
        "impatient",
        step(serde_json::json!([{"job": "extract"}])),
    )
    .await;
    let mut spec = store
        .get_job("default", "impatient")
        .await
        .unwrap()
        .unwrap()
        .spec;
    spec.deps_timeout = Some("1m".parse().unwrap());
    store
        .put_job(
            "default",
            &spec.validate(Some("impatient"), t0()).unwrap(),
            PutMode::Upsert,
            t0(),
            Audit::none(),
        )
        .await
        .unwrap();
    let at = t0() + secs(1);
    let failed = fire_one(store, fire(extract.id, at)).await;
    finish(store, failed.run_id, AttemptOutcome::Failed, at).await;
    for name in ["transform", "load", "impatient"] {
        let runs = runs_of(store, name).await;
        assert_eq!(
            (runs.len(), runs[0].skip_reason),
            (1, Some(SkipReason::UpstreamFailed)),
            "{name}"
        );
    }
    assert!(store
        .retry_run(999_999, at, Audit::none())
        .await
        .unwrap()
        .is_none());

    // Two minutes later: the step that waits up to a minute stays skipped, the pipeline
    // waits for extract again, all the way down.
    let later = at + secs(120);
    let RetryOutcome::Retried {
        run: reopened_run,
        was,
        queued,
        reopened,
    } = retry(store, failed.run_id, later).await
    else {
        panic!("a failed run is retried")
    };
    assert_eq!(
        (was, reopened_run.state),
        (RunState::Failed, RunState::Queued)
    );
    assert_eq!(
        (
            reopened_run.failures,
            reopened_run.error.as_deref(),
            reopened_run.finished_at
        ),
        (0, None, None)
    );
    assert_eq!(queued, [failed.run_id]);
    let transform = runs_of(store, "transform").await.remove(0);
    let load = runs_of(store, "load").await.remove(0);
    assert_eq!(reopened, [transform.id, load.id]);
    for reopened in [&transform, &load] {
        assert_eq!(reopened.state, RunState::Waiting);
        assert_eq!(reopened.skip_reason, None);
        assert_eq!(reopened.waiting_reason, Some(WaitReason::Dependencies));
    }
    assert_eq!(
        runs_of(store, "impatient").await[0].state,
        RunState::Skipped
    );

    // A second attempt succeeds: the pipeline runs at the instant.
    let (state, requeued) = finish(store, failed.run_id, AttemptOutcome::Succeeded, later).await;
    assert_eq!(state, RunState::Succeeded);
    assert_eq!(requeued, [transform.id]);
    let (_, attempts) = run(store, failed.run_id).await;
    let outcomes: Vec<AttemptState> = attempts.iter().map(|a| a.state).collect();
    assert_eq!(
        outcomes,
        [AttemptState::Failed, AttemptState::Succeeded],
        "history kept"
    );

    // A success is final, and so is a run that has not ended.
    let RetryOutcome::Refused { reason, .. } = retry(store, failed.run_id, later).await else {
        panic!("a succeeded run is not retried")
    };
    assert!(reason.contains("succeeded"), "{reason}");
    let RetryOutcome::Refused { reason, .. } = retry(store, transform.id, later).await else {
        panic!("a queued run is not retried")
    };
    assert!(reason.contains("not ended"), "{reason}");
    // A run whose own upstream still failed for good is not reopened.
    let second = fire_one(store, fire(extract.id, at + secs(1))).await;
    finish(store, second.run_id, AttemptOutcome::Failed, later).await;
    let skipped = runs_of(store, "transform").await.remove(1);
    let RetryOutcome::Refused { reason, .. } = retry(store, skipped.id, later).await else {
        panic!("its upstream failed")
    };
    assert!(reason.contains("can no longer be met"), "{reason}");
}

// --- priority: auto -----------------------------------------------------------------------

pub async fn auto_priority_ranks_by_the_jobs_downstream(store: &dyn Store) {
    let rank = |name: &'static str| async move {
        store.get_job("default", name).await.unwrap().unwrap().rank
    };
    let root = put(
        store,
        "root",
        every_second(serde_json::json!({"priority": "auto"})),
    )
    .await;
    assert_eq!(
        (root.rank, root.spec.priority),
        (0, sked_core::job::Priority::Auto)
    );
    let fixed = put(
        store,
        "fixed",
        every_second(serde_json::json!({"priority": 7})),
    )
    .await;
    assert_eq!(fixed.rank, 7);
    // A diamond under root: each job below counts once.
    for (name, ups) in [
        ("a", vec!["root"]),
        ("b", vec!["root"]),
        ("c", vec!["a", "b"]),
    ] {
        let deps: Vec<serde_json::Value> =
            ups.iter().map(|u| serde_json::json!({"job": u})).collect();
        let mut json = step(serde_json::Value::Array(deps));
        json["priority"] = serde_json::json!("auto");
        put(store, name, json).await;
    }
    assert_eq!(
        (rank("root").await, rank("a").await, rank("c").await),
        (3, 1, 0)
    );
    let fired = fire_one(store, fire(root.id, t0() + secs(1))).await;
    assert_eq!(
        run(store, fired.run_id).await.0.priority,
        3,
        "runs take the rank"
    );
    // The graph shrinks: ranks above follow, at every level.
    store
        .delete_job("default", "c", false, t0(), Audit::none())
        .await
        .unwrap();
    assert_eq!((rank("root").await, rank("a").await), (2, 0));
    // A definition that stops waiting for root takes its subtree away from root's rank.
    let mut b = store.get_job("default", "b").await.unwrap().unwrap().spec;
    b.depends_on = serde_json::from_value(serde_json::json!([{"job": "fixed"}])).unwrap();
    store
        .put_job(
            "default",
            &b.validate(Some("b"), t0()).unwrap(),
            PutMode::Upsert,
            t0(),
            Audit::none(),
        )
        .await
        .unwrap();
    assert_eq!((rank("root").await, rank("fixed").await), (1, 7));
}

// --- notifications -------------------------------------------------------------------------

fn hook(on: &[&str]) -> serde_json::Value {
    serde_json::json!([{"on": on, "webhook": {"url": "https://hooks.example.com/sked"}}])
}

async fn notifications_of(
    store: &dyn Store,
    job: &str,
) -> Vec<sked_core::notify::NotificationRecord> {
    let query = NotificationQuery {
        namespace: "default".into(),
        job: Some(job.into()),
        limit: 100,
        ..NotificationQuery::default()
    };
    store
        .list_notifications(&query)
        .await
        .expect("list_notifications")
        .items
}

/// Fails the run's attempt for good (the job has no retries).
async fn fail_run(store: &dyn Store, run_id: i64, token: i64, now: Instant) {
    let attempt = start(store, run_id, "w", token, now).await;
    let mut r = report(attempt, token, AttemptOutcome::Failed);
    r.exit_code = Some(3);
    complete(store, r, now).await;
}

async fn succeed_run(store: &dyn Store, run_id: i64, token: i64, now: Instant) {
    let attempt = start(store, run_id, "w", token, now).await;
    complete(
        store,
        report(attempt, token, AttemptOutcome::Succeeded),
        now,
    )
    .await;
}

pub async fn a_runs_end_records_each_notification_once(store: &dyn Store) {
    use sked_core::notify::{Channel, NotificationState, NotifyEvent};
    worker(store, "w", t0()).await;
    let j = put(
        store,
        "n",
        every_second(serde_json::json!({"notify": hook(&["failed", "missed"])})),
    )
    .await;
    let quiet = put(store, "quiet", every_second(serde_json::json!({}))).await;
    let failed = fire_one(store, fire(j.id, t0() + secs(1))).await;
    fail_run(store, failed.run_id, 1, t0() + secs(1)).await;
    let mut missed = fire(j.id, t0() + secs(2));
    missed.skip = Some(SkipReason::Misfire);
    fire_one(store, missed.clone()).await;
    // The same instant again, and a report of the ended attempt again: nothing new.
    fire_one(store, missed).await;
    let mut paused = fire(j.id, t0() + secs(3));
    paused.skip = Some(SkipReason::Paused);
    fire_one(store, paused).await;
    let quiet_run = fire_one(store, fire(quiet.id, t0() + secs(1))).await;
    fail_run(store, quiet_run.run_id, 2, t0() + secs(1)).await;

    let found = notifications_of(store, "n").await;
    let events: Vec<NotifyEvent> = found.iter().rev().map(|n| n.event).collect();
    assert_eq!(
        events,
        [NotifyEvent::Failed, NotifyEvent::Missed],
        "{found:?}"
    );
    let first = &found[1];
    assert_eq!(first.run_id, failed.run_id);
    assert_eq!(first.state, NotificationState::Pending);
    assert_eq!(first.message.job, "n");
    assert_eq!(first.message.state, RunState::Failed);
    assert_eq!(first.message.error.as_deref(), Some("exited with code 3"));
    assert_eq!(first.message.scheduled_for, t0() + secs(1));
    assert!(
        matches!(&first.channel, Channel::Webhook(w) if w.url == "https://hooks.example.com/sked")
    );
    assert_eq!(found[0].message.skip_reason, Some(SkipReason::Misfire));
    assert!(
        notifications_of(store, "quiet").await.is_empty(),
        "no rules, no notifications"
    );
}

pub async fn recovered_follows_a_failure_and_a_namespace_default_applies(store: &dyn Store) {
    use sked_core::notify::NotifyEvent;
    worker(store, "w", t0()).await;
    let defaults = settings(serde_json::json!({"notify": hook(&["failed", "recovered"])}));
    store
        .put_namespace("default", &defaults, t0(), Audit::none())
        .await
        .expect("put_namespace");
    let j = put(store, "flaky", every_second(serde_json::json!({}))).await;
    let opted_out = put(
        store,
        "opted-out",
        every_second(serde_json::json!({"notify": []})),
    )
    .await;
    let mut token = 0;
    for (i, ok) in [true, false, false, true, true].into_iter().enumerate() {
        let at = t0() + secs(i as i64 + 1);
        for job in [&j, &opted_out] {
            token += 1;
            let fired = fire_one(store, fire(job.id, at)).await;
            if ok {
                succeed_run(store, fired.run_id, token, at).await;
            } else {
                fail_run(store, fired.run_id, token, at).await;
            }
        }
    }
    let events: Vec<NotifyEvent> = notifications_of(store, "flaky")
        .await
        .iter()
        .rev()
        .map(|n| n.event)
        .collect();
    assert_eq!(
        events,
        [
            NotifyEvent::Failed,
            NotifyEvent::Failed,
            NotifyEvent::Recovered
        ],
        "only the first success after failures is a recovery"
    );
    assert!(
        notifications_of(store, "opted-out").await.is_empty(),
        "`notify: []` opts out"
    );
}

pub async fn late_runs_are_found_waiting_and_at_their_end(store: &dyn Store) {
    use sked_core::notify::NotifyEvent;
    worker(store, "w", t0()).await;
    let rules = serde_json::json!([{"on": ["late"], "late_after": "30s",
        "webhook": {"url": "https://hooks.example.com/late"}}]);
    let j = put(
        store,
        "slow",
        every_second(serde_json::json!({"notify": rules, "overlap": "allow"})),
    )
    .await;
    let waiting = fire_one(store, fire(j.id, t0() + secs(1))).await;
    let started_late = fire_one(store, fire(j.id, t0() + secs(2))).await;
    let on_time = fire_one(store, fire(j.id, t0() + secs(3))).await;
    succeed_run(store, on_time.run_id, 1, t0() + secs(4)).await;
    assert_eq!(
        store
            .record_late_notifications(t0() + secs(20))
            .await
            .unwrap(),
        0
    );
    // Started 40 s after its instant: late when it ends, whatever the scan saw.
    succeed_run(store, started_late.run_id, 2, t0() + secs(42)).await;
    assert_eq!(
        store
            .record_late_notifications(t0() + secs(45))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .record_late_notifications(t0() + secs(50))
            .await
            .unwrap(),
        0,
        "once"
    );
    let late: Vec<(i64, NotifyEvent)> = notifications_of(store, "slow")
        .await
        .iter()
        .map(|n| (n.run_id, n.event))
        .collect();
    assert_eq!(late.len(), 2, "{late:?}");
    assert!(late.contains(&(waiting.run_id, NotifyEvent::Late)));
    assert!(late.contains(&(started_late.run_id, NotifyEvent::Late)));
}

/// The scan reads a namespace's jobs only when the namespace has a `late` rule; those with
/// rules of their own keep them.
pub async fn a_namespaces_late_rule_reaches_only_the_jobs_that_follow_it(store: &dyn Store) {
    use sked_core::notify::NotifyEvent;
    let late = serde_json::json!([{"on": ["late"], "late_after": "30s",
        "webhook": {"url": "https://hooks.example.com/late"}}]);
    let follows = put(store, "follows", every_second(serde_json::json!({}))).await;
    let own = put(
        store,
        "own",
        every_second(serde_json::json!({"notify": hook(&["failed"])})),
    )
    .await;
    let opted_out = put(
        store,
        "opted-out",
        every_second(serde_json::json!({"notify": []})),
    )
    .await;
    for job in [&follows, &own, &opted_out] {
        fire_one(store, fire(job.id, t0() + secs(1))).await;
    }
    let scan = |at: i64| store.record_late_notifications(t0() + secs(at));
    assert_eq!(scan(40).await.unwrap(), 0, "no rule for late anywhere yet");
    store
        .put_namespace(
            "default",
            &settings(serde_json::json!({"notify": late})),
            t0(),
            Audit::none(),
        )
        .await
        .expect("put_namespace");
    assert_eq!(scan(41).await.unwrap(), 1);
    assert_eq!(scan(42).await.unwrap(), 0, "once");
    let events = |job| async move {
        notifications_of(store, job)
            .await
            .iter()
            .map(|n| n.event)
            .collect::<Vec<_>>()
    };
    assert_eq!(events("follows").await, [NotifyEvent::Late]);
    assert!(events("own").await.is_empty(), "its own rules win");
    assert!(
        events("opted-out").await.is_empty(),
        "`notify: []` opts out"
    );
}

pub async fn claims_are_exclusive_and_reports_under_a_lapsed_claim_change_nothing(
    store: &dyn Store,
) {
    use sked_core::notify::{NotificationState, SendOutcome};
    worker(store, "w", t0()).await;
    let j = put(
        store,
        "c",
        every_second(serde_json::json!({"notify": hook(&["failed"])})),
    )
    .await;
    for i in 1..=3 {
        let fired = fire_one(store, fire(j.id, t0() + secs(i))).await;
        fail_run(store, fired.run_id, i, t0() + secs(i)).await;
    }
    let now = t0() + secs(10);
    let lease = std::time::Duration::from_secs(60);
    let first = store.claim_notifications(now, lease, 2).await.unwrap();
    let second = store.claim_notifications(now, lease, 10).await.unwrap();
    assert_eq!(
        (first.len(), second.len()),
        (2, 1),
        "claimed notifications are not due"
    );
    assert!(store
        .claim_notifications(now, lease, 10)
        .await
        .unwrap()
        .is_empty());
    let report = |n: &sked_core::notify::NotificationRecord, outcome| SendReport {
        id: n.id,
        claim: n.claim,
        outcome,
    };
    store
        .finish_notifications(
            &[
                report(&first[0], SendOutcome::Sent),
                report(&first[1], SendOutcome::Failed("HTTP 503".into())),
                report(&second[0], SendOutcome::Refused("HTTP 404".into())),
            ],
            now,
        )
        .await
        .unwrap();
    let by_id = |id| async move {
        notifications_of(store, "c")
            .await
            .into_iter()
            .find(|n| n.id == id)
            .unwrap()
    };
    let sent = by_id(first[0].id).await;
    assert_eq!(
        (sent.state, sent.sends, sent.sent_at),
        (NotificationState::Sent, 1, Some(now))
    );
    let retried = by_id(first[1].id).await;
    assert_eq!(retried.state, NotificationState::Pending);
    assert_eq!(retried.last_error.as_deref(), Some("HTTP 503"));
    assert_eq!(retried.next_send_at, now + secs(5));
    assert_eq!(by_id(second[0].id).await.state, NotificationState::Failed);

    // The retry is due in 5 s; a node claims it and dies; its claim lapses and another takes it.
    let lost = store
        .claim_notifications(now + secs(5), lease, 10)
        .await
        .unwrap();
    assert_eq!(lost.len(), 1);
    let taken = store
        .claim_notifications(now + secs(66), lease, 10)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    store
        .finish_notifications(&[report(&lost[0], SendOutcome::Sent)], now + secs(67))
        .await
        .unwrap();
    assert_eq!(
        by_id(lost[0].id).await.state,
        NotificationState::Pending,
        "a lapsed claim"
    );
    store
        .finish_notifications(&[report(&taken[0], SendOutcome::Sent)], now + secs(67))
        .await
        .unwrap();
    assert_eq!(by_id(taken[0].id).await.state, NotificationState::Sent);

    assert_eq!(
        store
            .delete_notifications_before(now + secs(100), 100)
            .await
            .unwrap(),
        3
    );
    assert!(notifications_of(store, "c").await.is_empty());
}

// --- heartbeats ----------------------------------------------------------------------------

pub async fn a_heartbeat_run_waits_for_a_ping_and_fails_without_one(store: &dyn Store) {
    use sked_core::notify::NotifyEvent;
    let j = put(
        store,
        "backup-ping",
        serde_json::json!({
            "schedule": {"every": "1h"},
            "target": {"heartbeat": {"grace": "10m"}},
            "notify": hook(&["failed", "recovered"]),
        }),
    )
    .await;
    let other = put(store, "plain", every_second(serde_json::json!({}))).await;
    assert_eq!(
        store.ping(other.id, t0()).await.unwrap(),
        Some(PingOutcome::NotHeartbeat)
    );
    assert_eq!(store.ping(j.id + 1000, t0()).await.unwrap(), None);

    // 01:00: the run waits; no worker gets it; a ping answers it.
    let first = fire_one(store, fire(j.id, t0() + secs(3600))).await;
    assert_eq!(first.state, RunState::Waiting);
    assert!(
        store.queued_runs(None).await.unwrap().is_empty(),
        "nothing to dispatch"
    );
    let (waiting, _) = run(store, first.run_id).await;
    assert_eq!(waiting.waiting_reason, Some(WaitReason::Ping));
    let answered = store.ping(j.id, t0() + secs(3660)).await.unwrap();
    assert!(
        matches!(answered, Some(PingOutcome::Answered { run_id, .. }) if run_id == first.run_id),
        "{answered:?}"
    );
    assert_eq!(run(store, first.run_id).await.0.state, RunState::Succeeded);

    // 02:00: no ping; at 02:10 the run fails, saying why.
    let second = fire_one(store, fire(j.id, t0() + secs(7200))).await;
    let early = store
        .expire_ping_waits(t0() + secs(7200 + 599), 100)
        .await
        .unwrap();
    assert!(early.failed.is_empty(), "still within its grace");
    let expired = store
        .expire_ping_waits(t0() + secs(7200 + 601), 100)
        .await
        .unwrap();
    assert_eq!(expired.failed, vec![second.run_id]);
    let (failed, attempts) = run(store, second.run_id).await;
    assert_eq!(failed.state, RunState::Failed);
    assert_eq!(
        failed.error.as_deref(),
        Some("no ping within 10m of its instant")
    );
    assert!(attempts.is_empty());

    // A ping a little before 03:00 is kept, and the 03:00 run is recorded answered; a second
    // kept ping does not answer 04:00 too.
    assert_eq!(
        store.ping(j.id, t0() + secs(10_790)).await.unwrap(),
        Some(PingOutcome::Kept)
    );
    let third = fire_one(store, fire(j.id, t0() + secs(10_800))).await;
    assert_eq!(third.state, RunState::Succeeded);
    let fourth = fire_one(store, fire(j.id, t0() + secs(14_400))).await;
    assert_eq!(
        fourth.state,
        RunState::Waiting,
        "a kept ping is credited once"
    );

    // A ping kept while the 04:00 run was being recorded is credited at its deadline.
    assert_eq!(
        store.ping(j.id, t0() + secs(14_399)).await.unwrap(),
        Some(PingOutcome::Kept)
    );
    let expired = store
        .expire_ping_waits(t0() + secs(14_400 + 601), 100)
        .await
        .unwrap();
    assert_eq!(expired.succeeded, vec![fourth.run_id]);

    // The failure, then the success after it, were notified.
    let events: Vec<(i64, NotifyEvent)> = notifications_of(store, "backup-ping")
        .await
        .iter()
        .rev()
        .map(|n| (n.run_id, n.event))
        .collect();
    assert_eq!(
        events,
        [
            (second.run_id, NotifyEvent::Failed),
            (third.run_id, NotifyEvent::Recovered)
        ]
    );
    // A heartbeat run is not retried.
    let retried = store
        .retry_run(second.run_id, t0() + secs(20_000), Audit::none())
        .await
        .unwrap();
    assert!(
        matches!(retried, Some(RetryOutcome::Refused { .. })),
        "{retried:?}"
    );
}

pub async fn a_job_that_asks_is_named_in_its_completions(store: &dyn Store) {
    worker(store, "w", t0()).await;
    let named = put(
        store,
        "billing",
        every_second(serde_json::json!({"job_metrics": true})),
    )
    .await;
    let plain = put(store, "quiet", every_second(serde_json::json!({}))).await;
    let mut labels = Vec::new();
    for (token, job) in [(1, &named), (2, &plain)] {
        let fired = fire_one(store, fire(job.id, t0() + secs(1))).await;
        let attempt = start(store, fired.run_id, "w", token, t0() + secs(1)).await;
        let effect = complete(
            store,
            report(attempt, token, AttemptOutcome::Succeeded),
            t0() + secs(2),
        )
        .await;
        match effect {
            CompletionEffect::Accepted { job_label, .. } => labels.push(job_label),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(labels, [Some("billing".to_string()), None]);
}

// --- deadlines ---------------------------------------------------------------------------

/// The watcher reads the runs of the jobs with a deadline (open, and ended since a given
/// instant), each mark adds only what is new, and each addition is told once.
pub async fn deadline_marks_are_merged_listed_and_told_once(store: &dyn Store) {
    use sked_core::deadline::{AtRisk, DeadlineKind, Miss, RunDeadline};
    use sked_core::notify::NotifyEvent;
    worker(store, "w", t0()).await;
    let j = put(
        store,
        "report",
        every_second(serde_json::json!({
            "overlap": "allow",
            "deadline": {"start_by": "10s", "finish_by": "1m"},
            "notify": hook(&["deadline_missed", "at_risk"]),
        })),
    )
    .await;
    let plain = put(store, "plain", every_second(serde_json::json!({}))).await;
    let late = fire_one(store, fire(j.id, t0() + secs(1))).await;
    let risky = fire_one(store, fire(j.id, t0() + secs(2))).await;
    let done = fire_one(store, fire(j.id, t0() + secs(3))).await;
    fire_one(store, fire(plain.id, t0() + secs(1))).await;
    let attempt = start(store, done.run_id, "w", 1, t0() + secs(3)).await;
    complete(
        store,
        report(attempt, 1, AttemptOutcome::Succeeded),
        t0() + secs(7),
    )
    .await;

    let watched = store.deadline_runs(t0()).await.unwrap();
    assert_eq!(watched.len(), 1, "only the job with a deadline");
    assert_eq!(watched[0].job.id, j.id);
    let ids: Vec<i64> = watched[0].runs.iter().map(|r| r.id).collect();
    assert_eq!(ids, [late.run_id, risky.run_id, done.run_id]);
    let later = store.deadline_runs(t0() + secs(8)).await.unwrap();
    let ids: Vec<i64> = later[0].runs.iter().map(|r| r.id).collect();
    assert_eq!(ids, [late.run_id, risky.run_id], "ended before the instant");
    let open: Vec<i64> = store
        .open_runs(&[j.id, plain.id])
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(open.len(), 3);
    assert!(open.contains(&late.run_id) && !open.contains(&done.run_id));
    assert_eq!(
        store.run_durations("default", "report", 10).await.unwrap(),
        [std::time::Duration::from_secs(4)]
    );

    let deadline = RunDeadline {
        start_by: Some(t0() + secs(11)),
        finish_by: Some(t0() + secs(61)),
        ..RunDeadline::default()
    };
    let miss = |kind, by_ms| Miss { kind, by_ms };
    let mark = |run_id, missed: Vec<Miss>, at_risk| DeadlineMark {
        run_id,
        deadline,
        missed,
        at_risk,
    };
    let risk = AtRisk {
        at: t0() + secs(20),
        estimated_finish: Some(t0() + secs(90)),
    };
    let added = store
        .mark_deadlines(
            &[
                mark(late.run_id, vec![miss(DeadlineKind::StartBy, 5000)], None),
                mark(risky.run_id, vec![], Some(risk)),
                mark(done.run_id, vec![], None),
                mark(999_999, vec![miss(DeadlineKind::StartBy, 1)], None),
            ],
            t0() + secs(20),
        )
        .await
        .unwrap();
    let summary: Vec<(i64, Vec<DeadlineKind>, bool)> = added
        .iter()
        .map(|a| (a.run.id, a.missed.clone(), a.at_risk))
        .collect();
    assert_eq!(
        summary,
        [
            (late.run_id, vec![DeadlineKind::StartBy], false),
            (risky.run_id, vec![], true),
        ],
        "a run whose only news is its deadline is recorded, not reported"
    );
    // Again, later: the amount grows, a second kind is new, the risk stays the first one.
    let added = store
        .mark_deadlines(
            &[
                mark(
                    late.run_id,
                    vec![
                        miss(DeadlineKind::StartBy, 9000),
                        miss(DeadlineKind::FinishBy, 1000),
                    ],
                    None,
                ),
                mark(
                    risky.run_id,
                    vec![],
                    Some(AtRisk {
                        at: t0() + secs(30),
                        estimated_finish: None,
                    }),
                ),
            ],
            t0() + secs(62),
        )
        .await
        .unwrap();
    assert_eq!(added.len(), 1);
    assert_eq!(added[0].missed, [DeadlineKind::FinishBy]);
    let (late_run, _) = run(store, late.run_id).await;
    assert_eq!(late_run.deadline, Some(deadline));
    assert_eq!(
        late_run.deadline_missed,
        [
            miss(DeadlineKind::StartBy, 9000),
            miss(DeadlineKind::FinishBy, 1000)
        ]
    );
    let (risky_run, _) = run(store, risky.run_id).await;
    assert_eq!(risky_run.at_risk, Some(risk));
    assert_eq!(run(store, done.run_id).await.0.deadline, Some(deadline));

    let told: Vec<(i64, NotifyEvent)> = notifications_of(store, "report")
        .await
        .iter()
        .map(|n| (n.run_id, n.event))
        .collect();
    assert_eq!(told.len(), 2, "{told:?}");
    assert!(told.contains(&(late.run_id, NotifyEvent::DeadlineMissed)));
    assert!(told.contains(&(risky.run_id, NotifyEvent::AtRisk)));
    let missed_notice = notifications_of(store, "report")
        .await
        .into_iter()
        .find(|n| n.event == NotifyEvent::DeadlineMissed)
        .and_then(|n| n.message.deadline)
        .expect("the notice names its deadline");
    assert_eq!(missed_notice.kind, DeadlineKind::StartBy);
    assert_eq!(missed_notice.deadline, t0() + secs(11));
    assert_eq!(missed_notice.by_ms, Some(5000));

    let listed = |deadline_missed, at_risk| async move {
        store
            .list_runs(&RunQuery {
                namespace: "default".into(),
                deadline_missed,
                at_risk,
                limit: 10,
                ..RunQuery::default()
            })
            .await
            .unwrap()
            .items
            .iter()
            .map(|r| r.id)
            .collect::<Vec<i64>>()
    };
    assert_eq!(listed(true, false).await, [late.run_id]);
    assert_eq!(listed(false, true).await, [risky.run_id]);
    assert!(listed(true, true).await.is_empty());
    assert_eq!(listed(false, false).await.len(), 4);
}

/// A start claiming the run's keys, as the dispatcher makes it.
fn keyed_start(run_id: i64, token: i64, job: &JobRecord, now: Instant) -> AttemptStart {
    let context = sked_core::flow::KeyContext {
        namespace: "default",
        job: &job.name,
        ..Default::default()
    };
    AttemptStart {
        run_id,
        worker_id: "w".to_string(),
        token,
        lease_expires_at: now + secs(30),
        flow: Some(crate::FlowClaim {
            namespace: "default".to_string(),
            job: job.name.clone(),
            gates: job.spec.flow().gates(&context),
        }),
    }
}

pub async fn a_keys_limit_holds_across_batches_and_frees_when_an_attempt_ends(store: &dyn Store) {
    use sked_core::flow::Hold;
    worker(store, "w", t0()).await;
    let keyed =
        serde_json::json!({"overlap": "allow", "concurrency": [{"key": "shared", "limit": 2}]});
    let a = put(store, "a", every_second(keyed.clone())).await;
    let b = put(store, "b", every_second(keyed)).await;
    let mut runs = Vec::new();
    for i in 1..=3 {
        runs.push((fire_one(store, fire(a.id, t0() + secs(i))).await.run_id, &a));
        runs.push((fire_one(store, fire(b.id, t0() + secs(i))).await.run_id, &b));
    }
    let now = t0() + secs(5);
    // One batch of three: two start, the third is held, naming the key and its count.
    let first: Vec<AttemptStart> = runs[..3]
        .iter()
        .enumerate()
        .map(|(i, (id, job))| keyed_start(*id, i as i64 + 1, job, now))
        .collect();
    let answers = store.start_attempts(&first, now).await.unwrap();
    assert!(answers[0].is_ok() && answers[1].is_ok(), "{answers:?}");
    assert_eq!(
        answers[2],
        Err(crate::NotStarted::Held(Hold::Concurrency {
            key: "shared".into(),
            holding: 2,
            limit: 2
        }))
    );
    // Another batch (another node's) sees the same two holders.
    let again = store
        .start_attempts(&[keyed_start(runs[3].0, 9, runs[3].1, now)], now)
        .await
        .unwrap();
    assert!(
        matches!(again[0], Err(crate::NotStarted::Held(_))),
        "{again:?}"
    );
    let holders = store.key_holders(None).await.unwrap();
    assert_eq!(holders.len(), 2);
    assert!(holders.iter().all(|h| h.key == "shared"));
    // One holder ends: exactly one more may start, and the held run is still queued.
    let ended = answers[0].as_ref().unwrap().attempt_id;
    complete(
        store,
        report(ended, 1, AttemptOutcome::Succeeded),
        now + secs(1),
    )
    .await;
    let later = now + secs(2);
    let starts: Vec<AttemptStart> = runs[2..]
        .iter()
        .enumerate()
        .map(|(i, (id, job))| keyed_start(*id, i as i64 + 20, job, later))
        .collect();
    let answers = store.start_attempts(&starts, later).await.unwrap();
    let started = answers.iter().filter(|a| a.is_ok()).count();
    assert_eq!(started, 1, "{answers:?}");
    assert!(answers[0].is_ok(), "the oldest held run goes first");
    assert_eq!(store.key_holders(None).await.unwrap().len(), 2);
    // A run that is no longer queued is told so, and holds nothing.
    let twice = store
        .start_attempts(&[keyed_start(runs[2].0, 99, runs[2].1, later)], later)
        .await
        .unwrap();
    assert_eq!(twice, vec![Err(crate::NotStarted::NotQueued)]);
}

pub async fn rate_keys_and_named_limits_are_read_at_each_start(store: &dyn Store) {
    use sked_core::flow::{Hold, LimitSpec};
    worker(store, "w", t0()).await;
    let rated = serde_json::json!({
        "overlap": "allow",
        "rate_limit": [{"key": "api", "limit": 2, "per": "1s"}],
    });
    let j = put(store, "rated", every_second(rated)).await;
    let mut ids = Vec::new();
    for i in 1..=3 {
        ids.push(fire_one(store, fire(j.id, t0() + secs(i))).await.run_id);
    }
    let now = t0() + secs(10);
    let starts: Vec<AttemptStart> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| keyed_start(*id, i as i64 + 1, &j, now))
        .collect();
    let answers = store.start_attempts(&starts, now).await.unwrap();
    assert!(answers[0].is_ok(), "{answers:?}");
    // Two per second, no burst: the next start is due half a second later.
    let half = now + chrono::Duration::milliseconds(500);
    assert_eq!(
        answers[1],
        Err(crate::NotStarted::Held(Hold::Rate {
            key: "api".into(),
            at: half
        }))
    );
    let answers = store
        .start_attempts(&[keyed_start(ids[1], 7, &j, half)], half)
        .await
        .unwrap();
    assert!(
        answers[0].is_ok(),
        "due at the moment it was told: {answers:?}"
    );

    // A named limit: read at each start, so changing it changes the next start.
    let used = serde_json::json!({"overlap": "allow", "concurrency": [{"use": "partner"}]});
    let u = put(store, "user", every_second(used)).await;
    let a = fire_one(store, fire(u.id, t0() + secs(1))).await.run_id;
    let b = fire_one(store, fire(u.id, t0() + secs(2))).await.run_id;
    let undefined = store
        .start_attempts(&[keyed_start(a, 11, &u, now)], now)
        .await
        .unwrap();
    assert!(matches!(
        &undefined[0],
        Err(crate::NotStarted::Held(Hold::Undefined { .. }))
    ));
    let one = LimitSpec {
        description: None,
        concurrency: Some(1),
        rate: None,
    };
    assert!(store
        .put_limit("default", "partner", &one, now, Audit::none())
        .await
        .unwrap());
    let answers = store
        .start_attempts(
            &[keyed_start(a, 12, &u, now), keyed_start(b, 13, &u, now)],
            now,
        )
        .await
        .unwrap();
    assert!(answers[0].is_ok() && answers[1].is_err(), "{answers:?}");
    let two = LimitSpec {
        concurrency: Some(2),
        ..one
    };
    assert!(!store
        .put_limit("default", "partner", &two, now, Audit::none())
        .await
        .unwrap());
    let answers = store
        .start_attempts(&[keyed_start(b, 14, &u, now)], now)
        .await
        .unwrap();
    assert!(
        answers[0].is_ok(),
        "the raised limit admits it: {answers:?}"
    );
    // A limit a job uses is not deleted; one no job uses is.
    assert_eq!(
        store
            .delete_limit("default", "partner", Audit::none())
            .await
            .unwrap(),
        crate::LimitDeletion::InUse(vec!["user".into()])
    );
    assert_eq!(store.list_limits(None).await.unwrap().len(), 1);
    assert_eq!(
        store
            .list_limits(Some(&["other".into()]))
            .await
            .unwrap()
            .len(),
        0
    );
    assert_eq!(
        store
            .delete_limit("default", "nothing", Audit::none())
            .await
            .unwrap(),
        crate::LimitDeletion::NotFound
    );
    // Arrival times in the past say nothing a missing row would not: swept.
    assert_eq!(store.sweep_rate_keys(now + secs(60)).await.unwrap(), 1);
}

async fn trigger_with(
    store: &dyn Store,
    job_id: i64,
    params: &[(&str, &str)],
    now: Instant,
) -> TriggeredRun {
    let params: sked_core::flow::Params = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let trigger = ManualTrigger {
        job_id,
        scheduled_for: now,
        params: (!params.is_empty()).then_some(params),
        trace_parent: None,
    };
    store
        .trigger_run(&trigger, now, Audit::none())
        .await
        .expect("trigger_run")
}

pub async fn triggers_meet_dedup_within_its_window(store: &dyn Store) {
    let j = put(
        store,
        "charge",
        every_second(serde_json::json!({"dedup": {"key": "{{params.order}}", "window": "1m"}})),
    )
    .await;
    let at = t0();
    let first = trigger_with(store, j.id, &[("order", "1")], at).await;
    assert_eq!(first.outcome, FlowOutcome::Recorded);
    assert!(first.run.inserted);
    let (record, _) = run(store, first.run.run_id).await;
    assert_eq!(
        record
            .params
            .as_ref()
            .and_then(|p| p.get("order"))
            .map(String::as_str),
        Some("1")
    );
    let queued = store.queued_runs(Some(&[first.run.run_id])).await.unwrap();
    assert_eq!(
        queued[0].params, record.params,
        "the queued run carries them"
    );
    let again = trigger_with(store, j.id, &[("order", "1")], at + secs(10)).await;
    assert_eq!(again.outcome, FlowOutcome::Deduplicated);
    assert!(!again.run.inserted);
    assert_eq!(again.run.run_id, first.run.run_id);
    let other = trigger_with(store, j.id, &[("order", "2")], at + secs(10)).await;
    assert_eq!(other.outcome, FlowOutcome::Recorded);
    assert_ne!(other.run.run_id, first.run.run_id);
    let later = trigger_with(store, j.id, &[("order", "1")], at + secs(61)).await;
    assert_eq!(later.outcome, FlowOutcome::Recorded, "the window is over");
    assert_ne!(later.run.run_id, first.run.run_id);
    // Expired keys go with retention.
    store
        .delete_events_before(at + secs(3600), 100)
        .await
        .unwrap();
    let after = trigger_with(store, j.id, &[("order", "1")], at + secs(70)).await;
    assert_eq!(after.outcome, FlowOutcome::Recorded);
}

pub async fn a_debounced_run_absorbs_triggers_and_starts_at_its_moved_ready_at(store: &dyn Store) {
    worker(store, "w", t0()).await;
    let j = put(
        store,
        "rebuild",
        every_second(serde_json::json!({
            "debounce": {"key": "{{params.customer}}", "period": "10s", "max_wait": "25s"}
        })),
    )
    .await;
    let at = t0();
    let first = trigger_with(store, j.id, &[("customer", "a"), ("n", "1")], at).await;
    assert_eq!(first.outcome, FlowOutcome::Recorded);
    let id = first.run.run_id;
    let (record, _) = run(store, id).await;
    assert_eq!(record.ready_at, at + secs(10));
    assert_eq!(record.absorbed.as_ref().map(|a| a.count), Some(0));
    for (n, offset, ready) in [("2", 5, 15), ("3", 12, 22), ("4", 20, 25)] {
        let t = trigger_with(
            store,
            j.id,
            &[("customer", "a"), ("n", n)],
            at + secs(offset),
        )
        .await;
        assert_eq!(t.outcome, FlowOutcome::Absorbed, "trigger {n}");
        assert_eq!(t.run.run_id, id);
        let (record, _) = run(store, id).await;
        assert_eq!(record.ready_at, at + secs(ready), "trigger {n}");
        assert_eq!(
            record
                .params
                .as_ref()
                .and_then(|p| p.get("n"))
                .map(String::as_str),
            Some(n)
        );
    }
    // Another key is another burst.
    let other = trigger_with(store, j.id, &[("customer", "b")], at + secs(1)).await;
    assert_eq!(other.outcome, FlowOutcome::Recorded);
    let (record, _) = run(store, id).await;
    let absorbed = record.absorbed.expect("absorbed");
    assert_eq!(absorbed.count, 3);
    assert_eq!(absorbed.triggers.len(), 3);
    assert_eq!(absorbed.triggers[2].at, at + secs(20));
    let queued = store.queued_runs(Some(&[id])).await.unwrap();
    assert_eq!(queued[0].ready_at, at + secs(25));
    // No node starts it before its moved `ready_at`, whatever ready_at it held.
    let early = store
        .start_attempts(
            &[AttemptStart {
                run_id: id,
                worker_id: "w".into(),
                token: 1,
                lease_expires_at: at + secs(60),
                flow: None,
            }],
            at + secs(21),
        )
        .await
        .unwrap();
    assert_eq!(early, vec![Err(NotStarted::NotQueued)]);
    start(store, id, "w", 1, at + secs(25)).await;
    // Once started, a trigger makes a new run.
    let next = trigger_with(store, j.id, &[("customer", "a")], at + secs(26)).await;
    assert_eq!(next.outcome, FlowOutcome::Recorded);
    assert_ne!(next.run.run_id, id);
}

pub async fn racing_triggers_with_one_dedup_key_make_one_run(store: &dyn Store) {
    let j = put(
        store,
        "once",
        every_second(serde_json::json!({"dedup": {"key": "constant", "window": "1h"}})),
    )
    .await;
    let at = t0();
    let racing = (0..6).map(|i| trigger_with(store, j.id, &[], at + Span::microseconds(i)));
    let outcomes = futures_util::future::join_all(racing).await;
    let recorded = outcomes
        .iter()
        .filter(|t| t.outcome == FlowOutcome::Recorded)
        .count();
    assert_eq!(recorded, 1, "{outcomes:?}");
    let ids: std::collections::BTreeSet<i64> = outcomes.iter().map(|t| t.run.run_id).collect();
    assert_eq!(ids.len(), 1, "{outcomes:?}");
}

pub async fn events_meet_dedup_and_debounce(store: &dyn Store) {
    let deduped = put(
        store,
        "dedup-orders",
        serde_json::json!({
            "schedule": {"event": "orders.placed"},
            "target": {"shell": {"command": "true"}},
            "dedup": {"key": "{{event.key}}", "window": "1m"},
        }),
    )
    .await;
    let debounced = put(
        store,
        "debounce-orders",
        serde_json::json!({
            "schedule": {"event": "orders.placed"},
            "target": {"shell": {"command": "true"}},
            "debounce": {"key": "{{event.key}}", "period": "10s"},
        }),
    )
    .await;
    let at = t0();
    let first = post(store, "default", "orders.placed", "1", at).await;
    assert_eq!(first.started.len(), 2);
    assert!(first.flowed.is_empty());
    let second = post(store, "default", "orders.placed", "2", at + secs(3)).await;
    assert!(second.created, "the event is still recorded");
    assert!(second.started.is_empty(), "{second:?}");
    let by_job = |job: &JobRecord| {
        second
            .flowed
            .iter()
            .find(|f| f.job == job.name)
            .cloned()
            .expect("the job's run is named")
    };
    let (deduped_to, absorbed_into) = (by_job(&deduped), by_job(&debounced));
    assert_eq!(deduped_to.outcome, FlowOutcome::Deduplicated);
    assert_eq!(absorbed_into.outcome, FlowOutcome::Absorbed);
    assert!(first.started.contains(&deduped_to.run_id));
    assert!(first.started.contains(&absorbed_into.run_id));
    let (record, _) = run(store, absorbed_into.run_id).await;
    assert_eq!(record.event_id.as_deref(), Some("2"), "the last payload");
    assert_eq!(record.ready_at, at + secs(13));
    assert_eq!(record.absorbed.map(|a| a.count), Some(1));
    assert!(second.queued.contains(&absorbed_into.run_id), "read again");
    let queued = store
        .queued_runs(Some(&[absorbed_into.run_id]))
        .await
        .unwrap();
    assert_eq!(queued[0].event.as_ref().map(|e| e.id.as_str()), Some("2"));
}

// --- the runs grid -------------------------------------------------------------------------

/// The job list keeps the jobs whose routing asks for a label with a value.
pub async fn jobs_filter_by_a_routing_label(store: &dyn Store) {
    let labelled =
        |zone: &str| every_second(serde_json::json!({"routing": {"labels": {"zone": zone}}}));
    put(store, "eu-job", labelled("eu")).await;
    put(store, "us-job", labelled("us")).await;
    put(store, "plain", every_second(serde_json::json!({}))).await;
    let names = |label: Option<(&str, &str)>| {
        let query = JobQuery {
            namespace: "default".into(),
            label: label.map(|(k, v)| (k.to_string(), v.to_string())),
            limit: 100,
            ..Default::default()
        };
        async move {
            let page = store.list_jobs(&query).await.unwrap();
            page.items.into_iter().map(|j| j.name).collect::<Vec<_>>()
        }
    };
    assert_eq!(names(Some(("zone", "eu"))).await, ["eu-job"]);
    assert_eq!(names(Some(("zone", "us"))).await, ["us-job"]);
    assert!(names(Some(("zone", "ap"))).await.is_empty());
    assert!(names(Some(("rack", "eu"))).await.is_empty());
    assert_eq!(names(None).await.len(), 3);
}

/// A grid read gives, for each named job of the namespace, its newest runs whose instant is in
/// the window, at most the limit per job, in the order the names were given.
pub async fn the_grid_reads_each_jobs_newest_runs_in_its_window(store: &dyn Store) {
    worker(store, "w", t0()).await;
    let allow = serde_json::json!({"overlap": "allow"});
    let a = put(store, "a", every_second(allow.clone())).await;
    let b = put(store, "b", every_second(allow.clone())).await;
    let mut a_runs = Vec::new();
    for n in 1..=5 {
        a_runs.push(fire_one(store, fire(a.id, t0() + secs(n))).await.run_id);
    }
    let b2 = fire_one(store, fire(b.id, t0() + secs(2))).await.run_id;
    let b3 = fire_one(store, fire(b.id, t0() + secs(3))).await.run_id;
    // a's run at +4 succeeds, b's at +3 fails, b's at +2 is cancelled.
    let attempt = start(store, a_runs[3], "w", 1, t0() + secs(4)).await;
    complete(
        store,
        report(attempt, 1, AttemptOutcome::Succeeded),
        t0() + secs(6),
    )
    .await;
    let attempt = start(store, b3, "w", 2, t0() + secs(3)).await;
    complete(
        store,
        report(attempt, 2, AttemptOutcome::Failed),
        t0() + secs(4),
    )
    .await;
    store
        .cancel_run(b2, t0() + secs(5), Audit::none())
        .await
        .unwrap();
    // A job of the same name in another namespace is not read.
    let other = store
        .put_job(
            "other",
            &job("a", every_second(allow), t0()),
            PutMode::Upsert,
            t0(),
            Audit::none(),
        )
        .await
        .unwrap()
        .1;
    fire_one(store, fire(other.id, t0() + secs(3))).await;

    let query = GridQuery {
        namespace: "default".into(),
        jobs: vec!["b".into(), "a".into(), "missing".into()],
        from: t0() + secs(2),
        to: t0() + secs(5),
        per_job: 2,
    };
    let cells = store.grid_runs(&query).await.unwrap();
    let seen: Vec<(&str, Instant, RunState)> = cells
        .iter()
        .map(|c| (c.job.as_str(), c.scheduled_for, c.state))
        .collect();
    assert_eq!(
        seen,
        [
            ("b", t0() + secs(3), RunState::Failed),
            ("b", t0() + secs(2), RunState::Cancelled),
            ("a", t0() + secs(4), RunState::Succeeded),
            ("a", t0() + secs(3), RunState::Queued),
        ],
        "names in order, newest first, the window's end left out, two a job"
    );
    let done = &cells[2];
    assert_eq!(done.id, a_runs[3]);
    assert_eq!(done.started_at, Some(t0() + secs(4)));
    assert_eq!(done.finished_at, Some(t0() + secs(6)));
    assert_eq!(cells[3].started_at, None);

    let all = store
        .grid_runs(&GridQuery {
            jobs: vec!["a".into()],
            from: t0(),
            to: t0() + secs(60),
            per_job: 100,
            ..query.clone()
        })
        .await
        .unwrap();
    let ids: Vec<i64> = all.iter().map(|c| c.id).collect();
    let mut newest_first = a_runs.clone();
    newest_first.reverse();
    assert_eq!(ids, newest_first, "every run of the window, newest first");

    let other_ns = store
        .grid_runs(&GridQuery {
            namespace: "other".into(),
            ..query.clone()
        })
        .await
        .unwrap();
    assert_eq!(other_ns.len(), 1, "only the other namespace's own job");
    assert_eq!(other_ns[0].job, "a");

    let empty = GridQuery {
        from: t0() + secs(5),
        to: t0() + secs(5),
        ..query.clone()
    };
    assert!(store.grid_runs(&empty).await.unwrap().is_empty());
    let none = GridQuery {
        jobs: Vec::new(),
        ..query
    };
    assert!(store.grid_runs(&none).await.unwrap().is_empty());
}

// --- tracing reads -------------------------------------------------------------------------

/// The exporter's walk: runs that ended in a window, by `(finished_at, id)` from a cursor, a
/// page at a time, open runs never among them; and the attempts of the runs it names.
pub async fn ended_runs_are_walked_in_the_order_they_ended(store: &dyn Store) {
    worker(store, "w", t0()).await;
    let allow = serde_json::json!({"overlap": "allow"});
    let a = put(store, "a", every_second(allow)).await;
    let mut runs = Vec::new();
    for n in 1..=4 {
        runs.push(fire_one(store, fire(a.id, t0() + secs(n))).await.run_id);
    }
    // Runs 3 and 1 end at +10 (one instant: read in id order), run 2 at +11 after a failed
    // attempt and a retry; run 4 stays open.
    let first = start(store, runs[2], "w", 1, t0() + secs(9)).await;
    complete(
        store,
        report(first, 1, AttemptOutcome::Succeeded),
        t0() + secs(10),
    )
    .await;
    let second = start(store, runs[0], "w", 2, t0() + secs(9)).await;
    complete(
        store,
        report(second, 2, AttemptOutcome::Succeeded),
        t0() + secs(10),
    )
    .await;
    store
        .cancel_run(runs[1], t0() + secs(11), Audit::none())
        .await
        .unwrap();
    start(store, runs[3], "w", 3, t0() + secs(9)).await;

    let from_start = EndedCursor {
        finished_at: t0(),
        run_id: 0,
    };
    let all = store
        .ended_runs(from_start, t0() + secs(60), 100)
        .await
        .unwrap();
    let order: Vec<i64> = all.iter().map(|r| r.id).collect();
    assert_eq!(order, [runs[0], runs[2], runs[1]]);
    // A page of one, then on from its last run: the same walk.
    let mut walked = Vec::new();
    let mut cursor = from_start;
    loop {
        let page = store.ended_runs(cursor, t0() + secs(60), 1).await.unwrap();
        let Some(last) = page.last() else { break };
        cursor = last.cursor().expect("an ended run has an end");
        walked.extend(page.iter().map(|r| r.id));
    }
    assert_eq!(walked, order);
    // `until` is excluded.
    let before = store
        .ended_runs(from_start, t0() + secs(11), 100)
        .await
        .unwrap();
    assert_eq!(
        before.iter().map(|r| r.id).collect::<Vec<_>>(),
        [runs[0], runs[2]]
    );

    // What the walk judges by: a cancelled run, never started, and ones that succeeded.
    assert_eq!(all[2].facts.state, RunState::Cancelled);
    assert_eq!(all[2].facts.started_at, None);
    assert_eq!(all[0].facts.attempts, 1);
    assert_eq!(all[0].facts.scheduled_for, t0() + secs(1));
    assert!(all
        .iter()
        .all(|r| r.job_id == a.id && !r.facts.deadline_marked));

    // Runs read whole, in the order asked, with their attempts; a missing id is left out.
    let told = store
        .told_runs(&[runs[2], runs[0], runs[1], 999_999])
        .await
        .unwrap();
    let seen: Vec<(i64, Vec<u32>)> = told
        .iter()
        .map(|(run, attempts)| (run.id, attempts.iter().map(|a| a.number).collect()))
        .collect();
    assert_eq!(
        seen,
        [(runs[2], vec![1]), (runs[0], vec![1]), (runs[1], vec![])]
    );
    assert!(store.told_runs(&[]).await.unwrap().is_empty());
}

/// A dependant's run made by an upstream run's end joins that run's trace, as a child of its
/// root; the next step keeps the trace's origin and names its own upstream. A run fired by its
/// schedule has a trace of its own.
pub async fn a_pipelines_runs_join_the_trace_of_the_run_that_made_them(store: &dyn Store) {
    worker(store, "w", t0()).await;
    let extract = pipeline(store).await;
    let first = fire_one(store, fire(extract.id, t0() + secs(1)))
        .await
        .run_id;
    finish(store, first, AttemptOutcome::Succeeded, t0() + secs(2)).await;
    let transform = runs_of(store, "transform").await;
    assert_eq!(transform.len(), 1);
    let expected = format!("r:{first}/r:{first}");
    assert_eq!(
        transform[0].trace_parent.as_deref(),
        Some(expected.as_str())
    );
    finish(
        store,
        transform[0].id,
        AttemptOutcome::Succeeded,
        t0() + secs(3),
    )
    .await;
    let load = runs_of(store, "load").await;
    let expected = format!("r:{first}/r:{}", transform[0].id);
    assert_eq!(load[0].trace_parent.as_deref(), Some(expected.as_str()));
    // Queued, the run carries it to the dispatcher.
    let queued = store.queued_runs(Some(&[load[0].id])).await.unwrap();
    assert_eq!(queued[0].trace_parent.as_deref(), Some(expected.as_str()));
    let own = store.get_run(first).await.unwrap().unwrap();
    assert_eq!(own.0.trace_parent, None);
}

/// A trigger that carries the caller's trace makes a run that joins it; a second trigger
/// deduplicated to that run changes nothing of it.
pub async fn a_triggered_run_joins_the_callers_trace(store: &dyn Store) {
    let job = put(
        store,
        "charge",
        every_second(serde_json::json!({"dedup": {"key": "{{params.order}}", "window": "1m"}})),
    )
    .await;
    let given = "t:4bf92f3577b34da6a3ce929d0e0e4736/s:00f067aa0ba902b7";
    let params: sked_core::flow::Params = [("order".to_string(), "1".to_string())].into();
    let trigger = |trace_parent: Option<&str>| ManualTrigger {
        job_id: job.id,
        scheduled_for: t0(),
        params: Some(params.clone()),
        trace_parent: trace_parent.map(str::to_string),
    };
    let first = store
        .trigger_run(&trigger(Some(given)), t0(), Audit::none())
        .await
        .unwrap();
    let (record, _) = run(store, first.run.run_id).await;
    assert_eq!(record.trace_parent.as_deref(), Some(given));
    let queued = store.queued_runs(Some(&[record.id])).await.unwrap();
    assert_eq!(queued[0].trace_parent.as_deref(), Some(given));
    let other = "t:11111111111111111111111111111111/s:2222222222222222";
    let again = store
        .trigger_run(&trigger(Some(other)), t0() + secs(1), Audit::none())
        .await
        .unwrap();
    assert_eq!(again.outcome, FlowOutcome::Deduplicated);
    let (record, _) = run(store, first.run.run_id).await;
    assert_eq!(record.trace_parent.as_deref(), Some(given));
    // Without one, a run has a trace of its own.
    let plain = put(store, "plain", every_second(serde_json::json!({}))).await;
    let own = store
        .trigger_run(
            &ManualTrigger {
                job_id: plain.id,
                scheduled_for: t0(),
                params: None,
                trace_parent: None,
            },
            t0(),
            Audit::none(),
        )
        .await
        .unwrap();
    assert_eq!(run(store, own.run.run_id).await.0.trace_parent, None);
}

/// A post that carries its poster's trace: the runs the event starts join it; a second post of
/// the same event is the first.
pub async fn a_posted_events_runs_join_its_posters_trace(store: &dyn Store) {
    put(
        store,
        "on-sales",
        serde_json::json!({
            "schedule": {"event": "sales.ready"},
            "target": {"shell": {"command": "true"}},
        }),
    )
    .await;
    let given = "t:4bf92f3577b34da6a3ce929d0e0e4736/s:00f067aa0ba902b7";
    let mut spec = event("sales.ready", "2026-11-30", serde_json::json!(null));
    spec.trace_parent = Some(given.into());
    let posted = store
        .post_event("default", &spec, t0(), Audit::none())
        .await
        .unwrap();
    assert_eq!(posted.started.len(), 1);
    assert_eq!(posted.event.trace_parent.as_deref(), Some(given));
    let (run_record, _) = run(store, posted.started[0]).await;
    assert_eq!(run_record.trace_parent.as_deref(), Some(given));
    let plain = post(
        store,
        "default",
        "sales.ready",
        "2026-12-01",
        t0() + secs(1),
    )
    .await;
    assert_eq!(run(store, plain.started[0]).await.0.trace_parent, None);
}
