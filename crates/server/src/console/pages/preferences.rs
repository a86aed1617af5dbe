//! The visitor's display preferences: the zone the console shows instants in (UTC, the
//! browser's own zone, each job's schedule zone, or a zone they name). Kept in a cookie of
//! the visitor's (`clock::COOKIE`), never in the store: it is theirs, and changes nothing
//! anyone else sees.

use crate::console::clock::Zone;
use crate::console::layout::{self, refusal};
use crate::console::{Console, Visitor};
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use maud::html;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
pub struct Shown {
    #[serde(default)]
    saved: bool,
}

pub async fn form(
    State(console): State<Console>,
    visitor: Visitor,
    Query(shown): Query<Shown>,
) -> Response {
    page(&console, &visitor, shown.saved, None)
}

fn page(console: &Console, visitor: &Visitor, saved: bool, error: Option<&str>) -> Response {
    let zone = &visitor.clock.zone;
    let named = match zone {
        Zone::Named(tz) => tz.name(),
        _ => "",
    };
    let body = html! {
        @if saved { p.notice role="status" { "Saved: times read in " (zone.label()) "." } }
        @if let Some(error) = error { (refusal(error)) }
        form.preferences method="post" action="/preferences" {
            input type="hidden" name="csrf" value=(visitor.csrf);
            // Filled in by the script with the browser's zone.
            input #browser-zone type="hidden" name="browser_zone" value="";
            fieldset {
                legend { "Show times in" }
                label { input type="radio" name="zone" value="utc" checked[*zone == Zone::Utc]; " UTC" }
                label { input type="radio" name="zone" value="browser" checked[matches!(zone, Zone::Browser(_))];
                        " this browser's zone"
                        @if let Zone::Browser(tz) = zone { " (" (tz.name()) ")" } }
                label { input type="radio" name="zone" value="job" checked[*zone == Zone::Job];
                        " each job's own zone (its schedule's; UTC for the rest)" }
                label { input type="radio" name="zone" value="named" checked[matches!(zone, Zone::Named(_))];
                        " this zone: " }
                label.inline { span.visually-hidden { "Zone name" }
                    input name="named" value=(named) placeholder="Europe/Paris" maxlength="64"
                        autocomplete="off" aria-describedby="zone-hint"; }
                p.hint #zone-hint { "A name from the tz database, such as America/New_York." }
            }
            button type="submit" { "Save" }
        }
        p.hint { "Times show how long ago they were; hover one for the exact instant. "
                 "Now: " (visitor.clock.exact(Some(chrono::Utc::now()), None)) "." }
    };
    layout::page(console, visitor, "Preferences", body)
}

#[derive(Debug, Deserialize)]
pub struct Chosen {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    zone: String,
    #[serde(default)]
    browser_zone: String,
    #[serde(default)]
    named: String,
}

/// The zone a form chose, or what is wrong with it.
fn chosen(form: &Chosen) -> Result<Zone, String> {
    let parse = |name: &str, what: &str| {
        let name = name.trim();
        if name.is_empty() {
            return Err(format!("{what}: no zone given"));
        }
        Zone::parse(&format!("zone:{name}"))
            .and_then(|z| match z {
                Zone::Named(tz) => Some(tz),
                _ => None,
            })
            .ok_or_else(|| format!("{what}: {name:?} is not a zone of the tz database"))
    };
    match form.zone.as_str() {
        "utc" => Ok(Zone::Utc),
        "job" => Ok(Zone::Job),
        "browser" => parse(
            &form.browser_zone,
            "this browser's zone (the page's script tells it)",
        )
        .map(Zone::Browser),
        "named" => parse(&form.named, "the zone named").map(Zone::Named),
        other => Err(format!("{other:?} is not a choice of this form")),
    }
}

pub async fn save(
    State(console): State<Console>,
    visitor: Visitor,
    Form(form): Form<Chosen>,
) -> Response {
    if let Err(turned) = console.check_csrf(&visitor, &form.csrf) {
        return turned.into_response();
    }
    match chosen(&form) {
        Ok(zone) => {
            let mut response = Redirect::to("/preferences?saved=true").into_response();
            response
                .headers_mut()
                .append(header::SET_COOKIE, console.sessions.zone_cookie(&zone));
            visitor.finish(&console, response)
        }
        Err(message) => {
            let mut response = page(&console, &visitor, false, Some(&message));
            *response.status_mut() = axum::http::StatusCode::UNPROCESSABLE_ENTITY;
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(zone: &str, browser: &str, named: &str) -> Chosen {
        Chosen {
            csrf: String::new(),
            zone: zone.into(),
            browser_zone: browser.into(),
            named: named.into(),
        }
    }

    #[test]
    fn a_form_chooses_a_zone_of_the_tz_database_or_is_refused() {
        assert_eq!(chosen(&form("utc", "", "")), Ok(Zone::Utc));
        assert_eq!(chosen(&form("job", "", "")), Ok(Zone::Job));
        assert_eq!(
            chosen(&form("browser", "Europe/Paris", "")),
            Ok(Zone::Browser(chrono_tz::Tz::Europe__Paris))
        );
        assert_eq!(
            chosen(&form("named", "", " Asia/Tokyo ")),
            Ok(Zone::Named(chrono_tz::Tz::Asia__Tokyo))
        );
        assert!(chosen(&form("browser", "", "")).is_err());
        assert!(chosen(&form("named", "", "Mars/Olympus")).is_err());
        assert!(chosen(&form("named", "", "zone:Europe/Paris")).is_err());
        assert!(chosen(&form("moon", "", "")).is_err());
    }
}
