//! Checkpoints of the embedded store's WAL, on a thread of their own: copying the WAL back into
//! the database file, the fsyncs that make the copy durable, and ending each cycle of the WAL so
//! that it starts over from its beginning.
//!
//! Owns that thread and its pace. It never writes a row; the one thing it takes from the writer
//! is its lock, for the last pass of a cycle, so that nothing is appended while it ends.
//!
//! Why a cycle is ended here: SQLite's PASSIVE checkpoints copy the WAL without blocking the
//! writer, but only a checkpoint that reaches the WAL's last frame syncs the database and lets
//! the WAL start over. Under a writer that commits every millisecond none of the thread's passes
//! does, so the WAL grew until the writer's own auto-checkpoint ended it inside a commit, with a
//! sync of the WAL and of the database: 2–30 ms on a slow disk, several times a second. So once
//! the WAL is [`CYCLE_FRAMES`] long, this thread catches up unblocked (copying, then syncing the
//! database through a file handle of its own) and only then holds the writer for a pass that has
//! the last milliseconds' frames to copy and sync (docs/BENCHMARKS.md, "Checkpoints that end
//! their own cycles").

use super::owned_thread::OwnedThread;
use super::Connections;
use rusqlite::Connection;
use sked_core::throttle::Throttle;
use std::fs::File;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Weak;
use std::time::Duration;

/// The pause while the writer is mostly idle. Frequent passes keep each one's fsync short; while
/// the writer is mostly idle, few transactions meet one.
const PAUSE_LIGHT: Duration = Duration::from_millis(10);
/// The pause while the writer is busy, or nothing is written: a writer that never stops meets
/// every pass's fsync, so a hundred of them a second cost throughput; and an idle store is not
/// woken a hundred times a second.
const PAUSE_HEAVY: Duration = Duration::from_millis(100);
/// The share of the last pause the writer may have spent in transactions for writing to count
/// as light. At half, 1,000 runs a second with a worker counted as heavy some of the time (the
/// stalls themselves lengthen its transactions) and its firing p99 was 5.6–6.2 ms.
const LIGHT_WRITER_SHARE: f64 = 0.85;
/// WAL frames (pages) after which the thread ends the WAL's cycle. Each end holds the writer
/// for a pass with two syncs, and the WAL's restart costs the next commit a sync of its header:
/// three flushes of the disk on the writer's path, where a slow flush stalls every write. At
/// 1,000 instants a second with a worker the WAL grows by about 16,000 frames a second, so
/// cycles of 2,000 frames ended 8 times a second; 8,000 end 2 times. On a fast disk that left
/// 1,000 fires a second and 25,000 runs a second as they were, and took the p99 at 10,000 fires
/// a second from 2.1-5.8 ms to 1.2-1.6 ms (docs/BENCHMARKS.md, "The writer's share of the
/// syncs").
const CYCLE_FRAMES: i64 = 8_000;

/// Pages of WAL after which the writer's commit checkpoints by itself: a safety net for when
/// the thread fails or falls behind, kept past [`CYCLE_FRAMES`] so that it does not fire while
/// the thread keeps up: a busy writer appends more than another cycle's worth while the thread
/// catches up (the WAL reached 16,500 pages at 25,000 runs a second and 18,700 at 10,000 fires
/// a second, when the net at 5 cycles of 2,000 pages was passed at 11,400). The writer's own
/// checkpoint copies and syncs everything the thread has not inside a commit: at 20,000 pages
/// it cost 100-190 ms once the ledger held millions of runs, at 2,000 pages under 45 ms
/// (docs/BENCHMARKS.md, "The ledger alone as it grows").
pub(super) const WRITER_AUTOCHECKPOINT_PAGES: i64 = 4 * CYCLE_FRAMES;

/// What a PASSIVE checkpoint reports: the frames in the WAL, and how many of them are copied
/// back into the database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct WalFrames {
    log: i64,
    checkpointed: i64,
}

/// Why a pass failed; the thread reports it and the writer's auto-checkpoint stands in.
#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] rusqlite::Error),
    #[error("sync of the database file: {0}")]
    Sync(#[from] std::io::Error),
}

/// Nanoseconds the writer has spent in transactions, ever, for the thread's pace.
#[derive(Debug, Default)]
pub(super) struct WriterBusy(std::sync::atomic::AtomicU64);

impl WriterBusy {
    pub(super) fn add(&self, spent: Duration) {
        let nanos = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        self.0
            .fetch_add(nanos, std::sync::atomic::Ordering::Relaxed);
    }

    fn nanos(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// How long the thread pauses after a pass that found `now` (and the one before, `previous`),
/// when the writer spent `writer_share` of the last pause in transactions.
/// At 1,000 instants a second (each its own transaction, a worker's starts and completions
/// beside them; the writer about half busy) passes every 10 ms took the firing p99 from
/// 2.2–2.5 ms to 1.3 ms. A writer that never stops meets every pass's fsync, and at 25,000
/// runs a second passes every 10 ms recorded 8–18% fewer runs than every 100 ms
/// (docs/BENCHMARKS.md, "Batches that follow the commits").
fn pause_after(previous: WalFrames, now: WalFrames, writer_share: f64) -> Duration {
    let idle = now == previous && now.log == now.checkpointed;
    if idle || writer_share > LIGHT_WRITER_SHARE {
        PAUSE_HEAVY
    } else {
        PAUSE_LIGHT
    }
}

/// Whether a pass that found `now` (the one before having found `previous`) ends the WAL's
/// cycle: the WAL is long and was written since. A pass reports the WAL as it was when the pass
/// began, so even one that copied every frame it saw has not reached the end if the writer
/// appended meanwhile; only the pass under the writer's lock is sure to. If nothing was written
/// between two passes, the first reached the end, and an idle store is left alone.
fn ends_cycle(previous: WalFrames, now: WalFrames) -> bool {
    now.log >= CYCLE_FRAMES && now != previous
}

/// The checkpoint thread. Dropping it stops the thread and waits for it, so that its connection
/// closes with the store's others: the last connection to close merges the WAL into the
/// database and removes it.
pub(super) type Checkpointer = OwnedThread<()>;

/// Starts the thread on `conn`, a connection of its own to the database `db_file` is open on.
/// It stops when the returned [`Checkpointer`] is dropped, or when `connections` (for the
/// writer's lock and its busy time) is gone.
pub(super) fn spawn(
    conn: Connection,
    db_file: File,
    connections: Weak<Connections>,
) -> std::io::Result<Checkpointer> {
    OwnedThread::spawn("sked-sqlite-checkpoint", move |stopped| {
        keep_checkpointing(&conn, &db_file, &stopped, &connections)
    })
}

fn keep_checkpointing(
    conn: &Connection,
    db_file: &File,
    stopped: &Receiver<()>,
    connections: &Weak<Connections>,
) {
    // A pass that fails (a full disk) fails every time: report it with a count, not ten lines
    // a second.
    let mut throttle = Throttle::new(Duration::from_secs(10));
    let mut pause = PAUSE_HEAVY;
    let mut previous = WalFrames::default();
    let mut busy_before = None;
    loop {
        match stopped.recv_timeout(pause) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let Some(connections) = connections.upgrade() else {
            return;
        };
        match pass(conn, db_file, &connections, previous) {
            Ok(now) => {
                let busy = connections.writer_busy.nanos();
                let spent = busy.saturating_sub(busy_before.unwrap_or(busy));
                busy_before = Some(busy);
                let share = spent as f64 / pause.as_nanos().max(1) as f64;
                pause = pause_after(previous, now, share);
                previous = now;
                let unreported = throttle.reset();
                if unreported > 0 {
                    tracing::info!(
                        "sqlite checkpoints succeed again ({unreported} more had failed)"
                    );
                }
            }
            Err(e) => {
                pause = PAUSE_HEAVY;
                match throttle.admit(std::time::Instant::now()) {
                    Some(0) => tracing::warn!(
                        "sqlite checkpoint failed (the writer will checkpoint instead): {e}"
                    ),
                    Some(n) => tracing::warn!(
                        "sqlite checkpoint failed (the writer will checkpoint instead): {e} \
                         ({n} more failures since the last report)"
                    ),
                    None => {}
                }
            }
        }
    }
}

/// One pass: copy what can be copied and sync it; once the WAL is long, end its cycle.
fn pass(
    conn: &Connection,
    db_file: &File,
    connections: &Connections,
    previous: WalFrames,
) -> Result<WalFrames, PassError> {
    let now = passive(conn)?;
    if now != previous && now.checkpointed > 0 {
        // What SQLite syncs only at a cycle's end, synced now while the writer goes on, so
        // the end has little left to sync.
        db_file.sync_data()?;
    }
    if !ends_cycle(previous, now) {
        return Ok(now);
    }
    // Catch up with what was appended during that pass, still unblocked; then the pass under
    // the writer's lock has only the frames of the last few milliseconds.
    passive(conn)?;
    db_file.sync_data()?;
    let _writer = connections
        .writer
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    Ok(passive(conn)?)
}

fn passive(conn: &Connection) -> rusqlite::Result<WalFrames> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok(WalFrames {
            log: row.get(1)?,
            checkpointed: row.get(2)?,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn frames(log: i64, checkpointed: i64) -> WalFrames {
        WalFrames { log, checkpointed }
    }

    #[test]
    fn passes_are_frequent_while_the_writer_is_mostly_idle_and_not_otherwise() {
        let (before, after) = (frames(40, 40), frames(90, 90));
        assert_eq!(pause_after(before, after, 0.1), PAUSE_LIGHT);
        assert_eq!(pause_after(before, after, 0.9), PAUSE_HEAVY);
        let behind = frames(90, 60);
        assert_eq!(
            pause_after(behind, behind, 0.0),
            PAUSE_LIGHT,
            "frames still to copy"
        );
        assert_eq!(
            pause_after(after, after, 0.0),
            PAUSE_HEAVY,
            "nothing written since the last"
        );
    }

    #[test]
    fn a_cycle_is_ended_once_the_wal_is_long_and_was_written_since_the_last_pass() {
        let before = frames(CYCLE_FRAMES - 10, CYCLE_FRAMES - 10);
        assert!(!ends_cycle(before, frames(CYCLE_FRAMES - 1, 10)), "short");
        assert!(ends_cycle(before, frames(CYCLE_FRAMES, CYCLE_FRAMES - 1)));
        let copied = frames(CYCLE_FRAMES + 5, CYCLE_FRAMES + 5);
        assert!(
            ends_cycle(before, copied),
            "every frame the pass saw was copied, but the writer may have appended since"
        );
        assert!(
            !ends_cycle(copied, copied),
            "nothing written between two passes: the first reached the end"
        );
    }

    /// A writer that commits every fraction of a millisecond, with its own auto-checkpoint off:
    /// only the thread can end the WAL's cycles, and it must, or the WAL grows with every frame.
    #[test]
    fn the_thread_ends_the_wals_cycles_under_a_writer_that_never_pauses_for_long() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("cycles.db");
        let writer = Connection::open(&path).expect("the database");
        writer
            .pragma_update(None, "journal_mode", "WAL")
            .expect("WAL");
        writer
            .pragma_update(None, "synchronous", "NORMAL")
            .expect("synchronous");
        writer
            .pragma_update(None, "wal_autocheckpoint", 0)
            .expect("no auto-checkpoint");
        writer
            .execute("CREATE TABLE pages (id INTEGER PRIMARY KEY, body BLOB)", [])
            .expect("a table");
        let connections = Arc::new(Connections {
            writer: Mutex::new(writer),
            writer_busy: Default::default(),
            readers: Vec::new(),
            reader_freed: Default::default(),
        });
        let conn = Connection::open(&path).expect("the thread's connection");
        let db_file = File::open(&path).expect("the database file");
        let _stop = spawn(conn, db_file, Arc::downgrade(&connections)).expect("the thread");
        // At least sixteen pages a commit, and five cycles' worth of frames.
        const PAGES_PER_COMMIT: i64 = 16;
        let body = vec![7u8; PAGES_PER_COMMIT as usize * 4096 - 200];
        let mut largest_wal = 0;
        for i in 0..5 * CYCLE_FRAMES / PAGES_PER_COMMIT {
            {
                let conn = connections.writer.lock().expect("the writer");
                conn.execute(
                    "INSERT OR REPLACE INTO pages (id, body) VALUES (?1, ?2)",
                    rusqlite::params![i % 50, body],
                )
                .expect("a commit");
            }
            largest_wal = largest_wal
                .max(std::fs::metadata(dir.path().join("cycles.db-wal")).map_or(0, |m| m.len()));
            std::thread::sleep(Duration::from_micros(500));
        }
        let frame_bytes = 4096 + 24;
        let largest_frames = largest_wal / frame_bytes;
        assert!(
            largest_frames < 2 * CYCLE_FRAMES as u64,
            "the WAL reached {largest_frames} frames: its cycles were not ended"
        );
    }
}
