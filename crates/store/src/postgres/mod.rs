//! The clustered store on PostgreSQL: every server node shares one database.
//!
//! Each call of the trait runs in one transaction on a connection of a small pool: writes at
//! READ COMMITTED, reads at REPEATABLE READ (read only), so a read sees one snapshot, as on
//! SQLite. Unlike SQLite, PostgreSQL runs writers side by side, so every decision is taken over
//! rows the transaction has locked (`SELECT ... FOR UPDATE`), and locks are always taken in one
//! order, each kind by ascending id:
//!
//! workers → jobs → runs → attempts
//!
//! A job's row is the lock that serialises everything touching how many of its runs are active:
//! recording its instants (the overlap decision), ending one of its runs (releasing a waiting
//! one), cancelling, deleting. Starting an attempt only moves a run from queued to running,
//! which leaves that count alone, so it locks just the runs, by id like everyone else, in the
//! statement that moves them (the lock's recheck of "still queued" on a row's newest version is
//! the decision). An update alone would lock rows in the order its plan meets them: two nodes
//! starting the same runs did so and deadlocked, and each deadlock waits out PostgreSQL's
//! `deadlock_timeout` (a second) before it is broken. A transaction PostgreSQL still
//! aborts as a deadlock or a serialization failure is run again from the start: it wrote
//! nothing.
//!
//! Each submodule holds the queries of one part of the trait as plain async functions over a
//! transaction, mirroring the SQLite implementation file by file.

mod audit;
mod cluster;
pub mod connection;
mod dependencies;
mod events;
mod heartbeats;
mod history;
mod jobs;
mod ledger;
mod namespaces;
mod notifications;
mod notify;
mod partitions;
mod rows;
mod schema;
mod sealed;
mod tls;
mod tokens;
mod triggers;
mod workers;

use crate::*;
use connection::{Connector, PoolConnect};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use notify::{Announcer, Channel, Kind};
use tokio_postgres::error::SqlState;
use tokio_postgres::IsolationLevel;

#[doc(hidden)]
pub use schema::{latest_version, migrations_through};

/// The transaction every query function runs in.
type Tx<'a> = deadpool_postgres::Transaction<'a>;

/// Connections per store. Each trait call holds one for its transaction.
const POOL_SIZE: usize = 8;
/// How long a call waits for a free connection, or for a new one to open.
const POOL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// Runs of a transaction PostgreSQL aborted as a deadlock or a serialization failure.
const TRIES: u32 = 5;

/// Why a transaction failed: the database's own error is kept whole until the transaction is
/// over, so that a deadlock can be told apart and the transaction run again.
enum Fail {
    Pg(tokio_postgres::Error),
    Store(StoreError),
}

type PgResult<T> = std::result::Result<T, Fail>;

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Self {
        Fail::Pg(e)
    }
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Fail::Store(e)
    }
}

impl From<Fail> for StoreError {
    fn from(e: Fail) -> Self {
        match e {
            Fail::Pg(e) => e.into(),
            Fail::Store(e) => e,
        }
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        if let Some(db) = e.as_db_error() {
            // A create that met a job of that name (`put_job` looks first, under a lock; this
            // is the net below it).
            if db.code() == &SqlState::UNIQUE_VIOLATION
                && db.constraint() == Some("jobs_namespace_name_key")
            {
                return StoreError::Conflict(format!("job ({})", db.message()));
            }
        }
        if unavailable(&e) {
            return StoreError::Unavailable(said(&e));
        }
        StoreError::Database(said(&e))
    }
}

/// Whether `e` says the database could not be used at all, rather than that a statement
/// failed: the connection is gone, the server is shutting down or not yet accepting
/// connections, or it no longer takes writes (a primary demoted by a failover).
fn unavailable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::READ_ONLY_SQL_TRANSACTION,
            SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
        ]
        .contains(code),
        // No answer from the server at all: the connection failed underneath.
        None => std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()),
    }
}

/// What a tokio-postgres error says, with its causes: its own words name only its kind
/// ("error connecting to server", "db error").
pub(crate) fn said(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut words = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        words.push_str(": ");
        words.push_str(&c.to_string());
        cause = c.source();
    }
    words
}

impl Fail {
    /// Why PostgreSQL rolled the transaction back whole, when it did: it may simply be run
    /// again.
    fn rolled_back(&self) -> Option<&'static str> {
        let Fail::Pg(e) = self else { return None };
        match e.code() {
            Some(code) if code == &SqlState::T_R_DEADLOCK_DETECTED => Some("a deadlock"),
            Some(code) if code == &SqlState::T_R_SERIALIZATION_FAILURE => {
                Some("a serialization failure")
            }
            _ => None,
        }
    }
}

/// The store on a PostgreSQL database, shared by any number of server nodes.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    /// How connections are opened; kept for the listening connection, which lives outside
    /// the pool.
    connector: Connector,
    /// Where job changes are announced to the other nodes, inside their transactions.
    channel: Channel,
    /// Announces runs queued and dequeued, after their transactions commit.
    announcer: Announcer,
    /// Told how each write ended (`Store::observe_writes`).
    observer: std::sync::OnceLock<Arc<dyn WriteObserver>>,
    /// What the runs events start are admitted against.
    backlog: crate::BacklogSlot,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/database`, or
    /// the `key=value` form) and brings its schema up to date. Several nodes may do this at
    /// once on an empty database: the migrations run once, under an advisory lock.
    ///
    /// The tables live in the connection's current schema (the first of its `search_path`),
    /// so `options=-csearch_path%3Dsked` in the URL puts sked in a schema of its own. TLS
    /// follows libpq's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` (`tls.rs`); several
    /// hosts are tried in order (`connection.rs`).
    pub async fn connect(url: &str) -> Result<PgStore> {
        let connector = Connector::new(url)?;
        let where_ = connector.place().to_string();

        // The first connection is made here rather than by the pool, whose errors cannot say
        // what each host answered; the schema is brought up to date on it.
        let mut client = connector.client().await?;
        schema::migrate(&mut client, &where_).await?;
        let schema: Option<String> = client
            .query_one("SELECT current_schema()", &[])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| StoreError::Open(format!("{where_}: {}", StoreError::from(e))))?;
        drop(client);

        let manager = Manager::from_connect(
            connector.config().clone(),
            PoolConnect(connector.clone()),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(POOL_WAIT))
            .build()
            .map_err(|e| StoreError::Open(format!("{where_}: {e}")))?;
        let channel = Channel::for_schema(&schema.unwrap_or_default());
        Ok(PgStore {
            announcer: Announcer::start(pool.clone(), channel.clone()),
            pool,
            connector,
            channel,
            observer: std::sync::OnceLock::new(),
            backlog: Default::default(),
        })
    }

    /// Where the data is and how the link to it is protected, for the start-up line.
    pub fn place(&self) -> String {
        format!(
            "{}, {}",
            self.connector.place(),
            self.connector.tls_summary()
        )
    }

    async fn client(&self) -> PgResult<deadpool_postgres::Client> {
        Ok(pooled(&self.pool).await?)
    }
}

/// A connection of `pool`, or why none could be had.
async fn pooled(pool: &Pool) -> Result<deadpool_postgres::Client> {
    pool.get()
        .await
        .map_err(|e| StoreError::Unavailable(format!("no connection to PostgreSQL: {e}")))
}

/// A connection of its own to the database at `url`, opened as the store opens its own (TLS
/// and hosts as the URL says), driven by a task until the client is dropped: for tools and
/// tests that read or prepare the database beside the store.
pub async fn client(url: &str) -> Result<tokio_postgres::Client> {
    Connector::new(url)?.client().await
}

/// Runs `$body` in one transaction on a pooled connection (`write`: READ COMMITTED; `read`:
/// REPEATABLE READ, read only) and commits it if the body succeeds; a transaction PostgreSQL
/// aborted as a deadlock or serialization failure is run again, up to [`TRIES`] times.
/// `?` inside the body leaves the transaction (which rolls back).
macro_rules! transact {
    ($store:expr, $kind:ident, |$tx:ident| $body:expr) => {{
        let mut tries = 0;
        let outcome = loop {
            tries += 1;
            let result: PgResult<_> = async {
                let mut client = $store.client().await?;
                let $tx = transact!(@begin $kind, client);
                let value = $body;
                $tx.commit().await?;
                Ok(value)
            }
            .await;
            let rolled_back = match &result {
                Err(e) if tries < TRIES => e.rolled_back(),
                _ => None,
            };
            if let Some(why) = rolled_back {
                // Locks taken in one order make these rare: many of them are worth a look.
                tracing::warn!("PostgreSQL rolled a transaction back ({why}); running it again");
                continue;
            }
            break result.map_err(StoreError::from);
        };
        transact!(@observe $kind, $store, &outcome);
        outcome
    }};
    (@observe write, $store:expr, $outcome:expr) => {
        observe_write($store.observer.get().map(|o| o.as_ref()), $outcome)
    };
    (@observe read, $store:expr, $outcome:expr) => {
        ()
    };
    (@begin write, $client:ident) => {
        $client.transaction().await?
    };
    (@begin read, $client:ident) => {
        $client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?
    };
}

// After `transact!`, which their trait implementations use.
mod calendars;
mod deadlines;
mod flow;
mod grid;
mod traces;

#[async_trait::async_trait]
impl crate::GraphStore for PgStore {
    async fn namespace_edges(
        &self,
        namespace: &str,
        limit: u32,
    ) -> crate::Result<Vec<DependencyEdge>> {
        let limit = limit.min(crate::MAX_NAMESPACE_EDGES);
        transact!(self, read, |tx| dependencies::namespace_edges(
            &tx, namespace, limit
        )
        .await?)
    }
}

#[async_trait]
impl Store for PgStore {
    fn admit_through(&self, source: std::sync::Arc<dyn crate::BacklogSource>) {
        self.backlog.set(source);
    }

    async fn put_job(
        &self,
        namespace: &str,
        job: &ValidJob,
        mode: PutMode,
        now: Instant,
        audit: Audit<(PutOutcome, JobRecord)>,
    ) -> Result<(PutOutcome, JobRecord)> {
        transact!(self, write, |tx| {
            let (outcome, job) = jobs::put(&tx, namespace, job, mode, now).await?;
            if outcome != PutOutcome::Unchanged {
                self.channel
                    .notify(&tx, Kind::JobChanged, &[job.id])
                    .await?;
            }
            let written = (outcome, job);
            audit::append_for(&tx, &audit, &written).await?;
            written
        })
    }

    async fn apply(
        &self,
        namespace: &str,
        batch: &Batch,
        now: Instant,
        dry_run: bool,
        audit: Audit<Applied>,
    ) -> Result<Applied, crate::BatchRefusal> {
        // Which item the batch reached (calendars, then jobs), so a refusal names it.
        let reached = std::sync::atomic::AtomicUsize::new(0);
        let written = transact!(self, write, |tx| {
            if dry_run {
                tx.batch_execute("SAVEPOINT dry_run").await?;
            }
            let mut applied = Applied::default();
            // Calendars first: their namespace lock is taken before any row is locked.
            for (i, calendar) in batch.calendars.iter().enumerate() {
                reached.store(i, std::sync::atomic::Ordering::Relaxed);
                applied.calendars.push(
                    calendars::put(&tx, namespace, &calendar.name, &calendar.spec, now).await?,
                );
            }
            for (i, job) in batch.jobs.iter().enumerate() {
                reached.store(
                    batch.calendars.len() + i,
                    std::sync::atomic::Ordering::Relaxed,
                );
                applied
                    .jobs
                    .push(jobs::put(&tx, namespace, job, PutMode::Upsert, now).await?);
            }
            reached.store(usize::MAX, std::sync::atomic::Ordering::Relaxed);
            if dry_run {
                tx.batch_execute("ROLLBACK TO SAVEPOINT dry_run").await?;
            } else {
                // The rules first, so a node reloading a changed job reads its new calendar.
                if applied.calendars_changed() {
                    self.channel
                        .notify(&tx, Kind::ScheduleRulesChanged, &[0])
                        .await?;
                }
                let changed: Vec<i64> = applied
                    .jobs
                    .iter()
                    .filter(|(outcome, _)| *outcome != PutOutcome::Unchanged)
                    .map(|(_, job)| job.id)
                    .collect();
                if !changed.is_empty() {
                    self.channel.notify(&tx, Kind::JobChanged, &changed).await?;
                }
                audit::append_for(&tx, &audit, &applied).await?;
            }
            applied
        });
        written.map_err(|error| {
            let position = reached.load(std::sync::atomic::Ordering::Relaxed);
            crate::BatchRefusal::reached(batch, position, error)
        })
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>> {
        transact!(self, read, |tx| jobs::get(&tx, namespace, name).await?)
    }

    async fn get_job_by_id(&self, id: i64) -> Result<Option<JobRecord>> {
        transact!(self, read, |tx| jobs::get_by_id(&tx, id).await?)
    }

    async fn job_versions(&self, namespace: &str, name: &str) -> Result<Option<Vec<JobVersion>>> {
        transact!(self, read, |tx| jobs::versions(&tx, namespace, name)
            .await?)
    }

    async fn list_jobs(&self, query: &JobQuery) -> Result<Page<JobRecord>> {
        transact!(self, read, |tx| jobs::list(&tx, query).await?)
    }

    async fn delete_job(
        &self,
        namespace: &str,
        name: &str,
        force: bool,
        now: Instant,
        audit: Audit<Option<DeletedJob>>,
    ) -> Result<Option<DeletedJob>> {
        let deleted = transact!(self, write, |tx| {
            let deleted = jobs::delete(&tx, namespace, name, force, now).await?;
            if let Some(deleted) = &deleted {
                // One notification per job: a job change names one job.
                let changed = std::iter::once(deleted.job.id)
                    .chain(deleted.paused_dependants.iter().map(|j| j.id));
                for id in changed {
                    self.channel.notify(&tx, Kind::JobChanged, &[id]).await?;
                }
            }
            audit::append_for(&tx, &audit, &deleted).await?;
            deleted
        })?;
        if let Some(deleted) = &deleted {
            // Every node's queue lets its cancelled runs go.
            self.announcer
                .announce(Kind::RunsDequeued, deleted.cancelled.clone());
        }
        Ok(deleted)
    }

    async fn set_paused(
        &self,
        namespace: &str,
        name: &str,
        paused: bool,
        now: Instant,
        audit: Audit<Option<JobRecord>>,
    ) -> Result<Option<JobRecord>> {
        transact!(self, write, |tx| {
            let changed = jobs::set_paused(&tx, namespace, name, paused, now).await?;
            if let Some(job) = &changed {
                self.channel
                    .notify(&tx, Kind::JobChanged, &[job.id])
                    .await?;
            }
            audit::append_for(&tx, &audit, &changed).await?;
            changed
        })
    }

    async fn dependency_edges(
        &self,
        namespace: &str,
        jobs: &[String],
        toward: Toward,
    ) -> Result<Vec<DependencyEdge>> {
        transact!(self, read, |tx| dependencies::edges(
            &tx, namespace, jobs, toward
        )
        .await?)
    }

    async fn scheduled_jobs(
        &self,
        partitions: Option<&[u32]>,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<ScheduledJob>> {
        transact!(self, read, |tx| jobs::scheduled(
            &tx, partitions, after_id, limit
        )
        .await?)
    }

    async fn record_fires(
        &self,
        fires: &[Fire],
        now: Instant,
        audit: Audit<FireOutcome>,
    ) -> Result<FireOutcome> {
        let outcome = transact!(self, write, |tx| {
            let outcome = ledger::record_fires(&tx, fires, now).await?;
            audit::append_for(&tx, &audit, &outcome).await?;
            outcome
        })?;
        let queued: Vec<i64> = outcome
            .runs
            .iter()
            .filter(|r| r.inserted && r.state == RunState::Queued)
            .flat_map(|r| r.all_runs())
            .chain(outcome.released.iter().copied())
            .collect();
        self.announcer.announce(Kind::RunsQueued, queued);
        Ok(outcome)
    }

    async fn trigger_run(
        &self,
        trigger: &ManualTrigger,
        now: Instant,
        audit: Audit<TriggeredRun>,
    ) -> Result<TriggeredRun> {
        let triggered = transact!(self, write, |tx| {
            let outcome = triggers::trigger_run(&tx, trigger, now).await?;
            audit::append_for(&tx, &audit, &outcome).await?;
            outcome
        })?;
        // A run absorbed a trigger: other nodes holding it read its new `ready_at`.
        let queued = if triggered.run.state == RunState::Queued
            && (triggered.run.inserted || triggered.outcome == FlowOutcome::Absorbed)
        {
            triggered.run.all_runs().collect()
        } else {
            Vec::new()
        };
        self.announcer.announce(Kind::RunsQueued, queued);
        Ok(triggered)
    }

    async fn queued_runs(&self, ids: Option<&[i64]>) -> Result<Vec<QueuedRun>> {
        transact!(self, read, |tx| ledger::queued_runs(&tx, ids).await?)
    }

    async fn queued_before(
        &self,
        ready_before: Instant,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<i64>> {
        transact!(self, read, |tx| ledger::queued_before(
            &tx,
            ready_before,
            after_id,
            limit
        )
        .await?)
    }

    async fn start_attempts(
        &self,
        starts: &[AttemptStart],
        now: Instant,
    ) -> Result<Vec<StartOutcome>> {
        let started = transact!(self, write, |tx| ledger::start_attempts(&tx, starts, now)
            .await?)?;
        let dequeued: Vec<i64> = starts
            .iter()
            .zip(&started)
            .filter(|(_, started)| started.is_ok())
            .map(|(start, _)| start.run_id)
            .collect();
        self.announcer.announce(Kind::RunsDequeued, dequeued);
        Ok(started)
    }

    async fn expire_dependency_waits(&self, now: Instant, limit: u32) -> Result<ExpiredWaits> {
        let (skipped, settled) = transact!(self, write, |tx| dependencies::expire_waits(
            &tx, now, limit
        )
        .await?)?;
        self.announcer
            .announce(Kind::RunsQueued, settled.queued.clone());
        Ok(ExpiredWaits {
            skipped,
            queued: settled.queued,
        })
    }

    async fn complete_attempts(
        &self,
        reports: &[AttemptReport],
        now: Instant,
    ) -> Result<Vec<CompletionEffect>> {
        let backlog = self.backlog.get();
        let effects = transact!(self, write, |tx| ledger::complete_attempts(
            &tx,
            reports,
            backlog.as_deref(),
            now
        )
        .await?)?;
        let requeued: Vec<i64> = effects
            .iter()
            .flat_map(|effect| match effect {
                CompletionEffect::Accepted { requeued, .. } => requeued.as_slice(),
                CompletionEffect::Rejected { .. } => &[],
            })
            .copied()
            .collect();
        self.announcer.announce(Kind::RunsQueued, requeued);
        Ok(effects)
    }

    async fn cancel_run(
        &self,
        run_id: i64,
        now: Instant,
        audit: Audit<Option<CancelOutcome>>,
    ) -> Result<Option<CancelOutcome>> {
        let outcome = transact!(self, write, |tx| {
            let outcome = ledger::cancel_run(&tx, run_id, now).await?;
            audit::append_for(&tx, &audit, &outcome).await?;
            outcome
        })?;
        if let Some(CancelOutcome::Cancelled { run, released }) = &outcome {
            self.announcer.announce(Kind::RunsDequeued, vec![run.id]);
            self.announcer.announce(Kind::RunsQueued, released.clone());
        }
        Ok(outcome)
    }

    async fn runs_under_windows(
        &self,
        namespaces: &[String],
        after: i64,
        limit: u32,
    ) -> Result<Vec<RunUnderWindows>> {
        transact!(self, read, |tx| ledger::runs_under_windows(
            &tx, namespaces, after, limit
        )
        .await?)
    }

    async fn stop_runs(&self, stops: &[(i64, String)]) -> Result<Vec<i64>> {
        transact!(self, write, |tx| ledger::stop_runs(&tx, stops).await?)
    }

    async fn retry_run(
        &self,
        run_id: i64,
        now: Instant,
        audit: Audit<Option<RetryOutcome>>,
    ) -> Result<Option<RetryOutcome>> {
        let outcome = transact!(self, write, |tx| {
            let outcome = ledger::retry_run(&tx, run_id, now).await?;
            audit::append_for(&tx, &audit, &outcome).await?;
            outcome
        })?;
        if let Some(RetryOutcome::Retried { queued, .. }) = &outcome {
            self.announcer.announce(Kind::RunsQueued, queued.clone());
        }
        Ok(outcome)
    }

    async fn get_run(&self, run_id: i64) -> Result<Option<(RunRecord, Vec<AttemptRecord>)>> {
        transact!(self, read, |tx| history::get_run(&tx, run_id).await?)
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Page<RunRecord>> {
        transact!(self, read, |tx| history::list_runs(&tx, query).await?)
    }

    async fn job_stats(&self, namespace: &str, name: &str) -> Result<Option<JobStats>> {
        transact!(self, read, |tx| history::job_stats(&tx, namespace, name)
            .await?)
    }

    async fn post_event(
        &self,
        namespace: &str,
        event: &sked_core::event::EventSpec,
        now: Instant,
        audit: Audit<PostedEvent>,
    ) -> Result<PostedEvent> {
        let backlog = self.backlog.get();
        let posted = transact!(self, write, |tx| {
            let outcome = events::post(&tx, namespace, event, backlog.as_deref(), now).await?;
            audit::append_for(&tx, &audit, &outcome).await?;
            outcome
        })?;
        self.announcer
            .announce(Kind::RunsQueued, posted.queued.clone());
        Ok(posted)
    }

    async fn list_events(&self, query: &EventQuery) -> Result<Vec<EventRecord>> {
        transact!(self, read, |tx| events::list(&tx, query).await?)
    }

    async fn append_output(
        &self,
        attempt_id: i64,
        token: i64,
        worker_id: &str,
        bytes: &[u8],
        cap: u64,
    ) -> Result<AppendOutcome> {
        transact!(self, write, |tx| history::append_output(
            &tx, attempt_id, token, worker_id, bytes, cap
        )
        .await?)
    }

    async fn read_output(&self, attempt_id: i64, offset: u64) -> Result<Vec<u8>> {
        transact!(self, read, |tx| history::read_output(
            &tx, attempt_id, offset
        )
        .await?)
    }

    async fn register_worker(&self, worker: &NewWorker, now: Instant) -> Result<()> {
        transact!(self, write, |tx| workers::register(&tx, worker, now)
            .await?)
    }

    async fn heartbeat(
        &self,
        worker_id: &str,
        running: &[i64],
        now: Instant,
        lease: LeaseRenewal,
        forgotten_before: Instant,
    ) -> Result<HeartbeatOutcome> {
        transact!(self, write, |tx| workers::heartbeat(
            &tx,
            worker_id,
            running,
            now,
            lease,
            forgotten_before
        )
        .await?)
    }

    async fn list_workers(&self, limit: u32, cursor: Option<&str>) -> Result<Page<WorkerRecord>> {
        transact!(self, read, |tx| workers::list(&tx, limit, cursor).await?)
    }

    async fn get_worker(&self, id: &str) -> Result<Option<WorkerRecord>> {
        transact!(self, read, |tx| workers::get(&tx, id).await?)
    }

    async fn deregister_worker(&self, id: &str, now: Instant) -> Result<Option<WorkerRecord>> {
        transact!(self, write, |tx| workers::deregister(&tx, id, now).await?)
    }

    async fn drain_worker(
        &self,
        id: &str,
        audit: Audit<Option<crate::Drained>>,
    ) -> Result<Option<crate::Drained>> {
        transact!(self, write, |tx| {
            let outcome = workers::drain(&tx, id).await?;
            audit::append_for(&tx, &audit, &outcome).await?;
            outcome
        })
    }

    async fn delete_dead_workers(&self, before: Instant, limit: u32) -> Result<u64> {
        transact!(self, write, |tx| workers::delete_dead(&tx, before, limit)
            .await?)
    }

    async fn reap(&self, silent_since: Instant, now: Instant) -> Result<ReapOutcome> {
        let outcome = transact!(self, write, |tx| ledger::reap(&tx, silent_since, now)
            .await?)?;
        self.announcer
            .announce(Kind::RunsQueued, outcome.requeued.clone());
        self.announcer
            .announce(Kind::RunsDequeued, outcome.failed.clone());
        Ok(outcome)
    }

    async fn delete_finished_runs(&self, before: Instant, limit: u32) -> Result<u64> {
        transact!(self, write, |tx| history::delete_finished_runs(
            &tx, before, limit
        )
        .await?)
    }

    async fn prepare_run_partitions(&self, now: Instant, width: Duration) -> Result<u32> {
        // Statistics first, in a transaction of their own: they matter every pass, and making
        // partitions may wait for its locks and give up. Neither failure stops the other (a
        // partition dropped between listing and ANALYZE fails this one, harmlessly).
        match transact!(self, write, |tx| partitions::refresh_statistics(&tx)
            .await?)
        {
            Ok(0) => {}
            Ok(analyzed) => {
                tracing::debug!("analyzed {analyzed} tables of filling partitions of runs")
            }
            Err(e) => tracing::error!("analyzing filling partitions of runs: {e}"),
        }
        transact!(self, write, |tx| partitions::prepare(&tx, now, width)
            .await?)
    }

    async fn drop_expired_run_partitions(&self, before: Instant) -> Result<u64> {
        let droppable = transact!(self, read, |tx| partitions::droppable(&tx, before).await?)?;
        let mut dropped = 0;
        for (span, runs) in droppable {
            // One transaction each: the parents stay locked only while one partition goes.
            if transact!(self, write, |tx| partitions::drop_one(&tx, &span, before)
                .await?)?
            {
                dropped += runs;
            }
        }
        Ok(dropped)
    }

    async fn delete_audit_before(&self, before: Instant, limit: u32) -> Result<u64> {
        transact!(self, write, |tx| audit::delete_before(&tx, before, limit)
            .await?)
    }

    async fn delete_events_before(&self, before: Instant, limit: u32) -> Result<u64> {
        transact!(self, write, |tx| {
            // Expired debounce and dedup keys go with the events.
            triggers::delete_expired(&tx, before, limit).await?;
            events::delete_before(&tx, before, limit).await?
        })
    }

    async fn ping(&self, job_id: i64, now: Instant) -> Result<Option<PingOutcome>> {
        let outcome = transact!(self, write, |tx| heartbeats::ping(&tx, job_id, now).await?)?;
        if let Some(PingOutcome::Answered { released, .. }) = &outcome {
            self.announcer.announce(Kind::RunsQueued, released.clone());
        }
        Ok(outcome)
    }

    async fn expire_ping_waits(&self, now: Instant, limit: u32) -> Result<ExpiredPings> {
        let expired = transact!(self, write, |tx| heartbeats::expire(&tx, now, limit)
            .await?)?;
        self.announcer
            .announce(Kind::RunsQueued, expired.queued.clone());
        Ok(expired)
    }

    async fn record_late_notifications(&self, now: Instant) -> Result<u64> {
        transact!(self, write, |tx| notifications::record_late(&tx, now)
            .await?)
    }

    async fn claim_notifications(
        &self,
        now: Instant,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<sked_core::notify::NotificationRecord>> {
        transact!(self, write, |tx| notifications::claim(
            &tx, now, lease, limit
        )
        .await?)
    }

    async fn finish_notifications(&self, reports: &[SendReport], now: Instant) -> Result<()> {
        transact!(self, write, |tx| notifications::finish(&tx, reports, now)
            .await?)
    }

    async fn list_notifications(
        &self,
        query: &NotificationQuery,
    ) -> Result<Page<sked_core::notify::NotificationRecord>> {
        transact!(self, read, |tx| notifications::list(&tx, query).await?)
    }

    async fn delete_notifications_before(&self, before: Instant, limit: u32) -> Result<u64> {
        transact!(self, write, |tx| notifications::delete_before(
            &tx, before, limit
        )
        .await?)
    }

    async fn get_namespace(&self, name: &str) -> Result<Option<NamespaceRecord>> {
        transact!(self, read, |tx| namespaces::get(&tx, name).await?)
    }

    async fn list_namespaces(&self) -> Result<Vec<NamespaceRecord>> {
        transact!(self, read, |tx| namespaces::list(&tx).await?)
    }

    async fn job_namespaces(&self, limit: u32) -> Result<Vec<String>> {
        transact!(self, read, |tx| namespaces::of_jobs(&tx, limit).await?)
    }

    async fn put_namespace(
        &self,
        name: &str,
        spec: &NamespaceSpec,
        now: Instant,
        audit: Audit<(Option<NamespaceRecord>, NamespaceRecord)>,
    ) -> Result<(Option<NamespaceRecord>, NamespaceRecord)> {
        transact!(self, write, |tx| {
            let outcome = namespaces::put(&tx, name, spec, now).await?;
            audit::append_for(&tx, &audit, &outcome).await?;
            // Its blackout windows are what its schedules meet.
            self.channel
                .notify(&tx, Kind::ScheduleRulesChanged, &[0])
                .await?;
            outcome
        })
    }

    async fn delete_namespace(
        &self,
        name: &str,
        audit: Audit<Option<NamespaceRecord>>,
    ) -> Result<Option<NamespaceRecord>> {
        transact!(self, write, |tx| {
            let outcome = namespaces::delete(&tx, name).await?;
            audit::append_for(&tx, &audit, &outcome).await?;
            if outcome.is_some() {
                self.channel
                    .notify(&tx, Kind::ScheduleRulesChanged, &[0])
                    .await?;
            }
            outcome
        })
    }

    async fn put_secret(
        &self,
        namespace: &str,
        name: &str,
        sealed: &str,
        now: Instant,
        audit: Audit<(bool, SecretRecord)>,
    ) -> Result<(bool, SecretRecord)> {
        transact!(self, write, |tx| {
            let outcome = namespaces::put_secret(&tx, namespace, name, sealed, now).await?;
            audit::append_for(&tx, &audit, &outcome).await?;
            outcome
        })
    }

    async fn list_secrets(&self, namespace: &str) -> Result<Vec<SecretRecord>> {
        transact!(self, read, |tx| namespaces::list_secrets(&tx, namespace)
            .await?)
    }

    async fn delete_secret(
        &self,
        namespace: &str,
        name: &str,
        audit: Audit<Option<SecretRecord>>,
    ) -> Result<Option<SecretRecord>> {
        transact!(self, write, |tx| {
            let outcome = namespaces::delete_secret(&tx, namespace, name).await?;
            audit::append_for(&tx, &audit, &outcome).await?;
            outcome
        })
    }

    async fn sealed_secrets(&self, wanted: &[SecretName]) -> Result<BTreeMap<SecretName, String>> {
        if wanted.is_empty() {
            return Ok(BTreeMap::new());
        }
        transact!(self, read, |tx| namespaces::sealed(&tx, wanted).await?)
    }

    async fn sealed_texts(&self, marker: &str) -> Result<Vec<StoredSeal>> {
        transact!(self, read, |tx| sealed::texts(&tx, marker).await?)
    }

    async fn replace_sealed(&self, stored: &StoredSeal, text: &str) -> Result<bool> {
        transact!(self, write, |tx| sealed::replace(&tx, stored, text).await?)
    }

    async fn create_token(
        &self,
        token: &NewToken,
        now: Instant,
        audit: Audit<TokenRecord>,
    ) -> Result<TokenRecord> {
        transact!(self, write, |tx| {
            let outcome = tokens::create(&tx, token, now).await?;
            audit::append_for(&tx, &audit, &outcome).await?;
            outcome
        })
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        transact!(self, read, |tx| tokens::by_hash(&tx, hash).await?)
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>> {
        transact!(self, read, |tx| tokens::list(&tx).await?)
    }

    async fn revoke_token(
        &self,
        name: &str,
        audit: Audit<Option<TokenRecord>>,
    ) -> Result<Option<TokenRecord>> {
        transact!(self, write, |tx| {
            let outcome = tokens::revoke(&tx, name).await?;
            audit::append_for(&tx, &audit, &outcome).await?;
            outcome
        })
    }

    async fn end_sessions(&self, token_id: i64, at: Instant) -> Result<bool> {
        transact!(self, write, |tx| tokens::end_sessions(&tx, token_id, at)
            .await?)
    }

    async fn touch_tokens(&self, used: &[(i64, Instant)]) -> Result<()> {
        if used.is_empty() {
            return Ok(());
        }
        transact!(self, write, |tx| tokens::touch(&tx, used).await?)
    }

    async fn append_audit(&self, entries: &[AuditEntry]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        transact!(self, write, |tx| audit::append(&tx, entries).await?)
    }

    async fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>> {
        transact!(self, read, |tx| audit::list(&tx, query).await?)
    }

    async fn renew_membership(
        &self,
        node: &NodeInfo,
        now: Instant,
        lease: Duration,
    ) -> Result<Membership> {
        transact!(self, write, |tx| cluster::renew(&tx, node, now, lease)
            .await?)
    }

    async fn leave_cluster(&self, node: &str) -> Result<()> {
        transact!(self, write, |tx| cluster::leave(&tx, node).await?)
    }

    async fn cluster_nodes(&self, now: Instant) -> Result<Vec<NodeRecord>> {
        transact!(self, read, |tx| cluster::nodes(&tx, now).await?)
    }

    fn observe_writes(&self, observer: Arc<dyn WriteObserver>) {
        let _ = self.observer.set(observer);
    }

    async fn subscribe(&self) -> Result<Option<StoreEvents>> {
        notify::subscribe(self.connector.clone(), self.channel.clone())
            .await
            .map(Some)
    }
}
