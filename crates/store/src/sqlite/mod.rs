//! The embedded store on SQLite: one database file in WAL mode.
//!
//! Writes go through one connection (SQLite has one writer at a time anyway), on a thread of
//! their own ([`writer`]): the writes that queue while one runs share the next `IMMEDIATE`
//! transaction (group commit), each after the first in a savepoint. Reads use [`READERS`] more
//! connections, which WAL lets run beside the writer and beside each other.
//! `synchronous = NORMAL`: a commit survives the process being killed; only a power cut can lose
//! the last commits, and no run pays an fsync of its own.
//!
//! Checkpoints (copying the WAL back into the database, with its fsyncs) run on a thread of their
//! own with a third connection ([`checkpoint`]), so that commits do not wait for them: the
//! thread also ends each cycle of the WAL, holding the writer only for a short last pass; the
//! writer's own auto-checkpoint stays as a distant safety net.
//!
//! Reads run on tokio's blocking pool. Each submodule holds the queries of one part of the trait
//! as plain functions over a connection or transaction.

mod audit;
mod calendars;
mod checkpoint;
mod deadlines;
mod dependencies;
mod events;
mod flow;
mod grid;
mod heartbeats;
mod history;
mod jobs;
mod ledger;
mod namespaces;
mod notifications;
mod owned_thread;
mod rows;
mod schema;
mod sealed;
mod tokens;
mod traces;
mod triggers;
mod workers;
mod writer;

use crate::*;
use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};
use std::path::Path;
use std::sync::{Arc, Mutex};

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(e.to_string())
    }
}

pub struct SqliteStore {
    inner: Arc<Connections>,
    /// The one server node a file serves: it holds every partition and the maintenance duty,
    /// so there is nothing to lease. Kept for `cluster_nodes`.
    node: Mutex<Option<NodeRecord>>,
    /// Told how each write ended (`Store::observe_writes`).
    observer: std::sync::OnceLock<Arc<dyn WriteObserver>>,
    /// The writer thread; dropping it waits for the writes already queued.
    writer: writer::Writer,
    /// What the runs events start are admitted against.
    backlog: crate::BacklogSlot,
    /// The checkpoint thread; dropped last, so that its connection is the last to close.
    _checkpointer: checkpoint::Checkpointer,
}

/// Read connections: two reads (an API request beside a page of schedules being loaded, or two
/// such pages) run at once, which on two cores is what there is to gain.
const READERS: usize = 2;
/// A connection's page cache, negative as SQLite takes it in KiB.
const CACHE_KIB: i64 = -32_000;
/// Each reader's page cache: the readers together have what the writer has.
const READER_CACHE_KIB: i64 = CACHE_KIB / READERS as i64;

struct Connections {
    writer: Mutex<Connection>,
    /// Time the writer has spent in transactions, for the checkpoint thread's pace.
    writer_busy: checkpoint::WriterBusy,
    readers: Vec<Mutex<Connection>>,
    /// Signalled when a reader is handed back, for reads waiting while all are busy.
    reader_freed: ReaderFreed,
}

#[derive(Default)]
struct ReaderFreed {
    lock: Mutex<()>,
    signal: std::sync::Condvar,
}

impl Connections {
    /// A free read connection, or, when all are busy, the first to come free. (Waiting on one
    /// chosen in turn made a page's quick read wait out a slow one on that connection while
    /// the other came free.)
    fn reader(&self) -> Reader<'_> {
        let mut waiting = self
            .reader_freed
            .lock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        loop {
            for reader in &self.readers {
                let conn = match reader.try_lock() {
                    Ok(conn) => conn,
                    Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                    Err(std::sync::TryLockError::WouldBlock) => continue,
                };
                return Reader {
                    conn: Some(conn),
                    freed: &self.reader_freed,
                };
            }
            // A reader handed back between the tries and this wait signals only once the
            // wait has released `waiting`, so no hand-back is missed.
            waiting = self
                .reader_freed
                .signal
                .wait(waiting)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A read connection taken from [`Connections::reader`]; handed back (and a waiting read
/// woken) when dropped.
struct Reader<'a> {
    conn: Option<std::sync::MutexGuard<'a, Connection>>,
    freed: &'a ReaderFreed,
}

impl std::ops::Deref for Reader<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
            .as_deref()
            .unwrap_or_else(|| unreachable!("taken only on drop"))
    }
}

impl std::ops::DerefMut for Reader<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn
            .as_deref_mut()
            .unwrap_or_else(|| unreachable!("taken only on drop"))
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        drop(self.conn.take());
        let _waiting = self.freed.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.freed.signal.notify_one();
    }
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.pragma_update(None, "cache_size", CACHE_KIB)?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// The file beside the database that says a store was created there, so that a database
/// file found missing or emptied later is refused instead of silently starting afresh.
pub fn marker_path(db: &Path) -> std::path::PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".created");
    db.with_file_name(name)
}

/// Creates a new store file readable and writable by its owner only (SQLite gives its WAL and
/// shared-memory files the same mode); an existing file is left as it is.
fn create_private(path: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::Open(format!("{}: {e}", path.display()))),
    }
}

/// What `sked store check` found: a list of problems, empty when the store is sound.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckReport {
    pub problems: Vec<String>,
}

/// Refuses a database file that a store was created in (its marker says so) but that is now
/// missing or empty: opening it would start an empty store over lost data.
fn check_not_emptied(path: &Path) -> Result<()> {
    let marker = marker_path(path);
    if !marker.exists() {
        return Ok(());
    }
    let size = std::fs::metadata(path).map(|m| m.len());
    let problem = match size {
        Err(_) => "is missing",
        Ok(0) => "is empty (zero bytes)",
        Ok(_) => return Ok(()),
    };
    Err(StoreError::Open(format!(
        "{} {problem}, but a store was created there ({} exists): refusing to start an empty \
         store over it. Restore the file from a backup, or, to start afresh on purpose, \
         remove both files.",
        path.display(),
        marker.display()
    )))
}

/// `PRAGMA quick_check` (or the slower, thorough `integrity_check`): the problems SQLite
/// finds, none when it answers "ok".
fn integrity_problems(conn: &Connection, thorough: bool) -> rusqlite::Result<Vec<String>> {
    let pragma = if thorough {
        "PRAGMA integrity_check(100)"
    } else {
        "PRAGMA quick_check(100)"
    };
    let mut stmt = conn.prepare(pragma)?;
    let lines = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(lines.into_iter().filter(|l| l != "ok").collect())
}

impl SqliteStore {
    /// Checks the database at `path` without changing it: the marker, the schema version and
    /// every page (`integrity_check`). For an operator (`sked store check`), on a stopped or
    /// running store.
    pub fn check(path: &Path) -> Result<CheckReport> {
        let mut problems = Vec::new();
        if let Err(e) = check_not_emptied(path) {
            problems.push(e.to_string());
            return Ok(CheckReport { problems });
        }
        if !path.exists() {
            return Err(StoreError::Open(format!(
                "{}: no such file",
                path.display()
            )));
        }
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| StoreError::Open(format!("{}: {e}", path.display())))?;
        let damaged = |e: rusqlite::Error| format!("{}: {e}", path.display());
        match conn.query_row("PRAGMA user_version", [], |r| r.get::<_, usize>(0)) {
            Ok(0) => problems.push(format!("{} holds no sked schema", path.display())),
            Ok(v) if v > schema::latest_version() => problems.push(format!(
                "{} has schema version {v}, newer than this sked knows ({})",
                path.display(),
                schema::latest_version()
            )),
            Ok(_) => {}
            Err(e) => problems.push(damaged(e)),
        }
        match integrity_problems(&conn, true) {
            Ok(found) => problems.extend(
                found
                    .into_iter()
                    .map(|p| format!("{}: {p}", path.display())),
            ),
            Err(e) => problems.push(damaged(e)),
        }
        Ok(CheckReport { problems })
    }

    /// Copies the database at `path` to a new file `to`, consistent as of one moment, while
    /// sked may be running on it (`VACUUM INTO` reads one snapshot and never blocks the
    /// writer). The copy is written beside `to` under a temporary name, checked, and only
    /// then renamed into place, readable by its owner only: a failed backup leaves no file
    /// that looks like one. `to` must not exist. The schema version of the copy.
    pub fn backup(path: &Path, to: &Path) -> Result<usize> {
        check_not_emptied(path)?;
        if !path.exists() {
            return Err(StoreError::Open(format!(
                "{}: no such file",
                path.display()
            )));
        }
        if to.exists() {
            return Err(StoreError::Open(format!(
                "{} exists already: a backup never overwrites a file",
                to.display()
            )));
        }
        let mut partial = to.as_os_str().to_owned();
        partial.push(".partial");
        let partial = std::path::PathBuf::from(partial);
        // Empty and private before SQLite writes into it (VACUUM INTO takes an empty file).
        std::fs::remove_file(&partial).ok();
        create_private(&partial)?;
        let copied = Self::copy_into(path, &partial).and_then(|version| {
            std::fs::rename(&partial, to)
                .map_err(|e| StoreError::Open(format!("{}: {e}", to.display())))?;
            Ok(version)
        });
        if copied.is_err() {
            std::fs::remove_file(&partial).ok();
        }
        copied
    }

    fn copy_into(path: &Path, partial: &Path) -> Result<usize> {
        let failed = |what: &Path| {
            let what = what.display().to_string();
            move |e: rusqlite::Error| StoreError::Open(format!("{what}: {e}"))
        };
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(failed(path))?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(failed(path))?;
        let version: usize = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(failed(path))?;
        if version == 0 {
            return Err(StoreError::Open(format!(
                "{} holds no sked schema",
                path.display()
            )));
        }
        let target = partial
            .to_str()
            .ok_or_else(|| StoreError::Open(format!("{}: not a UTF-8 path", partial.display())))?;
        conn.execute("VACUUM INTO ?1", [target])
            .map_err(failed(path))?;
        let copy = Connection::open_with_flags(partial, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(failed(partial))?;
        let problems = integrity_problems(&copy, false).map_err(failed(partial))?;
        let copied_version: usize = copy
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(failed(partial))?;
        if !problems.is_empty() || copied_version != version {
            return Err(StoreError::Open(format!(
                "the copy of {} does not check out: {}",
                path.display(),
                if problems.is_empty() {
                    format!("schema version {copied_version}, not {version}")
                } else {
                    problems.join("; ")
                }
            )));
        }
        Ok(version)
    }

    /// Opens (creating if needed) the database at `path` and brings its schema up to date.
    /// Refuses, naming the file, a database that was emptied or lost since a store was
    /// created there, and one whose pages `quick_check` finds damaged.
    pub fn open(path: &Path) -> Result<SqliteStore> {
        let open_err = |e: rusqlite::Error| {
            use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
            if matches!(e.sqlite_error_code(), Some(DatabaseCorrupt | NotADatabase)) {
                StoreError::Open(format!(
                    "{} is damaged ({e}); run `sked store check` for details and restore it \
                     from a backup",
                    path.display()
                ))
            } else {
                StoreError::Open(format!("{}: {e}", path.display()))
            }
        };
        check_not_emptied(path)?;
        create_private(path)?;
        let mut writer = Connection::open(path).map_err(open_err)?;
        let mode: String = writer
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(open_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Open(format!(
                "{}: cannot switch to WAL mode (got {mode})",
                path.display()
            )));
        }
        configure(&writer).map_err(open_err)?;
        let version: usize = writer
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(open_err)?;
        if version > schema::latest_version() {
            return Err(StoreError::Open(format!(
                "{} has schema version {version}, newer than this sked knows ({}); \
                 run a newer sked",
                path.display(),
                schema::latest_version()
            )));
        }
        let problems = integrity_problems(&writer, false).map_err(open_err)?;
        if !problems.is_empty() {
            return Err(StoreError::Open(format!(
                "{} is damaged ({}); run `sked store check` for details and restore it \
                 from a backup",
                path.display(),
                problems.join("; ")
            )));
        }
        schema::migrate(&mut writer).map_err(open_err)?;
        let marker = marker_path(path);
        if !marker.exists() {
            std::fs::write(
                &marker,
                format!("a sked store was created in {}\n", path.display()),
            )
            .map_err(|e| StoreError::Open(format!("{}: {e}", marker.display())))?;
        }
        writer
            .pragma_update(
                None,
                "wal_autocheckpoint",
                checkpoint::WRITER_AUTOCHECKPOINT_PAGES,
            )
            .map_err(open_err)?;
        let checkpointer = Connection::open(path).map_err(open_err)?;
        configure(&checkpointer).map_err(open_err)?;
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            let reader = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(open_err)?;
            configure(&reader).map_err(open_err)?;
            reader
                .pragma_update(None, "cache_size", READER_CACHE_KIB)
                .map_err(open_err)?;
            readers.push(Mutex::new(reader));
        }
        // The checkpoint thread syncs the database file through a handle of its own.
        let db_file = std::fs::File::open(path)
            .map_err(|e| StoreError::Open(format!("{}: {e}", path.display())))?;
        let inner = Arc::new(Connections {
            writer: Mutex::new(writer),
            writer_busy: Default::default(),
            readers,
            reader_freed: Default::default(),
        });
        let checkpointer = checkpoint::spawn(checkpointer, db_file, Arc::downgrade(&inner))
            .map_err(|e| StoreError::Open(format!("cannot start the checkpoint thread: {e}")))?;
        let writer = writer::Writer::spawn(inner.clone())
            .map_err(|e| StoreError::Open(format!("cannot start the writer thread: {e}")))?;
        Ok(SqliteStore {
            node: Mutex::new(None),
            observer: std::sync::OnceLock::new(),
            inner,
            writer,
            backlog: Default::default(),
            _checkpointer: checkpointer,
        })
    }

    /// Runs `work` on the writer thread, in a transaction other writes may share; what it wrote
    /// is kept if it succeeds and undone alone if it fails, and its value is answered once the
    /// transaction has committed.
    async fn write<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.writer
            .send(Box::new(writer::Pending { work, answer }))?;
        let result = answered.await.unwrap_or_else(|_| {
            Err(StoreError::Database(
                "a store write failed unexpectedly (see the log)".into(),
            ))
        });
        observe_write(self.observer.get().map(|o| o.as_ref()), &result);
        result
    }

    /// [`SqliteStore::write`] that also appends the audit entries `audit` makes from the
    /// outcome, in the same transaction (its savepoint, when it shares one).
    async fn write_audited<T, F>(&self, audit: Audit<T>, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T> + Send + 'static,
    {
        self.write(move |tx| {
            let outcome = work(tx)?;
            let entries = audit.entries(&outcome);
            if !entries.is_empty() {
                audit::append(tx, &entries)?;
            }
            Ok(outcome)
        })
        .await
    }

    /// Runs `work` on the read connection, in one read transaction so it sees one snapshot.
    async fn read<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        blocking(move || {
            let mut conn = inner.reader();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
            work(&tx)
        })
        .await
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StoreError::Database(format!("a store task failed: {e}")))?
}

#[async_trait]
impl Store for SqliteStore {
    fn admit_through(&self, source: Arc<dyn crate::BacklogSource>) {
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
        let (namespace, job) = (namespace.to_string(), job.clone());
        self.write_audited(audit, move |tx| jobs::put(tx, &namespace, &job, mode, now))
            .await
    }

    async fn apply(
        &self,
        namespace: &str,
        batch: &Batch,
        now: Instant,
        dry_run: bool,
        audit: Audit<Applied>,
    ) -> Result<Applied, crate::BatchRefusal> {
        let (namespace, owned) = (namespace.to_string(), batch.clone());
        // Which item the batch reached (calendars, then jobs), so a refusal names it.
        let reached = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let at = reached.clone();
        let written = self
            .write(move |tx| {
                if dry_run {
                    tx.execute_batch("SAVEPOINT dry_run")?;
                }
                let mut applied = Applied::default();
                for (i, calendar) in owned.calendars.iter().enumerate() {
                    at.store(i, std::sync::atomic::Ordering::Relaxed);
                    applied.calendars.push(calendars::put(
                        tx,
                        &namespace,
                        &calendar.name,
                        &calendar.spec,
                        now,
                    )?);
                }
                for (i, job) in owned.jobs.iter().enumerate() {
                    at.store(
                        owned.calendars.len() + i,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    applied
                        .jobs
                        .push(jobs::put(tx, &namespace, job, PutMode::Upsert, now)?);
                }
                at.store(usize::MAX, std::sync::atomic::Ordering::Relaxed);
                if dry_run {
                    tx.execute_batch("ROLLBACK TO dry_run; RELEASE dry_run")?;
                } else {
                    let entries = audit.entries(&applied);
                    if !entries.is_empty() {
                        audit::append(tx, &entries)?;
                    }
                }
                Ok(applied)
            })
            .await;
        written.map_err(|error| {
            let position = reached.load(std::sync::atomic::Ordering::Relaxed);
            crate::BatchRefusal::reached(batch, position, error)
        })
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobRecord>> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.read(move |tx| jobs::get(tx, &namespace, &name)).await
    }

    async fn get_job_by_id(&self, id: i64) -> Result<Option<JobRecord>> {
        self.read(move |tx| jobs::get_by_id(tx, id)).await
    }

    async fn job_versions(&self, namespace: &str, name: &str) -> Result<Option<Vec<JobVersion>>> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.read(move |tx| jobs::versions(tx, &namespace, &name))
            .await
    }

    async fn list_jobs(&self, query: &JobQuery) -> Result<Page<JobRecord>> {
        let query = query.clone();
        self.read(move |tx| jobs::list(tx, &query)).await
    }

    async fn delete_job(
        &self,
        namespace: &str,
        name: &str,
        force: bool,
        now: Instant,
        audit: Audit<Option<DeletedJob>>,
    ) -> Result<Option<DeletedJob>> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.write_audited(audit, move |tx| {
            jobs::delete(tx, &namespace, &name, force, now)
        })
        .await
    }

    async fn set_paused(
        &self,
        namespace: &str,
        name: &str,
        paused: bool,
        now: Instant,
        audit: Audit<Option<JobRecord>>,
    ) -> Result<Option<JobRecord>> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.write_audited(audit, move |tx| {
            jobs::set_paused(tx, &namespace, &name, paused, now)
        })
        .await
    }

    async fn dependency_edges(
        &self,
        namespace: &str,
        jobs: &[String],
        toward: Toward,
    ) -> Result<Vec<DependencyEdge>> {
        let (namespace, jobs) = (namespace.to_string(), jobs.to_vec());
        self.read(move |tx| dependencies::edges(tx, &namespace, &jobs, toward))
            .await
    }

    async fn scheduled_jobs(
        &self,
        partitions: Option<&[u32]>,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<ScheduledJob>> {
        let partitions = partitions.map(<[u32]>::to_vec);
        self.read(move |tx| jobs::scheduled(tx, partitions.as_deref(), after_id, limit))
            .await
    }

    async fn record_fires(
        &self,
        fires: &[Fire],
        now: Instant,
        audit: Audit<FireOutcome>,
    ) -> Result<FireOutcome> {
        let fires = fires.to_vec();
        self.write_audited(audit, move |tx| ledger::record_fires(tx, &fires, now))
            .await
    }

    async fn trigger_run(
        &self,
        trigger: &ManualTrigger,
        now: Instant,
        audit: Audit<TriggeredRun>,
    ) -> Result<TriggeredRun> {
        let trigger = trigger.clone();
        self.write_audited(audit, move |tx| triggers::trigger_run(tx, &trigger, now))
            .await
    }

    async fn queued_runs(&self, ids: Option<&[i64]>) -> Result<Vec<QueuedRun>> {
        let ids = ids.map(<[i64]>::to_vec);
        self.read(move |tx| ledger::queued_runs(tx, ids.as_deref()))
            .await
    }

    async fn queued_before(
        &self,
        ready_before: Instant,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<i64>> {
        self.read(move |tx| ledger::queued_before(tx, ready_before, after_id, limit))
            .await
    }

    async fn start_attempts(
        &self,
        starts: &[AttemptStart],
        now: Instant,
    ) -> Result<Vec<StartOutcome>> {
        let starts = starts.to_vec();
        self.write(move |tx| ledger::start_attempts(tx, &starts, now))
            .await
    }

    async fn expire_dependency_waits(&self, now: Instant, limit: u32) -> Result<ExpiredWaits> {
        self.write(move |tx| {
            let (skipped, settled) = dependencies::expire_waits(tx, now, limit)?;
            Ok(ExpiredWaits {
                skipped,
                queued: settled.queued,
            })
        })
        .await
    }

    async fn complete_attempts(
        &self,
        reports: &[AttemptReport],
        now: Instant,
    ) -> Result<Vec<CompletionEffect>> {
        let reports = reports.to_vec();
        let backlog = self.backlog.get();
        self.write(move |tx| ledger::complete_attempts(tx, &reports, backlog.as_deref(), now))
            .await
    }

    async fn cancel_run(
        &self,
        run_id: i64,
        now: Instant,
        audit: Audit<Option<CancelOutcome>>,
    ) -> Result<Option<CancelOutcome>> {
        self.write_audited(audit, move |tx| ledger::cancel_run(tx, run_id, now))
            .await
    }

    async fn runs_under_windows(
        &self,
        namespaces: &[String],
        after: i64,
        limit: u32,
    ) -> Result<Vec<RunUnderWindows>> {
        let namespaces = namespaces.to_vec();
        self.read(move |tx| ledger::runs_under_windows(tx, &namespaces, after, limit))
            .await
    }

    async fn stop_runs(&self, stops: &[(i64, String)]) -> Result<Vec<i64>> {
        let stops = stops.to_vec();
        self.write(move |tx| ledger::stop_runs(tx, &stops)).await
    }

    async fn retry_run(
        &self,
        run_id: i64,
        now: Instant,
        audit: Audit<Option<RetryOutcome>>,
    ) -> Result<Option<RetryOutcome>> {
        self.write_audited(audit, move |tx| ledger::retry_run(tx, run_id, now))
            .await
    }

    async fn get_run(&self, run_id: i64) -> Result<Option<(RunRecord, Vec<AttemptRecord>)>> {
        self.read(move |tx| history::get_run(tx, run_id)).await
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Page<RunRecord>> {
        let query = query.clone();
        self.read(move |tx| history::list_runs(tx, &query)).await
    }

    async fn job_stats(&self, namespace: &str, name: &str) -> Result<Option<JobStats>> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.read(move |tx| history::job_stats(tx, &namespace, &name))
            .await
    }

    async fn post_event(
        &self,
        namespace: &str,
        event: &sked_core::event::EventSpec,
        now: Instant,
        audit: Audit<PostedEvent>,
    ) -> Result<PostedEvent> {
        let (namespace, event) = (namespace.to_string(), event.clone());
        let backlog = self.backlog.get();
        self.write_audited(audit, move |tx| {
            events::post(tx, &namespace, &event, backlog.as_deref(), now)
        })
        .await
    }

    async fn list_events(&self, query: &EventQuery) -> Result<Vec<EventRecord>> {
        let query = query.clone();
        self.read(move |tx| events::list(tx, &query)).await
    }

    async fn append_output(
        &self,
        attempt_id: i64,
        token: i64,
        worker_id: &str,
        bytes: &[u8],
        cap: u64,
    ) -> Result<AppendOutcome> {
        let bytes = bytes.to_vec();
        let worker_id = worker_id.to_string();
        self.write(move |tx| history::append_output(tx, attempt_id, token, &worker_id, &bytes, cap))
            .await
    }

    async fn read_output(&self, attempt_id: i64, offset: u64) -> Result<Vec<u8>> {
        self.read(move |tx| history::read_output(tx, attempt_id, offset))
            .await
    }

    async fn register_worker(&self, worker: &NewWorker, now: Instant) -> Result<()> {
        let worker = worker.clone();
        self.write(move |tx| workers::register(tx, &worker, now))
            .await
    }

    async fn heartbeat(
        &self,
        worker_id: &str,
        running: &[i64],
        now: Instant,
        lease: LeaseRenewal,
        forgotten_before: Instant,
    ) -> Result<HeartbeatOutcome> {
        let (worker_id, running) = (worker_id.to_string(), running.to_vec());
        self.write(move |tx| {
            workers::heartbeat(tx, &worker_id, &running, now, lease, forgotten_before)
        })
        .await
    }

    async fn list_workers(&self, limit: u32, cursor: Option<&str>) -> Result<Page<WorkerRecord>> {
        let cursor = cursor.map(str::to_string);
        self.read(move |tx| workers::list(tx, limit, cursor.as_deref()))
            .await
    }

    async fn get_worker(&self, id: &str) -> Result<Option<WorkerRecord>> {
        let id = id.to_string();
        self.read(move |tx| workers::get(tx, &id)).await
    }

    async fn deregister_worker(&self, id: &str, now: Instant) -> Result<Option<WorkerRecord>> {
        let id = id.to_string();
        self.write(move |tx| workers::deregister(tx, &id, now))
            .await
    }

    async fn drain_worker(
        &self,
        id: &str,
        audit: Audit<Option<crate::Drained>>,
    ) -> Result<Option<crate::Drained>> {
        let id = id.to_string();
        self.write_audited(audit, move |tx| workers::drain(tx, &id))
            .await
    }

    async fn delete_dead_workers(&self, before: Instant, limit: u32) -> Result<u64> {
        self.write(move |tx| workers::delete_dead(tx, before, limit))
            .await
    }

    async fn reap(&self, silent_since: Instant, now: Instant) -> Result<ReapOutcome> {
        self.write(move |tx| ledger::reap(tx, silent_since, now))
            .await
    }

    async fn delete_finished_runs(&self, before: Instant, limit: u32) -> Result<u64> {
        self.write(move |tx| history::delete_finished_runs(tx, before, limit))
            .await
    }

    async fn delete_audit_before(&self, before: Instant, limit: u32) -> Result<u64> {
        self.write(move |tx| audit::delete_before(tx, before, limit))
            .await
    }

    async fn delete_events_before(&self, before: Instant, limit: u32) -> Result<u64> {
        self.write(move |tx| {
            // Expired debounce and dedup keys go with the events.
            triggers::delete_expired(tx, before, limit)?;
            events::delete_before(tx, before, limit)
        })
        .await
    }

    async fn ping(&self, job_id: i64, now: Instant) -> Result<Option<PingOutcome>> {
        self.write(move |tx| heartbeats::ping(tx, job_id, now))
            .await
    }

    async fn expire_ping_waits(&self, now: Instant, limit: u32) -> Result<ExpiredPings> {
        self.write(move |tx| heartbeats::expire(tx, now, limit))
            .await
    }

    async fn record_late_notifications(&self, now: Instant) -> Result<u64> {
        self.write(move |tx| notifications::record_late(tx, now))
            .await
    }

    async fn claim_notifications(
        &self,
        now: Instant,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<sked_core::notify::NotificationRecord>> {
        self.write(move |tx| notifications::claim(tx, now, lease, limit))
            .await
    }

    async fn finish_notifications(&self, reports: &[SendReport], now: Instant) -> Result<()> {
        let reports = reports.to_vec();
        self.write(move |tx| notifications::finish(tx, &reports, now))
            .await
    }

    async fn list_notifications(
        &self,
        query: &NotificationQuery,
    ) -> Result<Page<sked_core::notify::NotificationRecord>> {
        let query = query.clone();
        self.read(move |tx| notifications::list(tx, &query)).await
    }

    async fn delete_notifications_before(&self, before: Instant, limit: u32) -> Result<u64> {
        self.write(move |tx| notifications::delete_before(tx, before, limit))
            .await
    }

    async fn get_namespace(&self, name: &str) -> Result<Option<NamespaceRecord>> {
        let name = name.to_string();
        self.read(move |tx| namespaces::get(tx, &name)).await
    }

    async fn list_namespaces(&self) -> Result<Vec<NamespaceRecord>> {
        self.read(namespaces::list).await
    }

    async fn job_namespaces(&self, limit: u32) -> Result<Vec<String>> {
        self.read(move |tx| namespaces::of_jobs(tx, limit)).await
    }

    async fn put_namespace(
        &self,
        name: &str,
        spec: &NamespaceSpec,
        now: Instant,
        audit: Audit<(Option<NamespaceRecord>, NamespaceRecord)>,
    ) -> Result<(Option<NamespaceRecord>, NamespaceRecord)> {
        let (name, spec) = (name.to_string(), spec.clone());
        self.write_audited(audit, move |tx| namespaces::put(tx, &name, &spec, now))
            .await
    }

    async fn delete_namespace(
        &self,
        name: &str,
        audit: Audit<Option<NamespaceRecord>>,
    ) -> Result<Option<NamespaceRecord>> {
        let name = name.to_string();
        self.write_audited(audit, move |tx| namespaces::delete(tx, &name))
            .await
    }

    async fn put_secret(
        &self,
        namespace: &str,
        name: &str,
        sealed: &str,
        now: Instant,
        audit: Audit<(bool, SecretRecord)>,
    ) -> Result<(bool, SecretRecord)> {
        let (namespace, name, sealed) =
            (namespace.to_string(), name.to_string(), sealed.to_string());
        self.write_audited(audit, move |tx| {
            namespaces::put_secret(tx, &namespace, &name, &sealed, now)
        })
        .await
    }

    async fn list_secrets(&self, namespace: &str) -> Result<Vec<SecretRecord>> {
        let namespace = namespace.to_string();
        self.read(move |tx| namespaces::list_secrets(tx, &namespace))
            .await
    }

    async fn delete_secret(
        &self,
        namespace: &str,
        name: &str,
        audit: Audit<Option<SecretRecord>>,
    ) -> Result<Option<SecretRecord>> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.write_audited(audit, move |tx| {
            namespaces::delete_secret(tx, &namespace, &name)
        })
        .await
    }

    async fn sealed_secrets(&self, wanted: &[SecretName]) -> Result<BTreeMap<SecretName, String>> {
        if wanted.is_empty() {
            return Ok(BTreeMap::new());
        }
        let wanted = wanted.to_vec();
        self.read(move |tx| namespaces::sealed(tx, &wanted)).await
    }

    async fn sealed_texts(&self, marker: &str) -> Result<Vec<StoredSeal>> {
        let marker = marker.to_string();
        self.read(move |tx| sealed::texts(tx, &marker)).await
    }

    async fn replace_sealed(&self, stored: &StoredSeal, text: &str) -> Result<bool> {
        let (stored, text) = (stored.clone(), text.to_string());
        self.write(move |tx| sealed::replace(tx, &stored, &text))
            .await
    }

    async fn create_token(
        &self,
        token: &NewToken,
        now: Instant,
        audit: Audit<TokenRecord>,
    ) -> Result<TokenRecord> {
        let token = token.clone();
        self.write_audited(audit, move |tx| tokens::create(tx, &token, now))
            .await
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let hash = hash.to_string();
        self.read(move |tx| tokens::by_hash(tx, &hash)).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>> {
        self.read(tokens::list).await
    }

    async fn revoke_token(
        &self,
        name: &str,
        audit: Audit<Option<TokenRecord>>,
    ) -> Result<Option<TokenRecord>> {
        let name = name.to_string();
        self.write_audited(audit, move |tx| tokens::revoke(tx, &name))
            .await
    }

    async fn end_sessions(&self, token_id: i64, at: Instant) -> Result<bool> {
        self.write(move |tx| tokens::end_sessions(tx, token_id, at))
            .await
    }

    async fn touch_tokens(&self, used: &[(i64, Instant)]) -> Result<()> {
        if used.is_empty() {
            return Ok(());
        }
        let used = used.to_vec();
        self.write(move |tx| tokens::touch(tx, &used)).await
    }

    async fn append_audit(&self, entries: &[AuditEntry]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let entries = entries.to_vec();
        self.write(move |tx| audit::append(tx, &entries)).await
    }

    async fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>> {
        let query = query.clone();
        self.read(move |tx| audit::list(tx, &query)).await
    }

    async fn renew_membership(
        &self,
        node: &NodeInfo,
        now: Instant,
        _lease: Duration,
    ) -> Result<Membership> {
        let partitions = sked_core::cluster::PARTITIONS;
        *self.node.lock().unwrap_or_else(|p| p.into_inner()) = Some(NodeRecord {
            id: node.id.clone(),
            address: node.address.clone(),
            started_at: node.started_at,
            seen_at: now,
            partitions,
            maintenance: true,
        });
        Ok(Membership {
            partitions: (0..partitions).collect(),
            maintenance: true,
        })
    }

    async fn leave_cluster(&self, node: &str) -> Result<()> {
        let mut held = self.node.lock().unwrap_or_else(|p| p.into_inner());
        if held.as_ref().is_some_and(|n| n.id == node) {
            *held = None;
        }
        Ok(())
    }

    async fn cluster_nodes(&self, _now: Instant) -> Result<Vec<NodeRecord>> {
        let held = self.node.lock().unwrap_or_else(|p| p.into_inner());
        Ok(held.iter().cloned().collect())
    }

    fn observe_writes(&self, observer: Arc<dyn WriteObserver>) {
        let _ = self.observer.set(observer);
    }

    async fn subscribe(&self) -> Result<Option<StoreEvents>> {
        Ok(None)
    }
}

/// The steps of SQLite's plan for `sql` (its parameters left unbound), as `EXPLAIN QUERY PLAN`
/// words them: what the statement tests hold the hot queries' index choices to.
#[cfg(test)]
fn query_plan(conn: &Connection, sql: &str) -> Vec<String> {
    let mut stmt = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .expect("a statement of this module");
    let nulls = std::iter::repeat_n(rusqlite::types::Null, stmt.parameter_count());
    stmt.query_map(rusqlite::params_from_iter(nulls), |r| r.get(3))
        .and_then(|steps| steps.collect())
        .expect("a plan")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A read waiting while every reader is busy takes the first handed back, whichever it
    /// is: a slow read on one connection does not hold up reads the other could serve.
    #[test]
    fn a_waiting_read_takes_the_first_reader_handed_back() {
        let open = || Mutex::new(Connection::open_in_memory().expect("a connection"));
        let connections = Arc::new(Connections {
            writer: open(),
            writer_busy: Default::default(),
            readers: vec![open(), open()],
            reader_freed: Default::default(),
        });
        // Both taken: the first is held to the end of the test.
        let slow = connections.reader();
        let quick = connections.reader();
        let (got, gets) = mpsc::channel();
        let waiting = {
            let connections = connections.clone();
            std::thread::spawn(move || {
                for _ in 0..3 {
                    let conn = connections.reader();
                    let one: i64 = conn
                        .query_row("SELECT 1", [], |r| r.get(0))
                        .expect("a read");
                    got.send(one).expect("the test waits");
                }
            })
        };
        assert!(
            gets.recv_timeout(Duration::from_millis(200)).is_err(),
            "no reader was free"
        );
        drop(quick);
        for _ in 0..3 {
            assert_eq!(gets.recv_timeout(Duration::from_secs(10)), Ok(1));
        }
        waiting.join().expect("the reads ended");
        drop(slow);
    }
}
