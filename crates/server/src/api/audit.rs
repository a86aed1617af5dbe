//! `/api/v1/audit`: the audit trail, newest first, as far as the caller's namespaces reach.
//! Entries without a namespace (tokens, failed authentications) are for admins only.

use super::extract::Query;
use super::jobs::check_limit;
use super::{ApiError, Namespace};
use crate::auth::Caller;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use sked_core::auth::Role;
use sked_core::records::AuditRecord;
use sked_core::Instant;
use sked_store::AuditQuery;

#[derive(Debug, Deserialize)]
pub struct AuditParams {
    namespace: Option<String>,
    object: Option<String>,
    actor: Option<String>,
    since: Option<Instant>,
    until: Option<Instant>,
    limit: Option<u32>,
    cursor: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct AuditPage {
    pub entries: Vec<AuditRecord>,
    pub next_cursor: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(p): Query<AuditParams>,
) -> Result<Json<AuditPage>, ApiError> {
    let namespace = p
        .namespace
        .filter(|n| !n.is_empty())
        .map(|namespace| Namespace { namespace }.checked(&caller))
        .transpose()?;
    let query = AuditQuery {
        visible: (!caller.all_namespaces()).then(|| caller.namespaces.clone()),
        namespace,
        object: p.object.filter(|o| !o.is_empty()),
        actor: p.actor.filter(|a| !a.is_empty()),
        since: p.since,
        until: p.until,
        limit: check_limit(p.limit)?,
        cursor: p.cursor,
    };
    let page = state.store.list_audit(&query).await?;
    // A non-admin token of every namespace still does not see entries without one (token
    // changes, refused authentications); its pages may come out short.
    let admin = caller.role == Role::Admin;
    Ok(Json(AuditPage {
        entries: page
            .items
            .into_iter()
            .filter(|e| admin || e.entry.namespace.is_some())
            .collect(),
        next_cursor: page.next_cursor,
    }))
}
