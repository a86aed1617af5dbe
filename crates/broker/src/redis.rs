//! Redis Streams: one managed connection per broker connection (it reconnects by itself),
//! opened on first use. A publish is one `XADD`; the entry id Redis answers is the success.

use crate::PublishError;
use redis::aio::ConnectionManager;
use sked_core::celery::{self, CeleryTarget, TaskState};
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

    /// Puts `target`'s Celery task message for `run` on its queue's list as kombu's Redis
    /// transport does (`LPUSH`; workers `BRPOP`); the list's new length is the success.
    pub async fn publish_celery(
        &self,
        target: &CeleryTarget,
        run: &RunContext<'_>,
    ) -> Result<(), PublishError> {
        if target.exchange.as_deref().is_some_and(|e| !e.is_empty()) {
            return Err(PublishError::Refused(
                "a Celery target through Redis publishes to its queue; `exchange` is for AMQP"
                    .to_string(),
            ));
        }
        let message = target.message(run);
        let routing_key = target.routing_key();
        let list = celery::redis_priority_queue(routing_key, message.priority);
        let mut connection = self.connection().await?;
        let _length: i64 = redis::cmd("LPUSH")
            .arg(&list)
            .arg(message.kombu_redis_envelope("", routing_key))
            .query_async(&mut connection)
            .await
            .map_err(|e| PublishError::Unreachable(format!("LPUSH {routing_key:?} failed: {e}")))?;
        Ok(())
    }

    /// Broadcasts Celery's `revoke` of `task_id` as kombu's Redis fanout does: a `PUBLISH`
    /// on the pidbox exchange's channel of the connection's database.
    pub async fn revoke_celery(&self, task_id: &str) -> Result<(), PublishError> {
        let db = redis::Client::open(self.url.as_str())
            .map(|client| client.get_connection_info().redis_settings().db())
            .unwrap_or(0);
        let message = celery::TaskMessage {
            id: task_id.to_string(),
            headers: serde_json::Map::new(),
            body: celery::revoke_command(task_id, true),
            priority: None,
        };
        let channel = format!("/{db}.{}", celery::PIDBOX_EXCHANGE);
        let mut connection = self.connection().await?;
        let _receivers: i64 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(message.kombu_redis_envelope(celery::PIDBOX_EXCHANGE, ""))
            .query_async(&mut connection)
            .await
            .map_err(|e| PublishError::Unreachable(format!("PUBLISH {channel:?} failed: {e}")))?;
        Ok(())
    }

    /// The state of Celery task `task_id` in this Redis result backend.
    pub async fn celery_task_state(&self, task_id: &str) -> Result<TaskState, PublishError> {
        let mut connection = self.connection().await?;
        let meta: Option<String> = redis::cmd("GET")
            .arg(format!("{}{task_id}", celery::RESULT_KEY_PREFIX))
            .query_async(&mut connection)
            .await
            .map_err(|e| PublishError::Unreachable(format!("reading the result failed: {e}")))?;
        Ok(celery::task_state(meta.as_deref()))
    }
}
