//! The page around every console page (navigation, who is logged in, log out) and the small
//! pieces pages share: times, durations, run states, forms that post with the CSRF token.

use super::{Console, Visitor};
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};
use sked_core::auth::Permission;
use sked_core::Instant;

/// A whole page for `visitor`, with the session cookie when it is new.
pub fn page(console: &Console, visitor: &Visitor, title: &str, body: Markup) -> Response {
    let nav = [
        ("/", "Overview", true),
        ("/jobs", "Jobs", true),
        ("/grid", "Grid", true),
        ("/workers", "Workers", true),
        ("/audit", "Audit", visitor.may(Permission::Read)),
        ("/tokens", "Tokens", visitor.is_admin()),
    ];
    let current = |href: &str| {
        if href == "/" {
            visitor.path == "/" || visitor.path.starts_with("/?")
        } else {
            visitor.path.starts_with(href)
        }
    };
    let zone = &visitor.clock.zone;
    let markup = html! {
        (DOCTYPE)
        html lang="en" data-zone=(zone.value()) {
            (head(title))
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    a.brand href="/" { "sked" }
                    nav aria-label="Main" {
                        @for (href, label, shown) in nav {
                            @if shown {
                                a href=(href) aria-current=[current(href).then_some("page")] { (label) }
                            }
                        }
                    }
                    form.search method="get" action="/search" role="search" {
                        label.visually-hidden for="search" { "Search jobs, runs and workers" }
                        input #search type="search" name="q" placeholder="Search  /" maxlength="200"
                            aria-keyshortcuts="/" autocomplete="off";
                    }
                    div.who {
                        a.zone href="/preferences" title="The zone times are shown in: change it" {
                            (zone.label())
                        }
                        span.token title="The token this console acts as" {
                            (visitor.caller.name) " · " (visitor.caller.grant.role.as_str())
                        }
                        @if visitor.caller.token_id.is_some() {
                            (post_button(visitor, "/logout", "Log out", "link"))
                        } @else {
                            a href="/login" { "Log in" }
                        }
                    }
                }
                main #main { h1 { (title) } (body) }
            }
        }
    };
    visitor.finish(console, Html(markup.into_string()).into_response())
}

/// The `<head>` of every console page: its title, the stylesheet, the icon and the script.
pub fn head(title: &str) -> Markup {
    head_with(title, None)
}

/// A page's `<head>` that moves on to `path` (a path of this console) as soon as it loads.
pub fn head_moving_to(title: &str, path: &str) -> Markup {
    head_with(title, Some(path))
}

fn head_with(title: &str, moving_to: Option<&str>) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            @if let Some(path) = moving_to {
                meta http-equiv="refresh" content=(format!("0;url={path}"));
            }
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · sked" }
            link rel="stylesheet" href="/assets/console.css";
            link rel="icon" href="/assets/favicon.svg" type="image/svg+xml";
            script src="/assets/console.js" defer {}
        }
    }
}

/// A button that posts to `action` with the CSRF token (and nothing else).
pub fn post_button(visitor: &Visitor, action: &str, label: &str, class: &str) -> Markup {
    html! {
        form.inline method="post" action=(action) {
            input type="hidden" name="csrf" value=(visitor.csrf);
            button type="submit" class=(class) { (label) }
        }
    }
}

/// Like [`post_button`], asking the visitor to confirm first (`console.js`).
pub fn confirmed_button(visitor: &Visitor, action: &str, label: &str, question: &str) -> Markup {
    html! {
        form.inline method="post" action=(action) data-confirm=(question) {
            input type="hidden" name="csrf" value=(visitor.csrf);
            button type="submit" class="danger" { (label) }
        }
    }
}

/// A duration in milliseconds, shortly.
pub fn millis(ms: f64) -> String {
    if !ms.is_finite() {
        return "—".into();
    }
    if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else if ms < 120_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else if ms < 7_200_000.0 {
        format!("{:.1} min", ms / 60_000.0)
    } else {
        format!("{:.1} h", ms / 3_600_000.0)
    }
}

/// How long from `from` to `to` (or to now, for something still running).
pub fn span(from: Option<Instant>, to: Option<Instant>) -> String {
    match from {
        Some(from) => {
            let to = to.unwrap_or_else(chrono::Utc::now);
            millis((to - from).num_milliseconds().max(0) as f64)
        }
        None => "—".into(),
    }
}

/// A state as a badge whose colour follows the state's meaning.
pub fn state(name: &str) -> Markup {
    let tone = match name {
        "succeeded" | "active" | "alive" => "good",
        "failed" | "timed_out" | "lost" => "bad",
        "running" | "queued" | "waiting" => "busy",
        _ => "quiet",
    };
    html! { span class={ "badge " (tone) } { (name.replace('_', " ")) } }
}

/// The message of a refused API call, shown above a page's content.
pub fn refusal(message: &str) -> Markup {
    html! { p.error role="alert" { (message) } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_their_unit() {
        assert_eq!(millis(12.4), "12 ms");
        assert_eq!(millis(1500.0), "1.5 s");
        assert_eq!(millis(600_000.0), "10.0 min");
        assert_eq!(millis(10_800_000.0), "3.0 h");
        assert_eq!(millis(f64::NAN), "—");
    }
}
