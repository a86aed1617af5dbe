//! Redis Streams: one managed connection per broker connection (it reconnects by itself),
//! opened on first use. A publish is one `XADD`; the entry id Redis answers is the success.

use crate::PublishError;
use redis::aio::ConnectionManager;
use sked_core::publish::{render, render_payload, RedisStreamTarget, RunContext};
use tokio::sync::Mutex;

pub struct Redis {
    url: String,
    connection: Mutex<Option<ConnectionManager>>,
}

impl Redis {
    pub fn new(url: &str) -> Redis {
        Redis {
            url: url.to_string(),
            connection: Mutex::new(None),
        }
    }

    async fn connection(&self) -> Result<ConnectionManager, PublishError> {
        let mut connection = self.connection.lock().await;
        if let Some(open) = &*connection {
            return Ok(open.clone());
        }
        let client = redis::Client::open(self.url.as_str())
            .map_err(|e| PublishError::Unreachable(format!("bad connection: {e}")))?;
        let open = ConnectionManager::new(client)
            .await
            .map_err(|e| PublishError::Unreachable(format!("cannot connect: {e}")))?;
        *connection = Some(open.clone());
        Ok(open)
    }

    /// Whether the server answers a `PING`.
    pub async fn probe(&self) -> Result<(), PublishError> {
        let mut connection = self.connection().await?;
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
            .map(|_| ())
            .map_err(|e| PublishError::Unreachable(format!("PING failed: {e}")))
    }

    pub async fn publish(
        &self,
        target: &RedisStreamTarget,
        run: &RunContext<'_>,
    ) -> Result<(), PublishError> {
        let stream = render(&target.stream, run);
        let mut command = redis::cmd("XADD");
        command.arg(&stream);
        if let Some(maxlen) = target.maxlen {
            command.arg("MAXLEN").arg("~").arg(maxlen);
        }
        command.arg("*");
        for (name, value) in run.envelope() {
            command.arg(name).arg(value);
        }
        for (name, value) in &target.fields {
            command.arg(name).arg(value);
        }
        // Without a payload of its own, a run an event started sends the event's.
        if target.payload.is_some() || run.event.is_some() {
            let payload = target.payload.clone().unwrap_or_default();
            command.arg("payload").arg(render_payload(&payload, run));
        }
        let mut connection = self.connection().await?;
        let _id: String = command
            .query_async(&mut connection)
            .await
            .map_err(|e| PublishError::Unreachable(format!("XADD {stream:?} failed: {e}")))?;
        Ok(())
    }
}
