//! Change events between server nodes, over PostgreSQL's LISTEN/NOTIFY.
//!
//! A write that other nodes may hold a copy of (a job's definition, a run entering or leaving
//! the queue) sends a notification inside its own transaction, so it is delivered if and only
//! if the write commits. Each store tags what it sends with an origin of its own and ignores
//! its own notifications: the node that wrote already knows. The channel is named after the
//! schema, so clusters in different schemas of one database do not hear each other.
//!
//! A listener lives on a connection outside the pool. If that connection is lost, whatever was
//! sent meanwhile is gone, so after reconnecting the listener reports [`StoreEvent::Resync`].

use super::{PgResult, Tx};
use crate::{Result, StoreError, StoreEvent, StoreEvents};
use futures_util::StreamExt;
use std::fmt::Write;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::{AsyncMessage, NoTls};

/// Ids per notification: PostgreSQL caps a payload at 8,000 bytes.
const IDS_PER_NOTIFICATION: usize = 300;
/// Pause before connecting again after the listening connection was lost.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// Kinds on the wire: one letter each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    JobChanged,
    RunsQueued,
    RunsDequeued,
}

impl Kind {
    fn letter(self) -> char {
        match self {
            Kind::JobChanged => 'j',
            Kind::RunsQueued => 'q',
            Kind::RunsDequeued => 'd',
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
        if ids.is_empty() {
            return Ok(());
        }
        let stmt = tx.prepare_cached("SELECT pg_notify($1, $2)").await?;
        for chunk in ids.chunks(IDS_PER_NOTIFICATION) {
            let mut payload = format!("{} {}", self.origin, kind.letter());
            for (i, id) in chunk.iter().enumerate() {
                let sep = if i == 0 { ' ' } else { ',' };
                let _ = write!(payload, "{sep}{id}");
            }
            tx.execute(&stmt, &[&self.name, &payload]).await?;
        }
        Ok(())
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
            _ => None,
        }
    }
}

/// Starts listening; returns once the first LISTEN is in place, so nothing committed after
/// this returns is missed.
pub async fn subscribe(config: tokio_postgres::Config, channel: Channel) -> Result<StoreEvents> {
    let (events, receiver) = mpsc::unbounded_channel();
    let (ready, listening) = oneshot::channel();
    tokio::spawn(listen(config, channel, events, ready));
    match listening.await {
        Ok(Ok(())) => Ok(receiver),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(StoreError::Database(
            "the listener stopped before listening".into(),
        )),
    }
}

async fn listen(
    config: tokio_postgres::Config,
    channel: Channel,
    events: mpsc::UnboundedSender<StoreEvent>,
    ready: oneshot::Sender<Result<()>>,
) {
    let mut ready = Some(ready);
    loop {
        let ended = listen_once(&config, &channel, &events, &mut ready).await;
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
    config: &tokio_postgres::Config,
    channel: &Channel,
    events: &mpsc::UnboundedSender<StoreEvent>,
    ready: &mut Option<oneshot::Sender<Result<()>>>,
) -> Result<()> {
    let (client, mut connection) = config.connect(NoTls).await?;
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
    fn long_schema_names_still_make_a_valid_channel() {
        let channel = Channel::for_schema(&"x".repeat(100));
        assert_eq!(channel.name.len(), 63);
    }
}
