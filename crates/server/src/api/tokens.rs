//! `/api/v1/tokens`: create (the secret is shown once, in that answer), list and revoke API
//! tokens. Admin only (the route table says so).

use super::extract::Path;
use super::{body, parse_json, ApiError};
use crate::audit::{self, Change};
use crate::auth::{generate_secret, hash_secret, Caller};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use sked_core::auth::{validate_grant, validate_token_name, Grant, LabelRule, Role, TokenRecord};
use sked_core::HumanDuration;
use sked_store::{NewToken, StoreError};

/// Most tokens a store keeps: listing them is one answer.
pub const MAX_TOKENS: usize = 10_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    name: String,
    role: String,
    namespaces: Vec<String>,
    #[serde(default)]
    shell: bool,
    /// Worker tokens: `key=value` or `key=*` labels its workers may claim.
    #[serde(default)]
    labels: Option<Vec<String>>,
    /// How long until it expires (`30d`, `12h`); never when absent.
    #[serde(default)]
    expires: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct CreatedToken {
    /// The secret: shown this once, kept nowhere.
    pub token: String,
    #[serde(flatten)]
    pub record: TokenRecord,
}

fn parse_request(req: CreateRequest) -> Result<(String, Grant, Option<HumanDuration>), ApiError> {
    validate_token_name(&req.name).map_err(|e| ApiError::invalid("name", e))?;
    let role = Role::parse(&req.role).ok_or_else(|| {
        ApiError::invalid(
            "role",
            format!("{:?} is not one of admin, editor, viewer, worker", req.role),
        )
    })?;
    let labels = req
        .labels
        .map(|rules| {
            rules
                .into_iter()
                .map(LabelRule::try_from)
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()
        .map_err(|e| ApiError::invalid("labels", e))?;
    let grant = Grant {
        role,
        namespaces: req.namespaces,
        shell: req.shell,
        labels,
    };
    validate_grant(&grant).map_err(|(field, message)| ApiError::invalid(field, message))?;
    let expires = req
        .expires
        .map(|e| e.parse::<HumanDuration>())
        .transpose()
        .map_err(|e| ApiError::invalid("expires", e))?;
    Ok((req.name, grant, expires))
}

pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<CreatedToken>), ApiError> {
    let req: CreateRequest = parse_json(&body(raw)?)?;
    let (name, grant, expires) = parse_request(req)?;
    let now = Utc::now();
    let expires_at = match expires {
        None => None,
        Some(d) if d.0.is_zero() => {
            return Err(ApiError::invalid("expires", "must be longer than 0s"))
        }
        Some(d) => Some(
            now.checked_add_signed(d.as_chrono())
                .ok_or_else(|| ApiError::invalid("expires", "is too far in the future"))?,
        ),
    };
    if state.store.list_tokens().await?.len() >= MAX_TOKENS {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "too_many_tokens",
            format!("the store holds {MAX_TOKENS} tokens, the most it keeps; revoke some first"),
        ));
    }
    let secret = generate_secret();
    let token = NewToken {
        name: name.clone(),
        grant,
        hash: hash_secret(&secret),
        expires_at,
    };
    let audit = audit::by(&caller, |record: &TokenRecord| {
        Some(Change {
            action: "token.create",
            namespace: None,
            object: Some(record.name.clone()),
            before: None,
            after: serde_json::to_value(record).ok(),
        })
    });
    let record = match state.store.create_token(&token, now, audit).await {
        Ok(record) => record,
        Err(StoreError::Conflict(_)) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("a token named {name:?} exists; revoke it first or choose another name"),
            )
            .with_field("name"))
        }
        Err(e) => return Err(e.into()),
    };
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            token: secret,
            record,
        }),
    ))
}

#[derive(Debug, Serialize)]
pub struct TokenList {
    pub tokens: Vec<TokenRecord>,
}

pub async fn list(State(state): State<AppState>) -> Result<Json<TokenList>, ApiError> {
    Ok(Json(TokenList {
        tokens: state.store.list_tokens().await?,
    }))
}

/// Deletes the token; every node refuses it within a second (`auth::TOKEN_CACHE_TTL`), this
/// one at once.
pub async fn revoke(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<TokenRecord>, ApiError> {
    let record = state
        .store
        .revoke_token(
            &name,
            audit::by(&caller, |revoked: &Option<TokenRecord>| {
                revoked.as_ref().map(|record| Change {
                    action: "token.revoke",
                    namespace: None,
                    object: Some(record.name.clone()),
                    before: serde_json::to_value(record).ok(),
                    after: None,
                })
            }),
        )
        .await?
        .ok_or_else(|| ApiError::not_found(format!("token {name:?}")))?;
    state.auth.forget_all();
    Ok(Json(record))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(role: &str, labels: Option<Vec<&str>>) -> CreateRequest {
        CreateRequest {
            name: "ci".into(),
            role: role.into(),
            namespaces: vec!["a".into()],
            shell: false,
            labels: labels.map(|l| l.into_iter().map(String::from).collect()),
            expires: Some("30d".into()),
        }
    }

    #[test]
    fn a_request_names_the_field_it_fails_on() {
        assert!(parse_request(request("editor", None)).is_ok());
        let field = |r| parse_request(r).unwrap_err().field;
        assert_eq!(field(request("root", None)).as_deref(), Some("role"));
        assert_eq!(
            field(request("editor", Some(vec!["pool=x"]))).as_deref(),
            Some("labels")
        );
        assert_eq!(
            field(request("worker", Some(vec!["pool"]))).as_deref(),
            Some("labels")
        );
        let mut bad_expiry = request("viewer", None);
        bad_expiry.expires = Some("soon".into());
        assert_eq!(field(bad_expiry).as_deref(), Some("expires"));
    }
}
