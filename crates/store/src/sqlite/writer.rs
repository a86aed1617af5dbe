//! The writer: a thread of its own that runs every write of the embedded store on the one write
//! connection, and commits the writes that queued up meanwhile together (group commit).
//!
//! Owns the order of writes, their grouping into transactions and the moment each is answered.
//! It never decides what a write does: each is a closure of the store's methods, run as it
//! would run alone.
//!
//! Why group: a commit appends every page it changed to the WAL, and the ledger's writes change
//! the same pages one after the other (the newest leaf of `runs` and of each of its indexes).
//! At 1,000 instants a second with a worker, a fire, a start and a completion each committed
//! every millisecond, each its own frames, its own wake-up of a pool thread and its own share of
//! the checkpoint thread's copying. Writes that arrive while another runs now share the next
//! transaction; a write that finds the writer idle runs at once, alone, as before
//! (docs/BENCHMARKS.md, "Writes that share a commit").
//!
//! A write that fails is undone alone and answered with its error at once, and the others still
//! commit: each write after a transaction's first runs in a savepoint, and a failed first write
//! rolls the transaction back before anything else joins it. A write's value is sent only once
//! its transaction has committed, so nothing is answered that a failed commit undoes.

use super::owned_thread::OwnedThread;
use super::Connections;
use crate::{Result, StoreError};
use rusqlite::{Transaction, TransactionBehavior};
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How many queued writes one transaction takes.
#[derive(Debug, Clone, Copy)]
struct Group {
    /// The most writes: past it, what is still queued waits for the next transaction.
    writes: usize,
    /// How long a transaction goes on taking queued writes: the first write's answer waits for
    /// the commit, so a long run of queued writes must not hold it for long.
    time: Duration,
}

const GROUP: Group = Group {
    writes: 64,
    time: Duration::from_millis(5),
};

/// One write waiting for the writer: its work, and where its answer goes.
pub(super) trait Request: Send {
    /// Runs the work in `tx`; says whether it succeeded, with what to answer once `tx` ends.
    fn run(self: Box<Self>, tx: &Transaction<'_>) -> Step;
    /// Answers without running: no transaction could begin.
    fn refuse(self: Box<Self>, error: StoreError);
}

/// What running a write left.
pub(super) enum Step {
    /// The work succeeded; its value is sent once the transaction has ended.
    Written(Box<dyn Reply>),
    /// The work failed and was answered with its error; what it wrote is to be undone.
    Failed,
}

/// A written value waiting for its transaction to end.
pub(super) trait Reply: Send {
    /// Sends the value if the transaction committed, or the reason it did not.
    fn send(self: Box<Self>, committed: std::result::Result<(), String>);
}

/// A write of the store's methods: `work` and the channel its caller waits on.
pub(super) struct Pending<T, F> {
    pub(super) work: F,
    pub(super) answer: oneshot::Sender<Result<T>>,
}

struct Written<T> {
    value: T,
    answer: oneshot::Sender<Result<T>>,
}

impl<T, F> Request for Pending<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Transaction<'_>) -> Result<T> + Send,
{
    fn run(self: Box<Self>, tx: &Transaction<'_>) -> Step {
        let Pending { work, answer } = *self;
        match work(tx) {
            Ok(value) => Step::Written(Box::new(Written { value, answer })),
            Err(e) => {
                // The caller may be gone (its request was cancelled): nothing to tell.
                let _ = answer.send(Err(e));
                Step::Failed
            }
        }
    }

    fn refuse(self: Box<Self>, error: StoreError) {
        let _ = self.answer.send(Err(error));
    }
}

impl<T: Send> Reply for Written<T> {
    fn send(self: Box<Self>, committed: std::result::Result<(), String>) {
        let Written { value, answer } = *self;
        let _ = answer.send(committed.map(|()| value).map_err(StoreError::Database));
    }
}

/// The writer thread and the queue of writes it serves. Dropping it lets the thread finish
/// the writes already queued and waits for it to end, so that once the store is dropped its
/// write connection is closed.
pub(super) struct Writer(OwnedThread<Box<dyn Request>>);

impl Writer {
    /// Starts the writer thread on `connections`' write connection.
    pub(super) fn spawn(connections: Arc<Connections>) -> std::io::Result<Writer> {
        Writer::grouping(connections, GROUP)
    }

    fn grouping(connections: Arc<Connections>, group: Group) -> std::io::Result<Writer> {
        OwnedThread::spawn("sked-sqlite-writer", move |queued| {
            keep_writing(&connections, &queued, group)
        })
        .map(Writer)
    }

    /// Queues `request`; an error if the thread has stopped.
    pub(super) fn send(&self, request: Box<dyn Request>) -> Result<()> {
        self.0
            .send(request)
            .map_err(|_| StoreError::Database("the store's writer has stopped".into()))
    }
}

fn keep_writing(connections: &Connections, queued: &Receiver<Box<dyn Request>>, group: Group) {
    while let Ok(first) = queued.recv() {
        let mut conn = connections
            .writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let began = Instant::now();
        match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => write_group(tx, first, queued, began, group),
            Err(e) => first.refuse(e.into()),
        }
        connections.writer_busy.add(began.elapsed());
    }
}

/// Runs `first` and the writes queued behind it (within `group`'s bounds) in `tx`, commits,
/// and answers them.
fn write_group(
    tx: Transaction<'_>,
    first: Box<dyn Request>,
    queued: &Receiver<Box<dyn Request>>,
    began: Instant,
    group: Group,
) {
    // The first write runs bare: if it fails, rolling back the whole transaction undoes it
    // alone, and a savepoint would copy every page it changes for nothing.
    let Some(reply) = run(&tx, first) else {
        return;
    };
    let mut written = vec![reply];
    while written.len() < group.writes && began.elapsed() < group.time {
        let Ok(request) = queued.try_recv() else {
            break;
        };
        if let Err(e) = run_in_savepoint(&tx, request, &mut written) {
            // The transaction itself is lost (SQLite rolls it back after some I/O errors):
            // the writes before this one are undone with it.
            let reason = format!("the transaction was rolled back: {e}");
            for reply in written {
                reply.send(Err(reason.clone()));
            }
            return;
        }
    }
    let committed = tx.commit().map_err(|e| e.to_string());
    for reply in written {
        reply.send(committed.clone());
    }
}

/// Runs `request` in `tx`: its reply if it succeeded. A panic drops the request's answer,
/// which its caller reports as a failed write; the thread goes on serving the others.
fn run(tx: &Transaction<'_>, request: Box<dyn Request>) -> Option<Box<dyn Reply>> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| request.run(tx))) {
        Ok(Step::Written(reply)) => Some(reply),
        Ok(Step::Failed) | Err(_) => None,
    }
}

/// Runs `request` in a savepoint of `tx`: kept if it succeeds (its reply joins `written`),
/// undone if it fails or panics. An error here is the transaction's, not the request's.
fn run_in_savepoint(
    tx: &Transaction<'_>,
    request: Box<dyn Request>,
    written: &mut Vec<Box<dyn Reply>>,
) -> rusqlite::Result<()> {
    tx.prepare_cached("SAVEPOINT write")?.execute([])?;
    match run(tx, request) {
        Some(reply) => {
            written.push(reply);
            tx.prepare_cached("RELEASE write")?.execute([])?;
        }
        None => {
            tx.prepare_cached("ROLLBACK TO write")?.execute([])?;
            tx.prepare_cached("RELEASE write")?.execute([])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;
    use std::sync::Mutex;
    use tokio::sync::oneshot::error::TryRecvError;

    /// No time bound, so that how long this machine takes cannot split a group.
    const UNTIMED: Group = Group {
        writes: 64,
        time: Duration::from_secs(3600),
    };

    /// A database in WAL mode with one table, and its write connection.
    fn database() -> (tempfile::TempDir, std::path::PathBuf, Arc<Connections>) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("group.db");
        let conn = Connection::open(&path).expect("the database");
        conn.pragma_update(None, "journal_mode", "WAL")
            .expect("WAL");
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)", [])
            .expect("a table");
        let connections = Arc::new(Connections {
            writer: Mutex::new(conn),
            writer_busy: Default::default(),
            readers: Vec::new(),
            reader_freed: Default::default(),
        });
        (dir, path, connections)
    }

    fn send<T: Send + 'static>(
        writer: &Writer,
        work: impl FnOnce(&Transaction<'_>) -> Result<T> + Send + 'static,
    ) -> oneshot::Receiver<Result<T>> {
        let (answer, answered) = oneshot::channel();
        writer
            .send(Box::new(Pending { work, answer }))
            .expect("the writer thread runs");
        answered
    }

    fn insert(tx: &Transaction<'_>, id: i64) -> Result<()> {
        tx.execute("INSERT INTO t (id) VALUES (?1)", [id])?;
        Ok(())
    }

    /// A write that inserts `id` and then fails, as a refused write does.
    fn failing(id: i64) -> impl FnOnce(&Transaction<'_>) -> Result<()> + Send + 'static {
        move |tx| {
            insert(tx, id)?;
            Err(StoreError::Conflict(format!("write {id}")))
        }
    }

    /// A write that inserts `id` and then panics.
    fn panicking(id: i64) -> impl FnOnce(&Transaction<'_>) -> Result<()> + Send + 'static {
        move |tx| {
            insert(tx, id)?;
            panic!("write {id} panics")
        }
    }

    fn ids(conn: &Connection) -> Vec<i64> {
        let mut stmt = conn
            .prepare("SELECT id FROM t ORDER BY id")
            .expect("a query");
        let rows = stmt.query_map([], |r| r.get(0)).expect("rows");
        rows.collect::<rusqlite::Result<_>>().expect("ids")
    }

    /// Writes queued while the writer is busy share its next transaction; each is kept or
    /// undone alone, and none is answered with a value before the transaction commits.
    #[test]
    fn queued_writes_share_a_commit_and_a_failed_one_is_undone_alone() {
        let (_dir, path, connections) = database();
        let writer = Writer::grouping(connections.clone(), UNTIMED).expect("the writer thread");
        // Holding the write connection keeps the thread from beginning until all are queued.
        let held = connections.writer.lock().expect("the write connection");
        let (go, gate) = std::sync::mpsc::channel::<()>();
        let (reached, under_way) = std::sync::mpsc::channel::<()>();
        let mut first = send(&writer, |tx| insert(tx, 1));
        let mut second = send(&writer, move |tx| {
            insert(tx, 2)?;
            reached.send(()).expect("the test waits for it");
            gate.recv().expect("the test lets it go on");
            Ok(())
        });
        let failed = send(&writer, failing(3));
        let panicked = send(&writer, panicking(4));
        let last = send(&writer, |tx| insert(tx, 5));
        drop(held);

        // The second write is under way, the first done but not committed: invisible to a
        // reader, and not answered.
        let reader = Connection::open(&path).expect("a reader");
        under_way.recv().expect("the second write runs");
        assert_eq!(ids(&reader), Vec::<i64>::new(), "nothing committed yet");
        assert!(matches!(first.try_recv(), Err(TryRecvError::Empty)));
        assert!(matches!(second.try_recv(), Err(TryRecvError::Empty)));

        go.send(()).expect("the second write waits");
        assert!(matches!(
            failed.blocking_recv().expect("an answer"),
            Err(StoreError::Conflict(_))
        ));
        assert!(
            panicked.blocking_recv().is_err(),
            "a write that panicked drops its answer, which its caller reports"
        );
        last.blocking_recv()
            .expect("an answer")
            .expect("the last write");
        first
            .blocking_recv()
            .expect("an answer")
            .expect("the first write");
        second
            .blocking_recv()
            .expect("an answer")
            .expect("the second write");
        assert_eq!(ids(&reader), vec![1, 2, 5]);

        // The thread goes on after a panic, and a write that finds it idle runs alone.
        send(&writer, |tx| insert(tx, 6))
            .blocking_recv()
            .expect("an answer")
            .expect("a later write");
        assert_eq!(ids(&reader), vec![1, 2, 5, 6]);
    }

    /// A transaction's first write runs without a savepoint: when it fails, the transaction is
    /// rolled back with nothing else in it, and the writes queued behind it still commit.
    #[test]
    fn a_failed_first_write_is_rolled_back_alone() {
        let (_dir, path, connections) = database();
        let writer = Writer::grouping(connections.clone(), UNTIMED).expect("the writer thread");
        let held = connections.writer.lock().expect("the write connection");
        let failed = send(&writer, failing(1));
        let panicked = send(&writer, panicking(2));
        let kept = send(&writer, |tx| insert(tx, 3));
        drop(held);
        assert!(matches!(
            failed.blocking_recv().expect("an answer"),
            Err(StoreError::Conflict(_))
        ));
        assert!(panicked.blocking_recv().is_err());
        kept.blocking_recv()
            .expect("an answer")
            .expect("the write behind them");
        let reader = Connection::open(&path).expect("a reader");
        assert_eq!(ids(&reader), vec![3]);
        drop(writer);
        assert_eq!(
            Arc::strong_count(&connections),
            1,
            "dropping the writer waits for its thread, which lets go of the connections"
        );
    }
}
