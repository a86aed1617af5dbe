//! `/api/v1/notifications`: the notifications a namespace's jobs raised (`notify` rules), newest
//! first, with where each stands. A view names the channel's kind, never its address or
//! headers: a webhook URL often holds a token.

use super::extract::Query;
use super::jobs::check_limit;
use super::{ApiError, Namespace};
use crate::auth::Caller;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use sked_core::notify::{Channel, Message, NotificationRecord, NotificationState, NotifyEvent};
use sked_core::Instant;
use sked_store::NotificationQuery;

#[derive(Debug, Deserialize)]
pub struct ListParams {
    #[serde(default = "super::default_namespace")]
    namespace: String,
    job: Option<String>,
    state: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct NotificationView {
    pub id: i64,
    pub namespace: String,
    pub job: String,
    pub run_id: i64,
    pub event: NotifyEvent,
    /// The rule's place in the `notify` list it came from.
    pub rule: u32,
    /// `webhook` or `email`.
    pub channel: &'static str,
    pub state: NotificationState,
    pub sends: u32,
    pub last_error: Option<String>,
    pub created_at: Instant,
    /// When it is sent next, while pending.
    pub next_send_at: Option<Instant>,
    pub sent_at: Option<Instant>,
    /// What it says: the webhook's body.
    pub message: Message,
}

impl From<NotificationRecord> for NotificationView {
    fn from(n: NotificationRecord) -> Self {
        NotificationView {
            id: n.id,
            namespace: n.namespace,
            job: n.job,
            run_id: n.run_id,
            event: n.event,
            rule: n.rule,
            channel: match n.channel {
                Channel::Webhook(_) => "webhook",
                Channel::Email(_) => "email",
            },
            state: n.state,
            sends: n.sends,
            last_error: n.last_error,
            created_at: n.created_at,
            next_send_at: (n.state == NotificationState::Pending).then_some(n.next_send_at),
            sent_at: n.sent_at,
            message: n.message,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct NotificationPage {
    pub notifications: Vec<NotificationView>,
    pub next_cursor: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(p): Query<ListParams>,
) -> Result<Json<NotificationPage>, ApiError> {
    let wanted = p
        .state
        .as_deref()
        .map(|s| {
            NotificationState::parse(s).ok_or_else(|| {
                ApiError::invalid(
                    "state",
                    format!("{s:?} is not one of {}", NotificationState::one_of()),
                )
            })
        })
        .transpose()?;
    let query = NotificationQuery {
        namespace: Namespace {
            namespace: p.namespace,
        }
        .checked(&caller)?,
        job: p.job.filter(|j| !j.is_empty()),
        state: wanted,
        limit: check_limit(p.limit)?,
        cursor: p.cursor,
    };
    let page = state.store.list_notifications(&query).await?;
    Ok(Json(NotificationPage {
        notifications: page.items.into_iter().map(NotificationView::from).collect(),
        next_cursor: page.next_cursor,
    }))
}
