//! The audit trail as handlers write it: who changed what, from where, before and after, with
//! the values that may hold secrets taken out. Reading it is `api/audit.rs`; keeping it is the
//! store's.

use crate::auth::Caller;
use crate::AppState;
use serde_json::Value;
use sked_core::records::AuditEntry;

/// What replaces a value that may be a secret.
pub const REDACTED: &str = "(redacted)";

/// Keys whose object's values may be secrets: a job's environment and an HTTP target's
/// headers (an `Authorization` header, a password in the env).
const SECRET_MAPS: &[&str] = &["env", "headers"];

/// One change to record.
pub struct Change<'a> {
    /// `job.put`, `job.delete`, `run.cancel`, `token.create`…
    pub action: &'a str,
    pub namespace: Option<&'a str>,
    pub object: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

/// Appends `change` by `caller` to the audit trail before the request is answered. A store
/// that cannot take it does not undo the change: the failure is logged as an error.
pub async fn record(state: &AppState, caller: &Caller, change: Change<'_>) {
    let entry = AuditEntry {
        at: chrono::Utc::now(),
        actor: caller.name.clone(),
        actor_id: caller.token_id,
        peer: caller.peer.map(|p| p.to_string()),
        action: change.action.to_string(),
        namespace: change.namespace.map(str::to_string),
        object: change.object,
        before: change.before.map(redacted),
        after: change.after.map(redacted),
    };
    if let Err(e) = state.store.append_audit(&[entry]).await {
        tracing::error!(
            "cannot record {} by {} in the audit trail: {e}",
            change.action,
            caller.name
        );
    }
}

/// `value` with every value under an `env` or `headers` object replaced by [`REDACTED`].
pub fn redacted(mut value: Value) -> Value {
    redact(&mut value);
    value
}

fn redact(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                match inner {
                    Value::Object(secrets) if SECRET_MAPS.contains(&key.as_str()) => {
                        for secret in secrets.values_mut() {
                            *secret = Value::String(REDACTED.to_string());
                        }
                    }
                    other => redact(other),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn env_and_header_values_are_redacted_wherever_they_are() {
        let job = json!({
            "name": "backup",
            "env": {"DB_PASSWORD": "hunter2"},
            "target": {"http": {"url": "https://x", "headers": {"Authorization": "Bearer abc"}}},
            "description": "env: not a map here",
        });
        let out = redacted(job).to_string();
        assert!(!out.contains("hunter2"), "{out}");
        assert!(!out.contains("Bearer abc"), "{out}");
        assert!(
            out.contains("DB_PASSWORD"),
            "keys stay, to say what changed: {out}"
        );
        assert!(out.contains("env: not a map here"));
    }
}
