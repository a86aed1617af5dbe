//! RabbitMQ: one connection and one confirming channel per broker connection, opened on first
//! use and again after it breaks. A publish is mandatory and waits for the broker's confirm:
//! an ack with nothing returned is the only success.

use crate::PublishError;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Confirmation;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use sked_core::publish::{render, render_payload, AmqpTarget, RunContext};
use tokio::sync::Mutex;

/// AMQP short strings (exchange, routing key, header names) hold at most this many bytes.
const SHORT_STRING_MAX: usize = 255;

pub struct Amqp {
    url: String,
    open: Mutex<Option<(Connection, Channel)>>,
}

impl Amqp {
    pub fn new(url: &str) -> Amqp {
        Amqp {
            url: url.to_string(),
            open: Mutex::new(None),
        }
    }

    /// The confirming channel, opened (again) if there is none or it broke.
    async fn channel(&self) -> Result<Channel, PublishError> {
        let mut open = self.open.lock().await;
        if let Some((connection, channel)) = &*open {
            if connection.status().connected() && channel.status().connected() {
                return Ok(channel.clone());
            }
        }
        *open = None;
        let connection = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .map_err(|e| PublishError::Unreachable(format!("cannot connect: {e}")))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| PublishError::Unreachable(format!("cannot open a channel: {e}")))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| PublishError::Unreachable(format!("cannot turn on confirms: {e}")))?;
        *open = Some((connection, channel.clone()));
        Ok(channel)
    }

    /// Whether the broker is reachable: the open channel still works, or a new one opens.
    pub async fn probe(&self) -> Result<(), PublishError> {
        self.channel().await.map(|_| ())
    }

    /// Forgets the channel, so the next publish opens a new one.
    async fn reset(&self) {
        *self.open.lock().await = None;
    }

    pub async fn publish(
        &self,
        target: &AmqpTarget,
        run: &RunContext<'_>,
    ) -> Result<(), PublishError> {
        let routing_key = render(&target.routing_key, run);
        if routing_key.len() > SHORT_STRING_MAX {
            return Err(PublishError::Refused(format!(
                "the routing key is {} bytes once rendered; AMQP allows {SHORT_STRING_MAX}",
                routing_key.len()
            )));
        }
        let mut headers = FieldTable::default();
        let envelope = run.envelope();
        let pairs = envelope
            .iter()
            .map(|(name, value)| (*name, value.as_str()))
            .chain(target.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        for (name, value) in pairs {
            headers.insert(name.into(), AMQPValue::LongString(value.into()));
        }
        let properties = BasicProperties::default()
            .with_headers(headers)
            .with_message_id(run.idempotency_key().into())
            .with_delivery_mode(if target.persistent { 2 } else { 1 });
        let channel = self.channel().await?;
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let sent = channel
            .basic_publish(
                target.exchange.as_str().into(),
                routing_key.as_str().into(),
                options,
                &render_payload(&target.payload, run),
                properties,
            )
            .await;
        let confirm = match sent {
            Ok(confirm) => confirm.await,
            Err(e) => Err(e),
        };
        match confirm {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) => Err(PublishError::Refused(format!(
                "the broker could not route it to any queue ({} {}) from exchange {:?} with \
                 routing key {routing_key:?}",
                returned.reply_code, returned.reply_text, target.exchange
            ))),
            Ok(Confirmation::Nack(_)) => Err(PublishError::Refused(
                "the broker refused the message (nack)".to_string(),
            )),
            Ok(Confirmation::NotRequested) => Err(PublishError::Unreachable(
                "the channel did not confirm the message".to_string(),
            )),
            Err(e) => {
                // A channel error (an exchange that does not exist closes the channel) or a
                // broken connection: the next publish opens a new one.
                self.reset().await;
                Err(PublishError::Unreachable(format!(
                    "the publish failed: {e}"
                )))
            }
        }
    }
}
