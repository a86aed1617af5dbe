//! Logging in with an API token or through an identity provider (OpenID Connect), and out.

use super::CsrfOnly;
use crate::auth::{AuthMode, MAX_SECRET_LEN};
use crate::console::{api, layout, same_origin, session, Console, Peer, Turned, Visitor};
use crate::oidc::{Flow, OidcError};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use maud::{html, DOCTYPE};
use serde::Deserialize;
use sked_core::auth::Permission;
use sked_core::identity;

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

/// What went wrong with the last try, shown beside the way it was tried.
enum Problem<'a> {
    None,
    Token(&'a str),
    Provider(&'a str),
}

/// The login page answered with `status`, saying what went wrong.
fn refused_page(
    console: &Console,
    next: &str,
    problem: Problem<'_>,
    status: StatusCode,
) -> Response {
    let mut response = login_page(console, next, problem);
    *response.status_mut() = status;
    response
}

fn login_page(console: &Console, next: &str, problem: Problem<'_>) -> Response {
    let open = console.auth.mode() == AuthMode::Open;
    let error = match problem {
        Problem::Token(message) => Some(message),
        _ => None,
    };
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            (layout::head("Log in"))
            body.login {
                main #main {
                    h1 { "sked" }
                    @if let Some(oidc) = &console.oidc {
                        p.sso {
                            a.button #sso href=(format!("/login/oidc?{}", api::query(&[("next", next)])))
                                aria-describedby=[matches!(problem, Problem::Provider(_)).then_some("sso-error")] {
                                "Log in with " (oidc.config.display_name)
                            }
                        }
                        @if let Problem::Provider(message) = problem {
                            p #sso-error .field-error role="alert" { (message) }
                        }
                        p.hint { "Or with an API token:" }
                    }
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
    login_page(&console, safe_next(&q.next), Problem::None)
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
        refused_page(
            &console,
            next,
            Problem::Token(message),
            StatusCode::UNAUTHORIZED,
        )
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
            let mut response = refused_page(
                &console,
                next,
                Problem::Token(&refusal.message),
                StatusCode::TOO_MANY_REQUESTS,
            );
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

/// The provider's answer when it sends a person back: a code, or an error.
#[derive(Debug, Deserialize)]
pub struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// Longest authorization code taken (providers send tens to hundreds of characters).
const MAX_CODE_LEN: usize = 4096;

/// Starts a login through the identity provider: to its login page, with what the callback
/// must check sealed in a cookie of this browser.
pub async fn oidc_start(State(console): State<Console>, Query(q): Query<Next>) -> Response {
    let next = safe_next(&q.next);
    let Some(oidc) = console.oidc.as_ref() else {
        return no_provider();
    };
    let flow = Flow::new(next, chrono::Utc::now(), session::FLOW_LIFETIME);
    match oidc.authorization_url(&flow).await {
        Ok(url) => {
            let mut response = Redirect::to(&url).into_response();
            response
                .headers_mut()
                .append(header::SET_COOKIE, console.sessions.flow_cookie(&flow));
            response
        }
        Err(e) => {
            tracing::warn!("a console login could not start: {e}");
            let problem = Problem::Provider(&e.to_string());
            refused_page(&console, next, problem, StatusCode::BAD_GATEWAY)
        }
    }
}

/// Where the provider sends the person back: the code becomes a session when the ID token
/// checks out and the person's groups give a role here.
pub async fn oidc_callback(
    State(console): State<Console>,
    Peer(peer): Peer,
    headers: HeaderMap,
    Query(callback): Query<Callback>,
) -> Response {
    let Some(oidc) = console.oidc.as_ref() else {
        return no_provider();
    };
    let now = chrono::Utc::now();
    let flow: Option<Flow> = console.sessions.open_flow(&headers);
    let next = flow
        .as_ref()
        .map_or("/", |f| safe_next(&f.next))
        .to_string();
    let refuse = |status: StatusCode, message: &str| {
        console
            .auth
            .failed(peer, &Method::GET, "/login/oidc/callback", message);
        let mut response = refused_page(&console, &next, Problem::Provider(message), status);
        response
            .headers_mut()
            .append(header::SET_COOKIE, console.sessions.clear_flow_cookie());
        response
    };
    let state = callback.state.as_deref().unwrap_or_default();
    let Some(flow) = flow.filter(|flow| flow.admits(state, now)) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "this login was not started in this browser, or was started more than ten \
             minutes ago: log in again",
        );
    };
    if let Some(error) = callback.error.as_deref() {
        let error: String = error.chars().filter(|c| !c.is_control()).take(64).collect();
        return refuse(
            StatusCode::UNAUTHORIZED,
            &OidcError::Refused(error).to_string(),
        );
    }
    let code = callback.code.as_deref().unwrap_or_default();
    if code.is_empty() || code.len() > MAX_CODE_LEN {
        return refuse(
            StatusCode::BAD_REQUEST,
            "the identity provider sent back no usable code: log in again",
        );
    }
    let person = match oidc.finish(&flow, code).await {
        Ok(person) => person,
        Err(e) => {
            tracing::warn!("a console login through the identity provider failed: {e}");
            let status = match e {
                OidcError::Provider(_) => StatusCode::BAD_GATEWAY,
                _ => StatusCode::UNAUTHORIZED,
            };
            return refuse(status, &e.to_string());
        }
    };
    let Some(grant) =
        identity::grant_for(&oidc.config.rules, person.groups.iter().map(String::as_str))
    else {
        let refusal = OidcError::NoRole {
            login: person.login.clone(),
        };
        tracing::info!("{refusal}");
        return refuse(StatusCode::FORBIDDEN, &refusal.to_string());
    };
    let lifetime = chrono::TimeDelta::from_std(oidc.config.session)
        .unwrap_or(session::LIFETIME)
        .min(session::LIFETIME);
    let secret = match console
        .auth
        .sign_in(&person, grant, lifetime, peer, now)
        .await
    {
        Ok(secret) => secret,
        Err(e) => return refuse(StatusCode::SERVICE_UNAVAILABLE, &e.message),
    };
    let session = console.sessions.seal(Some(&secret), now);
    // A page that moves on by itself rather than a redirect: the person arrived here from the
    // provider's site, and the session cookie (SameSite=Strict) is sent only with a request
    // this site starts.
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            (layout::head_moving_to("Logged in", &next))
            body.login {
                main #main {
                    h1 { "sked" }
                    p { "Logged in as " strong { (person.login) } "." }
                    p { a href=(next) { "Go on" } }
                }
            }
        }
    };
    let mut response = Html(markup.into_string()).into_response();
    let headers = response.headers_mut();
    headers.append(header::SET_COOKIE, console.sessions.set_cookie(&session));
    headers.append(header::SET_COOKIE, console.sessions.clear_flow_cookie());
    response
}

fn no_provider() -> Response {
    (
        StatusCode::NOT_FOUND,
        "this server logs people in with API tokens only (no --oidc-issuer)",
    )
        .into_response()
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
