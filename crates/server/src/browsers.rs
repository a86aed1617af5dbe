//! What a web page in a visitor's browser can make this server do: nothing it was not built
//! to. A page of another site may send requests here (a form, `fetch` without CORS), and on an
//! open development server those need no token. So:
//!
//! - an open server answers only requests sent to a loopback name or address, or to its public
//!   URL's host ([`answer_own_hosts`]): a page that made its own name resolve to 127.0.0.1 (DNS
//!   rebinding) would otherwise read every answer;
//! - the API refuses a state-changing request whose `Origin` is not the server's own, and a
//!   body on a JSON route that is not `application/json` ([`refusal`]), which no page of
//!   another origin can send without a CORS preflight this server never grants.
//!
//! The rules are `sked_core::web`'s; this module applies them to requests.

use crate::api::ApiError;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use sked_core::web;

/// The server's own addresses as its configuration names them.
#[derive(Debug, Clone, Default)]
pub struct OwnAddress {
    /// The public URL's origin (`https://sked.example.com`), when one is configured.
    pub origin: Option<String>,
    /// The public URL's host.
    pub host: Option<String>,
}

impl OwnAddress {
    pub fn from_public_url(public_url: Option<&str>) -> OwnAddress {
        let Some(url) = public_url.and_then(|u| url::Url::parse(u).ok()) else {
            return OwnAddress::default();
        };
        OwnAddress {
            origin: Some(url.origin().ascii_serialization()).filter(|o| o != "null"),
            host: url
                .host_str()
                .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_string()),
        }
    }
}

/// What body a route reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// A JSON document (every route with a body but one).
    Json,
    /// Raw bytes: a worker's output chunks, sent as `application/octet-stream`.
    Bytes,
}

impl BodyKind {
    /// The body route `path` reads.
    pub fn of(path: &str) -> BodyKind {
        if path.starts_with("/api/v1/attempts/") {
            BodyKind::Bytes
        } else {
            BodyKind::Json
        }
    }
}

/// Methods that change nothing, which browsers send cross-origin freely and whose answers a
/// page of another origin cannot read.
fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// A state-changing request whose `Origin` is not the server's own (403): a page of another
/// site sent it. Clients that are not browsers send no `Origin` and are not concerned.
pub fn foreign_origin(method: &Method, headers: &HeaderMap, own: &OwnAddress) -> Option<ApiError> {
    if is_safe(method) {
        return None;
    }
    let origin = headers.get(header::ORIGIN)?;
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let own_origin = origin
        .to_str()
        .is_ok_and(|o| web::is_own_origin(o, host, own.origin.as_deref()));
    (!own_origin).then(|| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "foreign_origin",
            "this request was sent by a page of another site; the API takes changes only from \
             its own origin or from clients that send no Origin",
        )
    })
}

/// A body of another type than the route reads (415). A request without a body (none, or an
/// empty one) is not concerned, whatever type it names; a body without a type is refused, as a
/// browser sends one (a `Blob` without a type) without asking first.
pub fn wrong_body(method: &Method, headers: &HeaderMap, body: BodyKind) -> Option<ApiError> {
    if is_safe(method) {
        return None;
    }
    let declared_empty = headers
        .get(header::CONTENT_LENGTH)
        .is_some_and(|v| v.as_bytes() == b"0");
    let has_body = !declared_empty
        && (headers.contains_key(header::CONTENT_LENGTH)
            || headers.contains_key(header::TRANSFER_ENCODING));
    if !has_body {
        return None;
    }
    let wanted = match body {
        BodyKind::Json => "application/json",
        BodyKind::Bytes => "application/octet-stream",
    };
    let fitting = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|t| web::is_media_type(t, wanted));
    (!fitting).then(|| {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("this endpoint takes a body of type {wanted} (send `Content-Type: {wanted}`)"),
        )
        .with_field("body")
    })
}

/// On an open development server: answers a request only when its `Host` is a loopback name
/// or address or the public URL's host, and `421 Misdirected Request` otherwise.
pub async fn answer_own_hosts(
    axum::extract::State(own): axum::extract::State<OwnAddress>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        // HTTP/2 and absolute-form requests name their host in the URI.
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    if web::open_server_answers(host, own.host.as_deref()) {
        return next.run(request).await;
    }
    ApiError::new(
        StatusCode::MISDIRECTED_REQUEST,
        "misdirected_request",
        "this development server needs no token, so it answers only requests sent to a \
         loopback name or address (localhost, 127.0.0.1, [::1]) or to its --public-url",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn status(method: Method, pairs: &[(header::HeaderName, &str)], body: BodyKind) -> u16 {
        let headers = headers(pairs);
        foreign_origin(&method, &headers, &OwnAddress::default())
            .or_else(|| wrong_body(&method, &headers, body))
            .map_or(200, |e| e.status.as_u16())
    }

    #[test]
    fn foreign_origins_and_other_bodies_are_refused_before_anything_is_read() {
        let host = (header::HOST, "127.0.0.1:7070");
        let json = (header::CONTENT_TYPE, "application/json");
        let length = (header::CONTENT_LENGTH, "2");
        let evil = (header::ORIGIN, "http://evil.example");
        let own = (header::ORIGIN, "http://127.0.0.1:7070");
        let plain = (header::CONTENT_TYPE, "text/plain;charset=UTF-8");
        use BodyKind::{Bytes, Json};
        assert_eq!(
            status(
                Method::POST,
                &[host.clone(), json.clone(), length.clone()],
                Json
            ),
            200
        );
        assert_eq!(
            status(
                Method::POST,
                &[host.clone(), own.clone(), json.clone()],
                Json
            ),
            200
        );
        assert_eq!(
            status(
                Method::POST,
                &[host.clone(), evil.clone(), json.clone()],
                Json
            ),
            403
        );
        assert_eq!(
            status(Method::DELETE, &[host.clone(), evil.clone()], Json),
            403
        );
        assert_eq!(
            status(Method::GET, &[host.clone(), evil.clone()], Json),
            200
        );
        assert_eq!(
            status(
                Method::POST,
                &[host.clone(), plain.clone(), length.clone()],
                Json
            ),
            415
        );
        assert_eq!(
            status(Method::POST, &[host.clone(), length.clone()], Json),
            415
        );
        assert_eq!(
            status(Method::POST, std::slice::from_ref(&host), Json),
            200,
            "no body, no type"
        );
        assert_eq!(
            status(
                Method::POST,
                &[host.clone(), (header::CONTENT_LENGTH, "0")],
                Json
            ),
            200
        );
        let form = (header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        assert_eq!(
            status(
                Method::POST,
                &[host.clone(), form, (header::CONTENT_LENGTH, "0")],
                Json
            ),
            200,
            "an empty body of any type: `curl -X POST -d ''`"
        );
        let octets = (header::CONTENT_TYPE, "application/octet-stream");
        assert_eq!(
            status(
                Method::POST,
                &[host.clone(), octets.clone(), length.clone()],
                Bytes
            ),
            200
        );
        assert_eq!(
            status(Method::POST, &[host.clone(), plain, length.clone()], Bytes),
            415
        );
        assert_eq!(status(Method::POST, &[host, octets, length], Json), 415);
    }

    #[test]
    fn the_public_url_names_an_origin_and_a_host() {
        let own = OwnAddress::from_public_url(Some("https://Sked.Example.com:8443/base/"));
        assert_eq!(own.origin.as_deref(), Some("https://sked.example.com:8443"));
        assert_eq!(own.host.as_deref(), Some("sked.example.com"));
        let v6 = OwnAddress::from_public_url(Some("http://[fd00::1]:7070"));
        assert_eq!(v6.host.as_deref(), Some("fd00::1"));
        assert!(OwnAddress::from_public_url(None).origin.is_none());
    }
}
