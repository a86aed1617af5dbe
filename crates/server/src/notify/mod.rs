//! The notifier: sends the notifications the store recorded when runs ended (and, on the node
//! holding the maintenance lease, first records those of runs that are late). Every node sends:
//! a claim keeps a notification to one node at a time, and one whose node died mid-send is due
//! again once its claim lapses. What a notification says and when a failed one is retried is
//! `sked_core::notify`'s; how it travels is [`webhook`]'s and [`email`]'s.

mod email;
mod webhook;

use crate::AppState;
use chrono::Utc;
use futures_util::StreamExt;
use sked_core::notify::{Channel, NotificationRecord, SendOutcome};
use sked_store::SendReport;
use std::time::Duration;
use tokio::sync::watch;

/// How often the notifier looks for due notifications.
const TICK: Duration = Duration::from_secs(1);
/// Notifications claimed at once.
const BATCH: u32 = 32;
/// Sends in flight at once.
const CONCURRENT: usize = 8;
/// One send, at most: a webhook's request or an email's SMTP exchange.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// A claim lasts this long: long past a batch's sends, so only a dead node's lapses.
const CLAIM: Duration = Duration::from_secs(120);

pub async fn run(state: AppState, mut shutdown: watch::Receiver<bool>) {
    let senders = match Senders::new(&state) {
        Ok(senders) => senders,
        Err(e) => {
            tracing::error!("notifications cannot be sent from this node: {e}");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = crate::stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(TICK) => {}
        }
        if *state.maintenance.borrow() {
            if let Err(e) = state.store.record_late_notifications(Utc::now()).await {
                tracing::warn!("cannot look for late runs: {e}");
            }
        }
        // A full batch says more are due: send them before sleeping again.
        while send_due(&state, &senders).await == BATCH as usize {
            if *shutdown.borrow() {
                return;
            }
        }
    }
}

/// Claims a batch of due notifications, sends them, records how it went; how many it claimed.
async fn send_due(state: &AppState, senders: &Senders) -> usize {
    let claimed = match state
        .store
        .claim_notifications(Utc::now(), CLAIM, BATCH)
        .await
    {
        Ok(claimed) => claimed,
        Err(e) => {
            tracing::warn!("cannot read due notifications: {e}");
            return 0;
        }
    };
    let count = claimed.len();
    let reports: Vec<(SendReport, NotificationRecord)> = futures_util::stream::iter(claimed)
        .map(|notification| async move {
            let outcome = senders.send(state, &notification).await;
            let report = SendReport {
                id: notification.id,
                claim: notification.claim,
                outcome,
            };
            (report, notification)
        })
        .buffer_unordered(CONCURRENT)
        .collect()
        .await;
    for (report, notification) in &reports {
        log_send(state, notification, &report.outcome);
    }
    let reports: Vec<SendReport> = reports.into_iter().map(|(r, _)| r).collect();
    if let Err(e) = state.store.finish_notifications(&reports, Utc::now()).await {
        // The claims lapse and the notifications are sent again: at least once.
        tracing::warn!("cannot record {} notification sends: {e}", reports.len());
    }
    count
}

/// A line per send that did not go through, and the count by outcome. The channel's address is
/// never logged: a webhook URL often holds a token.
fn log_send(state: &AppState, n: &NotificationRecord, outcome: &SendOutcome) {
    let gives_up = n.sends + 1 >= sked_core::notify::MAX_SENDS;
    let label = match outcome {
        SendOutcome::Sent => "sent",
        SendOutcome::Failed(_) if !gives_up => "retried",
        SendOutcome::Failed(_) | SendOutcome::Refused(_) => "failed",
    };
    state.metrics.notification_sent(n.event, label);
    let why = match outcome {
        SendOutcome::Sent => return,
        SendOutcome::Failed(why) | SendOutcome::Refused(why) => why,
    };
    let what = if label == "retried" {
        "will be retried"
    } else {
        "given up"
    };
    tracing::warn!(
        notification = n.id,
        namespace = %n.namespace,
        job = %n.job,
        run_id = n.run_id,
        event = %n.event,
        "notification {} of rule {} not sent ({what}): {why}",
        n.id,
        n.rule,
    );
}

/// The ways out: an HTTP client under the egress policy, and the SMTP relay if there is one.
struct Senders {
    webhook: webhook::Sender,
    email: Option<email::Sender>,
}

impl Senders {
    fn new(state: &AppState) -> Result<Senders, String> {
        let email = match &state.config.smtp {
            Some(relay) => Some(email::Sender::new(relay)?),
            None => None,
        };
        Ok(Senders {
            webhook: webhook::Sender::new(state.config.http_target_policy.clone())?,
            email,
        })
    }

    async fn send(&self, state: &AppState, notification: &NotificationRecord) -> SendOutcome {
        let sending = async {
            match &notification.channel {
                Channel::Webhook(hook) => self.webhook.send(state, notification, hook).await,
                Channel::Email(mail) => match &self.email {
                    Some(sender) => sender.send(notification, mail).await,
                    None => SendOutcome::Refused(
                        "no SMTP relay is configured (sked server --smtp-url)".to_string(),
                    ),
                },
            }
        };
        match tokio::time::timeout(SEND_TIMEOUT, sending).await {
            Ok(outcome) => outcome,
            Err(_) => SendOutcome::Failed(format!("no answer within {}s", SEND_TIMEOUT.as_secs())),
        }
    }
}
