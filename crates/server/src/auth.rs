//! Who is calling: API tokens (generated, hashed, looked up), the caller a request carries into
//! its handler, and the bootstrap admin token.
//!
//! What a token grants and whether a request is within it are `sked_core::auth`'s rules; this
//! module finds the token behind a request and nothing else. The route table in `api` names the
//! permission each route needs and calls [`Authenticator::caller`] before the handler runs.

use crate::api::ApiError;
use crate::rate::Refusals;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use base64::Engine;
use sha2::{Digest, Sha256};
use sked_core::auth::{Denied, Grant, TokenRecord};
use sked_core::records::AuditEntry;
use sked_core::throttle::Throttle;
use sked_core::Instant;
use sked_store::{Audit, NewToken, Store, StoreError};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Whether requests without a token are let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Every request needs a valid token (`sked server`, and `sked dev --require-token`).
    Tokens,
    /// A request without a token acts as an admin: `sked dev` on a loopback address only.
    /// A request that does carry a token is still judged by it.
    Open,
}

/// A token's secret starts with this, so it is recognisable in a config file or a leak scan.
pub const TOKEN_PREFIX: &str = "sked_";

/// A new secret: 256 random bits.
pub fn generate_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// What the store keeps of a secret. Secrets are 256 random bits, so a plain SHA-256 is as
/// good as a slow password hash here and costs nothing per request.
pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A looked-up token is trusted this long before the store is asked again: a revoked token is
/// refused on every node within it (well within the second the contract promises).
pub const TOKEN_CACHE_TTL: Duration = Duration::from_millis(500);
/// Most secrets remembered at once; past it the memory is cleared (a flood of made-up tokens
/// must not grow it).
const TOKEN_CACHE_SIZE: usize = 10_000;
/// `last_used_at` is written at most this often per token.
const TOUCH_INTERVAL: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// The caller of a request, as its handler sees it.
#[derive(Debug, Clone)]
pub struct Caller {
    pub grant: Grant,
    /// `None`: no token, on an open development server.
    pub token_id: Option<i64>,
    /// The token's name, or `anonymous`.
    pub name: String,
    pub peer: Option<SocketAddr>,
    /// Console sessions of the token made at or before this are over (a logout).
    pub sessions_ended_at: Option<Instant>,
}

impl std::ops::Deref for Caller {
    type Target = Grant;
    fn deref(&self) -> &Grant {
        &self.grant
    }
}

impl From<Denied> for ApiError {
    fn from(denied: Denied) -> ApiError {
        match denied {
            Denied::Forbidden(message) => {
                ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
            }
            Denied::Hidden(message) => ApiError::new(StatusCode::NOT_FOUND, "not_found", message),
        }
    }
}

/// Handlers take the caller the route's guard put in the request.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Caller, ApiError> {
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "this route has no permission in the route table",
            )
        })
    }
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
}

/// Failed authentications enter the audit trail at most once per this interval, each saying
/// how many were held back: a client guessing tokens must not flood it.
const FAILURE_AUDIT_INTERVAL: Duration = Duration::from_secs(1);

struct Remembered {
    token: Option<TokenRecord>,
    read_at: std::time::Instant,
}

/// Failed authentications (a token unknown, expired or malformed) one address may cause in a
/// second; past it, its requests with a token are answered 429 until the second is over,
/// unless the token is one this node remembers as valid. Each failure may have cost a store
/// lookup, so this bounds what guessed tokens cost per address.
pub const FAILURES_PER_SECOND: u32 = 100;

/// Finds the token behind a request, remembering each for [`TOKEN_CACHE_TTL`].
pub struct Authenticator {
    mode: AuthMode,
    store: Arc<dyn Store>,
    remembered: Mutex<HashMap<String, Remembered>>,
    failures: Mutex<Throttle>,
    /// Failed authentications per client address.
    failed_by_address: Refusals,
}

impl Authenticator {
    pub fn new(mode: AuthMode, store: Arc<dyn Store>) -> Authenticator {
        Authenticator {
            mode,
            store,
            remembered: Mutex::new(HashMap::new()),
            failures: Mutex::new(Throttle::new(FAILURE_AUDIT_INTERVAL)),
            failed_by_address: Refusals::new(FAILURES_PER_SECOND),
        }
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// The caller behind an `Authorization` header value (or its absence). Refusals are 401;
    /// 429 for an address past [`FAILURES_PER_SECOND`] whose token this node does not
    /// remember as valid.
    pub async fn caller(
        &self,
        authorization: Option<&[u8]>,
        peer: Option<SocketAddr>,
        now: Instant,
    ) -> Result<Caller, ApiError> {
        let address = peer.map(|p| p.ip());
        let tripped = address.and_then(|a| {
            self.failed_by_address
                .check(a, std::time::Instant::now())
                .err()
        });
        let found = self.find_caller(authorization, peer, now, tripped).await;
        if let (Err(refusal), Some(address)) = (&found, address) {
            if refusal.status == StatusCode::UNAUTHORIZED && authorization.is_some() {
                self.failed_by_address
                    .refused(address, std::time::Instant::now());
            }
        }
        found
    }

    /// [`Authenticator::caller`] without the counting. `tripped`: how long the caller's
    /// address must wait, when it is past its failures; then only a remembered token is
    /// looked at.
    async fn find_caller(
        &self,
        authorization: Option<&[u8]>,
        peer: Option<SocketAddr>,
        now: Instant,
        tripped: Option<Duration>,
    ) -> Result<Caller, ApiError> {
        let Some(header) = authorization else {
            return match self.mode {
                AuthMode::Open => Ok(Caller {
                    grant: Grant::open(),
                    token_id: None,
                    name: "anonymous".to_string(),
                    peer,
                    sessions_ended_at: None,
                }),
                AuthMode::Tokens => Err(unauthorized(
                    "this request needs a token: send `Authorization: Bearer <token>`",
                )),
            };
        };
        let secret = std::str::from_utf8(header)
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_SECRET_LEN)
            .ok_or_else(|| unauthorized("the Authorization header is not `Bearer <token>`"))?;
        let hash = hash_secret(secret);
        let token = match tripped {
            None => self.lookup(&hash).await?,
            Some(wait) => Some(self.remembered(&hash).flatten().ok_or_else(|| {
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    "too many failed authentications from this address; wait before sending \
                     a token again",
                )
                .retry_after(wait)
            })?),
        }
        .ok_or_else(|| unauthorized("this token is not known (revoked, or mistyped)"))?;
        if token.expired(now) {
            return Err(unauthorized("this token has expired"));
        }
        if token
            .last_used_at
            .is_none_or(|at| now - at >= TOUCH_INTERVAL)
        {
            self.touch(&token, now);
        }
        Ok(Caller {
            grant: token.grant,
            token_id: Some(token.id),
            name: token.name,
            peer,
            sessions_ended_at: token.sessions_ended_at,
        })
    }

    /// What this node remembers of a token, while that is fresh: `Some(None)` for one the
    /// store did not know.
    fn remembered(&self, hash: &str) -> Option<Option<TokenRecord>> {
        self.lock()
            .get(hash)
            .filter(|r| r.read_at.elapsed() < TOKEN_CACHE_TTL)
            .map(|r| r.token.clone())
    }

    async fn lookup(&self, hash: &str) -> Result<Option<TokenRecord>, ApiError> {
        if let Some(fresh) = self.remembered(hash) {
            return Ok(fresh);
        }
        let token = self.store.token_by_hash(hash).await?;
        let mut remembered = self.lock();
        if remembered.len() >= TOKEN_CACHE_SIZE {
            remembered.clear();
        }
        remembered.insert(
            hash.to_string(),
            Remembered {
                token: token.clone(),
                read_at: std::time::Instant::now(),
            },
        );
        Ok(token)
    }

    /// Records the use in the background, and in memory so the next requests do not repeat it.
    fn touch(&self, token: &TokenRecord, now: Instant) {
        for remembered in self.lock().values_mut() {
            if let Some(t) = remembered.token.as_mut().filter(|t| t.id == token.id) {
                t.last_used_at = Some(now);
            }
        }
        let store = self.store.clone();
        let id = token.id;
        tokio::spawn(async move {
            if let Err(e) = store.touch_tokens(&[(id, now)]).await {
                tracing::debug!("cannot record when token {id} was used: {e}");
            }
        });
    }

    /// Records a refused authentication in the audit trail (throttled), without the token.
    pub fn failed(&self, peer: Option<SocketAddr>, method: &Method, path: &str, why: &str) {
        let admitted = self
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(std::time::Instant::now());
        let Some(held_back) = admitted else { return };
        let mut detail = serde_json::json!({"request": format!("{method} {path}"), "reason": why});
        if held_back > 0 {
            detail["failures_not_recorded_since_last"] = held_back.into();
        }
        let entry = AuditEntry {
            at: chrono::Utc::now(),
            actor: "unauthenticated".to_string(),
            actor_id: None,
            peer: peer.map(|p| p.to_string()),
            action: "auth.failed".to_string(),
            namespace: None,
            object: None,
            before: None,
            after: Some(detail),
        };
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.append_audit(&[entry]).await {
                tracing::warn!("cannot record a failed authentication in the audit trail: {e}");
            }
        });
    }

    /// Ends the console sessions of token `token_id` made until `now` (a logout), on every
    /// node: the store keeps the instant with the token, which every node reads with it, and
    /// this node forgets what it remembered of the token at once.
    pub async fn end_sessions(&self, token_id: i64, now: Instant) -> Result<(), ApiError> {
        self.store.end_sessions(token_id, now).await?;
        self.lock()
            .retain(|_, r| r.token.as_ref().is_none_or(|t| t.id != token_id));
        Ok(())
    }

    /// Makes the token a person's console session runs on, once an identity provider vouched
    /// for them and their groups gave `grant`: named `sso-LOGIN-RANDOM`, expiring with the
    /// session. The person's earlier session tokens that have expired are revoked first, so
    /// logins do not pile up tokens. The login is one audit entry, by the new token.
    pub async fn sign_in(
        &self,
        person: &crate::oidc::Person,
        grant: Grant,
        lifetime: chrono::TimeDelta,
        peer: Option<SocketAddr>,
        now: Instant,
    ) -> Result<String, ApiError> {
        let prefix = sked_core::identity::token_prefix(&person.login);
        let tokens = self.store.list_tokens().await?;
        let mut kept = tokens.len();
        for stale in tokens
            .iter()
            .filter(|t| t.name.starts_with(&prefix) && t.expires_at.is_some_and(|at| at <= now))
        {
            self.store.revoke_token(&stale.name, Audit::none()).await?;
            kept -= 1;
        }
        if kept >= crate::api::tokens::MAX_TOKENS {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "too_many_tokens",
                "the store holds the most tokens it keeps; an admin must revoke some first",
            ));
        }
        let secret = generate_secret();
        let suffix: [u8; 4] = rand::random();
        let expires_at = now + lifetime;
        let token = NewToken {
            name: format!("{prefix}{}", hex::encode(suffix)),
            grant,
            hash: hash_secret(&secret),
            expires_at: Some(expires_at),
        };
        let login = person.login.clone();
        let subject = person.subject.clone();
        let peer = peer.map(|p| p.to_string());
        let audit = Audit::new(move |record: &sked_core::auth::TokenRecord| {
            vec![AuditEntry {
                at: now,
                actor: record.name.clone(),
                actor_id: Some(record.id),
                peer: peer.clone(),
                action: "auth.login".to_string(),
                namespace: None,
                object: Some(record.name.clone()),
                before: None,
                after: Some(serde_json::json!({
                    "through": "oidc",
                    "login": login,
                    "subject": subject,
                    "role": record.grant.role,
                    "namespaces": record.grant.namespaces,
                    "shell": record.grant.shell,
                    "expires_at": expires_at,
                })),
            }]
        });
        self.store.create_token(&token, now, audit).await?;
        Ok(secret)
    }

    /// Forgets every remembered token at once (this node revoked one).
    pub fn forget_all(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Remembered>> {
        self.remembered.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Makes sure `secret` (the admin token file's content) is an admin token in the store. Its
/// name derives from its hash, so nodes of one cluster with different files each keep their
/// own, and a node started again with the same file finds its token there.
pub async fn ensure_admin_token(
    store: &dyn Store,
    secret: &str,
    now: Instant,
) -> Result<String, StoreError> {
    let hash = hash_secret(secret);
    let name = format!("admin-{}", &hash[..8]);
    if store.token_by_hash(&hash).await?.is_some() {
        return Ok(name);
    }
    let token = NewToken {
        name: name.clone(),
        grant: Grant {
            role: sked_core::auth::Role::Admin,
            namespaces: vec![sked_core::auth::ALL_NAMESPACES.to_string()],
            shell: true,
            labels: None,
        },
        hash,
        expires_at: None,
    };
    match store.create_token(&token, now, Audit::none()).await {
        Ok(_) => Ok(name),
        // Another node of the cluster, started with the same file, made it first; anything
        // else holding the name (a token made by hand, another secret with the same hash
        // prefix) leaves this secret without its token, which must not pass silently.
        Err(StoreError::Conflict(_)) if store.token_by_hash(&token.hash).await?.is_some() => {
            Ok(name)
        }
        Err(StoreError::Conflict(_)) => Err(StoreError::Conflict(format!(
            "token {name:?}, with another secret; revoke it so this admin token can take the name"
        ))),
        Err(e) => Err(e),
    }
}

/// Shortest secret accepted from an admin token file: a token is a password that cannot be
/// rate-limited away, so it must be long.
pub const MIN_SECRET_LEN: usize = 24;
/// Longest secret a request may carry.
pub const MAX_SECRET_LEN: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_admin_token_whose_name_another_secret_holds_is_refused_not_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let store = sked_store::SqliteStore::open(&dir.path().join("sked.db")).unwrap();
        let now = chrono::Utc::now();
        let secret = generate_secret();
        let name = ensure_admin_token(&store, &secret, now).await.unwrap();
        assert_eq!(
            ensure_admin_token(&store, &secret, now).await.unwrap(),
            name
        );
        store.revoke_token(&name, Audit::none()).await.unwrap();
        let squatter = NewToken {
            name: name.clone(),
            grant: Grant::open(),
            hash: hash_secret("another secret"),
            expires_at: None,
        };
        store
            .create_token(&squatter, now, Audit::none())
            .await
            .unwrap();
        assert!(matches!(
            ensure_admin_token(&store, &secret, now).await,
            Err(StoreError::Conflict(_))
        ));
    }

    #[test]
    fn secrets_are_long_random_and_hash_to_hex() {
        let a = generate_secret();
        let b = generate_secret();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 43, "256 bits in base64");
        let h = hash_secret(&a);
        assert_eq!(h.len(), 64);
        assert!(h.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(h, hash_secret(&a));
        assert_ne!(h, hash_secret(&b));
    }

    /// Stores hold these hashes: a change of encoding would lock every token out.
    #[test]
    fn a_secret_hashes_to_its_sha256_in_lowercase_hex() {
        assert_eq!(
            hash_secret("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
