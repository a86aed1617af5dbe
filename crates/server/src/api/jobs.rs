//! `/api/v1/jobs`: define, list, read, delete, trigger, pause, resume, preview, runs and stats.

use super::extract::{Path, Query};
use super::{body, parse_json, ApiError, DeleteParams, Namespace};
use crate::audit::{self, Change};
use crate::auth::Caller;
use crate::secrets::{seal_notify, seal_target, Binding};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use sked_core::dependency::Upstream;
use sked_core::egress::EgressPolicy;
use sked_core::job::{JobSpec, JobState, ValidJob};
use sked_core::records::{JobRecord, RunRecord};
use sked_core::run::{RunState, SkipReason};
use sked_core::schedule::{Occurrence, Schedule, ScheduleKind, ScheduleSpec};
use sked_core::target::TargetSpec;
use sked_core::{Instant, SpecError};
use sked_store::{
    DeletedJob, FlowOutcome, JobQuery, JobSort, ManualTrigger, Page, PutMode, PutOutcome, RunQuery,
    TriggeredRun,
};
use std::collections::BTreeMap;

/// The fields a [`JobView`] adds to the definition: what a client removes from a job it read
/// to compare it with a definition (`sked job apply --dry-run`).
pub const JOB_VIEW_FIELDS: &[&str] = &[
    "namespace",
    "state",
    "rank",
    "next_fire_at",
    "fired_count",
    "created_at",
    "updated_at",
    "version",
    "last_run",
    "counters",
    "after",
];

/// A job as the API returns it: the definition, flattened, with where it stands.
#[derive(Debug, Serialize)]
pub struct JobView {
    #[serde(flatten)]
    pub spec: JobSpec,
    pub namespace: String,
    pub state: JobState,
    /// The priority its runs get (`priority`, or for `auto` the jobs downstream of it).
    pub rank: i32,
    pub next_fire_at: Option<Instant>,
    pub fired_count: u64,
    pub created_at: Instant,
    pub updated_at: Instant,
    /// The definition's version (`GET /jobs/{name}/versions`).
    pub version: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_run: Option<RunRecord>,
    /// Runs by state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters: Option<BTreeMap<String, u64>>,
    /// A job without a schedule that runs after its upstream jobs: which, and when the next
    /// of their runs is due.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<RunsAfter>,
}

/// When a job without a schedule of its own runs: after each run of its upstream jobs.
#[derive(Debug, Clone, Serialize)]
pub struct RunsAfter {
    /// The upstream jobs it waits for, by name.
    pub upstreams: Vec<String>,
    /// The soonest instant an upstream owes (following upstreams that have no schedule either,
    /// a few levels up); `None` when none owes one.
    pub next_fire_at: Option<Instant>,
}

/// An upstream as [`runs_after`] reads it: its next instant, and, when it has no schedule
/// either, its own upstreams (`None`: no such job).
type UpstreamSeen = Option<(Option<Instant>, Vec<String>)>;

/// Jobs of a namespace's graph whose reads are under way at once.
const GRAPH_READS_AT_ONCE: usize = 8;

/// Levels of upstreams without a schedule followed to find the next instant above a job.
const AFTER_LEVELS: usize = 5;

/// What [`runs_after`] keeps of an upstream read: its next instant, and its own upstreams
/// when it has no schedule (so the search goes on above it).
fn upstream_seen(job: Option<&JobRecord>) -> UpstreamSeen {
    job.map(|job| {
        let ups = if job.spec.schedule.is_none() {
            sked_core::dependency::upstreams(&job.spec.depends_on)
                .into_iter()
                .collect()
        } else {
            Vec::new()
        };
        (job.next_fire_at, ups)
    })
}

/// What [`RunsAfter`] says of `spec`, if it has no schedule and waits for jobs. `seen` keeps
/// the upstreams already read (a page of jobs shares it).
async fn runs_after(
    state: &AppState,
    namespace: &str,
    spec: &JobSpec,
    seen: &mut BTreeMap<String, UpstreamSeen>,
) -> Result<Option<RunsAfter>, ApiError> {
    if spec.schedule.is_some() {
        return Ok(None);
    }
    let upstreams: Vec<String> = sked_core::dependency::upstreams(&spec.depends_on)
        .into_iter()
        .collect();
    if upstreams.is_empty() {
        return Ok(None);
    }
    let mut next: Option<Instant> = None;
    let mut frontier = upstreams.clone();
    for _ in 0..AFTER_LEVELS {
        let mut above = Vec::new();
        for name in frontier {
            if !seen.contains_key(&name) {
                let found = state.store.get_job(namespace, &name).await?;
                seen.insert(name.clone(), upstream_seen(found.as_ref()));
            }
            if let Some(Some((fire, ups))) = seen.get(&name) {
                next = match (next, *fire) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                above.extend(ups.iter().cloned());
            }
        }
        if above.is_empty() {
            break;
        }
        frontier = above;
    }
    Ok(Some(RunsAfter {
        upstreams,
        next_fire_at: next,
    }))
}

impl From<JobRecord> for JobView {
    fn from(job: JobRecord) -> Self {
        JobView {
            spec: job.spec,
            namespace: job.namespace,
            state: job.state,
            rank: job.rank,
            next_fire_at: job.next_fire_at,
            fired_count: job.fired_count,
            created_at: job.created_at,
            updated_at: job.updated_at,
            version: job.version,
            last_run: None,
            counters: None,
            after: None,
        }
    }
}

/// Header telling `sked job apply` what a PUT changed.
pub const CHANGE_HEADER: &str = "x-sked-change";

fn change_name(outcome: PutOutcome) -> &'static str {
    match outcome {
        PutOutcome::Created => "created",
        PutOutcome::Updated => "updated",
        PutOutcome::Unchanged => "unchanged",
    }
}

/// Validates a definition as every job write does, and seals its secrets: the job the store is
/// handed. `before` is the job's current record, if any: a definition identical to it needs no
/// new permission, so an editor without the shell grant may re-apply a file holding shell
/// jobs another wrote, as long as they are unchanged.
pub(super) fn prepared(
    state: &AppState,
    caller: &Caller,
    namespace: &str,
    name_from_path: Option<&str>,
    spec: JobSpec,
    before: Option<&JobRecord>,
    now: Instant,
) -> Result<ValidJob, ApiError> {
    let mut job = spec.validate(name_from_path, now)?;
    if let TargetSpec::Http(http) = &job.spec.target {
        refused_url(
            &state.config.http_target_policy,
            "target.http.url",
            &http.url,
        )?;
    }
    if let TargetSpec::Container(container) = &job.spec.target {
        state.config.container_policy.check(namespace, container)?;
    }
    sked_core::publish::check_destination(
        &job.spec.target,
        namespace,
        !job.spec.routing.labels.is_empty(),
        &state.config.brokers,
        &state.config.broker_allowances,
    )?;
    let granted = caller.may_define(job.spec.target.runs_commands());
    // Without the grant only an unchanged job may pass (compared below, once its secrets are
    // sealed as stored): a new one is refused before anything is sealed.
    if before.is_none() {
        granted.clone()?;
    }
    let binding = Binding::Job {
        namespace,
        job: &job.name,
    };
    seal_target(
        state.config.secret_key.as_ref(),
        binding,
        &mut job.spec.target,
    )?;
    if let Some(rules) = &mut job.spec.notify {
        for rule in rules.iter().filter_map(|r| r.webhook.as_ref()) {
            refused_url(
                &state.config.http_target_policy,
                "notify.webhook.url",
                &rule.url,
            )?;
        }
        seal_notify(state.config.secret_key.as_ref(), binding, rules)?;
    }
    if let Err(denied) = granted {
        if !before.is_some_and(|b| b.spec == job.spec) {
            return Err(denied.into());
        }
    }
    Ok(job)
}

/// Whether the caller may write `job` only because it is unchanged (see [`prepared`]): then
/// it is not written at all, so no write of the caller's can race another's change to it.
pub(super) fn unchanged_without_grant(caller: &Caller, job: &ValidJob) -> bool {
    caller.may_define(job.spec.target.runs_commands()).is_err()
}

/// Validates a definition and writes it; `action` names the change in the audit trail.
pub(super) async fn store_job(
    state: &AppState,
    caller: &Caller,
    namespace: &str,
    name_from_path: Option<&str>,
    bytes: &[u8],
    mode: PutMode,
    action: &'static str,
) -> Result<Response, ApiError> {
    let spec: JobSpec = parse_json(bytes)?;
    let now = Utc::now();
    let before = match (mode, name_from_path.or(spec.name.as_deref())) {
        (PutMode::Upsert, Some(name)) => state.store.get_job(namespace, name).await?,
        _ => None,
    };
    let mut job = prepared(
        state,
        caller,
        namespace,
        name_from_path,
        spec,
        before.as_ref(),
        now,
    )?;
    super::limits::check_used(state, namespace, &job.spec).await?;
    crate::schedule_rules::attach(&*state.store, namespace, &mut job.schedule).await?;
    if let Some(record) = before
        .clone()
        .filter(|_| unchanged_without_grant(caller, &job))
    {
        let headers = [(CHANGE_HEADER, change_name(PutOutcome::Unchanged))];
        return Ok((StatusCode::OK, headers, Json(JobView::from(record))).into_response());
    }
    let before = before.map(|b| definition(&b.spec));
    let ns = namespace.to_string();
    let audit = audit::by(
        caller,
        move |(outcome, record): &(PutOutcome, JobRecord)| {
            (*outcome != PutOutcome::Unchanged).then(|| Change {
                action,
                namespace: Some(ns.clone()),
                object: Some(record.name.clone()),
                before: before.clone(),
                after: Some(definition(&record.spec)),
            })
        },
    );
    let (outcome, record) = state
        .store
        .put_job(namespace, &job, mode, now, audit)
        .await?;
    if outcome != PutOutcome::Unchanged {
        state.firing.reload(record.id);
    }
    let status = if outcome == PutOutcome::Created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let headers = [(CHANGE_HEADER, change_name(outcome))];
    Ok((status, headers, Json(JobView::from(record))).into_response())
}

/// Early feedback on a URL the HTTP target policy refuses by itself: a denied host, or an IP
/// literal the policy refuses. A name's addresses are judged when it is resolved (by the
/// worker for a target, by the notifier for a webhook). `field` is where the URL is.
pub(super) fn refused_url(policy: &EgressPolicy, field: &str, text: &str) -> Result<(), SpecError> {
    // `validate` has checked that it parses.
    let Ok(url) = url::Url::parse(text.trim()) else {
        return Ok(());
    };
    policy.check_url(&url).map_err(|refusal| {
        SpecError::new(
            field,
            format!("refused by the HTTP target policy: {refusal}"),
        )
    })
}

/// A definition as the audit trail keeps it (secrets are redacted when it is recorded).
pub(super) fn definition(spec: &JobSpec) -> serde_json::Value {
    serde_json::to_value(spec).unwrap_or(serde_json::Value::Null)
}

pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let namespace = ns.checked(&caller)?;
    store_job(
        &state,
        &caller,
        &namespace,
        Some(&name),
        &body(raw)?,
        PutMode::Upsert,
        "job.put",
    )
    .await
}

pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Query(ns): Query<Namespace>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let namespace = ns.checked(&caller)?;
    store_job(
        &state,
        &caller,
        &namespace,
        None,
        &body(raw)?,
        PutMode::CreateOnly,
        "job.put",
    )
    .await
}

#[derive(Debug, Deserialize)]
pub struct ListParams {
    #[serde(default = "super::default_namespace")]
    namespace: String,
    search: Option<String>,
    state: Option<String>,
    /// Schedule kind: cron, every, iso8601, at, event or manual.
    kind: Option<String>,
    /// The state of the job's newest run.
    last: Option<String>,
    /// `key=value`: jobs whose routing asks for this label.
    label: Option<String>,
    sort: Option<String>,
    order: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
    /// `last_run`: each job with its newest run (one index seek per job on the page).
    include: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct JobPage {
    pub jobs: Vec<JobView>,
    pub next_cursor: Option<String>,
}

/// The job state a `state` query parameter names; an empty one names none and is refused.
pub(super) fn parse_job_state(text: Option<&str>) -> Result<Option<JobState>, ApiError> {
    text.map(|s| {
        JobState::parse(s).ok_or_else(|| {
            ApiError::invalid(
                "state",
                format!("{s:?} is not one of active, paused, completed"),
            )
        })
    })
    .transpose()
}

/// The schedule kind a `kind` query parameter names; an empty one names none and is refused.
pub(super) fn parse_schedule_kind(text: Option<&str>) -> Result<Option<ScheduleKind>, ApiError> {
    text.map(|k| {
        ScheduleKind::parse(k).ok_or_else(|| {
            ApiError::invalid(
                "kind",
                format!("{k:?} is not one of {}", ScheduleKind::one_of()),
            )
        })
    })
    .transpose()
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(p): Query<ListParams>,
) -> Result<Json<JobPage>, ApiError> {
    let namespace = Namespace {
        namespace: p.namespace,
    }
    .checked(&caller)?;
    let job_state = parse_job_state(p.state.as_deref())?;
    let sort = match p.sort.as_deref() {
        None | Some("name") => JobSort::Name,
        Some("created_at") => JobSort::CreatedAt,
        Some("updated_at") => JobSort::UpdatedAt,
        Some(s) => {
            return Err(ApiError::invalid(
                "sort",
                format!("{s:?} is not one of name, created_at, updated_at"),
            ))
        }
    };
    let descending = match p.order.as_deref() {
        None | Some("asc") => false,
        Some("desc") => true,
        Some(s) => {
            return Err(ApiError::invalid(
                "order",
                format!("{s:?} is not asc or desc"),
            ))
        }
    };
    let with_last_run = match p.include.as_deref() {
        None => false,
        Some("last_run") => true,
        Some(s) => {
            return Err(ApiError::invalid(
                "include",
                format!("{s:?} is not last_run"),
            ))
        }
    };
    let kind = parse_schedule_kind(p.kind.as_deref())?;
    let query = JobQuery {
        namespace,
        search: p.search.filter(|s| !s.is_empty()),
        state: job_state,
        kind,
        last: run_state_in("last", p.last.as_deref())?,
        label: parse_label(p.label.as_deref())?,
        sort,
        descending,
        limit: check_limit(p.limit)?,
        cursor: p.cursor,
    };
    let Page { items, next_cursor } = state.store.list_jobs(&query).await?;
    let mut jobs: Vec<JobView> = items.into_iter().map(JobView::from).collect();
    let mut seen = BTreeMap::new();
    for job in &mut jobs {
        job.after = runs_after(&state, &job.namespace, &job.spec, &mut seen).await?;
    }
    if with_last_run {
        for job in &mut jobs {
            let newest = RunQuery {
                namespace: job.namespace.clone(),
                job: job.spec.name.clone(),
                limit: 1,
                ..RunQuery::default()
            };
            job.last_run = state.store.list_runs(&newest).await?.items.pop();
        }
    }
    Ok(Json(JobPage { jobs, next_cursor }))
}

/// The longest label key or value a filter takes.
const MAX_LABEL_FILTER: usize = 128;

/// A `label` filter, `key=value`: a key and a value, neither empty nor over
/// [`MAX_LABEL_FILTER`] characters. An empty filter is none.
pub fn parse_label(label: Option<&str>) -> Result<Option<(String, String)>, ApiError> {
    let Some(text) = label.filter(|l| !l.is_empty()) else {
        return Ok(None);
    };
    match text.split_once('=') {
        Some((key, value))
            if !key.is_empty()
                && !value.is_empty()
                && key.chars().count() <= MAX_LABEL_FILTER
                && value.chars().count() <= MAX_LABEL_FILTER =>
        {
            Ok(Some((key.to_string(), value.to_string())))
        }
        _ => Err(ApiError::invalid(
            "label",
            format!("{text:?} is not key=value (each 1 to {MAX_LABEL_FILTER} characters)"),
        )),
    }
}

pub fn check_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    match limit {
        None => Ok(100),
        Some(n @ 1..=1000) => Ok(n),
        Some(_) => Err(ApiError::invalid("limit", "must be between 1 and 1000")),
    }
}

pub(super) async fn find(
    state: &AppState,
    namespace: &str,
    name: &str,
) -> Result<JobRecord, ApiError> {
    state
        .store
        .get_job(namespace, name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("job {name:?} in namespace {namespace:?}")))
}

pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
) -> Result<Json<JobView>, ApiError> {
    let namespace = ns.checked(&caller)?;
    let job = find(&state, &namespace, &name).await?;
    let stats = state.store.job_stats(&namespace, &name).await?;
    let after = runs_after(&state, &namespace, &job.spec, &mut BTreeMap::new()).await?;
    let mut view = JobView::from(job);
    view.after = after;
    if let Some(stats) = stats {
        view.last_run = stats.last_run;
        view.counters = Some(stats.by_state);
    }
    Ok(Json(view))
}

/// A deleted job, with the jobs that depended on it, now paused.
#[derive(Debug, Serialize)]
pub struct DeletedView {
    #[serde(flatten)]
    pub job: JobView,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paused_dependants: Vec<String>,
}

pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(params): Query<DeleteParams>,
) -> Result<Json<DeletedView>, ApiError> {
    let namespace = Namespace {
        namespace: params.namespace,
    }
    .checked(&caller)?;
    let ns = namespace.clone();
    let audit = audit::by(&caller, move |deleted: &Option<DeletedJob>| {
        let Some(deleted) = deleted else {
            return Vec::new();
        };
        let mut changes = vec![Change {
            action: "job.delete",
            namespace: Some(ns.clone()),
            object: Some(deleted.job.name.clone()),
            before: Some(definition(&deleted.job.spec)),
            after: None,
        }];
        changes.extend(deleted.paused_dependants.iter().map(|dependant| Change {
            action: "job.pause",
            namespace: Some(ns.clone()),
            object: Some(dependant.name.clone()),
            before: None,
            after: Some(serde_json::json!({"because_deleted": deleted.job.name})),
        }));
        changes
    });
    let deleted = state
        .store
        .delete_job(&namespace, &name, params.force, Utc::now(), audit)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("job {name:?} in namespace {namespace:?}")))?;
    state.firing.reload(deleted.job.id);
    // Other nodes learn it from the store's announcement.
    state.dispatcher.remove(&deleted.cancelled);
    for dependant in &deleted.paused_dependants {
        state.firing.reload(dependant.id);
    }
    Ok(Json(DeletedView {
        paused_dependants: deleted
            .paused_dependants
            .into_iter()
            .map(|j| j.name)
            .collect(),
        job: JobView::from(deleted.job),
    }))
}

async fn set_paused(
    state: &AppState,
    caller: &Caller,
    ns: Namespace,
    name: String,
    paused: bool,
) -> Result<Json<JobView>, ApiError> {
    let namespace = ns.checked(caller)?;
    let ns = namespace.clone();
    let audit = audit::by(caller, move |job: &Option<JobRecord>| {
        job.as_ref().map(|job| Change {
            action: if paused { "job.pause" } else { "job.resume" },
            namespace: Some(ns.clone()),
            object: Some(job.name.clone()),
            before: None,
            after: None,
        })
    });
    let job = state
        .store
        .set_paused(&namespace, &name, paused, Utc::now(), audit)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("job {name:?} in namespace {namespace:?}")))?;
    state.firing.reload(job.id);
    Ok(Json(JobView::from(job)))
}

pub async fn pause(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
) -> Result<Json<JobView>, ApiError> {
    set_paused(&state, &caller, ns, name, true).await
}

pub async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
) -> Result<Json<JobView>, ApiError> {
    set_paused(&state, &caller, ns, name, false).await
}

/// A trigger's body: optional, and so is each of its fields.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerBody {
    #[serde(default)]
    pub params: Option<sked_core::flow::Params>,
}

/// Runs the job now. The run's instant is the moment of the request. Under the job's `dedup`
/// a trigger whose key was recorded within the window answers with that run (200), and under
/// its `debounce` one whose key has a run not started yet is absorbed into it (200); a new run
/// is 201.
pub async fn trigger(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
    headers: axum::http::HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<RunRecord>), ApiError> {
    let namespace = ns.checked(&caller)?;
    let raw = super::body_within(raw, super::MAX_TRIGGER_BODY)?;
    let blank = raw.iter().all(u8::is_ascii_whitespace) || raw.trim_ascii() == b"null";
    let body: TriggerBody = if blank {
        TriggerBody::default()
    } else {
        parse_json(&raw)?
    };
    let params = body.params.filter(|p| !p.is_empty());
    if let Some(params) = &params {
        sked_core::flow::trigger::validate_params(params)?;
    }
    let job = find(&state, &namespace, &name).await?;
    let trigger = ManualTrigger {
        job_id: job.id,
        scheduled_for: sked_core::ledger_instant(Utc::now()),
        params,
        trace_parent: super::joined_trace(&state, &headers),
    };
    let (ns, job_name) = (namespace.clone(), name.clone());
    let audit = audit::by(&caller, move |triggered: &TriggeredRun| {
        Some(Change {
            action: "job.trigger",
            namespace: Some(ns.clone()),
            object: Some(job_name.clone()),
            before: None,
            after: Some(serde_json::json!({
                "run_id": triggered.run.run_id,
                "outcome": triggered.outcome,
            })),
        })
        .filter(|_| triggered.run.run_id != 0)
    });
    let triggered = state.store.trigger_run(&trigger, Utc::now(), audit).await?;
    let run = &triggered.run;
    if run.run_id == 0 {
        return Err(ApiError::not_found(format!(
            "job {name:?} in namespace {namespace:?}"
        )));
    }
    let moved = triggered.outcome == FlowOutcome::Absorbed;
    if run.state == RunState::Queued && (run.inserted || moved) {
        // Read back as the store has them: the instant (moved on past a run at the same
        // microsecond), a placed run's place, a debounced one's `ready_at`, the parameters.
        let ids: Vec<i64> = run.all_runs().collect();
        let queued = state.store.queued_runs(Some(&ids)).await?;
        state.dispatcher.enqueue(queued);
    }
    let (record, _) = state
        .store
        .get_run(run.run_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("run {}", run.run_id)))?;
    let status = if run.inserted {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(record)))
}

#[derive(Debug, Deserialize)]
pub struct PreviewParams {
    #[serde(default = "super::default_namespace")]
    namespace: String,
    count: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct Preview {
    /// The instants runs are for, moved ones included.
    pub fire_times: Vec<Instant>,
    /// For a schedule that meets a calendar or blackout windows: every instant that falls
    /// due, with what became of it (moved from a closed day, or removed and why).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outcomes: Vec<PreviewOccurrence>,
    /// Why there are fewer fire times than asked for (the schedule ends, or cron's last year
    /// is behind); absent when the list is full.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PreviewOccurrence {
    pub at: Instant,
    /// A run moved here from this instant, on a closed day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<Instant>,
    /// The instant is removed: recorded skipped for this reason (`calendar`, `blackout`)...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<SkipReason>,
    /// ... and why, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

impl Preview {
    fn of(schedule: &Schedule, from: Instant, occurrences: Vec<Occurrence>, count: usize) -> Self {
        let note = (occurrences.len() < count)
            .then(|| schedule.preview_end(occurrences.last().map_or(from, |o| o.due)));
        let fire_times = occurrences
            .iter()
            .filter(|o| o.removed.is_none())
            .map(|o| o.due)
            .collect();
        let outcomes = if schedule.meets_rules() {
            occurrences
                .into_iter()
                .map(|o| {
                    let (skip_reason, skipped) = o.removed.map(|r| (r.by, r.why)).unzip();
                    PreviewOccurrence {
                        at: o.due,
                        moved_from: o.nominal_for,
                        skip_reason,
                        skipped,
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        Preview {
            fire_times,
            outcomes,
            note,
        }
    }
}

fn check_count(count: Option<usize>) -> Result<usize, ApiError> {
    match count {
        None => Ok(10),
        Some(n @ 1..=1000) => Ok(n),
        Some(_) => Err(ApiError::invalid("count", "must be between 1 and 1000")),
    }
}

/// The job's next fire times, from the instant it owes next.
pub async fn preview(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(p): Query<PreviewParams>,
) -> Result<Json<Preview>, ApiError> {
    let namespace = Namespace {
        namespace: p.namespace,
    }
    .checked(&caller)?;
    let count = check_count(p.count)?;
    let job = find(&state, &namespace, &name).await?;
    let schedule = crate::schedule_rules::schedule_of(&*state.store, &job).await?;
    let mut occurrences = Vec::with_capacity(count);
    if let Some(next) = job.next_fire_at {
        // As the firing loop does: what falls due from the stored instant on, under the
        // calendar as it is now.
        let from = next - chrono::Duration::microseconds(1);
        occurrences = schedule.preview_occurrences(from, job.fired_count, count);
    }
    let from = job.next_fire_at.unwrap_or_else(Utc::now);
    Ok(Json(Preview::of(&schedule, from, occurrences, count)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewRequest {
    schedule: ScheduleSpec,
    #[serde(default)]
    count: Option<usize>,
    /// Preview from this instant (default now).
    #[serde(default)]
    from: Option<Instant>,
}

/// The next fire times of any schedule, without creating a job; a calendar it names is read
/// from the namespace.
pub async fn preview_schedule(
    State(state): State<AppState>,
    caller: Caller,
    Query(ns): Query<Namespace>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Preview>, ApiError> {
    let req: PreviewRequest = parse_json(&body(raw)?)?;
    let count = check_count(req.count)?;
    let from = req.from.unwrap_or_else(Utc::now);
    let mut schedule = Schedule::compile(Some(&req.schedule), from)?;
    if schedule.calendar_name().is_some() {
        let namespace = ns.checked(&caller)?;
        crate::schedule_rules::attach(&*state.store, &namespace, &mut schedule).await?;
    }
    let occurrences = schedule.preview_occurrences(from, 0, count);
    Ok(Json(Preview::of(&schedule, from, occurrences, count)))
}

#[derive(Debug, Deserialize)]
pub struct RunsParams {
    #[serde(default = "super::default_namespace")]
    namespace: String,
    state: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct RunPage {
    pub runs: Vec<RunRecord>,
    pub next_cursor: Option<String>,
}

pub fn parse_run_state(state: Option<&str>) -> Result<Option<RunState>, ApiError> {
    run_state_in("state", state)
}

/// The run state query parameter `field` names, if given.
fn run_state_in(field: &str, state: Option<&str>) -> Result<Option<RunState>, ApiError> {
    state
        .map(|s| {
            RunState::parse(s).ok_or_else(|| {
                let names: Vec<&str> = RunState::ALL.iter().map(|s| s.as_str()).collect();
                ApiError::invalid(field, format!("{s:?} is not one of {}", names.join(", ")))
            })
        })
        .transpose()
}

pub async fn runs(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(p): Query<RunsParams>,
) -> Result<Json<RunPage>, ApiError> {
    let namespace = Namespace {
        namespace: p.namespace,
    }
    .checked(&caller)?;
    let query = RunQuery {
        namespace,
        job: Some(name),
        state: parse_run_state(p.state.as_deref())?,
        limit: check_limit(p.limit)?,
        cursor: p.cursor,
        ..RunQuery::default()
    };
    let page = state.store.list_runs(&query).await?;
    Ok(Json(RunPage {
        runs: page.items,
        next_cursor: page.next_cursor,
    }))
}

pub async fn stats(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(ns): Query<Namespace>,
) -> Result<Json<sked_core::records::JobStats>, ApiError> {
    let namespace = ns.checked(&caller)?;
    let stats = state.store.job_stats(&namespace, &name).await?;
    stats
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("job {name:?} in namespace {namespace:?}")))
}

/// The most levels `GET /jobs/{name}/graph` walks either way, and the most jobs it returns.
const MAX_GRAPH_DEPTH: u32 = 50;
const MAX_GRAPH_JOBS: usize = 1000;

#[derive(Debug, Deserialize)]
pub struct GraphParams {
    #[serde(default = "super::default_namespace")]
    namespace: String,
    /// Levels of upstreams to follow (default 5).
    up: Option<u32>,
    /// Levels of dependants to follow (default 5).
    down: Option<u32>,
}

/// The dependency graph around a job: its upstreams above, its dependants below.
#[derive(Debug, Serialize)]
pub struct Graph {
    pub job: String,
    /// The job first, then by depth (upstreams negative, dependants positive) and name.
    pub nodes: Vec<GraphNode>,
    pub edges: Vec<GraphEdge>,
    /// More jobs were within reach than the answer holds ([`MAX_GRAPH_JOBS`]).
    pub truncated: bool,
}

#[derive(Debug, Serialize)]
pub struct GraphNode {
    #[serde(flatten)]
    pub job: GraphJob,
    /// Levels from the job: -1 for what it waits for, 1 for what waits for it.
    pub depth: i32,
}

/// A job as a node of a dependency graph: where it stands, how its newest run went and when
/// it runs next.
#[derive(Debug, Serialize)]
pub struct GraphJob {
    pub name: String,
    /// `None` for a job deleted (with `force`) that others still name.
    pub state: Option<JobState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleSpec>,
    /// Its run with the latest instant, if any.
    pub last_run: Option<LastRun>,
    /// Its own next instant or, for a job without a schedule that runs after its upstreams,
    /// theirs (as its `after.next_fire_at`).
    pub next_fire_at: Option<Instant>,
}

/// The newest run of a graph's job, in short.
#[derive(Debug, Serialize)]
pub struct LastRun {
    pub id: i64,
    pub state: RunState,
    pub scheduled_for: Instant,
    pub finished_at: Option<Instant>,
}

/// Reads what a graph shows of job `name`: its record, its newest run (one index seek, as
/// the job list's `include=last_run`) and its next instant. `seen` keeps the upstreams
/// already read for the next instants of jobs without a schedule.
async fn graph_job(
    state: &AppState,
    namespace: &str,
    name: &str,
    seen: &mut BTreeMap<String, UpstreamSeen>,
) -> Result<(GraphJob, Option<JobSpec>), ApiError> {
    let (record, last_run) = graph_reads(state, namespace, name).await?;
    graph_node(state, namespace, name, record, last_run, seen).await
}

/// What a graph's node reads of its job: the job, and its newest run.
async fn graph_reads(
    state: &AppState,
    namespace: &str,
    name: &str,
) -> Result<(Option<JobRecord>, Option<LastRun>), ApiError> {
    let Some(record) = state.store.get_job(namespace, name).await? else {
        return Ok((None, None));
    };
    let newest = RunQuery {
        namespace: namespace.to_string(),
        job: Some(name.to_string()),
        limit: 1,
        ..RunQuery::default()
    };
    let last_run = state
        .store
        .list_runs(&newest)
        .await?
        .items
        .pop()
        .map(|run| LastRun {
            id: run.id,
            state: run.state,
            scheduled_for: run.scheduled_for,
            finished_at: run.finished_at,
        });
    Ok((Some(record), last_run))
}

/// A graph's node from what [`graph_reads`] found, with the pipeline's next instant.
async fn graph_node(
    state: &AppState,
    namespace: &str,
    name: &str,
    record: Option<JobRecord>,
    last_run: Option<LastRun>,
    seen: &mut BTreeMap<String, UpstreamSeen>,
) -> Result<(GraphJob, Option<JobSpec>), ApiError> {
    let Some(record) = record else {
        let gone = GraphJob {
            name: name.to_string(),
            state: None,
            schedule: None,
            last_run: None,
            next_fire_at: None,
        };
        return Ok((gone, None));
    };
    let after = runs_after(state, namespace, &record.spec, seen).await?;
    let next_fire_at = record.next_fire_at.or(after.and_then(|a| a.next_fire_at));
    let job = GraphJob {
        name: name.to_string(),
        state: Some(record.state),
        schedule: record.spec.schedule.clone(),
        last_run,
        next_fire_at,
    };
    Ok((job, Some(record.spec)))
}

/// `job` waits for `upstream`, on these terms (one per entry or alternative naming it).
#[derive(Debug, Serialize)]
pub struct GraphEdge {
    pub upstream: String,
    pub job: String,
    pub requirements: Vec<GraphRequirement>,
}

#[derive(Debug, Serialize)]
pub struct GraphRequirement {
    pub window: sked_core::dependency::Window,
    pub state: sked_core::dependency::Awaited,
}

fn check_depth(field: &str, levels: Option<u32>) -> Result<u32, ApiError> {
    match levels {
        None => Ok(5),
        Some(n @ 0..=MAX_GRAPH_DEPTH) => Ok(n),
        Some(_) => Err(ApiError::invalid(
            field,
            format!("must be between 0 and {MAX_GRAPH_DEPTH}"),
        )),
    }
}

pub async fn graph(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(p): Query<GraphParams>,
) -> Result<Json<Graph>, ApiError> {
    let namespace = Namespace {
        namespace: p.namespace,
    }
    .checked(&caller)?;
    let up = check_depth("up", p.up)?;
    let down = check_depth("down", p.down)?;
    find(&state, &namespace, &name).await?;
    let mut depth: BTreeMap<String, i32> = BTreeMap::from([(name.clone(), 0)]);
    let mut edges = std::collections::BTreeSet::new();
    let mut truncated = false;
    for (toward, levels, sign) in [
        (sked_store::Toward::Upstream, up, -1),
        (sked_store::Toward::Downstream, down, 1),
    ] {
        let mut frontier = vec![name.clone()];
        for level in 1..=levels as i32 {
            if frontier.is_empty() {
                break;
            }
            let found = state
                .store
                .dependency_edges(&namespace, &frontier, toward)
                .await?;
            frontier.clear();
            for edge in found {
                let next = match toward {
                    sked_store::Toward::Upstream => edge.upstream.clone(),
                    sked_store::Toward::Downstream => edge.job.clone(),
                };
                if !depth.contains_key(&next) {
                    if depth.len() >= MAX_GRAPH_JOBS {
                        truncated = true;
                        continue;
                    }
                    depth.insert(next.clone(), sign * level);
                    frontier.push(next);
                }
                edges.insert((edge.upstream, edge.job));
            }
        }
    }
    let mut nodes = Vec::with_capacity(depth.len());
    let mut specs: BTreeMap<String, JobSpec> = BTreeMap::new();
    let mut seen = BTreeMap::new();
    for (job, level) in &depth {
        let (node, spec) = graph_job(&state, &namespace, job, &mut seen).await?;
        nodes.push(GraphNode {
            job: node,
            depth: *level,
        });
        if let Some(spec) = spec {
            specs.insert(job.clone(), spec);
        }
    }
    nodes.sort_by(|a, b| {
        (a.depth != 0, a.depth, &a.job.name).cmp(&(b.depth != 0, b.depth, &b.job.name))
    });
    let edges = graph_edges(edges, &specs, |name| depth.contains_key(name));
    Ok(Json(Graph {
        job: name,
        nodes,
        edges,
        truncated,
    }))
}

/// The edges between the jobs `kept` holds, each with the terms of the dependant's
/// definition (`specs`) that name its upstream.
fn graph_edges(
    edges: std::collections::BTreeSet<(String, String)>,
    specs: &BTreeMap<String, JobSpec>,
    kept: impl Fn(&str) -> bool,
) -> Vec<GraphEdge> {
    edges
        .into_iter()
        // An edge to a job beyond the answer's bounds is left out with it.
        .filter(|(upstream, job)| kept(upstream) && kept(job))
        .map(|(upstream, job)| {
            let requirements = specs
                .get(&job)
                .map(|spec| {
                    sked_core::dependency::requirements(&spec.depends_on)
                        .filter(|r| r.upstream == Upstream::Job(&upstream))
                        .map(|r| GraphRequirement {
                            window: r.window,
                            state: r.state,
                        })
                        .collect()
                })
                .unwrap_or_default();
            GraphEdge {
                upstream,
                job,
                requirements,
            }
        })
        .collect()
}

/// The most jobs `GET /graph` returns by default, and at most.
const NAMESPACE_GRAPH_JOBS: u32 = 300;
const MAX_NAMESPACE_GRAPH_JOBS: u32 = 1000;

#[derive(Debug, Deserialize)]
pub struct NamespaceGraphParams {
    #[serde(default = "super::default_namespace")]
    namespace: String,
    /// Jobs at most (default 300, at most 1,000).
    limit: Option<u32>,
}

/// Every job of a namespace that depends on another or that another depends on, with the
/// edges between them.
#[derive(Debug, Serialize)]
pub struct NamespaceGraph {
    pub namespace: String,
    /// By name.
    pub nodes: Vec<GraphJob>,
    pub edges: Vec<GraphEdge>,
    /// The namespace holds more such jobs (or edges) than the answer does.
    pub truncated: bool,
}

pub async fn namespace_graph(
    State(state): State<AppState>,
    caller: Caller,
    Query(p): Query<NamespaceGraphParams>,
) -> Result<Json<NamespaceGraph>, ApiError> {
    let namespace = Namespace {
        namespace: p.namespace,
    }
    .checked(&caller)?;
    let limit = match p.limit {
        None => NAMESPACE_GRAPH_JOBS,
        Some(n @ 1..=MAX_NAMESPACE_GRAPH_JOBS) => n,
        Some(_) => {
            return Err(ApiError::invalid(
                "limit",
                format!("must be between 1 and {MAX_NAMESPACE_GRAPH_JOBS}"),
            ))
        }
    };
    let found = state
        .store
        .namespace_edges(&namespace, sked_store::MAX_NAMESPACE_EDGES)
        .await?;
    let mut truncated = found.len() >= sked_store::MAX_NAMESPACE_EDGES as usize;
    // Jobs in the order their edges come (by upstream), until the bound.
    let mut kept: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut edges = std::collections::BTreeSet::new();
    for edge in found {
        for name in [&edge.upstream, &edge.job] {
            if !kept.contains(name.as_str()) {
                if kept.len() >= limit as usize {
                    truncated = true;
                    continue;
                }
                kept.insert(name.clone());
            }
        }
        edges.insert((edge.upstream, edge.job));
    }
    // Each job's reads are a few round trips to the store; a few jobs at a time keep a
    // large graph from paying them one after another (on PostgreSQL, 300 jobs read in
    // turn took half a second).
    use futures_util::{StreamExt, TryStreamExt};
    let read: Vec<(String, Option<JobRecord>, Option<LastRun>)> =
        futures_util::stream::iter(kept.iter().cloned())
            .map(|name| {
                let (state, namespace) = (state.clone(), namespace.clone());
                async move {
                    let (record, last_run) = graph_reads(&state, &namespace, &name).await?;
                    Ok::<_, ApiError>((name, record, last_run))
                }
            })
            .buffered(GRAPH_READS_AT_ONCE)
            .try_collect()
            .await?;
    // What was read answers the search for next instants above schedule-less jobs, too.
    let mut seen: BTreeMap<String, UpstreamSeen> = read
        .iter()
        .map(|(name, record, _)| (name.clone(), upstream_seen(record.as_ref())))
        .collect();
    let mut nodes = Vec::with_capacity(kept.len());
    let mut specs: BTreeMap<String, JobSpec> = BTreeMap::new();
    for (name, record, last_run) in read {
        let (node, spec) =
            graph_node(&state, &namespace, &name, record, last_run, &mut seen).await?;
        nodes.push(node);
        if let Some(spec) = spec {
            specs.insert(name, spec);
        }
    }
    let edges = graph_edges(edges, &specs, |name| kept.contains(name));
    Ok(Json(NamespaceGraph {
        namespace,
        nodes,
        edges,
        truncated,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_less_its_own_fields_is_the_definition() {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "nightly",
            "schedule": {"cron": "30 2 * * *"},
            "target": {"shell": {"command": "true"}},
        }))
        .unwrap();
        let at = Utc::now();
        let view = JobView {
            spec: spec.clone(),
            namespace: "default".into(),
            state: JobState::Active,
            rank: 0,
            next_fire_at: Some(at),
            fired_count: 1,
            created_at: at,
            updated_at: at,
            version: 3,
            last_run: None,
            counters: Some(BTreeMap::from([("succeeded".to_string(), 1)])),
            after: Some(RunsAfter {
                upstreams: vec!["extract".into()],
                next_fire_at: Some(at),
            }),
        };
        let mut value = serde_json::to_value(&view).unwrap();
        let object = value.as_object_mut().unwrap();
        for field in JOB_VIEW_FIELDS {
            object.remove(*field);
        }
        let back: JobSpec = serde_json::from_value(value).expect("only definition fields left");
        assert_eq!(back, spec);
    }
}
