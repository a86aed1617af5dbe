//! Console sessions: a login turns an API token into a cookie, and each console request turns
//! the cookie back into that token.
//!
//! The cookie is the token and an expiry, sealed with AES-256-GCM under a key derived from the
//! server's secret key, so any node of a cluster opens a cookie another node made and nothing
//! is stored. A server configured without a secret key (an embedded server, as the benchmarks
//! start) seals with a key of its own process, and its sessions end when it stops. The token
//! is checked again on every request (`crate::auth`), so revoking it ends its sessions within
//! the token cache's half second. A cookie also says when it was made: a logout records its
//! instant with the token in the store (`Store::end_sessions`), and a session made at or
//! before it is over on every node within that same half second, at no cost per request (the
//! instant is read with the token).
//!
//! Forms carry a CSRF token: an HMAC of the session cookie, which a page of another origin can
//! neither read nor compute. The cookie is `HttpOnly` and `SameSite=Strict` besides.
//!
//! A login through an identity provider keeps what it must check when the person comes back
//! (state, nonce, PKCE verifier) in a cookie of its own, sealed the same way under a different
//! purpose, so nothing is stored for it either.
//!
//! This module owns cookies and CSRF tokens only; what a token may do is the API's to decide.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use axum::http::{HeaderMap, HeaderValue};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The session cookie's name.
pub const COOKIE: &str = "sked_session";
/// How long a login lasts (the token's own expiry applies too).
pub const LIFETIME: chrono::TimeDelta = chrono::TimeDelta::hours(12);
/// The cookie of a login through an identity provider under way.
pub const FLOW_COOKIE: &str = "sked_oidc";
/// How long a person may take at the identity provider.
pub const FLOW_LIFETIME: chrono::TimeDelta = chrono::TimeDelta::minutes(10);
/// Longest cookie value opened: a sealed token is about 150 characters, a login under way
/// about 400.
const MAX_COOKIE_LEN: usize = 1024;
/// What each sealed cookie is bound to (GCM's associated data). Sessions have none, as
/// before flow cookies existed, so their cookies still open.
const SESSION_AAD: &[u8] = b"";
const FLOW_AAD: &[u8] = b"sked oidc flow v1";
const NONCE_LEN: usize = 12;

/// What a cookie holds once opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Sealed {
    /// The API token; `None` for a visitor of an open development server who did not log in.
    token: Option<String>,
    /// Unix seconds after which the cookie is refused.
    expires: i64,
    /// Unix microseconds at which the session was made: a logout of its token at or after
    /// this ends it. (0 in cookies made before this was kept: any logout ends those.)
    #[serde(default)]
    issued: i64,
}

/// An opened session.
#[derive(Clone, PartialEq, Eq)]
pub struct Session {
    /// The API token its requests carry; `None`: none (an open development server).
    pub token: Option<String>,
    /// When it was made, in Unix microseconds.
    pub issued: i64,
    /// The cookie's value, which the CSRF token is derived from.
    cookie: String,
}

impl Session {
    /// Whether a logout of its token at `ended` (`sked_store::Store::end_sessions`) ended it.
    pub fn ended_by(&self, ended: Option<chrono::DateTime<chrono::Utc>>) -> bool {
        ended.is_some_and(|at| self.issued <= at.timestamp_micros())
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Seals and opens session cookies, and makes and checks CSRF tokens.
pub struct Sessions {
    cipher: Aes256Gcm,
    csrf_key: [u8; 32],
    /// Whether cookies are sent only over HTTPS (the server speaks TLS).
    secure: bool,
}

type HmacSha256 = Hmac<Sha256>;

impl Sessions {
    pub fn new(key: [u8; 32], secure: bool) -> Sessions {
        let csrf_key = Sha256::new()
            .chain_update(b"sked console csrf v1\0")
            .chain_update(key)
            .finalize()
            .into();
        Sessions {
            cipher: Aes256Gcm::new(&key.into()),
            csrf_key,
            secure,
        }
    }

    /// A new session for `token`, as the cookie's value.
    pub fn seal(&self, token: Option<&str>, now: chrono::DateTime<chrono::Utc>) -> Session {
        let sealed = Sealed {
            token: token.map(str::to_string),
            expires: (now + LIFETIME).timestamp(),
            issued: now.timestamp_micros(),
        };
        // Serialising a struct of a string and a number cannot fail.
        let clear = serde_json::to_vec(&sealed).unwrap_or_default();
        let cookie = self.seal_bytes(&clear, SESSION_AAD);
        Session {
            token: sealed.token,
            issued: sealed.issued,
            cookie,
        }
    }

    /// The session a request's cookie holds, if it opens and has not expired.
    pub fn open(&self, headers: &HeaderMap, now: chrono::DateTime<chrono::Utc>) -> Option<Session> {
        let cookie = cookie_value(headers, COOKIE)?;
        let clear = self.open_bytes(cookie, SESSION_AAD)?;
        let sealed: Sealed = serde_json::from_slice(&clear).ok()?;
        if sealed.expires <= now.timestamp() {
            return None;
        }
        Some(Session {
            token: sealed.token,
            issued: sealed.issued,
            cookie: cookie.to_string(),
        })
    }

    /// Encrypts `clear` for a cookie, bound to `aad` (what the cookie is for), so a value
    /// sealed for one cookie never opens as another.
    fn seal_bytes(&self, clear: &[u8], aad: &[u8]) -> String {
        let nonce: [u8; NONCE_LEN] = rand::random();
        // Encryption fails only past GCM's input limit, far above a cookie's length.
        let ciphertext = self
            .cipher
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: clear, aad })
            .unwrap_or_default();
        let mut bytes = nonce.to_vec();
        bytes.extend(ciphertext);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// What [`Sessions::seal_bytes`] sealed for `aad`, if `cookie` is that and untouched.
    fn open_bytes(&self, cookie: &str, aad: &[u8]) -> Option<Vec<u8>> {
        if cookie.len() > MAX_COOKIE_LEN {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(cookie).ok()?;
        if bytes.len() <= NONCE_LEN {
            return None;
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        self.cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad,
                },
            )
            .ok()
    }

    /// The `Set-Cookie` value that carries a login through an identity provider while the
    /// person is away at it: sealed, for `/login/oidc` only, for [`FLOW_LIFETIME`]. It is
    /// `SameSite=Lax`, not `Strict`: the provider sends the person back with a navigation
    /// from its own site, which a strict cookie would not come with.
    pub fn flow_cookie<T: Serialize>(&self, flow: &T) -> HeaderValue {
        let clear = serde_json::to_vec(flow).unwrap_or_default();
        let value = self.seal_bytes(&clear, FLOW_AAD);
        self.flow_cookie_header(&value, FLOW_LIFETIME.num_seconds())
    }

    /// The login a request's flow cookie carries, if it opens.
    pub fn open_flow<T: serde::de::DeserializeOwned>(&self, headers: &HeaderMap) -> Option<T> {
        let cookie = cookie_value(headers, FLOW_COOKIE)?;
        serde_json::from_slice(&self.open_bytes(cookie, FLOW_AAD)?).ok()
    }

    /// The `Set-Cookie` value that ends a flow cookie (the login came back, either way).
    pub fn clear_flow_cookie(&self) -> HeaderValue {
        self.flow_cookie_header("", 0)
    }

    fn flow_cookie_header(&self, value: &str, max_age: i64) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let text = format!(
            "{FLOW_COOKIE}={value}; Path=/login/oidc; HttpOnly; SameSite=Lax; \
             Max-Age={max_age}{secure}"
        );
        HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// The `Set-Cookie` value that keeps `session`.
    pub fn set_cookie(&self, session: &Session) -> HeaderValue {
        self.cookie_header(&session.cookie, LIFETIME.num_seconds())
    }

    /// The `Set-Cookie` value that ends a session.
    pub fn clear_cookie(&self) -> HeaderValue {
        self.cookie_header("", 0)
    }

    fn cookie_header(&self, value: &str, max_age: i64) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let text = format!(
            "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
        );
        // The value is base64url: always a valid header value.
        HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// The `Set-Cookie` value that keeps a visitor's display zone for a year. The script reads
    /// and renews it (a browser's zone moves with its owner), so it is not `HttpOnly`; it
    /// holds a preference, never anything that grants.
    pub fn zone_cookie(&self, zone: &super::clock::Zone) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let text = format!(
            "{}={}; Path=/; SameSite=Strict; Max-Age=31536000{secure}",
            super::clock::COOKIE,
            zone.value()
        );
        // A zone's value is ASCII letters, digits and `:/_+-`: always a valid header value.
        HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    fn csrf_mac(&self, session: &Session) -> HmacSha256 {
        let mut mac = <HmacSha256 as hmac::KeyInit>::new_from_slice(&self.csrf_key)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(session.cookie.as_bytes());
        mac
    }

    /// The CSRF token the session's forms carry.
    pub fn csrf(&self, session: &Session) -> String {
        URL_SAFE_NO_PAD.encode(self.csrf_mac(session).finalize().into_bytes())
    }

    /// Whether `given` is the session's CSRF token (compared in constant time).
    pub fn csrf_matches(&self, session: &Session, given: &str) -> bool {
        match URL_SAFE_NO_PAD.decode(given) {
            Ok(tag) => self.csrf_mac(session).verify_slice(&tag).is_ok(),
            Err(_) => false,
        }
    }
}

/// The value of cookie `name` in a request's `Cookie` headers.
pub(crate) fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {COOKIE}={value}")).unwrap(),
        );
        headers
    }

    #[test]
    fn a_sealed_session_opens_until_it_expires() {
        let sessions = Sessions::new([7; 32], false);
        let now = chrono::Utc::now();
        let session = sessions.seal(Some("sked_secret"), now);
        let opened = sessions.open(&with_cookie(&session.cookie), now).unwrap();
        assert_eq!(opened.token.as_deref(), Some("sked_secret"));
        assert!(sessions
            .open(&with_cookie(&session.cookie), now + LIFETIME)
            .is_none());
    }

    #[test]
    fn a_cookie_of_another_key_or_tampered_with_does_not_open() {
        let now = chrono::Utc::now();
        let ours = Sessions::new([7; 32], false);
        let theirs = Sessions::new([8; 32], false);
        let session = theirs.seal(Some("sked_secret"), now);
        assert!(ours.open(&with_cookie(&session.cookie), now).is_none());
        let mut bytes = URL_SAFE_NO_PAD.decode(&session.cookie).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let tampered = URL_SAFE_NO_PAD.encode(bytes);
        assert!(theirs.open(&with_cookie(&tampered), now).is_none());
        assert!(ours.open(&with_cookie("not base64!"), now).is_none());
        assert!(ours.open(&with_cookie(&"A".repeat(5000)), now).is_none());
        assert!(ours.open(&HeaderMap::new(), now).is_none());
    }

    #[test]
    fn csrf_tokens_belong_to_their_session() {
        let sessions = Sessions::new([7; 32], false);
        let now = chrono::Utc::now();
        let one = sessions.seal(None, now);
        let two = sessions.seal(None, now);
        let token = sessions.csrf(&one);
        assert!(sessions.csrf_matches(&one, &token));
        assert!(!sessions.csrf_matches(&two, &token));
        assert!(!sessions.csrf_matches(&one, ""));
        assert!(!sessions.csrf_matches(&one, "%%%"));
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_under_tls() {
        let now = chrono::Utc::now();
        let plain = Sessions::new([7; 32], false);
        let header = plain.set_cookie(&plain.seal(None, now));
        let text = header.to_str().unwrap();
        assert!(text.contains("HttpOnly") && text.contains("SameSite=Strict"));
        assert!(!text.contains("Secure"));
        let tls = Sessions::new([7; 32], true);
        assert!(tls
            .set_cookie(&tls.seal(None, now))
            .to_str()
            .unwrap()
            .ends_with("; Secure"));
        assert!(plain.clear_cookie().to_str().unwrap().contains("Max-Age=0"));
    }

    #[test]
    fn a_session_is_ended_by_a_logout_of_its_token_after_it_was_made() {
        let sessions = Sessions::new([7; 32], false);
        let now = chrono::Utc::now();
        let session = sessions.seal(Some("sked_secret"), now);
        let opened = sessions.open(&with_cookie(&session.cookie), now).unwrap();
        assert!(!opened.ended_by(None));
        assert!(opened.ended_by(Some(now)));
        assert!(opened.ended_by(Some(now + chrono::TimeDelta::seconds(1))));
        assert!(!opened.ended_by(Some(now - chrono::TimeDelta::microseconds(1))));
    }

    #[test]
    fn a_login_under_way_opens_only_as_itself() {
        let sessions = Sessions::new([7; 32], false);
        let flow = serde_json::json!({"state": "s", "nonce": "n"});
        let header = sessions.flow_cookie(&flow);
        let text = header.to_str().unwrap();
        assert!(text.contains("Path=/login/oidc") && text.contains("SameSite=Lax"));
        assert!(text.contains("HttpOnly") && text.contains("Max-Age=600"));
        let value = text
            .split(';')
            .next()
            .and_then(|pair| pair.split_once('='))
            .unwrap()
            .1;
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::COOKIE,
            HeaderValue::from_str(&format!("{FLOW_COOKIE}={value}")).unwrap(),
        );
        let opened: serde_json::Value = sessions.open_flow(&headers).unwrap();
        assert_eq!(opened, flow);
        // The same sealed value under the session's name is no session, and a session's
        // value is no login under way.
        let now = chrono::Utc::now();
        assert!(sessions.open(&with_cookie(value), now).is_none());
        let session = sessions.seal(Some("sked_secret"), now);
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::COOKIE,
            HeaderValue::from_str(&format!("{FLOW_COOKIE}={}", session.cookie)).unwrap(),
        );
        assert!(sessions.open_flow::<serde_json::Value>(&headers).is_none());
        assert!(sessions
            .clear_flow_cookie()
            .to_str()
            .unwrap()
            .contains("Max-Age=0"));
    }

    #[test]
    fn debug_never_shows_the_token() {
        let sessions = Sessions::new([7; 32], false);
        let session = sessions.seal(Some("sked_secret"), chrono::Utc::now());
        assert!(!format!("{session:?}").contains("sked_secret"));
    }
}
