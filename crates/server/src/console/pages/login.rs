//! Logging in with an API token, and out.

use super::CsrfOnly;
use crate::auth::{AuthMode, MAX_SECRET_LEN};
use crate::console::{layout, same_origin, Console, Peer, Turned, Visitor};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use maud::{html, DOCTYPE};
use serde::Deserialize;
use sked_core::auth::Permission;

#[derive(Debug, Default, Deserialize)]
pub struct Next {
    #[serde(default)]
    next: String,
}

#[derive(Debug, Deserialize)]
pub struct Login {
    #[serde(default)]
    token: String,
    #[serde(default)]
    next: String,
}

/// Where to go after logging in: a path of this console, never another site
/// (`sked_core::web::return_path`).
fn safe_next(next: &str) -> &str {
    sked_core::web::return_path(next)
}

fn login_page(console: &Console, next: &str, error: Option<&str>) -> Response {
    let open = console.auth.mode() == AuthMode::Open;
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            (layout::head("Log in"))
            body.login {
                main #main {
                    h1 { "sked" }
                    form method="post" action="/login" {
                        label for="token" { "API token" }
                        input #token type="password" name="token" autocomplete="current-password"
                            required autofocus maxlength=(MAX_SECRET_LEN)
                            aria-invalid=[error.map(|_| "true")]
                            aria-describedby=[error.map(|_| "token-error")];
                        @if let Some(error) = error {
                            p #token-error .field-error role="alert" { (error) }
                        }
                        input type="hidden" name="next" value=(next);
                        button type="submit" { "Log in" }
                    }
                    p.hint {
                        "An admin makes tokens with " code { "sked token create" } "."
                        @if open {
                            " This development server needs none: "
                            a href="/" { "go in without one" } "."
                        }
                    }
                }
            }
        }
    };
    Html(markup.into_string()).into_response()
}

pub async fn form(State(console): State<Console>, Query(q): Query<Next>) -> Response {
    login_page(&console, safe_next(&q.next), None)
}

pub async fn submit(
    State(console): State<Console>,
    Peer(peer): Peer,
    headers: HeaderMap,
    Form(login): Form<Login>,
) -> Response {
    let next = safe_next(&login.next);
    if !same_origin(&headers) {
        return Turned::Forged.into_response();
    }
    let token = login.token.trim();
    let refuse = |message: &str| {
        console.auth.failed(peer, &Method::POST, "/login", message);
        let mut response = login_page(&console, next, Some(message));
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        response
    };
    if token.is_empty() || token.len() > MAX_SECRET_LEN {
        return refuse("enter an API token");
    }
    let authorization = format!("Bearer {token}");
    let caller = match console
        .auth
        .caller(Some(authorization.as_bytes()), peer, chrono::Utc::now())
        .await
    {
        Ok(caller) => caller,
        Err(refusal) if refusal.status == StatusCode::TOO_MANY_REQUESTS => {
            let mut response = login_page(&console, next, Some(&refusal.message));
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            if let Some(wait) = refusal.retry_after {
                response.headers_mut().insert(
                    header::RETRY_AFTER,
                    header::HeaderValue::from(wait.as_secs().max(1)),
                );
            }
            return response;
        }
        Err(refusal) => return refuse(&refusal.message),
    };
    if caller.permits(Permission::Read).is_err() {
        return refuse(&format!(
            "this is {} token: the console takes admin, editor and viewer tokens",
            caller.grant.role.with_article()
        ));
    }
    let session = console.sessions.seal(Some(token), chrono::Utc::now());
    let mut response = Redirect::to(next).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, console.sessions.set_cookie(&session));
    response
}

pub async fn logout(
    State(console): State<Console>,
    visitor: Visitor,
    Form(form): Form<CsrfOnly>,
) -> Response {
    if let Err(turned) = console.check_csrf(&visitor, &form.csrf) {
        return turned.into_response();
    }
    // The session ends on the server too, so a copy of the cookie opens nothing: every
    // session of the token made until now (see `session`).
    if let Some(token_id) = visitor.caller.token_id {
        if let Err(e) = console
            .auth
            .end_sessions(token_id, chrono::Utc::now())
            .await
        {
            let mut response = (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the logout could not be recorded, so the session is still open: {}",
                    e.message
                ),
            )
                .into_response();
            response
                .headers_mut()
                .insert(header::SET_COOKIE, console.sessions.clear_cookie());
            return response;
        }
    }
    let mut response = Redirect::to("/login").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, console.sessions.clear_cookie());
    response
}

#[cfg(test)]
mod tests {
    use super::safe_next;

    #[test]
    fn only_local_paths_are_followed_after_login() {
        assert_eq!(safe_next("/jobs?namespace=x"), "/jobs?namespace=x");
        assert_eq!(safe_next("//evil.example/"), "/");
        assert_eq!(safe_next("/\\evil.example"), "/");
        assert_eq!(safe_next("/\t/evil.example"), "/");
        assert_eq!(safe_next("https://evil.example/"), "/");
        assert_eq!(safe_next("/login?next=/"), "/");
        assert_eq!(safe_next(""), "/");
    }
}
