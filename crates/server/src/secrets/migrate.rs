//! At start, seals again what the unbound `v1` format sealed, and seals the namespaces' default
//! webhook URLs kept in clear before they were secrets. Each `v1:` value found in the store is
//! opened with the server's key and sealed for the place it is stored in — a job's definition,
//! versions and notifications for that job, a namespace's secrets and settings for that
//! namespace — then written back only if the stored text is still the one read (a write since
//! wins). Afterwards no `v1:` value opens anywhere: one pasted elsewhere before the upgrade is
//! bound where it was pasted, one pasted after is refused.

use super::{is_sealed, Binding, SecretError, SecretKey};
use crate::secrets::seal_value;
use sked_store::{Audit, SealedColumn, Store, StoreError, StoredSeal};

/// What [`reseal`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Resealed {
    /// Values sealed again for where they are.
    pub values: u64,
    /// Stored texts rewritten.
    pub texts: u64,
    /// Default webhook URLs sealed.
    pub urls: u64,
    /// Where a value could not be opened (another key, or damaged): left as it was, refused
    /// when used. Names places, never values.
    pub unopened: Vec<String>,
}

/// Seals every `v1:` value again for where it is stored, and every namespace's default
/// webhook URL kept in clear. Safe to run on every start and on several nodes at once.
pub async fn reseal(store: &dyn Store, key: &SecretKey) -> Result<Resealed, StoreError> {
    let mut done = Resealed::default();
    for stored in store.sealed_texts("v1:").await? {
        let text = match &stored.column {
            SealedColumn::Secret(..) => {
                let place = place(&stored);
                let binding = Binding::Namespace(&stored.namespace);
                let sealed = key
                    .open_unbound(&place, &stored.text)
                    .and_then(|clear| key.seal(&place, &clear, binding));
                match sealed {
                    Ok(text) => {
                        done.values += 1;
                        text
                    }
                    Err(_) => {
                        done.unopened.push(place);
                        continue;
                    }
                }
            }
            _ => match resealed_text(key, &stored, &mut done) {
                Some(text) if text != stored.text => text,
                _ => continue,
            },
        };
        if store.replace_sealed(&stored, &text).await? {
            done.texts += 1;
        }
    }
    done.urls = seal_default_urls(store, key).await?;
    Ok(done)
}

/// Where a stored text is, for a log line.
fn place(stored: &StoredSeal) -> String {
    match &stored.column {
        SealedColumn::JobSpec(_) | SealedColumn::JobNotify(_) => format!(
            "job {}/{}",
            stored.namespace,
            stored.job.as_deref().unwrap_or_default()
        ),
        SealedColumn::JobVersion(_, version) => format!(
            "version {version} of job {}/{}",
            stored.namespace,
            stored.job.as_deref().unwrap_or_default()
        ),
        SealedColumn::NamespaceSpec(name) | SealedColumn::NamespaceNotify(name) => {
            format!("settings of namespace {name}")
        }
        SealedColumn::Secret(namespace, name) => format!("secret {name} of namespace {namespace}"),
        SealedColumn::Notification(id) => format!("notification {id}"),
    }
}

/// A JSON text with each `{"sealed": "v1:..."}` value sealed again for where it is stored;
/// `None` when it is not JSON.
fn resealed_text(key: &SecretKey, stored: &StoredSeal, done: &mut Resealed) -> Option<String> {
    let json: serde_json::Value = serde_json::from_str(&stored.text).ok()?;
    let mut old = Vec::new();
    unbound_values(&json, &mut old);
    let binding = match &stored.job {
        Some(job) => Binding::Job {
            namespace: &stored.namespace,
            job,
        },
        None => Binding::Namespace(&stored.namespace),
    };
    let place = place(stored);
    // Each sealed value has a nonce of its own, so its text occurs once: replacing the text
    // keeps the rest of the stored text byte for byte.
    let mut text = stored.text.clone();
    for value in old {
        let sealed = key
            .open_unbound(&place, value)
            .and_then(|clear| key.seal(&place, &clear, binding));
        match sealed {
            Ok(new) => {
                text = text.replace(&format!("\"{value}\""), &format!("\"{new}\""));
                done.values += 1;
            }
            Err(_) => done.unopened.push(place.clone()),
        }
    }
    Some(text)
}

/// The `v1:` texts of every `{"sealed": ...}` object in `json`.
fn unbound_values<'j>(json: &'j serde_json::Value, found: &mut Vec<&'j str>) {
    match json {
        serde_json::Value::Object(map) => {
            if let (1, Some(serde_json::Value::String(sealed))) = (map.len(), map.get("sealed")) {
                if sealed.starts_with("v1:") {
                    found.push(sealed);
                }
                return;
            }
            map.values().for_each(|v| unbound_values(v, found));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| unbound_values(v, found)),
        _ => {}
    }
}

/// Seals the default webhook URLs namespaces kept in clear; how many.
async fn seal_default_urls(store: &dyn Store, key: &SecretKey) -> Result<u64, StoreError> {
    let mut sealed = 0;
    for mut namespace in store.list_namespaces().await? {
        let binding = Binding::Namespace(&namespace.name);
        let mut changed = false;
        for (i, rule) in namespace.spec.notify.iter_mut().enumerate() {
            let Some(hook) = rule.webhook.as_mut().filter(|h| !is_sealed(&h.url)) else {
                continue;
            };
            let field = format!("notify[{i}].webhook.url");
            match seal_value(Some(key), binding, &field, &hook.url) {
                Ok(url) => {
                    hook.url = url;
                    changed = true;
                    sealed += 1;
                }
                Err(SecretError::TooLong { .. }) => continue,
                Err(e) => tracing::warn!("namespace {}: {e}", namespace.name),
            }
        }
        if changed {
            store
                .put_namespace(
                    &namespace.name,
                    &namespace.spec,
                    chrono::Utc::now(),
                    Audit::none(),
                )
                .await?;
        }
    }
    Ok(sealed)
}
