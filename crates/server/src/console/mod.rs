//! The web console at `/`: server-rendered pages for people, with a little script for what
//! must be live (a run's output). Every page reads and changes sked through the same HTTP API
//! as every other client, called in-process with the visitor's token ([`api`]), so a page
//! shows and offers exactly what that token may see and do.
//!
//! This module owns sessions ([`session`]), page markup and the console's assets (embedded in
//! the binary; no build step). It holds no permission rule of its own and never touches the
//! store: what a token may do is the route table's to decide (`crate::api`).

mod api;
mod assets;
mod chart;
mod clock;
mod dag;
mod diff;
mod layout;
mod pages;
mod session;

use crate::auth::{AuthMode, Authenticator, Caller};
use crate::AppState;
use api::{Api, As};
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use sked_core::auth::{Permission, Role};
use std::net::SocketAddr;
use std::sync::Arc;

pub use session::Sessions;

/// Largest form a console page posts (a job definition is at most the API's 1 MiB, and a
/// form encodes it once more).
const MAX_FORM: usize = 3 * 1024 * 1024;
/// Largest login form: a token and the path to return to. It is read before anyone is known.
const MAX_LOGIN_FORM: usize = 16 * 1024;

/// What every console handler shares.
#[derive(Clone)]
pub(crate) struct Console {
    api: Api,
    sessions: Arc<Sessions>,
    auth: Arc<Authenticator>,
    /// The identity provider people may log in through, when one is configured.
    oidc: Option<Arc<crate::oidc::Oidc>>,
}

/// The console's routes, added beside the API's. `api` is the API router the pages call.
pub fn router(state: &AppState, api: Router) -> Router {
    let key = state
        .config
        .secret_key
        .as_ref()
        .map_or_else(rand::random, crate::secrets::SecretKey::sessions_key);
    let console = Console {
        api: Api::new(api),
        sessions: Arc::new(Sessions::new(key, state.config.tls.is_some())),
        auth: state.auth.clone(),
        oidc: state
            .config
            .oidc
            .clone()
            .map(|config| Arc::new(crate::oidc::Oidc::new(config))),
    };
    Router::new()
        .route("/", get(pages::overview::page))
        .route(
            "/login",
            get(pages::login::form)
                .post(pages::login::submit)
                .layer(axum::extract::DefaultBodyLimit::max(MAX_LOGIN_FORM)),
        )
        .route("/login/oidc", get(pages::login::oidc_start))
        .route("/login/oidc/callback", get(pages::login::oidc_callback))
        .route("/logout", post(pages::login::logout))
        .route("/jobs", get(pages::jobs::page))
        .route("/grid", get(pages::grid::page))
        .route(
            "/jobs/new",
            get(pages::job_form::new_form).post(pages::job_form::create),
        )
        .route("/jobs/{namespace}/{name}", get(pages::job::page))
        .route(
            "/jobs/{namespace}/{name}/edit",
            get(pages::job_form::edit_form).post(pages::job_form::update),
        )
        .route(
            "/jobs/{namespace}/{name}/{action}",
            post(pages::job::action),
        )
        .route("/graph", get(pages::graph::page))
        .route("/runs/{id}", get(pages::run::page))
        .route("/runs/{id}/output", get(pages::run::output))
        .route("/runs/{id}/cancel", post(pages::run::cancel))
        .route("/workers", get(pages::workers::page))
        .route("/search", get(pages::search::page))
        .route(
            "/preferences",
            get(pages::preferences::form).post(pages::preferences::save),
        )
        .route("/audit", get(pages::admin::audit))
        .route("/tokens", get(pages::admin::tokens))
        .route("/assets/{file}", get(assets::serve))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FORM))
        .layer(axum::middleware::from_fn(refuse_declared_oversize))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(console)
}

/// The person behind a console request: their session and the caller its token makes them.
pub(crate) struct Visitor {
    pub caller: Caller,
    session: session::Session,
    /// A session made for this request, whose cookie the response must set.
    fresh: bool,
    pub peer: Option<SocketAddr>,
    pub csrf: String,
    /// Where the request went, for coming back after a login.
    pub path: String,
    /// The visitor's display zone and the instant the page is made at.
    pub clock: clock::Clock,
}

impl Visitor {
    /// Who the visitor's API calls are made as.
    pub fn who(&self) -> As<'_> {
        As {
            token: self.session.token.as_deref(),
            peer: self.peer,
        }
    }

    /// Whether the visitor's token may call routes that need `permission` (in some
    /// namespace): pages offer only what it may do.
    pub fn may(&self, permission: Permission) -> bool {
        self.caller.permits(permission).is_ok()
    }

    pub fn is_admin(&self) -> bool {
        self.caller.grant.role == Role::Admin
    }

    /// Adds the session's cookie to a response when the session is new.
    pub fn finish(&self, console: &Console, mut response: Response) -> Response {
        if self.fresh {
            response.headers_mut().append(
                header::SET_COOKIE,
                console.sessions.set_cookie(&self.session),
            );
        }
        response
    }
}

/// A request the console turns away before any page runs.
pub(crate) enum Turned {
    /// No session (or one whose token no longer works): to the login page, ending the
    /// session's cookie with `clear` (the sessions' own `Set-Cookie`, so it keeps their
    /// attributes, `Secure` among them) when the request carried one.
    ToLogin {
        next: String,
        clear: Option<HeaderValue>,
    },
    /// A form posted from another origin or without its CSRF token.
    Forged,
}

impl IntoResponse for Turned {
    fn into_response(self) -> Response {
        match self {
            Turned::ToLogin { next, clear } => {
                let target = format!("/login?{}", api::query(&[("next", &next)]));
                let mut response = Redirect::to(&target).into_response();
                if let Some(clear) = clear {
                    response.headers_mut().insert(header::SET_COOKIE, clear);
                }
                response
            }
            Turned::Forged => (
                StatusCode::FORBIDDEN,
                "this form did not come from this console (stale page or another site): \
                 reload the page and send it again",
            )
                .into_response(),
        }
    }
}

impl FromRequestParts<Console> for Visitor {
    type Rejection = Turned;

    async fn from_request_parts(parts: &mut Parts, console: &Console) -> Result<Self, Turned> {
        let now = chrono::Utc::now();
        let peer = peer_of(parts);
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let (session, fresh) = match console.sessions.open(&parts.headers, now) {
            Some(session) => (session, false),
            None if console.auth.mode() == AuthMode::Open => {
                (console.sessions.seal(None, now), true)
            }
            None => {
                let clear = parts
                    .headers
                    .contains_key(header::COOKIE)
                    .then(|| console.sessions.clear_cookie());
                return Err(Turned::ToLogin { next: path, clear });
            }
        };
        let authorization = session.token.as_ref().map(|t| format!("Bearer {t}"));
        let caller = console
            .auth
            .caller(authorization.as_deref().map(str::as_bytes), peer, now)
            .await
            .ok()
            .filter(|caller| !session.ended_by(caller.sessions_ended_at))
            .ok_or_else(|| Turned::ToLogin {
                next: path.clone(),
                clear: Some(console.sessions.clear_cookie()),
            })?;
        if caller.token_id.is_some() {
            crate::http::vouch(&parts.extensions);
        }
        if parts.method != Method::GET && !same_origin(&parts.headers) {
            return Err(Turned::Forged);
        }
        let csrf = console.sessions.csrf(&session);
        let zone = session::cookie_value(&parts.headers, clock::COOKIE)
            .and_then(clock::Zone::parse)
            .unwrap_or_default();
        Ok(Visitor {
            caller,
            session,
            fresh,
            peer,
            csrf,
            path,
            clock: clock::Clock::new(zone, now),
        })
    }
}

/// The address a request came from, when the listener recorded it.
fn peer_of(parts: &Parts) -> Option<SocketAddr> {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
}

/// The address a request came from, for handlers without a [`Visitor`] (the login form).
pub(crate) struct Peer(pub Option<SocketAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Peer(peer_of(parts)))
    }
}

/// A form's request came from this console: its `Origin`, when the browser sent one, names
/// the host the request was sent to. (The CSRF token is checked as well.)
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let authority = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, authority)| authority);
    matches!((authority, host), (Some(a), Some(h)) if a.eq_ignore_ascii_case(h))
}

impl Console {
    /// Checks a posted form's CSRF token against the visitor's session.
    pub(crate) fn check_csrf(&self, visitor: &Visitor, given: &str) -> Result<(), Turned> {
        if self.sessions.csrf_matches(&visitor.session, given) {
            Ok(())
        } else {
            Err(Turned::Forged)
        }
    }
}

/// Refuses a form whose declared length is over its route's limit before reading any of it
/// (a login is read before anyone is known, so it is not drained either).
async fn refuse_declared_oversize(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let limit = if request.uri().path() == "/login" {
        MAX_LOGIN_FORM
    } else {
        MAX_FORM
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        let mut response = (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("this form is larger than the limit of {limit} bytes"),
        )
            .into_response();
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    next.run(request).await
}

/// Headers every console response carries: nothing but this origin may run, be fetched, be
/// framed or receive a form, and nothing is cached.
async fn security_headers(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
