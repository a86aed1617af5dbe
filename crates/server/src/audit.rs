//! The audit trail as handlers write it: who changed what, from where, before and after, with
//! the values that may hold secrets taken out. A handler hands its audit to the store with the
//! write ([`by`]), so that the change and its entry commit together or not at all. Reading it is
//! `api/audit.rs`; keeping it is the store's.

use crate::auth::Caller;
use serde_json::Value;
use sked_core::records::AuditEntry;
use sked_store::Audit;

/// What replaces a value that may be a secret.
pub const REDACTED: &str = "(redacted)";

/// Keys whose object's values may be secrets: a job's environment and an HTTP target's
/// headers (an `Authorization` header, a password in the env).
const SECRET_MAPS: &[&str] = &["env", "headers"];

/// One change to record.
pub struct Change {
    /// `job.put`, `job.delete`, `run.cancel`, `token.create`…
    pub action: &'static str,
    pub namespace: Option<String>,
    pub object: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

/// The audit of a write by `caller`, for the store to write in the change's own transaction:
/// `changes` says, from what the write did, which changes it made (none when it changed
/// nothing). A change whose entry cannot be written is not made: the request fails instead.
pub fn by<T, C>(caller: &Caller, changes: impl Fn(&T) -> C + Send + Sync + 'static) -> Audit<T>
where
    T: 'static,
    C: IntoIterator<Item = Change> + 'static,
{
    let actor = caller.name.clone();
    let actor_id = caller.token_id;
    let peer = caller.peer.map(|p| p.to_string());
    Audit::new(move |outcome| {
        let at = chrono::Utc::now();
        changes(outcome)
            .into_iter()
            .map(|change| AuditEntry {
                at,
                actor: actor.clone(),
                actor_id,
                peer: peer.clone(),
                action: change.action.to_string(),
                namespace: change.namespace,
                object: change.object,
                before: change.before.map(redacted),
                after: change.after.map(redacted),
            })
            .collect()
    })
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
