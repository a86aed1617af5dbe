//! The audit trail (what the visitor's token may read of it) and, for admins, the tokens.
//! Neither page shows a secret: the API never returns one after a token is made.

use super::refused;
use crate::console::api::query;
use crate::console::layout::when;
use crate::console::{Console, Visitor};
use axum::extract::{Query, State};
use axum::response::Response;
use maud::html;
use serde::Deserialize;
use sked_core::auth::TokenRecord;
use sked_core::records::AuditRecord;

#[derive(Debug, Default, Deserialize)]
pub struct Params {
    #[serde(default)]
    cursor: String,
}

#[derive(Deserialize)]
struct AuditPage {
    entries: Vec<AuditRecord>,
    next_cursor: Option<String>,
}

pub async fn audit(
    State(console): State<Console>,
    visitor: Visitor,
    Query(p): Query<Params>,
) -> Response {
    let path = format!(
        "/api/v1/audit?{}",
        query(&[("limit", "100"), ("cursor", &p.cursor)])
    );
    let page: AuditPage = match console.api.get(visitor.who(), &path).await {
        Ok(page) => page,
        Err(failure) => return refused(&console, &visitor, "Audit", failure),
    };
    let body = html! {
        div.table-wrap { table.audit {
            thead { tr { th scope="col" { "When" } th scope="col" { "Who" } th scope="col" { "Action" }
                         th scope="col" { "Namespace" } th scope="col" { "Object" } th scope="col" { "From" } } }
            tbody { @for e in &page.entries { tr {
                td { (when(Some(e.entry.at))) } td { (e.entry.actor) } td { code { (e.entry.action) } }
                td { (e.entry.namespace.as_deref().unwrap_or_default()) }
                td { (e.entry.object.as_deref().unwrap_or_default()) }
                td { (e.entry.peer.as_deref().unwrap_or_default()) }
            } } }
        } }
        nav.pager aria-label="Pages" {
            @if !p.cursor.is_empty() { a href="/audit" { "Newest" } }
            @if let Some(cursor) = &page.next_cursor {
                a rel="next" href={ "/audit?" (query(&[("cursor", cursor)])) } { "Older" }
            }
        }
    };
    crate::console::layout::page(&console, &visitor, "Audit", body)
}

#[derive(Deserialize)]
struct TokenList {
    tokens: Vec<TokenRecord>,
}

pub async fn tokens(State(console): State<Console>, visitor: Visitor) -> Response {
    let list: TokenList = match console.api.get(visitor.who(), "/api/v1/tokens").await {
        Ok(list) => list,
        Err(failure) => return refused(&console, &visitor, "Tokens", failure),
    };
    let body = html! {
        p.hint { "Make and revoke tokens with " code { "sked token create" } " and "
                 code { "sked token revoke" } "; a token's secret is shown once, when it is made." }
        div.table-wrap { table.tokens {
            thead { tr { th scope="col" { "Name" } th scope="col" { "Role" } th scope="col" { "Namespaces" }
                         th scope="col" { "Shell" } th scope="col" { "Made" } th scope="col" { "Expires" }
                         th scope="col" { "Last used" } } }
            tbody { @for t in &list.tokens { tr {
                td { (t.name) } td { (t.grant.role.as_str()) } td { (t.grant.namespaces.join(", ")) }
                td { @if t.grant.shell { "yes" } } td { (when(Some(t.created_at))) }
                td { (when(t.expires_at)) } td { (when(t.last_used_at)) }
            } } }
        } }
    };
    crate::console::layout::page(&console, &visitor, "Tokens", body)
}
