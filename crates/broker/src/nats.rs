//! NATS JetStream: one client per broker connection, opened on first use (the client then
//! reconnects by itself). A publish succeeds on the stream's ack; the message id is the run's
//! idempotency key, so JetStream drops a second publish of the same run within its duplicate
//! window and acks it as a duplicate.

use crate::PublishError;
use async_nats::jetstream;
use async_nats::HeaderMap;
use sked_core::publish::{render, render_payload, NatsTarget, RunContext, HEADER_NATS_MSG_ID};
use tokio::sync::Mutex;

pub struct Nats {
    url: String,
    context: Mutex<Option<(async_nats::Client, jetstream::Context)>>,
}

impl Nats {
    pub fn new(url: &str) -> Nats {
        Nats {
            url: url.to_string(),
            context: Mutex::new(None),
        }
    }

    async fn context(&self) -> Result<(async_nats::Client, jetstream::Context), PublishError> {
        let mut context = self.context.lock().await;
        if let Some(open) = &*context {
            return Ok(open.clone());
        }
        let client = async_nats::connect(&self.url)
            .await
            .map_err(|e| PublishError::Unreachable(format!("cannot connect: {e}")))?;
        let open = (client.clone(), jetstream::new(client));
        *context = Some(open.clone());
        Ok(open)
    }

    /// Whether the server is reachable: the client (which reconnects by itself) is connected.
    pub async fn probe(&self) -> Result<(), PublishError> {
        let (client, _) = self.context().await?;
        match client.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            state => Err(PublishError::Unreachable(format!(
                "the client is {state} (reconnecting)"
            ))),
        }
    }

    pub async fn publish(
        &self,
        target: &NatsTarget,
        run: &RunContext<'_>,
    ) -> Result<(), PublishError> {
        let subject = render(&target.subject, run);
        let mut headers = HeaderMap::new();
        for (name, value) in run.envelope() {
            headers.insert(name, value.as_str());
        }
        for (name, value) in &target.headers {
            headers.insert(name.as_str(), value.as_str());
        }
        headers.insert(HEADER_NATS_MSG_ID, run.idempotency_key().as_str());
        let (_, context) = self.context().await?;
        let ack = context
            .publish_with_headers(
                subject.clone(),
                headers,
                render_payload(&target.payload, run).into(),
            )
            .await
            .map_err(|e| PublishError::Unreachable(format!("cannot publish to {subject:?}: {e}")))?
            .await
            .map_err(|e| {
                PublishError::Refused(format!("no stream acknowledged {subject:?}: {e}"))
            })?;
        tracing::trace!(stream = %ack.stream, sequence = ack.sequence, duplicate = ack.duplicate, "published");
        Ok(())
    }
}
