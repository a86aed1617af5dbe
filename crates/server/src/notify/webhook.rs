//! Webhook notifications: a JSON POST of the message, with the rule's headers (secrets opened
//! only here, just before the request), through the HTTP client that enforces the HTTP target
//! policy, so a webhook reaches nothing an HTTP target could not.

use crate::secrets::{is_sealed, open_value, open_values, Binding};
use crate::AppState;
use reqwest::header::HeaderName;
use sked_core::notify::{NotificationRecord, SendOutcome, Webhook};
use sked_core::target::TargetValue;
use sked_egress::{refusal_behind, SendError, SharedPolicy, TargetClient};
use sked_store::SecretName;
use std::collections::BTreeMap;

/// What the requests say they come from.
const USER_AGENT: &str = concat!("sked-notifier/", env!("CARGO_PKG_VERSION"));

pub struct Sender {
    client: TargetClient,
}

impl Sender {
    pub fn new(policy: sked_core::egress::EgressPolicy) -> Result<Sender, String> {
        let client = TargetClient::new(SharedPolicy::new(policy), USER_AGENT)
            .map_err(|e| format!("cannot build the webhook client: {e}"))?;
        Ok(Sender { client })
    }

    pub async fn send(
        &self,
        state: &AppState,
        notification: &NotificationRecord,
        hook: &Webhook,
    ) -> SendOutcome {
        // A job's rule's values are sealed for the job; a namespace's default rule's (its URL
        // too), for the namespace.
        let bindings = [
            Binding::Job {
                namespace: &notification.namespace,
                job: &notification.job,
            },
            Binding::Namespace(&notification.namespace),
        ];
        let url = if is_sealed(&hook.url) {
            let key = state.config.secret_key.as_ref();
            match open_value(key, &bindings, "webhook.url", &hook.url) {
                Ok(url) => url,
                Err(e) => return SendOutcome::Refused(e.to_string()),
            }
        } else {
            hook.url.clone()
        };
        let url = match reqwest::Url::parse(url.trim()) {
            Ok(url) => url,
            Err(e) => return SendOutcome::Refused(format!("the webhook URL is not usable: {e}")),
        };
        if let Err(refused) = self.client.permits(&url) {
            return SendOutcome::Refused(refused.to_string());
        }
        // Headers whose values are secrets never follow a redirect to another origin.
        let secret: Vec<HeaderName> = hook
            .headers
            .iter()
            .filter(|(_, value)| !matches!(value, TargetValue::Plain(_)))
            .filter_map(|(name, _)| HeaderName::from_bytes(name.as_bytes()).ok())
            .collect();
        let headers = match opened_headers(state, &bindings, hook).await {
            Ok(headers) => headers,
            Err(outcome) => return outcome,
        };
        let mut request = self
            .client
            .http()
            .post(url)
            .header("Sked-Notification-Id", notification.id.to_string())
            .header("Sked-Event", notification.event.as_str())
            .json(&notification.message);
        for (name, value) in &headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = match request.build() {
            Ok(request) => request,
            Err(e) => return SendOutcome::Refused(error_chain(&e.without_url())),
        };
        match self.client.send(request, &secret).await {
            Ok(response) => judge(response.status()),
            Err(SendError::Http(e)) => match refusal_behind(&e) {
                Some(refused) => SendOutcome::Refused(refused.to_string()),
                // reqwest names the URL in its errors; a webhook URL often holds a token.
                None => SendOutcome::Failed(error_chain(&e.without_url())),
            },
            Err(SendError::RedirectRefused { refused, .. }) => {
                SendOutcome::Refused(format!("{refused} (on a redirect)"))
            }
            Err(SendError::BadRedirect { why, .. }) => SendOutcome::Refused(why),
            Err(SendError::TooManyRedirects { .. }) => {
                SendOutcome::Refused("the webhook redirected too many times".to_string())
            }
        }
    }
}

/// An error and its causes on one line: reqwest's own message rarely says what failed.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        source = cause.source();
    }
    text
}

/// 2xx is delivered; 408, 429 and 5xx are worth another try; any other answer will not change.
fn judge(status: reqwest::StatusCode) -> SendOutcome {
    let code = status.as_u16();
    if status.is_success() {
        SendOutcome::Sent
    } else if status.is_server_error() || code == 408 || code == 429 {
        SendOutcome::Failed(format!("the webhook answered {status}"))
    } else {
        SendOutcome::Refused(format!("the webhook answered {status}"))
    }
}

/// The rule's headers in clear: sealed values opened with the server's key, references read
/// from the namespace's secrets. A header that cannot be opened fails the send, naming it.
async fn opened_headers(
    state: &AppState,
    bindings: &[Binding<'_>],
    hook: &Webhook,
) -> Result<BTreeMap<String, String>, SendOutcome> {
    let namespace = bindings.first().map_or("", Binding::namespace);
    let mut headers = hook.headers.clone();
    let wanted: Vec<SecretName> = headers
        .values()
        .filter_map(|value| match value {
            TargetValue::SecretRef(r) => Some((namespace.to_string(), r.secret_ref.clone())),
            _ => None,
        })
        .collect();
    let sealed =
        if wanted.is_empty() {
            BTreeMap::new()
        } else {
            state.store.sealed_secrets(&wanted).await.map_err(|e| {
                SendOutcome::Failed(format!("cannot read the namespace's secrets: {e}"))
            })?
        };
    let refs: BTreeMap<&str, &str> = sealed
        .iter()
        .map(|((_, name), value)| (name.as_str(), value.as_str()))
        .collect();
    open_values(
        state.config.secret_key.as_ref(),
        bindings,
        "webhook.headers",
        headers.iter_mut(),
        &refs,
    )
    .map_err(|e| SendOutcome::Refused(e.to_string()))?;
    Ok(headers
        .into_iter()
        .filter_map(|(name, value)| value.text().map(|text| (name, text.to_string())))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_a_retry_can_change_are_retried() {
        let outcome = |code| judge(reqwest::StatusCode::from_u16(code).unwrap());
        assert_eq!(outcome(200), SendOutcome::Sent);
        assert_eq!(outcome(204), SendOutcome::Sent);
        for code in [408, 429, 500, 503] {
            assert!(matches!(outcome(code), SendOutcome::Failed(_)), "{code}");
        }
        for code in [301, 400, 401, 404, 410] {
            assert!(matches!(outcome(code), SendOutcome::Refused(_)), "{code}");
        }
    }
}
