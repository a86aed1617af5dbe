//! The firing loop: keeps the next instant of every schedule in memory ([`slots`]) and, when
//! instants fall due, writes them to the ledger in batches (one transaction per batch) and
//! hands the queued runs to the dispatcher. A batch is whatever fell due while the last one was
//! being written, so batches grow with the rate and the store's commit time: a lone instant is
//! written at once, and a thousand a second on a slow disk share transactions.
//!
//! It fires the schedules of the partitions this node holds (all of them on a single node;
//! in a cluster, the share the membership duty leased). When it gains partitions it loads their
//! schedules from the store; instants that fell due while nothing could fire them (the server
//! was down, or the node holding them died) are resolved by each job's misfire policy, and each
//! gets its ledger row. A created, changed, paused or deleted job reaches the loop through
//! [`FiringHandle::reload`], so it takes effect at once. The loop owns no durable state: the
//! store's `next_fire_at` is the truth, and the in-memory timer is rebuilt from it. Nor does it
//! keep job definitions: what dispatch needs of a run is read back with the batch's queued
//! runs, and kept only for schedules that fire often. Two nodes
//! firing one partition for a moment (a lease changing hands) write nothing twice: the ledger
//! keeps one run per instant and applies one advance of each firing state.

mod slots;

use crate::admission::NodeBacklog;
use crate::dispatch::Dispatcher;
use crate::metrics::Metrics;
use crate::schedule_rules::RulesCache;
use chrono::Utc;
use sked_core::cluster::partition_of;
use sked_core::policy::admission::Admission;
use sked_core::records::{JobRecord, ScheduledJob};
use sked_core::run::{RunState, SkipReason, Trigger};
use sked_core::schedule::{Occurrence, Schedule};
use sked_core::Instant;
use sked_store::{Advance, Audit, Fire, QueuedRun, Store};
use slots::{is_frequent, Slot, Slots};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// Scheduled jobs read from the store at a time when partitions are gained.
const LOAD_PAGE: u32 = 10_000;
/// Streams of pages read at once when loading schedules.
const LOAD_STREAMS: usize = 2;

/// What the firing loop is told.
enum Change {
    /// A job's definition changed in the store.
    Job(i64),
    /// The partitions this node holds now.
    Partitions(Vec<u32>),
    /// The store may have changed unannounced: read every held schedule again.
    Resync,
    /// A calendar or a namespace's settings were written or deleted: what the schedules meet
    /// is read again.
    Rules,
}

/// Tells the firing loop what changed.
#[derive(Clone)]
pub struct FiringHandle {
    tx: mpsc::UnboundedSender<Change>,
}

impl FiringHandle {
    // The loop only stops at shutdown, when nothing is left to tell: sends cannot fail before.

    /// Re-reads job `job_id` from the store (created, changed, paused, resumed or deleted).
    pub fn reload(&self, job_id: i64) {
        let _ = self.tx.send(Change::Job(job_id));
    }

    /// Fires the schedules of `partitions` from now on, and no others.
    pub fn hold(&self, partitions: Vec<u32>) {
        let _ = self.tx.send(Change::Partitions(partitions));
    }

    /// Reads every held schedule again.
    pub fn resync(&self) {
        let _ = self.tx.send(Change::Resync);
    }

    /// Reads what the schedules meet again: their calendars and their namespaces' blackout
    /// windows.
    pub fn rules_changed(&self) {
        let _ = self.tx.send(Change::Rules);
    }
}

pub struct FiringLoop {
    store: Arc<dyn Store>,
    dispatcher: Arc<Dispatcher>,
    metrics: Arc<Metrics>,
    backlog: Arc<NodeBacklog>,
    batch: usize,
    rx: mpsc::UnboundedReceiver<Change>,
    /// The partitions whose schedules this loop fires.
    held: BTreeSet<u32>,
    slots: Slots,
    /// The names of the slots' namespaces.
    namespaces: Namespaces,
    /// The calendars and namespace blackout windows the slots' schedules meet.
    rules: RulesCache,
    /// Held jobs with no slot because their calendar does not exist: read again when a
    /// calendar is written.
    missing_calendar: BTreeSet<i64>,
}

/// A pending write: the fire and, when the loop keeps it, what dispatching its run needs.
struct Pending {
    fire: Fire,
    namespace: u16,
    template: Option<Arc<QueuedRun>>,
}

impl FiringLoop {
    pub fn new(
        store: Arc<dyn Store>,
        dispatcher: Arc<Dispatcher>,
        metrics: Arc<Metrics>,
        batch: usize,
        backlog: Arc<NodeBacklog>,
    ) -> (FiringHandle, FiringLoop) {
        let (tx, rx) = mpsc::unbounded_channel();
        let looper = FiringLoop {
            store,
            dispatcher,
            metrics,
            backlog,
            batch: batch.max(1),
            rx,
            held: BTreeSet::new(),
            slots: Slots::default(),
            namespaces: Namespaces::default(),
            rules: RulesCache::default(),
            missing_calendar: BTreeSet::new(),
        };
        (FiringHandle { tx }, looper)
    }

    pub async fn run(mut self, ready: watch::Sender<bool>, mut shutdown: watch::Receiver<bool>) {
        loop {
            let next_due = self.slots.next_due();
            tokio::select! {
                biased;
                _ = crate::stopped(&mut shutdown) => return,
                Some(change) = self.rx.recv() => {
                    let mut changes = vec![change];
                    while let Ok(more) = self.rx.try_recv() {
                        changes.push(more);
                    }
                    let first_hold = !*ready.borrow()
                        && changes.iter().any(|c| matches!(c, Change::Partitions(_)));
                    self.apply(changes, &mut shutdown).await;
                    if first_hold {
                        let _ = ready.send(true);
                        tracing::info!(
                            "firing: {} partitions held, {} schedules loaded",
                            self.held.len(),
                            self.slots.len()
                        );
                    }
                }
                _ = until(next_due) => {
                    let written = self.fire_due(&mut shutdown).await;
                    // The store told readiness about the failure.
                    if written.is_err() {
                        // The instants stay due in the store; rebuild from it after a pause.
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        self.reload_held(&mut shutdown).await;
                    }
                }
            }
        }
    }

    async fn apply(&mut self, changes: Vec<Change>, shutdown: &mut watch::Receiver<bool>) {
        let mut resync = false;
        let mut rules = false;
        for change in changes {
            match change {
                Change::Job(id) => {
                    if let Err(e) = self.reload(id).await {
                        // The job keeps its old schedule until every held one is read again;
                        // a change never read would leave it firing by a stale definition.
                        tracing::error!("firing: cannot reload job {id}, reading all again: {e}");
                        resync = true;
                    }
                }
                Change::Partitions(partitions) => {
                    let now: BTreeSet<u32> = partitions.into_iter().collect();
                    let lost = self.held.difference(&now).count();
                    let gained: Vec<u32> = now.difference(&self.held).copied().collect();
                    self.held = now;
                    if lost > 0 {
                        let held = &self.held;
                        self.slots.retain(|id| held.contains(&partition_of(id)));
                        self.missing_calendar
                            .retain(|id| held.contains(&partition_of(*id)));
                        tracing::info!("firing: gave up {lost} partitions");
                    }
                    if !gained.is_empty() {
                        self.load(&gained, shutdown).await;
                    }
                }
                Change::Resync => resync = true,
                Change::Rules => rules = true,
            }
        }
        if rules && !resync {
            self.reload_rules(shutdown).await;
        }
        if resync {
            self.reload_held(shutdown).await;
        }
        self.metrics.schedules.set(self.slots.len() as i64);
    }

    /// Loads the schedules of `partitions` until the store answers (or shutdown), and says
    /// what that took: an operator watching a start sees it progress and end.
    async fn load(&mut self, partitions: &[u32], shutdown: &mut watch::Receiver<bool>) {
        loop {
            let started = std::time::Instant::now();
            let before = self.slots.len();
            match self.load_partitions(partitions, shutdown).await {
                Ok(missed) => {
                    tracing::info!(
                        partitions = partitions.len(),
                        schedules = self.slots.len().saturating_sub(before),
                        missed,
                        elapsed = ?started.elapsed(),
                        "firing: schedules loaded; missed instants were recorded by their jobs' \
                         misfire policies"
                    );
                    return;
                }
                Err(e) => tracing::error!("firing: cannot load schedules, retrying: {e}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                _ = crate::stopped(shutdown) => return,
            }
        }
    }

    /// Gives every held schedule its namespace's blackout windows and the calendar it names as
    /// the store holds them now, each read once: what falls due from each slot's next instant
    /// on is judged by them. A slot whose calendar is gone is dropped (its job fires nothing
    /// until the calendar is written again, as at a load).
    async fn reload_rules(&mut self, shutdown: &mut watch::Receiver<bool>) {
        self.rules.clear();
        if let Err(e) = self.reattach_namespace_windows().await {
            tracing::error!("firing: cannot read namespace settings, reading all again: {e}");
            self.reload_held(shutdown).await;
            return;
        }
        if let Err(e) = self.load_missing_calendar(shutdown).await {
            tracing::error!(
                "firing: cannot read jobs whose calendar was missing, reading all again: {e}"
            );
            self.reload_held(shutdown).await;
            return;
        }
        let jobs = self
            .slots
            .jobs_where(|slot| slot.schedule.calendar_name().is_some());
        for job_id in jobs {
            let Some(mut slot) = self.slots.remove(job_id) else {
                continue;
            };
            let Some(name) = slot.schedule.calendar_name().map(str::to_string) else {
                continue;
            };
            let namespace = self.namespaces.name(slot.namespace).to_string();
            let calendar = match self.rules.calendar(&*self.store, &namespace, &name).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(
                        "firing: cannot read calendar {name:?}, reading all again: {e}"
                    );
                    self.reload_held(shutdown).await;
                    return;
                }
            };
            let Some(calendar) = calendar else {
                say_calendar_missing(job_id, &name);
                self.missing_calendar.insert(job_id);
                continue;
            };
            let due = meet_calendar(job_id, &mut slot.schedule, calendar, slot.next, slot.fired);
            if let Some(next) = due {
                slot.next = next;
                self.slots.insert(slot);
            }
        }
    }

    /// Gives every held schedule with a timer its namespace's blackout windows, each
    /// namespace's read once. Windows remove instants where they fall due and move none, so
    /// no slot's next instant changes.
    async fn reattach_namespace_windows(&mut self) -> Result<(), sked_store::StoreError> {
        let mut windows = Vec::with_capacity(self.namespaces.names.len());
        for name in &self.namespaces.names {
            windows.push(self.rules.namespace_windows(&*self.store, name).await?);
        }
        self.slots.for_each_mut(|slot| {
            let of_namespace = windows.get(usize::from(slot.namespace)).cloned().flatten();
            slot.schedule.set_namespace_blackouts(of_namespace);
        });
        Ok(())
    }

    /// Reads again the jobs that had no slot because their calendar was missing, as a load
    /// does: the instants they owed meanwhile are resolved by their misfire policies.
    async fn load_missing_calendar(
        &mut self,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), sked_store::StoreError> {
        let now = Utc::now();
        let mut pending = Vec::new();
        for job_id in std::mem::take(&mut self.missing_calendar) {
            let Some(job) = self
                .store
                .get_job_by_id(job_id)
                .await?
                .and_then(ScheduledJob::of)
            else {
                continue;
            };
            if let Some(slot) = self.slot_of(&job).await? {
                self.catch_up(&job, slot, now, &mut pending);
            }
        }
        self.write(pending, now, shutdown).await
    }

    /// Drops every schedule and loads those of the held partitions again.
    async fn reload_held(&mut self, shutdown: &mut watch::Receiver<bool>) {
        self.rules.clear();
        self.missing_calendar.clear();
        self.slots.clear();
        let held: Vec<u32> = self.held.iter().copied().collect();
        self.load(&held, shutdown).await;
    }

    /// Loads the schedules of `partitions`, a page at a time; instants already past are missed
    /// and resolved by misfire policy.
    async fn load_partitions(
        &mut self,
        partitions: &[u32],
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<usize, sked_store::StoreError> {
        if partitions.is_empty() {
            return Ok(0);
        }
        let mut missed = 0;
        // Pages are read on tasks of their own, each stream a page ahead, while this loop
        // files them: reading (decoding each definition) is most of loading a million
        // schedules, and two streams over alternate partitions keep both cores on it.
        let (pages, mut incoming) = mpsc::channel(LOAD_STREAMS);
        let mut readers = tokio::task::JoinSet::new();
        for stream in 0..LOAD_STREAMS {
            let own: Vec<u32> = partitions
                .iter()
                .skip(stream)
                .step_by(LOAD_STREAMS)
                .copied()
                .collect();
            if !own.is_empty() {
                readers.spawn(read_pages(self.store.clone(), own, pages.clone()));
            }
        }
        drop(pages);
        while let Some(page) = incoming.recv().await {
            let now = Utc::now();
            let mut pending = Vec::new();
            for job in page? {
                if let Some(slot) = self.slot_of(&job).await? {
                    self.catch_up(&job, slot, now, &mut pending);
                }
                if pending.len() >= self.batch {
                    missed += pending.len();
                    self.write(std::mem::take(&mut pending), now, shutdown)
                        .await?;
                }
            }
            missed += pending.len();
            self.write(pending, now, shutdown).await?;
        }
        // A stream ends by sending its last page or its error, or by panicking: then its
        // partitions were not all read, and the load must fail rather than look complete.
        while let Some(ended) = readers.join_next().await {
            ended
                .map_err(|e| sked_store::StoreError::Database(format!("reading schedules: {e}")))?;
        }
        Ok(missed)
    }

    /// Replaces job `job_id`'s slot with what the store holds now. On error the old slot stays,
    /// so a failed read never stops a schedule.
    async fn reload(&mut self, job_id: i64) -> Result<(), sked_store::StoreError> {
        if !self.held.contains(&partition_of(job_id)) {
            // Another node fires it.
            self.slots.remove(job_id);
            self.missing_calendar.remove(&job_id);
            return Ok(());
        }
        let job = self.store.get_job_by_id(job_id).await?;
        self.slots.remove(job_id);
        self.missing_calendar.remove(&job_id);
        if let Some(job) = job.and_then(ScheduledJob::of) {
            if let Some(slot) = self.slot_of(&job).await? {
                self.slots.insert(slot);
            }
        }
        Ok(())
    }

    /// The slot for `job` with what it meets read (cached); `None` when it gets none (see
    /// [`slot_from`]). A job left without one because its calendar is missing is kept in
    /// `missing_calendar`, to be read again when a calendar is written.
    async fn slot_of(
        &mut self,
        job: &ScheduledJob,
    ) -> Result<Option<Slot>, sked_store::StoreError> {
        let rules = self.rules_of(job).await?;
        if rules.calendar_missing() {
            self.missing_calendar.insert(job.id);
        }
        Ok(slot_from(job, self.namespaces.id(&job.namespace), rules))
    }

    /// What `job`'s schedule meets: the calendar it names, resolved (or missing: the schedule
    /// then has no slot, which [`slot_from`] says), and its namespace's blackout windows.
    async fn rules_of(&mut self, job: &ScheduledJob) -> Result<SlotRules, sked_store::StoreError> {
        let namespace_windows = match &job.schedule {
            Some(_) => {
                self.rules
                    .namespace_windows(&*self.store, &job.namespace)
                    .await?
            }
            None => None,
        };
        let calendar = match job.schedule.as_ref().and_then(|s| s.calendar.as_deref()) {
            None => CalendarSlot::None,
            Some(name) => match self
                .rules
                .calendar(&*self.store, &job.namespace, name)
                .await?
            {
                Some(calendar) => CalendarSlot::Resolved(calendar),
                None => CalendarSlot::Missing(name.to_string()),
            },
        };
        Ok(SlotRules {
            calendar,
            namespace_windows,
        })
    }

    /// Records every instant of `slot` before `now` as missed, by the job's misfire policy,
    /// then puts the slot on the timer at its first instant from `now` on.
    fn catch_up(
        &mut self,
        job: &ScheduledJob,
        mut slot: Slot,
        now: Instant,
        pending: &mut Vec<Pending>,
    ) {
        while slot.next < now {
            let instant = slot.next;
            let following = slot.schedule.next_after(instant, slot.fired + 1);
            let is_latest = following.is_none_or(|f| f >= now);
            let occurrence = slot.schedule.occurrence(instant);
            let skip = if let Some(removed) = &occurrence.removed {
                Some(removed.by)
            } else if slot.paused {
                Some(SkipReason::Paused)
            } else if job.misfire.runs_missed(instant, is_latest, now) {
                None
            } else {
                Some(SkipReason::Misfire)
            };
            pending.push(advance(&mut slot, skip, occurrence, following));
            match following {
                Some(next) => slot.next = next,
                None => return,
            }
        }
        self.slots.insert(slot);
    }

    /// Fires everything due now, in batches.
    async fn fire_due(
        &mut self,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), sked_store::StoreError> {
        loop {
            let now = Utc::now();
            let mut pending = Vec::new();
            // The batch's runs count against the caps of those after them.
            let mut admission = Admission::default();
            while pending.len() < self.batch {
                let Some(mut slot) = self.slots.take_due(now) else {
                    break;
                };
                let following = slot.schedule.next_after(slot.next, slot.fired + 1);
                let occurrence = slot.schedule.occurrence(slot.next);
                let skip = if let Some(removed) = &occurrence.removed {
                    Some(removed.by)
                } else if slot.paused {
                    Some(SkipReason::Paused)
                } else {
                    let namespace = self.namespaces.name(slot.namespace);
                    let backlog = self.backlog.of(slot.job_id, namespace);
                    admission.admit(slot.job_id, namespace, backlog)
                };
                if skip == Some(SkipReason::Backlog) {
                    self.metrics.fires_skipped_backlog.inc();
                }
                pending.push(advance(&mut slot, skip, occurrence, following));
                if let Some(next) = following {
                    slot.next = next;
                    self.slots.insert(slot);
                }
            }
            if pending.is_empty() {
                self.metrics.schedules.set(self.slots.len() as i64);
                return Ok(());
            }
            let full = pending.len() == self.batch;
            self.write(pending, Utc::now(), shutdown).await?;
            if !full {
                self.metrics.schedules.set(self.slots.len() as i64);
                return Ok(());
            }
        }
    }

    /// Writes a batch to the ledger and hands its queued runs to the dispatcher.
    async fn write(
        &mut self,
        pending: Vec<Pending>,
        now: Instant,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), sked_store::StoreError> {
        if pending.is_empty() {
            return Ok(());
        }
        let fires: Vec<Fire> = pending.iter().map(|p| p.fire.clone()).collect();
        let outcome = self
            .metrics
            .store_call(
                "record_fires",
                self.store.record_fires(&fires, now, Audit::none()),
            )
            .await?;
        let mut queued = Vec::new();
        let mut read_back = Vec::new();
        let mut skipped = 0u64;
        for (p, run) in pending.into_iter().zip(outcome.runs) {
            if !run.inserted {
                continue;
            }
            let namespace = self.namespaces.name(p.namespace);
            self.metrics.fired(namespace, now - p.fire.scheduled_for);
            match (run.state, p.template) {
                // A sharded or broadcast instant's runs each carry their place: read back.
                (RunState::Queued, Some(template)) if !run.placed => {
                    queued.push(from_template(&template, run.run_id, &p.fire));
                }
                (RunState::Queued, _) => read_back.extend(run.all_runs()),
                (RunState::Skipped, _) => {
                    skipped += 1;
                    // Skipped by the store: the overlap policy, the one reason not decided here.
                    let reason = p.fire.skip.unwrap_or(SkipReason::Overlap);
                    self.metrics
                        .run_ended(namespace, RunState::Skipped, Some(reason));
                }
                _ => {}
            }
        }
        // Dependants' runs that these instants released (a skipped upstream instant that
        // a `finished` dependency accepts).
        read_back.extend(outcome.released);
        self.metrics.fires.inc_by(fires.len() as u64);
        self.metrics.fires_skipped.inc_by(skipped);
        self.metrics.fire_batches.inc();
        if !read_back.is_empty() {
            // Committed as queued: they must reach the dispatcher, so the read is retried
            // until the store answers.
            if let Some(runs) = crate::read_queued(&*self.store, Some(&read_back), shutdown).await {
                for run in &runs {
                    self.keep_template(run);
                }
                queued.extend(runs);
            }
        }
        self.dispatcher.enqueue(queued);
        Ok(())
    }

    /// Keeps `run`'s dispatch details on its slot when its schedule fires often.
    fn keep_template(&mut self, run: &QueuedRun) {
        // A rank that follows the graph changes with other jobs' definitions: such a job's
        // runs are read back with the rank each was recorded with; a shard's run is one of
        // several per instant, each with its own place.
        if run.graph_ranked || run.shard.is_some() || run.pinned_worker.is_some() {
            return;
        }
        if let Some(slot) = self.slots.get_mut(run.job_id) {
            if is_frequent(run.scheduled_for, slot.next) {
                slot.template = Some(Arc::new(run.clone()));
            }
        }
    }
}

/// Each namespace's name once, by index: a million slots name a handful of namespaces. Past
/// `u16::MAX - 1` names, further namespaces share the index `OTHER` (their metrics are labelled
/// `(other)`): a metric label with that many values would be unusable anyway.
#[derive(Debug, Default)]
struct Namespaces {
    names: Vec<String>,
    ids: HashMap<String, u16>,
}

impl Namespaces {
    const OTHER: u16 = u16::MAX;

    fn id(&mut self, name: &str) -> u16 {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let Ok(id) = u16::try_from(self.names.len()) else {
            return Self::OTHER;
        };
        if id == Self::OTHER {
            return Self::OTHER;
        }
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }

    fn name(&self, id: u16) -> &str {
        self.names
            .get(usize::from(id))
            .map_or("(other)", String::as_str)
    }
}

/// What a scheduled job's schedule meets beyond its definition, as the loop found it.
struct SlotRules {
    calendar: CalendarSlot,
    namespace_windows: Option<Arc<sked_core::schedule::Blackouts>>,
}

impl SlotRules {
    fn calendar_missing(&self) -> bool {
        matches!(self.calendar, CalendarSlot::Missing(_))
    }
}

/// The calendar a scheduled job's schedule meets, as the loop found it.
enum CalendarSlot {
    None,
    Resolved(Arc<sked_core::calendar::Calendar>),
    /// It names a calendar that does not exist (deleted with `force`).
    Missing(String),
}

/// The slot for a scheduled job; `None` (logged) when its schedule no longer compiles or names
/// a calendar that does not exist: it fires nothing until the calendar is written again, and
/// then its missed instants are resolved by its misfire policy.
fn slot_from(job: &ScheduledJob, namespace: u16, rules: SlotRules) -> Option<Slot> {
    let compiled =
        sked_core::job::compile_schedule(job.schedule.as_ref(), &job.blackouts, job.schedule_epoch);
    let mut schedule = match compiled {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(
                "firing: job {} has a schedule that no longer compiles: {e}",
                job.id
            );
            return None;
        }
    };
    schedule.set_namespace_blackouts(rules.namespace_windows);
    let mut next = job.next_fire_at;
    match rules.calendar {
        CalendarSlot::None => {}
        CalendarSlot::Missing(name) => {
            say_calendar_missing(job.id, &name);
            return None;
        }
        CalendarSlot::Resolved(calendar) => {
            next = meet_calendar(job.id, &mut schedule, calendar, next, job.fired_count)?;
        }
    }
    Some(Slot {
        job_id: job.id,
        namespace,
        schedule,
        fired: job.fired_count,
        next,
        paused: job.paused,
        template: None,
    })
}

/// Gives `schedule` its calendar as it is now. Its instant `next` was set under the calendar
/// as it was then: what falls due from it on is judged by the calendar as it is now. `None`
/// (logged) when nothing more falls due.
fn meet_calendar(
    job_id: i64,
    schedule: &mut Schedule,
    calendar: Arc<sked_core::calendar::Calendar>,
    next: Instant,
    fired: u64,
) -> Option<Instant> {
    schedule.attach_calendar(calendar);
    let due = schedule.next_after(next - chrono::Duration::microseconds(1), fired);
    if due.is_none() {
        tracing::warn!(
            "firing: job {job_id} owes no instant its calendar allows any more: it fires nothing \
             until its schedule or calendar changes"
        );
    }
    due
}

fn say_calendar_missing(job_id: i64, name: &str) {
    tracing::error!(
        "firing: job {job_id} names calendar {name:?}, which does not exist: it fires nothing \
         until the calendar is written again"
    );
}

/// Sends the scheduled jobs of `partitions` to `pages`, a page at a time, then ends; on an error
/// it sends the error and ends. It also ends when nobody receives any more.
async fn read_pages(
    store: Arc<dyn Store>,
    partitions: Vec<u32>,
    pages: mpsc::Sender<Result<Vec<ScheduledJob>, sked_store::StoreError>>,
) {
    let mut after = 0;
    loop {
        let page = store
            .scheduled_jobs(Some(&partitions), after, LOAD_PAGE)
            .await;
        let more = match &page {
            Ok(jobs) if jobs.len() == LOAD_PAGE as usize => jobs.last().map(|job| job.id),
            _ => None,
        };
        if pages.send(page).await.is_err() {
            return;
        }
        match more {
            Some(last) => after = last,
            None => return,
        }
    }
}

/// Waits until `at` (an hour when nothing is due). tokio's timer wakes on whole milliseconds,
/// rounded up, so an instant would fire 1–2 ms late: the last stretch is slept on a blocking
/// thread instead, which the kernel wakes within tens of microseconds.
async fn until(at: Option<Instant>) {
    const COARSE: std::time::Duration = std::time::Duration::from_millis(2);
    let Some(at) = at else {
        return tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
    };
    let left = |at: Instant| (at - Utc::now()).to_std().unwrap_or_default();
    if let Some(coarse) = left(at).checked_sub(COARSE) {
        tokio::time::sleep(coarse).await;
    }
    let fine = left(at);
    if !fine.is_zero() {
        // Cancelling this future leaves the thread to finish a sleep of at most COARSE.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(fine)).await;
    }
}

/// The fire for `slot`'s current instant (`occurrence` says what falls due there), moving the
/// slot's count on; the caller moves its instant to `following`.
fn advance(
    slot: &mut Slot,
    skip: Option<SkipReason>,
    occurrence: Occurrence,
    following: Option<Instant>,
) -> Pending {
    let instant = slot.next;
    let jitter = slot.schedule.jitter_offset(slot.job_id as u64, instant);
    let ready_at = instant + chrono::Duration::from_std(jitter).unwrap_or_default();
    let fire = Fire {
        job_id: slot.job_id,
        scheduled_for: instant,
        trigger: Trigger::Schedule,
        skip,
        ready_at,
        advance: Some(Advance {
            epoch: slot.schedule.epoch(),
            fired_before: slot.fired,
            next_fire_at: following,
        }),
        nominal_for: occurrence.nominal_for,
        why: occurrence.removed.map(|r| r.why),
    };
    slot.fired += 1;
    Pending {
        fire,
        namespace: slot.namespace,
        template: slot.template.clone(),
    }
}

/// A run of the same job as `template`, for `fire`'s instant.
fn from_template(template: &QueuedRun, run_id: i64, fire: &Fire) -> QueuedRun {
    QueuedRun {
        run_id,
        scheduled_for: fire.scheduled_for,
        ready_at: fire.ready_at,
        ..template.clone()
    }
}

/// The dispatcher's view of a run written outside the firing loop (a manual trigger), built
/// from the job the caller holds rather than read back from the store.
pub fn queued_run(run_id: i64, fire: &Fire, job: &JobRecord) -> QueuedRun {
    QueuedRun {
        run_id,
        job_id: fire.job_id,
        namespace: job.namespace.clone(),
        job: job.name.clone(),
        scheduled_for: fire.scheduled_for,
        priority: job.rank,
        ready_at: fire.ready_at,
        target: job.spec.target.clone(),
        timeout: job.spec.timeout.map(|t| t.0),
        routing: job.spec.routing.clone(),
        event: None,
        graph_ranked: job.spec.priority.is_auto(),
        shard: None,
        pinned_worker: None,
        gates: Default::default(),
        params: None,
        trace_parent: None,
    }
    .gated_by(&job.spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_named_once_and_past_the_table_share_other() {
        let mut namespaces = Namespaces::default();
        let a = namespaces.id("team-a");
        assert_eq!(namespaces.id("team-b"), a + 1);
        assert_eq!(namespaces.id("team-a"), a);
        assert_eq!(namespaces.name(a), "team-a");
        for i in 2..usize::from(Namespaces::OTHER) {
            namespaces.id(&format!("ns-{i}"));
        }
        let past = namespaces.id("one-too-many");
        assert_eq!(past, Namespaces::OTHER);
        assert_eq!(namespaces.name(past), "(other)");
        let b = namespaces.id("team-b");
        assert_eq!(namespaces.name(b), "team-b");
    }
}
