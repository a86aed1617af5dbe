//! Change events between server nodes, over PostgreSQL's LISTEN/NOTIFY.
//!
//! A job's change is sent inside the transaction that writes it, so it is delivered if and
//! only if the write commits: a node firing from a stale definition would be wrong. Runs
//! entering or leaving the queue are announced by an [`Announcer`] just after their
//! transaction commits, a few writes at a time. PostgreSQL serialises the commits of every
//! transaction that notified (they queue on one lock while each flushes its WAL), so
//! announcing from the ledger's own transactions made every node's fires, starts and
//! completions wait on each other's commits. What an announcement saves is only a read: a
//! node that misses one (the writer stopped between its commit and the announcement) still
//! finds the run by its periodic sweep of runs queued for long.
//!
//! Each store tags what it sends with an origin of its own and ignores its own notifications:
//! the node that wrote already knows. The channel is named after the schema, so clusters in
//! different schemas of one database do not hear each other.
//!
//! A listener lives on a connection outside the pool. If that connection is lost, whatever was
//! sent meanwhile is gone, so after reconnecting the listener reports [`StoreEvent::Resync`].

use super::connection::Connector;
use super::{PgResult, Tx};
use crate::{Result, StoreError, StoreEvent, StoreEvents};
use deadpool_postgres::Pool;
use futures_util::StreamExt;
use std::fmt::Write;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_postgres::AsyncMessage;

/// Ids per notification: PostgreSQL caps a payload at 8,000 bytes.
const IDS_PER_NOTIFICATION: usize = 300;
/// Pause before connecting again after the listening connection was lost.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);
/// The least time between two of an announcer's sends: at a high rate of writes, each send
/// carries what many of them queued or started.
const ANNOUNCE_GAP: Duration = Duration::from_millis(5);
/// Tries of one send before its announcements are given up (the sweep finds those runs).
const ANNOUNCE_TRIES: u32 = 3;

/// Kinds on the wire: one letter each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    JobChanged,
    RunsQueued,
    RunsDequeued,
    /// A namespace's calendar or settings were written or deleted (its one id is 0: the
    /// receivers read every calendar and namespace setting their schedules meet again).
    ScheduleRulesChanged,
}

impl Kind {
    fn letter(self) -> char {
        match self {
            Kind::JobChanged => 'j',
            Kind::RunsQueued => 'q',
            Kind::RunsDequeued => 'd',
            Kind::ScheduleRulesChanged => 'c',
        }
    }
}

/// Where this store sends and listens, and the origin that marks its own notifications.
#[derive(Debug, Clone)]
pub struct Channel {
    pub name: String,
    pub origin: String,
}

impl Channel {
    pub fn for_schema(schema: &str) -> Channel {
        // Identifiers are cut at 63 bytes; a schema name that long is unlikely but must not
        // make LISTEN and NOTIFY disagree.
        let mut name = format!("sked.{schema}");
        while name.len() > 63 {
            name.pop();
        }
        Channel {
            name,
            origin: format!("{:016x}", rand::random::<u64>()),
        }
    }

    /// Sends `ids` of `kind` when the transaction commits.
    pub async fn notify(&self, tx: &Tx<'_>, kind: Kind, ids: &[i64]) -> PgResult<()> {
        let stmt = tx.prepare_cached("SELECT pg_notify($1, $2)").await?;
        for payload in self.payloads(kind, ids) {
            tx.execute(&stmt, &[&self.name, &payload]).await?;
        }
        Ok(())
    }

    /// The notifications that carry `ids` of `kind`, each within PostgreSQL's payload cap.
    fn payloads(&self, kind: Kind, ids: &[i64]) -> Vec<String> {
        ids.chunks(IDS_PER_NOTIFICATION)
            .map(|chunk| {
                let mut payload = format!("{} {}", self.origin, kind.letter());
                for (i, id) in chunk.iter().enumerate() {
                    let sep = if i == 0 { ' ' } else { ',' };
                    let _ = write!(payload, "{sep}{id}");
                }
                payload
            })
            .collect()
    }

    /// The event a notification carries; `None` for this store's own, or one it cannot read.
    fn parse(&self, payload: &str) -> Option<StoreEvent> {
        let mut parts = payload.splitn(3, ' ');
        let origin = parts.next()?;
        if origin == self.origin {
            return None;
        }
        let kind = parts.next()?;
        let ids: Vec<i64> = parts
            .next()?
            .split(',')
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()
            .ok()?;
        match kind {
            "j" => ids.first().map(|id| StoreEvent::JobChanged(*id)),
            "q" => Some(StoreEvent::RunsQueued(ids)),
            "d" => Some(StoreEvent::RunsDequeued(ids)),
            "c" => Some(StoreEvent::ScheduleRulesChanged),
            _ => None,
        }
    }
}

/// Announces runs queued and dequeued by this store, after their transactions committed. The
/// announcements of one store reach the other nodes in the order they were made.
#[derive(Debug, Clone)]
pub struct Announcer {
    queue: mpsc::UnboundedSender<(Kind, Vec<i64>)>,
}

impl Announcer {
    /// Starts the task that sends announcements over `pool`'s connections; it ends when the
    /// last copy of the announcer is dropped.
    pub fn start(pool: Pool, channel: Channel) -> Announcer {
        let (queue, pending) = mpsc::unbounded_channel();
        tokio::spawn(send_announcements(pool, channel, pending));
        Announcer { queue }
    }

    /// Announces `ids` of `kind`; the caller has committed the change they name.
    pub fn announce(&self, kind: Kind, ids: Vec<i64>) {
        if !ids.is_empty() {
            // The task only stops once every sender is gone, so this cannot fail while `self`
            // lives.
            let _ = self.queue.send((kind, ids));
        }
    }
}

/// Announcements waiting to be sent, in order; consecutive ones of a kind are merged (a run
/// queued, started and queued again must not be heard as started).
#[derive(Debug, Default, PartialEq)]
struct Batch(Vec<(Kind, Vec<i64>)>);

impl Batch {
    fn push(&mut self, kind: Kind, mut ids: Vec<i64>) {
        match self.0.last_mut() {
            Some((last, held)) if *last == kind => held.append(&mut ids),
            _ => self.0.push((kind, ids)),
        }
    }

    fn payloads(&self, channel: &Channel) -> Vec<String> {
        self.0
            .iter()
            .flat_map(|(kind, ids)| channel.payloads(*kind, ids))
            .collect()
    }
}

async fn send_announcements(
    pool: Pool,
    channel: Channel,
    mut pending: mpsc::UnboundedReceiver<(Kind, Vec<i64>)>,
) {
    let mut last_send = Instant::now() - ANNOUNCE_GAP;
    while let Some((kind, ids)) = pending.recv().await {
        tokio::time::sleep_until(last_send + ANNOUNCE_GAP).await;
        let mut batch = Batch::default();
        batch.push(kind, ids);
        while let Ok((kind, ids)) = pending.try_recv() {
            batch.push(kind, ids);
        }
        last_send = Instant::now();
        let payloads = batch.payloads(&channel);
        for tried in 1..=ANNOUNCE_TRIES {
            match send(&pool, &channel, &payloads).await {
                Ok(()) => break,
                Err(e) if tried < ANNOUNCE_TRIES => {
                    tracing::debug!("announcing runs to other nodes failed, trying again: {e}");
                    tokio::time::sleep(ANNOUNCE_GAP * 10).await;
                }
                Err(e) => tracing::warn!(
                    "announcing runs to other nodes failed; they will find them by sweeping: {e}"
                ),
            }
        }
    }
}

/// Sends `payloads` in one statement, so in one transaction and in order.
async fn send(pool: &Pool, channel: &Channel, payloads: &[String]) -> Result<()> {
    let client = super::pooled(pool).await?;
    let stmt = client
        .prepare_cached(
            "SELECT pg_notify($1, p) FROM unnest($2::text[]) WITH ORDINALITY AS u(p, n) ORDER BY n",
        )
        .await?;
    client.execute(&stmt, &[&channel.name, &payloads]).await?;
    Ok(())
}

/// Starts listening; returns once the first LISTEN is in place, so nothing committed after
/// this returns is missed.
pub async fn subscribe(connector: Connector, channel: Channel) -> Result<StoreEvents> {
    let (events, receiver) = mpsc::unbounded_channel();
    let (ready, listening) = oneshot::channel();
    tokio::spawn(listen(connector, channel, events, ready));
    match listening.await {
        Ok(Ok(())) => Ok(receiver),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(StoreError::Database(
            "the listener stopped before listening".into(),
        )),
    }
}

async fn listen(
    connector: Connector,
    channel: Channel,
    events: mpsc::UnboundedSender<StoreEvent>,
    ready: oneshot::Sender<Result<()>>,
) {
    let mut ready = Some(ready);
    loop {
        let ended = listen_once(&connector, &channel, &events, &mut ready).await;
        if let Some(first) = ready.take() {
            // The first connection failed: the caller hears why and decides.
            let _ = first.send(ended);
            return;
        }
        if events.is_closed() {
            return;
        }
        match ended {
            Ok(()) => tracing::warn!("the PostgreSQL listening connection closed; reconnecting"),
            Err(e) => {
                tracing::warn!("the PostgreSQL listening connection failed: {e}; reconnecting")
            }
        }
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
}

/// One listening connection, until it ends or nobody receives events any more.
async fn listen_once(
    connector: &Connector,
    channel: &Channel,
    events: &mpsc::UnboundedSender<StoreEvent>,
    ready: &mut Option<oneshot::Sender<Result<()>>>,
) -> Result<()> {
    let (client, mut connection) = connector.connect().await?;
    let (messages, mut incoming) = mpsc::unbounded_channel();
    // The connection is driven by polling its messages; notifications are passed on, and the
    // stream's end (or error) closes `incoming`.
    let driver = tokio::spawn(async move {
        let mut stream = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = stream.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if messages.send(n.payload().to_string()).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!("listening connection: {e}");
                    return;
                }
            }
        }
    });
    let quoted = format!("\"{}\"", channel.name.replace('"', "\"\""));
    let listened = client.batch_execute(&format!("LISTEN {quoted}")).await;
    if let Err(e) = listened {
        driver.abort();
        return Err(e.into());
    }
    match ready.take() {
        Some(first) => {
            let _ = first.send(Ok(()));
        }
        None => {
            if events.send(StoreEvent::Resync).is_err() {
                driver.abort();
                return Ok(());
            }
        }
    }
    while let Some(payload) = incoming.recv().await {
        if let Some(event) = channel.parse(&payload) {
            if events.send(event).is_err() {
                break;
            }
        }
    }
    driver.abort();
    drop(client);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_notifications_are_ignored_and_others_read() {
        let mine = Channel::for_schema("s");
        let other = Channel::for_schema("s");
        assert_eq!(mine.parse(&format!("{} q 1,2", mine.origin)), None);
        assert_eq!(
            mine.parse(&format!("{} q 1,2", other.origin)),
            Some(StoreEvent::RunsQueued(vec![1, 2]))
        );
        assert_eq!(
            mine.parse(&format!("{} j 7", other.origin)),
            Some(StoreEvent::JobChanged(7))
        );
        assert_eq!(
            mine.parse(&format!("{} d 9", other.origin)),
            Some(StoreEvent::RunsDequeued(vec![9]))
        );
        assert_eq!(mine.parse(&format!("{} x 1", other.origin)), None);
        assert_eq!(mine.parse(&format!("{} q 1,zz", other.origin)), None);
    }

    #[test]
    fn an_announcement_batch_keeps_the_order_of_kinds_and_merges_runs_of_one() {
        let mut batch = Batch::default();
        batch.push(Kind::RunsQueued, vec![1, 2]);
        batch.push(Kind::RunsQueued, vec![3]);
        batch.push(Kind::RunsDequeued, vec![2]);
        batch.push(Kind::RunsQueued, vec![2]);
        assert_eq!(
            batch,
            Batch(vec![
                (Kind::RunsQueued, vec![1, 2, 3]),
                (Kind::RunsDequeued, vec![2]),
                (Kind::RunsQueued, vec![2]),
            ])
        );
        let channel = Channel::for_schema("s");
        let listener = Channel::for_schema("s");
        let heard: Vec<_> = batch
            .payloads(&channel)
            .iter()
            .filter_map(|p| listener.parse(p))
            .collect();
        assert_eq!(
            heard,
            vec![
                StoreEvent::RunsQueued(vec![1, 2, 3]),
                StoreEvent::RunsDequeued(vec![2]),
                StoreEvent::RunsQueued(vec![2]),
            ]
        );
    }

    #[test]
    fn many_ids_are_split_within_the_payload_cap() {
        let channel = Channel::for_schema("s");
        let ids: Vec<i64> = (i64::MAX - 1000..i64::MAX).collect();
        let payloads = channel.payloads(Kind::RunsQueued, &ids);
        assert_eq!(payloads.len(), 4);
        assert!(payloads.iter().all(|p| p.len() < 8000));
    }

    #[test]
    fn long_schema_names_still_make_a_valid_channel() {
        let channel = Channel::for_schema(&"x".repeat(100));
        assert_eq!(channel.name.len(), 63);
    }
}
