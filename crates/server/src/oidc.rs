//! Logging in through an OpenID Connect provider: its discovery document and signing keys, the
//! authorization code flow with PKCE, the checks an ID token must pass, and the groups it
//! vouches for.
//!
//! The console starts a login ([`Flow::new`], [`Oidc::authorization_url`]) and finishes it when
//! the provider sends the person back ([`Oidc::finish`]); what the person's groups grant is
//! `sked_core::identity`'s, and the token their session runs on is `crate::auth`'s. This module
//! owns no page, no cookie and no store row: it speaks to the provider and nothing else.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use sked_core::identity::GroupRule;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// What the server's config says about its identity provider.
#[derive(Clone)]
pub struct OidcConfig {
    /// The provider's issuer URL, as its discovery document states it.
    pub issuer: String,
    pub client_id: String,
    pub client_secret: String,
    /// Where the provider sends people back: `PUBLIC_URL/login/oidc/callback`.
    pub redirect_uri: String,
    /// Scopes asked for besides `openid`.
    pub scopes: Vec<String>,
    /// The claim that lists a person's groups (in the ID token, or else from the userinfo
    /// endpoint).
    pub groups_claim: String,
    /// Which groups grant what.
    pub rules: Vec<GroupRule>,
    /// How long a console session made by a login lasts.
    pub session: Duration,
    /// What the login button calls the provider.
    pub display_name: String,
}

impl std::fmt::Debug for OidcConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcConfig")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("redirect_uri", &self.redirect_uri)
            .field("scopes", &self.scopes)
            .field("groups_claim", &self.groups_claim)
            .field("rules", &self.rules)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// Why a login through the provider did not make a session. The message is shown to the
/// person on the login page; none holds a token, a code or the client secret.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The provider could not be reached or answered something that is not OpenID Connect.
    #[error("the identity provider could not be used: {0}")]
    Provider(String),
    /// The provider said no (the person cancelled, or is not allowed this client).
    #[error("the identity provider refused the login: {0}")]
    Refused(String),
    /// What came back fails a check (state, nonce, signature, issuer, audience, expiry).
    #[error("the login could not be verified: {0}")]
    Invalid(String),
    /// The person is known, but none of their groups is mapped to a role here.
    #[error(
        "{login} logged in, but none of their groups gives a role on this server; an admin \
         maps groups to roles with --oidc-group"
    )]
    NoRole { login: String },
}

/// A login under way, kept in a sealed cookie while the person is at the provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flow {
    /// Sent to the provider and back: a callback with another state is not this login's.
    pub state: String,
    /// Sent to the provider, which puts it in the ID token: a token minted for another login
    /// does not carry it.
    pub nonce: String,
    /// PKCE (S256): the provider hands out tokens for the code only to who holds this.
    pub verifier: String,
    /// The console path to go on to.
    pub next: String,
    /// Unix seconds after which the login is stale.
    pub expires: i64,
}

fn random_text() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

impl Flow {
    pub fn new(
        next: &str,
        now: chrono::DateTime<chrono::Utc>,
        lifetime: chrono::TimeDelta,
    ) -> Flow {
        Flow {
            state: random_text(),
            nonce: random_text(),
            verifier: random_text(),
            next: next.to_string(),
            expires: (now + lifetime).timestamp(),
        }
    }

    /// The PKCE challenge of the verifier (S256).
    fn challenge(&self) -> String {
        URL_SAFE_NO_PAD.encode(Sha256::digest(self.verifier.as_bytes()))
    }

    /// Whether a callback carrying `state` belongs to this login and came in time. The state is
    /// compared in full, in time independent of where it differs.
    pub fn admits(&self, state: &str, now: chrono::DateTime<chrono::Utc>) -> bool {
        let same = self.state.len() == state.len()
            && self
                .state
                .bytes()
                .zip(state.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        same && now.timestamp() < self.expires
    }
}

/// Who the provider vouched for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    /// The provider's subject identifier.
    pub subject: String,
    /// What people call them: `preferred_username`, else `email`, else the subject.
    pub login: String,
    pub groups: Vec<String>,
}

/// The parts of the provider's discovery document used here.
#[derive(Debug, Clone, Deserialize)]
struct Metadata {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
    #[serde(default)]
    userinfo_endpoint: Option<String>,
}

/// The token endpoint's answer.
#[derive(Deserialize)]
struct Tokens {
    id_token: Option<String>,
    access_token: Option<String>,
}

/// The provider's discovery document is read again after this.
const METADATA_TTL: Duration = Duration::from_secs(3600);
/// Signing keys are read again after this, or sooner for a key id not seen (a rotation), but
/// not more often than [`KEYS_MIN_INTERVAL`].
const KEYS_TTL: Duration = Duration::from_secs(3600);
const KEYS_MIN_INTERVAL: Duration = Duration::from_secs(30);
/// Longest answer read from the provider.
const MAX_ANSWER: usize = 256 * 1024;
/// How long a call to the provider may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Clock difference allowed between the provider and this node.
const LEEWAY_SECONDS: u64 = 60;
/// Signature algorithms an ID token may use: asymmetric only, so the client secret never
/// doubles as a signing key.
const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// The identity provider of one server, with what it has read of it.
pub struct Oidc {
    pub config: OidcConfig,
    /// The client for the provider's endpoints, or why none could be made (each login then
    /// fails with it, rather than calling without the time bound).
    http: Result<reqwest::Client, String>,
    metadata: Mutex<Option<(Metadata, Instant)>>,
    keys: Mutex<Option<(JwkSet, Instant)>>,
}

impl Oidc {
    pub fn new(config: OidcConfig) -> Oidc {
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("no HTTP client for the identity provider: {e}"));
        Oidc {
            config,
            http,
            metadata: Mutex::new(None),
            keys: Mutex::new(None),
        }
    }

    fn http(&self) -> Result<&reqwest::Client, OidcError> {
        self.http
            .as_ref()
            .map_err(|e| OidcError::Provider(e.clone()))
    }

    /// Where to send a person to log in for `flow`.
    pub async fn authorization_url(&self, flow: &Flow) -> Result<String, OidcError> {
        let metadata = self.metadata().await?;
        let mut url = url::Url::parse(&metadata.authorization_endpoint).map_err(|e| {
            OidcError::Provider(format!("its authorization endpoint is not a URL: {e}"))
        })?;
        let scope = std::iter::once("openid")
            .chain(
                self.config
                    .scopes
                    .iter()
                    .map(String::as_str)
                    .filter(|s| *s != "openid"),
            )
            .collect::<Vec<_>>()
            .join(" ");
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.config.client_id)
            .append_pair("redirect_uri", &self.config.redirect_uri)
            .append_pair("scope", &scope)
            .append_pair("state", &flow.state)
            .append_pair("nonce", &flow.nonce)
            .append_pair("code_challenge", &flow.challenge())
            .append_pair("code_challenge_method", "S256");
        Ok(url.into())
    }

    /// Trades the `code` the provider sent back for the ID token, checks it against `flow`,
    /// and says who it vouches for.
    pub async fn finish(&self, flow: &Flow, code: &str) -> Result<Person, OidcError> {
        let metadata = self.metadata().await?;
        let form = [
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", self.config.redirect_uri.as_str()),
            ("code_verifier", flow.verifier.as_str()),
        ];
        // client_secret_basic: both parts form-encoded first (RFC 6749, 2.3.1).
        let encode =
            |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let response = self
            .http()?
            .post(&metadata.token_endpoint)
            .basic_auth(
                encode(&self.config.client_id),
                Some(encode(&self.config.client_secret)),
            )
            .form(&form)
            .send()
            .await
            .map_err(|e| OidcError::Provider(format!("its token endpoint: {}", without_url(&e))))?;
        let status = response.status();
        let body = read_capped(response).await?;
        if !status.is_success() {
            let error: Map<String, Value> = serde_json::from_slice(&body).unwrap_or_default();
            let code = error
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("no error code");
            return Err(OidcError::Refused(format!(
                "its token endpoint answered {status} ({})",
                printable(code)
            )));
        }
        let tokens: Tokens = serde_json::from_slice(&body).map_err(|e| {
            OidcError::Provider(format!(
                "its token endpoint's answer is not a token response: {e}"
            ))
        })?;
        let id_token = tokens
            .id_token
            .ok_or_else(|| OidcError::Provider("its token endpoint sent no ID token".into()))?;
        let claims = self.verify(&metadata, &id_token, flow).await?;
        let subject = claims
            .get("sub")
            .and_then(Value::as_str)
            .ok_or_else(|| OidcError::Invalid("the ID token names no subject".into()))?
            .to_string();
        let groups = match claims.get(&self.config.groups_claim) {
            Some(value) => groups_of(value),
            None => match (&metadata.userinfo_endpoint, &tokens.access_token) {
                (Some(endpoint), Some(access)) => {
                    self.groups_from_userinfo(endpoint, access, &subject)
                        .await?
                }
                _ => Vec::new(),
            },
        };
        let login = ["preferred_username", "email"]
            .iter()
            .find_map(|claim| claims.get(*claim).and_then(Value::as_str))
            .filter(|login| !login.is_empty() && login.len() <= 256)
            .unwrap_or(&subject)
            .to_string();
        Ok(Person {
            subject,
            login,
            groups,
        })
    }

    /// The ID token's claims, once its signature, issuer, audience, times and nonce pass.
    async fn verify(
        &self,
        metadata: &Metadata,
        id_token: &str,
        flow: &Flow,
    ) -> Result<Map<String, Value>, OidcError> {
        let header = jsonwebtoken::decode_header(id_token)
            .map_err(|e| OidcError::Invalid(format!("the ID token is not a JWT: {e}")))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(OidcError::Invalid(format!(
                "the ID token is signed with {:?}, which is not accepted",
                header.alg
            )));
        }
        let key = self
            .key(metadata, header.kid.as_deref(), header.alg)
            .await?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[metadata.issuer.as_str()]);
        validation.set_audience(&[self.config.client_id.as_str()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = LEEWAY_SECONDS;
        let data = jsonwebtoken::decode::<Map<String, Value>>(id_token, &key, &validation)
            .map_err(|e| OidcError::Invalid(format!("the ID token: {e}")))?;
        let claims = data.claims;
        if claims.get("nonce").and_then(Value::as_str) != Some(flow.nonce.as_str()) {
            return Err(OidcError::Invalid(
                "the ID token was not made for this login (its nonce differs)".into(),
            ));
        }
        // A token for several audiences must have been issued to this client.
        if let Some(azp) = claims.get("azp").and_then(Value::as_str) {
            if azp != self.config.client_id {
                return Err(OidcError::Invalid(
                    "the ID token was issued to another client".into(),
                ));
            }
        }
        Ok(claims)
    }

    /// The provider's key that signed a token, reading its keys again on an unknown key id.
    async fn key(
        &self,
        metadata: &Metadata,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<DecodingKey, OidcError> {
        let mut keys = self.keys.lock().await;
        for attempt in 0..2 {
            let fresh = keys
                .as_ref()
                .is_some_and(|(_, read)| read.elapsed() < KEYS_TTL);
            let recent = keys
                .as_ref()
                .is_some_and(|(_, read)| read.elapsed() < KEYS_MIN_INTERVAL);
            if !fresh || (attempt == 1 && !recent) {
                let set: JwkSet = self
                    .get_json(&metadata.jwks_uri, "its signing keys")
                    .await?;
                *keys = Some((set, Instant::now()));
            }
            if let Some((set, _)) = keys.as_ref() {
                let found = set.keys.iter().find(|jwk| match kid {
                    Some(kid) => jwk.common.key_id.as_deref() == Some(kid),
                    // Without a key id, the only key there is.
                    None => set.keys.len() == 1,
                });
                if let Some(jwk) = found {
                    // Both name the algorithm as JOSE does ("RS256").
                    let named = |v: Result<Value, _>| v.ok();
                    if jwk.common.key_algorithm.is_some_and(|a| {
                        named(serde_json::to_value(a)) != named(serde_json::to_value(alg))
                    }) {
                        return Err(OidcError::Invalid(
                            "the ID token's algorithm is not its key's".into(),
                        ));
                    }
                    return DecodingKey::from_jwk(jwk).map_err(|e| {
                        OidcError::Provider(format!("its signing key cannot be used: {e}"))
                    });
                }
            }
        }
        Err(OidcError::Invalid(
            "the ID token is signed with a key the provider does not publish".into(),
        ))
    }

    async fn groups_from_userinfo(
        &self,
        endpoint: &str,
        access_token: &str,
        subject: &str,
    ) -> Result<Vec<String>, OidcError> {
        let response = self
            .http()?
            .get(endpoint)
            .bearer_auth(access_token)
            .send()
            .await
            .map_err(|e| {
                OidcError::Provider(format!("its userinfo endpoint: {}", without_url(&e)))
            })?;
        if !response.status().is_success() {
            return Err(OidcError::Provider(format!(
                "its userinfo endpoint answered {}",
                response.status()
            )));
        }
        let info: Map<String, Value> = serde_json::from_slice(&read_capped(response).await?)
            .map_err(|e| OidcError::Provider(format!("its userinfo is not JSON: {e}")))?;
        // Userinfo about someone else must not lend them its groups (OpenID Connect Core 5.3.2).
        if info.get("sub").and_then(Value::as_str) != Some(subject) {
            return Err(OidcError::Invalid(
                "the userinfo endpoint answered about another subject".into(),
            ));
        }
        Ok(info
            .get(&self.config.groups_claim)
            .map(groups_of)
            .unwrap_or_default())
    }

    /// The discovery document, read again after [`METADATA_TTL`].
    async fn metadata(&self) -> Result<Metadata, OidcError> {
        let mut cached = self.metadata.lock().await;
        if let Some((metadata, read)) = cached.as_ref() {
            if read.elapsed() < METADATA_TTL {
                return Ok(metadata.clone());
            }
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.config.issuer.trim_end_matches('/')
        );
        let metadata: Metadata = self.get_json(&url, "its discovery document").await?;
        // The document must be the configured issuer's (OpenID Connect Discovery 4.3).
        if metadata.issuer.trim_end_matches('/') != self.config.issuer.trim_end_matches('/') {
            return Err(OidcError::Provider(format!(
                "its discovery document names issuer {:?}, not {:?}",
                printable(&metadata.issuer),
                self.config.issuer
            )));
        }
        *cached = Some((metadata.clone(), Instant::now()));
        Ok(metadata)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        what: &str,
    ) -> Result<T, OidcError> {
        let response = self
            .http()?
            .get(url)
            .send()
            .await
            .map_err(|e| OidcError::Provider(format!("{what}: {}", without_url(&e))))?;
        if !response.status().is_success() {
            return Err(OidcError::Provider(format!(
                "{what} answered {}",
                response.status()
            )));
        }
        serde_json::from_slice(&read_capped(response).await?)
            .map_err(|e| OidcError::Provider(format!("{what} is not what was expected: {e}")))
    }
}

/// A reqwest error's message without its URL (which may carry a code or a token).
fn without_url(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "cannot connect"
    } else {
        "failed"
    };
    kind.to_string()
}

/// At most 64 printable characters of what a provider said.
fn printable(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(64).collect()
}

/// A claim's groups: a list of strings, or one string.
fn groups_of(value: &Value) -> Vec<String> {
    match value {
        Value::String(one) => vec![one.clone()],
        Value::Array(many) => many
            .iter()
            .filter_map(Value::as_str)
            .take(sked_core::identity::MAX_GROUPS)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// The body of an answer, refused past [`MAX_ANSWER`] bytes.
async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, OidcError> {
    let too_large = || OidcError::Provider(format!("it answered more than {MAX_ANSWER} bytes"));
    if response
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| OidcError::Provider(format!("its answer: {}", without_url(&e))))?
    {
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_admits_only_its_own_state_in_time() {
        let now = chrono::Utc::now();
        let flow = Flow::new("/jobs", now, chrono::TimeDelta::minutes(10));
        assert!(flow.admits(&flow.state, now));
        assert!(!flow.admits(&flow.state, now + chrono::TimeDelta::minutes(10)));
        assert!(!flow.admits("", now));
        assert!(!flow.admits(&flow.state[1..], now));
        let other = Flow::new("/jobs", now, chrono::TimeDelta::minutes(10));
        assert!(!flow.admits(&other.state, now));
        assert_ne!(flow.nonce, other.nonce);
        assert_ne!(flow.verifier, other.verifier);
    }

    #[test]
    fn the_pkce_challenge_is_the_verifiers_s256() {
        // RFC 7636, appendix B.
        let flow = Flow {
            verifier: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk".into(),
            ..Flow::new("/", chrono::Utc::now(), chrono::TimeDelta::minutes(1))
        };
        assert_eq!(
            flow.challenge(),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn groups_are_a_list_or_one_name_and_bounded() {
        assert_eq!(groups_of(&serde_json::json!("ops")), ["ops"]);
        assert_eq!(groups_of(&serde_json::json!(["a", 1, "b"])), ["a", "b"]);
        assert!(groups_of(&serde_json::json!({"a": 1})).is_empty());
        let many: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
        assert_eq!(
            groups_of(&serde_json::json!(many)).len(),
            sked_core::identity::MAX_GROUPS
        );
    }

    #[test]
    fn the_client_secret_is_never_printed() {
        let config = OidcConfig {
            issuer: "https://id.example".into(),
            client_id: "sked".into(),
            client_secret: "hunter2-secret".into(),
            redirect_uri: "https://sked.example/login/oidc/callback".into(),
            scopes: vec![],
            groups_claim: "groups".into(),
            rules: vec![],
            session: Duration::from_secs(3600),
            display_name: "Example".into(),
        };
        assert!(!format!("{config:?}").contains("hunter2"));
    }
}
