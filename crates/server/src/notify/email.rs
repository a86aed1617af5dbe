//! Email notifications: a plain-text message through the SMTP relay the server is given. The
//! relay's URL may hold credentials, so no error here repeats it.

use crate::config::SmtpRelay;
use lettre::message::Mailbox;
use lettre::transport::smtp::AsyncSmtpTransport;
use lettre::{AsyncTransport, Message, Tokio1Executor};
use sked_core::notify::{Email, NotificationRecord, SendOutcome};

pub struct Sender {
    relay: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
}

impl Sender {
    pub fn new(relay: &SmtpRelay) -> Result<Sender, String> {
        let from: Mailbox = relay
            .from
            .parse()
            .map_err(|e| format!("--smtp-from {:?} is not an address: {e}", relay.from))?;
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(&relay.url)
            .map_err(|e| format!("--smtp-url is not an SMTP URL: {e}"))?
            .timeout(Some(super::SEND_TIMEOUT))
            .build();
        Ok(Sender {
            relay: transport,
            from,
        })
    }

    pub async fn send(&self, notification: &NotificationRecord, mail: &Email) -> SendOutcome {
        let (subject, body) = notification.message.email_text();
        let mut builder = Message::builder()
            .from(self.from.clone())
            .subject(subject)
            .message_id(Some(format!(
                "<sked-notification-{}@{}>",
                notification.id,
                self.from.email.domain()
            )));
        for to in &mail.to {
            match to.parse::<Mailbox>() {
                Ok(mailbox) => builder = builder.to(mailbox),
                Err(e) => return SendOutcome::Refused(format!("{to:?} is not an address: {e}")),
            }
        }
        let message = match builder.body(body) {
            Ok(message) => message,
            Err(e) => return SendOutcome::Refused(format!("cannot build the email: {e}")),
        };
        match self.relay.send(message).await {
            Ok(_) => SendOutcome::Sent,
            Err(e) if e.is_permanent() => {
                SendOutcome::Refused(format!("the SMTP relay refused it: {e}"))
            }
            Err(e) => SendOutcome::Failed(format!("the SMTP relay: {e}")),
        }
    }
}
