//! The audit trail (what the visitor's token may read of it, filtered by actor, namespace,
//! object and time, each change shown as the fields it touched) and, for admins, the tokens.
//! Neither page shows a secret: the API never returns one after a token is made, and a
//! change's fields are redacted once more before they are shown (`console::diff`).

use super::{namespaces, refused};
use crate::console::api::query;
use crate::console::clock::Clock;
use crate::console::diff::{diff, Line};
use crate::console::layout;
use crate::console::{Console, Visitor};
use axum::extract::{Query, State};
use axum::response::Response;
use maud::{html, Markup};
use serde::Deserialize;
use sked_core::auth::TokenRecord;
use sked_core::records::AuditRecord;

/// Entries per page of the audit trail.
const AUDIT_PAGE: &str = "100";

/// The audit page's filters, as its form sends them (each may be empty).
#[derive(Debug, Default, Deserialize)]
pub struct Params {
    #[serde(default)]
    cursor: String,
    #[serde(default)]
    actor: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    object: String,
    /// `datetime-local` values, in the visitor's zone.
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
}

impl Params {
    /// The filters as the API's query, each time read in the visitor's zone.
    fn api_query(&self, clock: &Clock) -> Result<Vec<(&'static str, String)>, String> {
        let mut pairs = vec![("limit", AUDIT_PAGE.to_string())];
        for (key, value) in [
            ("actor", &self.actor),
            ("namespace", &self.namespace),
            ("object", &self.object),
            ("cursor", &self.cursor),
        ] {
            if !value.trim().is_empty() {
                pairs.push((key, value.trim().to_string()));
            }
        }
        for (key, value) in [("since", &self.since), ("until", &self.until)] {
            if !value.trim().is_empty() {
                let at = clock
                    .parse_local(value)
                    .map_err(|e| format!("{key}: {e}"))?;
                pairs.push((key, at.to_rfc3339()));
            }
        }
        Ok(pairs)
    }

    /// The filters, without the cursor, for the pager's links.
    fn filters(&self) -> Vec<(&'static str, &str)> {
        [
            ("actor", &self.actor),
            ("namespace", &self.namespace),
            ("object", &self.object),
            ("since", &self.since),
            ("until", &self.until),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k, v.as_str()))
        .collect()
    }
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
    let known = namespaces(&console, &visitor).await;
    let form = html! {
        form.filters method="get" action="/audit" {
            label { "Actor" input name="actor" value=(p.actor) maxlength="200" placeholder="token name"; }
            label { "Namespace"
                select name="namespace" {
                    option value="" { "all" }
                    @for ns in &known { option value=(ns) selected[*ns == p.namespace] { (ns) } }
                }
            }
            label { "Object" input name="object" value=(p.object) maxlength="200" placeholder="job name, run id"; }
            label { "From (" (visitor.clock.zone.label()) ")" input type="datetime-local" name="since" value=(p.since); }
            label { "Until" input type="datetime-local" name="until" value=(p.until); }
            button type="submit" { "Filter" }
            @if !p.filters().is_empty() { a href="/audit" { "Clear" } }
        }
    };
    let pairs = match p.api_query(&visitor.clock) {
        Ok(pairs) => pairs,
        Err(message) => {
            let body = html! { (form) (layout::refusal(&message)) };
            let mut response = layout::page(&console, &visitor, "Audit", body);
            *response.status_mut() = axum::http::StatusCode::BAD_REQUEST;
            return response;
        }
    };
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let path = format!("/api/v1/audit?{}", query(&pairs));
    let page: AuditPage = match console.api.get(visitor.who(), &path).await {
        Ok(page) => page,
        Err(failure) => return refused(&console, &visitor, "Audit", failure),
    };
    let older = page.next_cursor.as_ref().map(|cursor| {
        let mut pairs = p.filters();
        pairs.push(("cursor", cursor));
        format!("/audit?{}", query(&pairs))
    });
    let body = html! {
        (form)
        @if page.entries.is_empty() { p.empty { "No entry matches." } }
        div.table-wrap tabindex="0" { table.audit {
            thead { tr { th scope="col" { "When" } th scope="col" { "Who" } th scope="col" { "Action" }
                         th scope="col" { "Namespace" } th scope="col" { "Object" } th scope="col" { "From" }
                         th scope="col" { "Change" } } }
            tbody { @for e in &page.entries { tr {
                td { (visitor.clock.when(Some(e.entry.at))) } td { (e.entry.actor) } td { code { (e.entry.action) } }
                td { (e.entry.namespace.as_deref().unwrap_or_default()) }
                td { (e.entry.object.as_deref().unwrap_or_default()) }
                td { (e.entry.peer.as_deref().unwrap_or_default()) }
                td { (change(&e.entry)) }
            } } }
        } }
        nav.pager aria-label="Pages" {
            @if !p.cursor.is_empty() { a href={ "/audit?" (query(&p.filters())) } { "Newest" } }
            @if let Some(older) = &older { a rel="next" href=(older) { "Older" } }
        }
    };
    crate::console::layout::page(&console, &visitor, "Audit", body)
}

/// An entry's change to a definition, as the fields it touched (folded away: one line says how
/// many).
fn change(entry: &sked_core::records::AuditEntry) -> Markup {
    if entry.before.is_none() && entry.after.is_none() {
        return html! {};
    }
    let d = diff(entry.before.as_ref(), entry.after.as_ref());
    let count = d.lines.len() + d.left_out;
    html! {
        @if count == 0 { span.none { "no field changed" } }
        @else {
            details.diff {
                summary { (count) @if count == 1 { " field" } @else { " fields" } }
                ul.diff { @for line in &d.lines {
                    @match line {
                        Line::Added { path, value } => li.added { code { "+ " (path) ": " (value) } },
                        Line::Removed { path, value } => li.removed { code { "- " (path) ": " (value) } },
                        Line::Changed { path, from, to } => li.changed { code { "~ " (path) ": " (from) " → " (to) } },
                    }
                } }
                @if d.left_out > 0 { p.hint { "and " (d.left_out) " more" } }
            }
        }
    }
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
        div.table-wrap tabindex="0" { table.tokens {
            thead { tr { th scope="col" { "Name" } th scope="col" { "Role" } th scope="col" { "Namespaces" }
                         th scope="col" { "Shell" } th scope="col" { "Made" } th scope="col" { "Expires" }
                         th scope="col" { "Last used" } } }
            tbody { @for t in &list.tokens { tr {
                td { (t.name) } td { (t.grant.role.as_str()) } td { (t.grant.namespaces.join(", ")) }
                td { @if t.grant.shell { "yes" } } td { (visitor.clock.when(Some(t.created_at))) }
                td { (visitor.clock.when(t.expires_at)) } td { (visitor.clock.when(t.last_used_at)) }
            } } }
        } }
    };
    crate::console::layout::page(&console, &visitor, "Tokens", body)
}
