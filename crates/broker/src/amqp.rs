//! RabbitMQ: one connection and one confirming channel per broker connection, opened on first
//! use and again after it breaks. A publish is mandatory and waits for the broker's confirm:
//! an ack with nothing returned is the only success.

use crate::PublishError;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Confirmation;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use sked_core::celery::{self, CeleryTarget};
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
        let exchange = target.exchange.as_str();
        self.send(
            exchange,
            &routing_key,
            &render_payload(&target.payload, run),
            properties,
        )
        .await
    }

    /// Publishes `target`'s Celery task message for `run` (message protocol 2).
    pub async fn publish_celery(
        &self,
        target: &CeleryTarget,
        run: &RunContext<'_>,
    ) -> Result<(), PublishError> {
        let message = target.message(run);
        let mut headers = FieldTable::default();
        for (name, value) in &message.headers {
            headers.insert(name.as_str().into(), amqp_value(value));
        }
        let mut properties = BasicProperties::default()
            .with_headers(headers)
            .with_correlation_id(message.id.as_str().into())
            .with_content_type(celery::CONTENT_TYPE.into())
            .with_content_encoding(celery::CONTENT_ENCODING.into())
            .with_message_id(run.idempotency_key().into())
            .with_delivery_mode(2);
        if let Some(priority) = message.priority {
            properties = properties.with_priority(priority);
        }
        self.send(
            target.exchange(),
            target.routing_key(),
            &message.body,
            properties,
        )
        .await
    }

    /// Broadcasts Celery's `revoke` of `task_id` to every worker of the app (their pidbox
    /// exchange); nothing is returned when no worker listens.
    pub async fn revoke_celery(&self, task_id: &str) -> Result<(), PublishError> {
        let channel = self.channel().await?;
        let properties = BasicProperties::default()
            .with_content_type(celery::CONTENT_TYPE.into())
            .with_content_encoding(celery::CONTENT_ENCODING.into());
        let sent = channel
            .basic_publish(
                celery::PIDBOX_EXCHANGE.into(),
                "".into(),
                BasicPublishOptions::default(),
                &celery::revoke_command(task_id, true),
                properties,
            )
            .await;
        match sent {
            Ok(confirm) => match confirm.await {
                Ok(Confirmation::Nack(_)) => Err(PublishError::Refused(
                    "the broker refused the revoke (nack)".to_string(),
                )),
                Ok(_) => Ok(()),
                Err(e) => {
                    self.reset().await;
                    Err(PublishError::Unreachable(format!("the revoke failed: {e}")))
                }
            },
            Err(e) => {
                self.reset().await;
                Err(PublishError::Unreachable(format!("the revoke failed: {e}")))
            }
        }
    }

    /// A mandatory publish under confirms: an ack with nothing returned is the only success.
    async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let channel = self.channel().await?;
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let sent = channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                options,
                body,
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
                returned.reply_code, returned.reply_text, exchange
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

/// A JSON value as an AMQP field value: how Celery's headers (`None`, lists, numbers) travel.
fn amqp_value(value: &serde_json::Value) -> AMQPValue {
    use serde_json::Value;
    match value {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => AMQPValue::LongLongInt(i),
            (None, Some(f)) => AMQPValue::Double(f),
            (None, None) => AMQPValue::LongString(n.to_string().into()),
        },
        Value::String(text) => AMQPValue::LongString(text.as_str().into()),
        Value::Array(items) => {
            AMQPValue::FieldArray(items.iter().map(amqp_value).collect::<Vec<_>>().into())
        }
        Value::Object(map) => {
            let mut table = FieldTable::default();
            for (name, value) in map {
                table.insert(name.as_str().into(), amqp_value(value));
            }
            AMQPValue::FieldTable(table)
        }
    }
}
