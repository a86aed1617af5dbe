//! The flow-control capability of a store: the limits named in a namespace, the attempts
//! holding each concurrency key, and the admission of a start batch over its keys.
//!
//! The rule is `sked_core::flow::Book::admit`; a store's part is to read the state of the
//! batch's keys with those keys locked (so two nodes starting runs of one key take turns),
//! call the rule run by run in the batch's order, start the admitted runs, and record what
//! they hold, all in the transaction that starts them. An attempt holds its concurrency keys
//! while it is `running` — while its fencing token is live — and a later start of a key
//! replaces the rows of its attempts that ended before it, so no path that ends an attempt (completion,
//! cancel, timeout, the reaper) has to know about keys. Until then their ends keep the next
//! start of the key from being recorded before them ([`start_instant`]).

use crate::Result;
use async_trait::async_trait;
use sked_core::flow::{Gates, Hold, LimitSpec};
use sked_core::Instant;
use std::collections::{BTreeSet, HashSet};

/// What a start needs to pass its run's keys: the run's namespace, job and rendered keys.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowClaim {
    pub namespace: String,
    pub job: String,
    pub gates: Gates,
}

/// Why a handed-out run did not start.
#[derive(Debug, Clone, PartialEq)]
pub enum NotStarted {
    /// It is no longer queued: started by another node, cancelled, deleted.
    NotQueued,
    /// A key holds it back; it stays queued.
    Held(Hold),
}

/// A limit named in a namespace, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitRecord {
    pub namespace: String,
    pub name: String,
    pub spec: LimitSpec,
    pub updated_at: Instant,
}

/// An attempt holding a concurrency key.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KeyHolder {
    pub namespace: String,
    pub key: String,
    pub attempt_id: i64,
    pub run_id: i64,
    pub job: String,
    pub since: Instant,
}

/// Why a limit was not deleted.
#[derive(Debug, Clone, PartialEq)]
pub enum LimitDeletion {
    Deleted,
    NotFound,
    /// These jobs use it.
    InUse(Vec<String>),
}

/// Keys whose holders one call lists, at most.
pub const MAX_HOLDERS_LISTED: u32 = 1000;

#[async_trait]
pub trait FlowStore: Send + Sync {
    /// Creates or replaces limit `name` of `namespace`; true if it was created. Audited in
    /// the same transaction.
    async fn put_limit(
        &self,
        namespace: &str,
        name: &str,
        spec: &LimitSpec,
        now: Instant,
        audit: crate::Audit<bool>,
    ) -> Result<bool>;
    async fn get_limit(&self, namespace: &str, name: &str) -> Result<Option<LimitRecord>>;
    /// The limits of `namespaces` (all when `None`), by namespace and name.
    async fn list_limits(&self, namespaces: Option<&[String]>) -> Result<Vec<LimitRecord>>;
    /// Deletes limit `name` unless a job of its namespace uses it. Audited in the same
    /// transaction.
    async fn delete_limit(
        &self,
        namespace: &str,
        name: &str,
        audit: crate::Audit<LimitDeletion>,
    ) -> Result<LimitDeletion>;
    /// The attempts holding concurrency keys of `namespaces` (all when `None`) that still
    /// run, by key, at most [`MAX_HOLDERS_LISTED`].
    async fn key_holders(&self, namespaces: Option<&[String]>) -> Result<Vec<KeyHolder>>;
    /// Forgets the rate keys whose arrival time is before `before` (they say no more than
    /// a missing row); returns how many.
    async fn sweep_rate_keys(&self, before: Instant) -> Result<u64>;
}

/// The keys a batch reads, each once, sorted (the order locks are taken in, the same on every
/// node): concurrency keys, rate keys, and the named limits.
#[derive(Debug, Default)]
pub struct BatchKeys {
    pub concurrency: BTreeSet<(String, String)>,
    pub rate: BTreeSet<(String, String)>,
    pub limits: BTreeSet<(String, String)>,
}

impl BatchKeys {
    pub fn of<'a>(claims: impl IntoIterator<Item = &'a FlowClaim>) -> BatchKeys {
        let mut keys = BatchKeys::default();
        for claim in claims {
            let id = |k: &str| (claim.namespace.clone(), k.to_string());
            keys.concurrency
                .extend(claim.gates.concurrency.iter().map(|g| id(&g.key)));
            keys.rate
                .extend(claim.gates.rate.iter().map(|g| id(&g.key)));
            keys.limits.extend(claim.gates.named().map(id));
        }
        keys
    }

    pub fn is_empty(&self) -> bool {
        self.concurrency.is_empty() && self.rate.is_empty()
    }

    /// Every key, concurrency and rate, once and sorted: what a batch locks.
    pub fn all(&self) -> Vec<&(String, String)> {
        let all: BTreeSet<&(String, String)> =
            self.concurrency.iter().chain(self.rate.iter()).collect();
        all.into_iter().collect()
    }
}

/// The instant a start batch records its attempts at: `now`, the instant the caller read
/// before the batch waited for its keys, unless an attempt of one of its keys started or ended
/// later (`floor`, in microseconds). An attempt the batch does not count as holding a key ended
/// before the batch read the key, so with this its recorded end is never after the new
/// attempts' recorded start, and the ledger shows no more attempts of a key at once than its
/// limit let run. The floor comes from the holder rows: those of running attempts (their
/// start) and those of ended attempts (their end), which stay until a start of their key
/// recorded at or after their end replaces them with its own.
pub fn start_instant(now: Instant, floor: Option<i64>) -> Instant {
    floor
        .and_then(chrono::DateTime::from_timestamp_micros)
        .map_or(now, |floor| now.max(floor))
}

/// A key's 32-bit lock number: two keys may share one (then their starts take turns for
/// nothing, never wrongly).
pub fn lock_number(namespace: &str, key: &str) -> i32 {
    // FNV-1a: stable across processes and versions, unlike std's hasher.
    let mut hash: u32 = 0x811c_9dc5;
    for byte in namespace.bytes().chain([0x1f]).chain(key.bytes()) {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash as i32
}

/// The rate keys' new arrival times after admitting a batch: those the book moved.
pub fn moved_tats<'a>(
    keys: &'a BatchKeys,
    before: &sked_core::flow::Book,
    after: &'a sked_core::flow::Book,
) -> Vec<(&'a (String, String), i64)> {
    keys.rate
        .iter()
        .filter_map(|k| {
            let tat = *after.tats.get(k)?;
            (before.tats.get(k) != Some(&tat)).then_some((k, tat))
        })
        .collect()
}

/// The jobs among `specs` (name, definition) that use limit `name`.
pub fn jobs_using<'a>(
    name: &str,
    specs: impl IntoIterator<Item = (String, &'a sked_core::JobSpec)>,
) -> Vec<String> {
    let mut users: Vec<String> = specs
        .into_iter()
        .filter(|(_, spec)| spec.flow().used_limits().any(|used| used == name))
        .map(|(job, _)| job)
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    users.sort();
    users
}
