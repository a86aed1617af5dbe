//! `Query` and `Path` as the handlers use them: axum's extractors, with their refusals (a query
//! or path value of the wrong type, a missing parameter) answered as [`ApiError`] JSON naming the
//! parameter, instead of axum's plain text.

use super::ApiError;
use axum::extract::path::ErrorKind;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

/// The query string, deserialized into `T`.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Query(value)),
            Err(rejection) => Err(query_error(&rejection)),
        }
    }
}

/// The path parameters, deserialized into `T`.
#[derive(Debug)]
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => {
                // The parameters as strings, to name the one at fault when axum does not.
                let raw: Vec<(String, String)> = RawPathParams::from_request_parts(parts, state)
                    .await
                    .map(|params| {
                        params
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect()
                    })
                    .unwrap_or_default();
                Err(path_error(&rejection, &raw))
            }
        }
    }
}

/// The error of the query-string deserializer (`serde_urlencoded`, through
/// `serde_path_to_error`), when the rejection carries it.
type QueryDeError = serde_path_to_error::Error<serde::de::value::Error>;

/// The path of the parameter at fault (`.` for none) and the deserializer's message.
fn deserializer_error(rejection: &QueryRejection) -> Option<(String, String)> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(error) = source {
        if let Some(e) = error.downcast_ref::<QueryDeError>() {
            return Some((e.path().to_string(), e.inner().to_string()));
        }
        source = error.source();
    }
    None
}

fn query_error(rejection: &QueryRejection) -> ApiError {
    let (path, message) = deserializer_error(rejection).unwrap_or_else(|| {
        // Not the error this code knows: read "<prefix>: <path>: <message>" from the text.
        let text = rejection.body_text();
        let detail = text.split_once(": ").map_or(text.as_str(), |(_, d)| d);
        match detail.split_once(": ") {
            Some((path, message)) if !path.contains(' ') => (path.to_string(), message.to_string()),
            _ => (".".to_string(), detail.to_string()),
        }
    });
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'));
    let error = ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", "");
    match missing {
        Some(name) => ApiError {
            message: format!("the query parameter `{name}` is required"),
            ..error.with_field(name)
        },
        None if path != "." && !path.is_empty() => ApiError {
            message: format!("the query parameter `{path}` is invalid: {message}"),
            ..error.with_field(path)
        },
        None => ApiError {
            message: format!("invalid query string: {message}"),
            ..error
        },
    }
}

/// What a value of a Rust type is, in words.
fn described(expected_type: &str) -> &str {
    match expected_type {
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "an integer",
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a non-negative integer",
        "f32" | "f64" => "a number",
        "bool" => "true or false",
        "char" => "a single character",
        _ => "a valid value",
    }
}

fn path_error(rejection: &PathRejection, raw: &[(String, String)]) -> ApiError {
    let PathRejection::FailedToDeserializePathParams(e) = rejection else {
        return internal(rejection.body_text());
    };
    if !e.status().is_client_error() {
        return internal(e.body_text());
    }
    let invalid = |key: Option<&str>, message: String| {
        let error = ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message);
        match key {
            Some(key) => error.with_field(key),
            None => error,
        }
    };
    // The parameter holding `value`: the only one, or the one with that value.
    let key_of = |value: &str| {
        let found = match raw {
            [(key, _)] => Some(key),
            _ => raw.iter().find(|(_, v)| v == value).map(|(k, _)| k),
        };
        found.map(String::as_str)
    };
    match e.kind() {
        ErrorKind::ParseErrorAtKey {
            key,
            value,
            expected_type,
        } => invalid(
            Some(key),
            format!("{value:?} is not {}", described(expected_type)),
        ),
        ErrorKind::ParseError {
            value,
            expected_type,
        }
        | ErrorKind::ParseErrorAtIndex {
            value,
            expected_type,
            ..
        } => invalid(
            key_of(value),
            format!("{value:?} is not {}", described(expected_type)),
        ),
        ErrorKind::InvalidUtf8InPathParam { key } => {
            invalid(Some(key), "is not valid UTF-8 once percent-decoded".into())
        }
        ErrorKind::DeserializeError {
            key,
            value,
            message,
        } => invalid(Some(key), format!("{value:?}: {message}")),
        _ => invalid(None, e.body_text()),
    }
}

fn internal(message: String) -> ApiError {
    tracing::error!("path parameters: {message}");
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Params {
        limit: Option<u32>,
        token: i64,
    }

    fn refused(uri: &str) -> QueryRejection {
        let uri: axum::http::Uri = uri.parse().unwrap();
        axum::extract::Query::<Params>::try_from_uri(&uri).unwrap_err()
    }

    #[test]
    fn the_deserializer_error_is_found_in_the_rejection() {
        // If axum wraps its error differently one day, the message is read from the text
        // instead; this test says when that happens.
        let (path, message) = deserializer_error(&refused("/x?limit=abc&token=1")).unwrap();
        assert_eq!(path, "limit");
        assert_eq!(message, "invalid digit found in string");
    }

    #[test]
    fn a_query_error_names_the_parameter() {
        let e = query_error(&refused("/x?limit=abc&token=1"));
        assert_eq!(
            (e.status, e.code),
            (StatusCode::BAD_REQUEST, "invalid_request")
        );
        assert_eq!(e.field.as_deref(), Some("limit"));
        let e = query_error(&refused("/x?limit=5"));
        assert_eq!(e.field.as_deref(), Some("token"));
        assert_eq!(e.message, "the query parameter `token` is required");
    }
}
