//! The console's way to the HTTP API: each call goes through the API's own router in-process,
//! carrying the visitor's token and address, so the route table's permissions, the namespace
//! checks, the validation, the rate limit and the audit trail are exactly those every other
//! client meets. The console never reads the store.

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, Method, Request, StatusCode};
use axum::response::Response;
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::net::SocketAddr;
use tower_service::Service;

/// Largest API response the console reads into memory (a page of 1,000 runs is well under it).
const MAX_RESPONSE: usize = 16 * 1024 * 1024;

/// Who a call is made as: the visitor's token (none on an open development server) and address.
#[derive(Debug, Clone, Copy)]
pub struct As<'a> {
    pub token: Option<&'a str>,
    pub peer: Option<SocketAddr>,
}

/// An API refusal as the console shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    /// The field at fault (`schedule.cron`), for a form to show the message beside it.
    pub field: Option<String>,
}

impl Failure {
    fn internal(message: impl Into<String>) -> Failure {
        Failure {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal".into(),
            message: message.into(),
            field: None,
        }
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    code: String,
    message: String,
    field: Option<String>,
}

/// The API router, called in-process.
#[derive(Clone)]
pub struct Api {
    router: Router,
}

impl Api {
    pub fn new(router: Router) -> Api {
        Api { router }
    }

    /// The API's response to one request, untouched (for the log, which streams).
    pub async fn raw(
        &self,
        who: As<'_>,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Response {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = who.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = match body {
            Some(json) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Body::from(json.to_string())
            }
            None => Body::empty(),
        };
        let mut request = match request.body(body) {
            Ok(request) => request,
            Err(e) => {
                return axum::response::IntoResponse::into_response((
                    StatusCode::BAD_REQUEST,
                    format!("not a request the console can make: {e}"),
                ))
            }
        };
        if let Some(peer) = who.peer {
            request.extensions_mut().insert(ConnectInfo(peer));
        }
        let mut router = self.router.clone();
        // The router is always ready and never fails: its errors are responses.
        let ready = std::future::poll_fn(|cx| {
            <Router as Service<Request<Body>>>::poll_ready(&mut router, cx)
        })
        .await;
        match ready {
            Ok(()) => match router.call(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            },
            Err(never) => match never {},
        }
    }

    /// The API's answer as `T`, or its refusal.
    pub async fn call<T: DeserializeOwned>(
        &self,
        who: As<'_>,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, Failure> {
        let response = self.raw(who, method, path, body).await;
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), MAX_RESPONSE)
            .await
            .map_err(|e| Failure::internal(format!("cannot read the API's answer: {e}")))?;
        if !status.is_success() {
            return Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(ErrorBody { error }) => Failure {
                    status,
                    code: error.code,
                    message: error.message,
                    field: error.field,
                },
                Err(_) => Failure {
                    status,
                    code: "error".into(),
                    message: String::from_utf8_lossy(&bytes).into_owned(),
                    field: None,
                },
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            Failure::internal(format!(
                "the API answered {path} in an unexpected shape: {e}"
            ))
        })
    }

    pub async fn get<T: DeserializeOwned>(&self, who: As<'_>, path: &str) -> Result<T, Failure> {
        self.call(who, Method::GET, path, None).await
    }
}

/// A query string from pairs, each value percent-encoded; empty values are left out.
pub fn query(pairs: &[(&str, &str)]) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (key, value) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
        out.append_pair(key, value);
    }
    out.finish()
}

/// One path segment, percent-encoded.
pub fn segment(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}
