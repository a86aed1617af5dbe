//! Secrets in job definitions and namespace secrets: sealed (AES-256-GCM) with the server's key
//! before a definition or a secret is stored, and opened only in the attempt handed to a
//! worker (or the webhook sent). What a secret is and where it may appear is
//! `sked_core::target`'s; this module only encrypts and decrypts.
//!
//! A sealed value reads `v2:<key id>:<base64 of nonce and ciphertext>`; the key id (the first
//! 8 hex digits of the key's SHA-256) says which key sealed it, so a node given another key
//! says so instead of failing obscurely. Every value is sealed for a [`Binding`] — the job
//! (namespace and name) whose definition holds it, or the namespace whose secret or settings
//! hold it — given to AES-GCM as associated data: it opens only there, so a sealed value read
//! in one namespace and pasted into another (or into another job) is refused. `v1:` values,
//! sealed before bindings existed, are sealed again at start ([`migrate`]) and never opened
//! otherwise.

pub mod migrate;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Digest, Sha256};
use sked_core::notify::NotifyRule;
use sked_core::target::{SealedText, TargetSpec, TargetValue};
use std::collections::BTreeMap;
use std::sync::Arc;

const VERSION: &str = "v2";
/// The format before bindings: opened only by [`migrate`], to seal it again.
const UNBOUND_VERSION: &str = "v1";
const NONCE_LEN: usize = 12;
/// Longest secret accepted, in bytes: env values and headers are small.
pub const MAX_SECRET_LEN: usize = 64 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("the secret key must be 32 bytes in base64 ({0})")]
    BadKey(String),
    #[error("{field} was sealed by another server's key ({found}; this server's is {ours}): give every node the same --secret-key-file, or send the secret again as {{\"secret\": ...}}")]
    OtherKey {
        field: String,
        found: String,
        ours: String,
    },
    #[error("{field} is not a value this server sealed for this place (a sealed value opens only in the job, or for a namespace's secrets and settings the namespace, it was sealed for): send the secret again as {{\"secret\": ...}}")]
    NotSealed { field: String },
    #[error("{field} was sealed in the unbound v1 format, which this server no longer opens: send the secret again as {{\"secret\": ...}}")]
    Unbound { field: String },
    #[error("{field} is longer than {MAX_SECRET_LEN} bytes")]
    TooLong { field: String },
    #[error("{field} is a secret, and this server has no secret key")]
    NoKey { field: String },
    #[error(
        "{field} refers to secret {name:?}, which its namespace does not have (sked secret set)"
    )]
    MissingRef { field: String, name: String },
}

/// Where a sealed value belongs: it opens only there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding<'a> {
    /// A value in a job's definition: its target's env or headers, its `notify` rules' headers.
    Job { namespace: &'a str, job: &'a str },
    /// A namespace secret, or a value in the namespace's settings (its default webhooks).
    Namespace(&'a str),
}

impl Binding<'_> {
    /// The associated data the value is sealed with. Names hold no NUL, so no two bindings
    /// share one.
    fn associated_data(&self) -> Vec<u8> {
        let text = match self {
            Binding::Job { namespace, job } => format!("sked sealed v2\0job\0{namespace}\0{job}"),
            Binding::Namespace(namespace) => format!("sked sealed v2\0namespace\0{namespace}"),
        };
        text.into_bytes()
    }

    pub fn namespace(&self) -> &str {
        match self {
            Binding::Job { namespace, .. } | Binding::Namespace(namespace) => namespace,
        }
    }
}

/// The server's key for secrets. `Debug` shows only its id.
#[derive(Clone)]
pub struct SecretKey {
    cipher: Arc<Aes256Gcm>,
    id: String,
    /// A key of its own for completion tokens, derived from this one (`crate::completion`).
    completion: [u8; 32],
    /// A key of its own for console sessions (`crate::console`).
    sessions: [u8; 32],
    /// The key runs' trace ids are derived under (`crate::traces`): not secret in itself, but
    /// one installation's, so two sked installations exporting to one collector do not
    /// share trace ids.
    traces: [u8; 32],
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey({})", self.id)
    }
}

impl SecretKey {
    /// A key from its file's text: 32 bytes in base64.
    pub fn from_base64(text: &str) -> Result<SecretKey, SecretError> {
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|e| SecretError::BadKey(e.to_string()))?;
        if bytes.len() != 32 {
            return Err(SecretError::BadKey(format!("{} bytes", bytes.len())));
        }
        let cipher =
            Aes256Gcm::new_from_slice(&bytes).map_err(|e| SecretError::BadKey(e.to_string()))?;
        let digest = Sha256::digest(&bytes);
        let id = hex::encode(&digest[..4]);
        let completion = Sha256::new()
            .chain_update(b"sked completion tokens v1\0")
            .chain_update(&bytes)
            .finalize()
            .into();
        let sessions = Sha256::new()
            .chain_update(b"sked console sessions v1\0")
            .chain_update(&bytes)
            .finalize()
            .into();
        let traces = Sha256::new()
            .chain_update(b"sked trace ids v1\0")
            .chain_update(&bytes)
            .finalize()
            .into();
        Ok(SecretKey {
            cipher: Arc::new(cipher),
            id,
            completion,
            sessions,
            traces,
        })
    }

    /// A new key's file text: 32 random bytes in base64.
    pub fn generate() -> String {
        STANDARD.encode(rand::random::<[u8; 32]>())
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The key completion tokens are made with: every node with this secret key has it.
    pub fn completion_key(&self) -> [u8; 32] {
        self.completion
    }

    /// The key console sessions are sealed with: every node with this secret key has it, so a
    /// console login works on any of them.
    pub fn sessions_key(&self) -> [u8; 32] {
        self.sessions
    }

    /// The key runs' trace ids are derived under: every node with this secret key has it.
    pub fn trace_key(&self) -> sked_core::trace::TraceKey {
        sked_core::trace::TraceKey(self.traces)
    }

    /// Fails only past GCM's input limit, far above [`MAX_SECRET_LEN`]; never stores a value
    /// that would not open.
    fn seal(&self, field: &str, clear: &str, binding: Binding<'_>) -> Result<String, SecretError> {
        let nonce_bytes: [u8; NONCE_LEN] = rand::random();
        let aad = binding.associated_data();
        let payload = Payload {
            msg: clear.as_bytes(),
            aad: &aad,
        };
        let ciphertext = self
            .cipher
            .encrypt(Nonce::from_slice(&nonce_bytes), payload)
            .map_err(|_| SecretError::TooLong {
                field: field.to_string(),
            })?;
        let mut sealed = nonce_bytes.to_vec();
        sealed.extend(ciphertext);
        Ok(format!("{VERSION}:{}:{}", self.id, STANDARD.encode(sealed)))
    }

    /// Opens a value sealed for one of `bindings` (a webhook's header may be its job's or its
    /// namespace's).
    fn open(
        &self,
        field: &str,
        sealed: &str,
        bindings: &[Binding<'_>],
    ) -> Result<String, SecretError> {
        if sealed.starts_with(&format!("{UNBOUND_VERSION}:")) {
            return Err(SecretError::Unbound {
                field: field.to_string(),
            });
        }
        let bytes = self.body(field, sealed, VERSION)?;
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        bindings
            .iter()
            .find_map(|binding| {
                let aad = binding.associated_data();
                let payload = Payload {
                    msg: ciphertext,
                    aad: &aad,
                };
                self.cipher.decrypt(Nonce::from_slice(nonce), payload).ok()
            })
            .and_then(|clear| String::from_utf8(clear).ok())
            .ok_or_else(|| SecretError::NotSealed {
                field: field.to_string(),
            })
    }

    /// Opens a `v1:` value, which no binding protects: only to seal it again where it is
    /// stored ([`migrate`]).
    fn open_unbound(&self, field: &str, sealed: &str) -> Result<String, SecretError> {
        let not_sealed = || SecretError::NotSealed {
            field: field.to_string(),
        };
        let bytes = self.body(field, sealed, UNBOUND_VERSION)?;
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        let clear = self
            .cipher
            .decrypt(Nonce::from_slice(nonce), ciphertext)
            .map_err(|_| not_sealed())?;
        String::from_utf8(clear).map_err(|_| not_sealed())
    }

    /// A sealed value's nonce and ciphertext (at least [`NONCE_LEN`] bytes), once its version
    /// and key id are checked.
    fn body(&self, field: &str, sealed: &str, version: &str) -> Result<Vec<u8>, SecretError> {
        let not_sealed = || SecretError::NotSealed {
            field: field.to_string(),
        };
        let mut parts = sealed.splitn(3, ':');
        let (Some(found), Some(id), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(not_sealed());
        };
        if found != version {
            return Err(not_sealed());
        }
        if id != self.id {
            return Err(SecretError::OtherKey {
                field: field.to_string(),
                found: id.to_string(),
                ours: self.id.clone(),
            });
        }
        let bytes = STANDARD.decode(body).map_err(|_| not_sealed())?;
        if bytes.len() < NONCE_LEN {
            return Err(not_sealed());
        }
        Ok(bytes)
    }
}

/// Seals every secret given in clear, for `binding`; checks that every sealed value is this
/// key's and opens there (one sealed elsewhere is refused, naming its field). Before a
/// definition is stored.
pub fn seal_target(
    key: Option<&SecretKey>,
    binding: Binding<'_>,
    target: &mut TargetSpec,
) -> Result<(), SecretError> {
    let place = target.values_field();
    seal_values(key, binding, place, target.values_mut())
}

/// Seals the secrets of `notify` rules' webhook headers, as [`seal_target`] does a target's.
pub fn seal_notify(
    key: Option<&SecretKey>,
    binding: Binding<'_>,
    rules: &mut [NotifyRule],
) -> Result<(), SecretError> {
    for (i, rule) in rules.iter_mut().enumerate() {
        let place = format!("notify[{i}].webhook.headers");
        seal_values(key, binding, &place, rule.webhook_headers_mut())?;
    }
    Ok(())
}

/// Seals the values given in clear among `values` (`place` says where they are, for errors).
fn seal_values<'v>(
    key: Option<&SecretKey>,
    binding: Binding<'_>,
    place: &str,
    values: impl Iterator<Item = (&'v String, &'v mut TargetValue)>,
) -> Result<(), SecretError> {
    for (name, value) in values {
        let field = format!("{place}.{name}");
        let needed = |field: &str| {
            key.ok_or_else(|| SecretError::NoKey {
                field: field.to_string(),
            })
        };
        let sealed = match &*value {
            TargetValue::Plain(_) | TargetValue::SecretRef(_) => continue,
            TargetValue::Secret(secret) if secret.secret.len() > MAX_SECRET_LEN => {
                return Err(SecretError::TooLong { field })
            }
            TargetValue::Secret(secret) => needed(&field)?.seal(&field, &secret.secret, binding)?,
            TargetValue::Sealed(sealed) => {
                needed(&field)?.open(&field, &sealed.sealed, &[binding])?;
                continue;
            }
        };
        *value = TargetValue::Sealed(SealedText { sealed });
    }
    Ok(())
}

/// Seals a value in clear for `binding` (`field` names it in errors): a namespace secret, a
/// namespace's default webhook URL.
pub fn seal_value(
    key: Option<&SecretKey>,
    binding: Binding<'_>,
    field: &str,
    clear: &str,
) -> Result<String, SecretError> {
    let field = field.to_string();
    if clear.len() > MAX_SECRET_LEN {
        return Err(SecretError::TooLong { field });
    }
    match key {
        Some(key) => key.seal(&field, clear, binding),
        None => Err(SecretError::NoKey { field }),
    }
}

/// Opens one value [`seal_value`] sealed, if it was sealed for one of `bindings`.
pub fn open_value(
    key: Option<&SecretKey>,
    bindings: &[Binding<'_>],
    field: &str,
    sealed: &str,
) -> Result<String, SecretError> {
    match key {
        Some(key) => key.open(field, sealed, bindings),
        None => Err(SecretError::NoKey {
            field: field.to_string(),
        }),
    }
}

/// A value sealed as servers before bindings sealed it (`v1:`, no associated data): what
/// [`migrate`] finds in an older store. Only for the migration's tests.
#[doc(hidden)]
pub fn seal_unbound(key: &SecretKey, clear: &str) -> String {
    let nonce: [u8; NONCE_LEN] = rand::random();
    let mut sealed = nonce.to_vec();
    // Fails only past GCM's input limit; a test's value is small.
    if let Ok(ciphertext) = key
        .cipher
        .encrypt(Nonce::from_slice(&nonce), clear.as_bytes())
    {
        sealed.extend(ciphertext);
    }
    format!("{UNBOUND_VERSION}:{}:{}", key.id, STANDARD.encode(sealed))
}

/// Whether `text` is a sealed value (of any version) rather than text in clear.
pub fn is_sealed(text: &str) -> bool {
    [VERSION, UNBOUND_VERSION].iter().any(|v| {
        text.strip_prefix(v)
            .is_some_and(|rest| rest.starts_with(':'))
    })
}

/// Opens every sealed value (sealed for `binding`) and every reference to a namespace secret
/// (`refs`: the sealed values of the namespace's secrets, by name, sealed for the namespace),
/// for the attempt handed to a worker. A value that cannot be opened stays as it was (the
/// worker then fails the attempt, naming it), and the first error is returned.
pub fn open_target(
    key: Option<&SecretKey>,
    binding: Binding<'_>,
    target: &mut TargetSpec,
    refs: &BTreeMap<&str, &str>,
) -> Result<(), SecretError> {
    let place = target.values_field();
    open_values(key, &[binding], place, target.values_mut(), refs)
}

/// Opens sealed values and references among `values`, as [`open_target`] does a target's: a
/// webhook's headers just before it is sent (sealed for its job or, for a namespace's default
/// rule, its namespace: `bindings` are tried in turn, all of one namespace).
pub fn open_values<'v>(
    key: Option<&SecretKey>,
    bindings: &[Binding<'_>],
    place: &str,
    values: impl Iterator<Item = (&'v String, &'v mut TargetValue)>,
    refs: &BTreeMap<&str, &str>,
) -> Result<(), SecretError> {
    let mut first_error = None;
    let namespace = bindings.first().map(|b| Binding::Namespace(b.namespace()));
    for (name, value) in values {
        let field = format!("{place}.{name}");
        let (sealed, bound): (&str, &[Binding<'_>]) = match value {
            TargetValue::Sealed(sealed) => (sealed.sealed.as_str(), bindings),
            TargetValue::SecretRef(r) => match refs.get(r.secret_ref.as_str()) {
                Some(sealed) => (sealed, namespace.as_slice()),
                None => {
                    first_error.get_or_insert(SecretError::MissingRef {
                        field,
                        name: r.secret_ref.clone(),
                    });
                    continue;
                }
            },
            TargetValue::Plain(_) | TargetValue::Secret(_) => continue,
        };
        let opened = match key {
            Some(key) => key.open(&field, sealed, bound),
            None => Err(SecretError::NoKey { field }),
        };
        match opened {
            Ok(clear) => *value = TargetValue::Plain(clear),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sked_core::target::SecretText;

    const JOB: Binding<'static> = Binding::Job {
        namespace: "team-a",
        job: "nightly",
    };
    const NS: Binding<'static> = Binding::Namespace("team-a");

    fn key() -> SecretKey {
        SecretKey::from_base64(&SecretKey::generate()).unwrap()
    }

    fn shell_with(value: TargetValue) -> TargetSpec {
        serde_json::from_value(serde_json::json!({"shell": {"command": "true"}}))
            .map(|mut t: TargetSpec| {
                if let TargetSpec::Shell(s) = &mut t {
                    s.env.insert("PASSWORD".into(), value);
                }
                t
            })
            .unwrap()
    }

    fn secret(text: &str) -> TargetValue {
        TargetValue::Secret(SecretText {
            secret: text.into(),
        })
    }

    #[test]
    fn a_secret_is_sealed_for_the_store_and_opened_for_the_worker() {
        let key = key();
        let mut target = shell_with(secret("hunter2"));
        seal_target(Some(&key), JOB, &mut target).unwrap();
        let stored = serde_json::to_string(&target).unwrap();
        assert!(!stored.contains("hunter2"), "{stored}");
        assert!(stored.contains(&format!("v2:{}:", key.id())), "{stored}");
        // Sent back unchanged, a sealed value is accepted and stays what it was.
        let mut again = target.clone();
        seal_target(Some(&key), JOB, &mut again).unwrap();
        assert_eq!(again, target);
        open_target(Some(&key), JOB, &mut target, &BTreeMap::new()).unwrap();
        assert_eq!(target, shell_with("hunter2".into()));
    }

    #[test]
    fn two_seals_of_one_secret_differ() {
        let key = key();
        assert_ne!(key.seal("f", "x", JOB), key.seal("f", "x", JOB));
    }

    #[test]
    fn another_key_a_forgery_or_no_key_is_refused_by_name() {
        let (ours, theirs) = (key(), key());
        let mut target = shell_with(secret("hunter2"));
        seal_target(Some(&theirs), JOB, &mut target).unwrap();
        let mut sent = target.clone();
        assert!(matches!(
            seal_target(Some(&ours), JOB, &mut sent),
            Err(SecretError::OtherKey { .. })
        ));
        assert!(open_target(Some(&ours), JOB, &mut sent, &BTreeMap::new()).is_err());
        assert_eq!(sent, target, "what cannot be opened stays sealed");

        let forged = format!("v2:{}:{}", ours.id(), STANDARD.encode([0u8; 40]));
        let mut target = shell_with(TargetValue::Sealed(SealedText { sealed: forged }));
        assert_eq!(
            seal_target(Some(&ours), JOB, &mut target),
            Err(SecretError::NotSealed {
                field: "target.shell.env.PASSWORD".into()
            })
        );
        let mut target = shell_with(secret("x"));
        assert!(matches!(
            seal_target(None, JOB, &mut target),
            Err(SecretError::NoKey { .. })
        ));
    }

    #[test]
    fn a_key_is_32_bytes_of_base64() {
        assert!(SecretKey::from_base64("not base64!").is_err());
        assert!(SecretKey::from_base64(&STANDARD.encode([1u8; 16])).is_err());
        let key = key();
        assert_eq!(format!("{key:?}"), format!("SecretKey({})", key.id()));
    }

    #[test]
    fn a_reference_opens_to_its_namespace_secret_or_stays_a_reference() {
        let key = key();
        let reference = TargetValue::SecretRef(sked_core::target::SecretRef {
            secret_ref: "db-password".into(),
        });
        let sealed = seal_value(Some(&key), NS, "secret db-password", "hunter2").unwrap();
        assert!(!sealed.contains("hunter2"));
        let mut target = shell_with(reference.clone());
        let refs = BTreeMap::from([("db-password", sealed.as_str())]);
        open_target(Some(&key), JOB, &mut target, &refs).unwrap();
        assert_eq!(target, shell_with(TargetValue::Plain("hunter2".into())));

        let mut missing = shell_with(reference.clone());
        let err = open_target(Some(&key), JOB, &mut missing, &BTreeMap::new()).unwrap_err();
        assert!(matches!(&err, SecretError::MissingRef { name, .. } if name == "db-password"));
        assert_eq!(missing, shell_with(reference));
        assert!(seal_value(None, NS, "secret x", "y").is_err());
        let long = "x".repeat(MAX_SECRET_LEN + 1);
        assert!(matches!(
            seal_value(Some(&key), NS, "secret x", &long),
            Err(SecretError::TooLong { .. })
        ));
    }

    #[test]
    fn a_sealed_value_opens_only_where_it_was_sealed() {
        let key = key();
        let mut target = shell_with(secret("hunter2"));
        seal_target(Some(&key), JOB, &mut target).unwrap();
        let elsewhere = [
            Binding::Job {
                namespace: "team-b",
                job: "nightly",
            },
            Binding::Job {
                namespace: "team-a",
                job: "other",
            },
            NS,
        ];
        for binding in elsewhere {
            let mut pasted = target.clone();
            assert!(
                matches!(
                    seal_target(Some(&key), binding, &mut pasted),
                    Err(SecretError::NotSealed { .. })
                ),
                "{binding:?}"
            );
            assert!(open_target(Some(&key), binding, &mut pasted, &BTreeMap::new()).is_err());
            assert_eq!(pasted, target, "{binding:?}: stays sealed");
        }
        // A namespace secret opens for the jobs of its namespace only.
        let sealed = seal_value(Some(&key), NS, "secret db", "s3cret").unwrap();
        let refs = BTreeMap::from([("db", sealed.as_str())]);
        let reference = TargetValue::SecretRef(sked_core::target::SecretRef {
            secret_ref: "db".into(),
        });
        let mut own = shell_with(reference.clone());
        open_target(Some(&key), JOB, &mut own, &refs).unwrap();
        assert_eq!(own, shell_with("s3cret".into()));
        let mut other = shell_with(reference);
        let team_b = Binding::Job {
            namespace: "team-b",
            job: "nightly",
        };
        assert!(open_target(Some(&key), team_b, &mut other, &refs).is_err());
        assert!(open_value(Some(&key), &[Binding::Namespace("team-b")], "f", &sealed).is_err());
        assert_eq!(
            open_value(Some(&key), &[NS], "f", &sealed).unwrap(),
            "s3cret"
        );
    }

    #[test]
    fn an_unbound_v1_value_opens_only_to_be_sealed_again() {
        let key = key();
        let v1 = seal_unbound(&key, "hunter2");
        assert!(is_sealed(&v1));
        assert_eq!(key.open_unbound("f", &v1).unwrap(), "hunter2");
        assert!(matches!(
            key.open("f", &v1, &[JOB, NS]),
            Err(SecretError::Unbound { .. })
        ));
        let mut target = shell_with(TargetValue::Sealed(SealedText { sealed: v1 }));
        assert!(matches!(
            seal_target(Some(&key), JOB, &mut target),
            Err(SecretError::Unbound { .. })
        ));
    }
}
