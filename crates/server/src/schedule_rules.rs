//! What schedules meet beyond their own definition: a namespace's calendar read from the
//! store with every calendar it includes or excepts, resolved
//! (`sked_core::calendar::Calendar::resolve`) and attached to a compiled schedule, and the
//! namespace's blackout windows. Every place that computes a stored schedule's instants (a
//! job's write, the firing loop, previews, backfills) goes through [`attach`] or
//! [`schedule_of`], or the firing loop's [`RulesCache`], so they agree.
//!
//! It reads calendars and namespace settings; writing them is the API's
//! (`crate::api::calendars`, `crate::api::namespaces`), and what a calendar or a window does
//! to an instant is the core's.

use sked_core::calendar::{Calendar, CalendarSpec, MAX_DEPTH, MAX_REFERENCES};
use sked_core::records::JobRecord;
use sked_core::schedule::{Blackouts, Schedule};
use sked_core::SpecError;
use sked_store::{Store, StoreError};
use std::collections::HashMap;
use std::sync::Arc;

/// The most calendars one resolution reads: a tree [`MAX_DEPTH`] deep is refused long before.
const MAX_READ: usize = MAX_DEPTH * MAX_REFERENCES;

/// Why a calendar could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The definition is wrong: an unknown name, a cycle (the field names where).
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Calendars about to be written (an apply's file), by name: they stand in front of the
/// namespace's stored calendars of the same name while the batch is checked.
pub type Pending = HashMap<String, CalendarSpec>;

/// The specs of `root` (given, or read) and of every calendar it names, transitively, from
/// `pending` or else read from `namespace`. Names that do not exist are left out: resolving
/// refuses them.
async fn specs_from(
    store: &dyn Store,
    namespace: &str,
    root: &str,
    root_spec: Option<&CalendarSpec>,
    pending: &Pending,
) -> Result<HashMap<String, CalendarSpec>, StoreError> {
    let mut specs = HashMap::new();
    let mut wanted = vec![root.to_string()];
    if let Some(spec) = root_spec {
        specs.insert(root.to_string(), spec.clone());
        wanted = spec.include.iter().chain(&spec.except).cloned().collect();
    }
    let mut read = 0;
    while let Some(name) = wanted.pop() {
        if specs.contains_key(&name) || read >= MAX_READ {
            continue;
        }
        read += 1;
        let spec = match pending.get(&name) {
            Some(spec) => Some(spec.clone()),
            None => store
                .get_calendar(namespace, &name)
                .await?
                .map(|record| record.spec),
        };
        if let Some(spec) = spec {
            wanted.extend(spec.include.iter().chain(&spec.except).cloned());
            specs.insert(name, spec);
        }
    }
    Ok(specs)
}

/// Calendar `name` of `namespace`, resolved; `None` when there is no such calendar.
pub async fn resolve(
    store: &dyn Store,
    namespace: &str,
    name: &str,
) -> Result<Option<Calendar>, ResolveError> {
    resolve_with(store, namespace, name, &Pending::new()).await
}

/// Calendar `name`, from `pending` or else from `namespace`, resolved with those it names
/// (each from `pending` first too); `None` when there is no such calendar.
async fn resolve_with(
    store: &dyn Store,
    namespace: &str,
    name: &str,
    pending: &Pending,
) -> Result<Option<Calendar>, ResolveError> {
    let specs = specs_from(store, namespace, name, None, pending).await?;
    if !specs.contains_key(name) {
        return Ok(None);
    }
    Ok(Some(Calendar::resolve(name, &|n| specs.get(n).cloned())?))
}

/// `spec`, about to be written as calendar `name` of `namespace`, resolved with the stored
/// calendars it names: refused when one is unknown or they form a cycle.
pub async fn resolve_new(
    store: &dyn Store,
    namespace: &str,
    name: &str,
    spec: &CalendarSpec,
) -> Result<Calendar, ResolveError> {
    let pending = Pending::from([(name.to_string(), spec.clone())]);
    resolve_pending(store, namespace, name, &pending).await
}

/// Calendar `name` of `pending`, about to be written with the others there, resolved with
/// the calendars it names, from `pending` first and then from `namespace`: refused when one
/// is unknown or they form a cycle (through stored calendars too).
pub async fn resolve_pending(
    store: &dyn Store,
    namespace: &str,
    name: &str,
    pending: &Pending,
) -> Result<Calendar, ResolveError> {
    let Some(spec) = pending.get(name) else {
        return Err(
            SpecError::new("name", format!("no calendar {name:?} is being written")).into(),
        );
    };
    let specs = specs_from(store, namespace, name, Some(spec), pending).await?;
    Ok(Calendar::resolve_spec(name, spec, &|n| {
        specs.get(n).cloned()
    })?)
}

/// Gives `schedule` the calendar it names, resolved from `namespace`. A calendar that does
/// not exist is refused naming `schedule.calendar`.
pub async fn attach(
    store: &dyn Store,
    namespace: &str,
    schedule: &mut Schedule,
) -> Result<(), ResolveError> {
    attach_pending(store, namespace, schedule, &Pending::new()).await
}

/// [`attach`], the calendar (and those it names) taken from `pending` first: the calendars an
/// apply writes with the job.
pub async fn attach_pending(
    store: &dyn Store,
    namespace: &str,
    schedule: &mut Schedule,
    pending: &Pending,
) -> Result<(), ResolveError> {
    let field = "schedule.calendar";
    let Some(name) = schedule.calendar_name().map(str::to_string) else {
        return Ok(());
    };
    let calendar = resolve_with(store, namespace, &name, pending)
        .await
        .map_err(|e| match e {
            ResolveError::Spec(s) => ResolveError::Spec(SpecError::new(field, s.to_string())),
            other => other,
        })?
        .ok_or_else(|| {
            SpecError::new(
                field,
                format!("there is no calendar named {name:?} in namespace {namespace:?}"),
            )
        })?;
    schedule.attach_calendar(Arc::new(calendar));
    Ok(())
}

/// Stored job `job`'s schedule as the firing loop runs it: with its and its namespace's
/// blackout windows, set at its epoch, meeting its calendar as the store holds it now.
pub async fn schedule_of(store: &dyn Store, job: &JobRecord) -> Result<Schedule, ResolveError> {
    let mut schedule = job.spec.compiled_schedule(job.schedule_epoch)?;
    attach(store, &job.namespace, &mut schedule).await?;
    if !schedule.is_manual() {
        schedule.set_namespace_blackouts(namespace_windows(store, &job.namespace).await?);
    }
    Ok(schedule)
}

/// Namespace `namespace`'s blackout windows; `None` when it has none.
async fn namespace_windows(
    store: &dyn Store,
    namespace: &str,
) -> Result<Option<Arc<Blackouts>>, StoreError> {
    let Some(record) = store.get_namespace(namespace).await? else {
        return Ok(None);
    };
    match record.spec.blackout_windows() {
        Ok(windows) => Ok(windows.map(Arc::new)),
        Err(e) => {
            // Its jobs then run as if it had no windows: said loudly, not silently.
            tracing::error!(
                "namespace {namespace:?} has blackout windows that no longer check, and they \
                 are not applied: {e}"
            );
            Ok(None)
        }
    }
}

/// What the firing loop's schedules meet, read once each: resolved calendars by (namespace,
/// name) — a million schedules name a handful — and each namespace's blackout windows. Dropped
/// whole when any of them changes (written on this node, or announced by another through the
/// store's events) and when every schedule is read again.
#[derive(Default)]
pub struct RulesCache {
    resolved: HashMap<(String, String), Option<Arc<Calendar>>>,
    windows: HashMap<String, Option<Arc<Blackouts>>>,
}

impl RulesCache {
    /// Calendar `name` of `namespace`: `None` when it does not exist (or does not resolve,
    /// which is logged).
    pub async fn calendar(
        &mut self,
        store: &dyn Store,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Calendar>>, StoreError> {
        let key = (namespace.to_string(), name.to_string());
        if let Some(known) = self.resolved.get(&key) {
            return Ok(known.clone());
        }
        let calendar = match resolve(store, namespace, name).await {
            Ok(c) => c.map(Arc::new),
            Err(ResolveError::Store(e)) => return Err(e),
            Err(ResolveError::Spec(e)) => {
                tracing::error!("calendars: {namespace}/{name} does not resolve: {e}");
                None
            }
        };
        self.resolved.insert(key, calendar.clone());
        Ok(calendar)
    }

    /// Namespace `namespace`'s blackout windows; `None` when it has none.
    pub async fn namespace_windows(
        &mut self,
        store: &dyn Store,
        namespace: &str,
    ) -> Result<Option<Arc<Blackouts>>, StoreError> {
        if let Some(known) = self.windows.get(namespace) {
            return Ok(known.clone());
        }
        let windows = namespace_windows(store, namespace).await?;
        self.windows.insert(namespace.to_string(), windows.clone());
        Ok(windows)
    }

    pub fn clear(&mut self) {
        self.resolved.clear();
        self.windows.clear();
    }
}
