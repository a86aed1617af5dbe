//! Flow control by key: what a job says about how its runs share the world with others.
//!
//! - `concurrency: [{key, limit}]`: at most `limit` runs holding the same key run at once,
//!   across every job and node (the store counts the attempts holding each key);
//! - `rate_limit: [{key, limit, per, burst}]`: starts per key at a rate (GCRA, `rate`);
//! - `debounce: {key, period, max_wait}`: a burst of triggers or events with one key becomes
//!   one run;
//! - `dedup: {key, window}`: a second trigger or event with one key within the window is the
//!   first one's run.
//!
//! A key is a template over the run (`template`). A limit may be written on the job or named
//! once in its namespace (`PUT /api/v1/limits/{name}`, a [`LimitSpec`]) and used by several
//! jobs. This module owns the definitions, their checks, the keys of one run ([`Gates`]) and
//! the admission rule over the keys' state ([`Book::admit`]); it does no IO: the store keeps
//! the state and calls the rule inside the transaction that starts attempts.

pub mod rate;
pub mod template;
pub mod trigger;

pub use rate::Rate;
pub use template::{KeyContext, KeyTemplate, MAX_KEY_BYTES};
pub use trigger::{Absorbed, AbsorbedTrigger, Params};

use crate::duration::HumanDuration;
use crate::error::SpecError;
use crate::Instant;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Duration;

/// The most concurrency and rate keys one job may have, together.
pub const MAX_GATES: usize = 8;
/// The largest concurrency limit.
pub const MAX_CONCURRENCY: u32 = 100_000;
/// The longest debounce period and dedup window.
pub const MAX_PERIOD: Duration = Duration::from_secs(24 * 3600);
pub const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);
/// `max_wait` when a debounce gives none: this many periods.
pub const DEFAULT_MAX_WAIT_PERIODS: u32 = 10;
/// How long a run held by a concurrency key waits before it asks again, when no release it
/// can see wakes it sooner (a key's holder ended on another node, or by the reaper).
pub const RECHECK: Duration = Duration::from_secs(1);

/// One concurrency key of a job: its own `{key, limit}`, or a namespace limit it `use`s (then
/// `key`, if given, splits that limit per rendered key: `{use: per-customer, key:
/// "{{event.payload.customer}}"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(default, rename = "use", skip_serializing_if = "Option::is_none")]
    pub uses: Option<String>,
}

/// One rate limit of a job: its own `{key, limit, per, burst}`, or a namespace limit's rate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(default, rename = "use", skip_serializing_if = "Option::is_none")]
    pub uses: Option<String>,
}

/// A burst of triggers or events with one key becomes one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebounceSpec {
    pub key: String,
    /// The run starts this long after the last trigger of the burst...
    pub period: HumanDuration,
    /// ... or this long after the first, whichever comes first
    /// ([`DEFAULT_MAX_WAIT_PERIODS`] periods when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<HumanDuration>,
}

impl DebounceSpec {
    pub fn max_wait(&self) -> Duration {
        self.max_wait
            .map_or(self.period.0 * DEFAULT_MAX_WAIT_PERIODS, |m| m.0)
    }
}

/// A second trigger or event with one key within the window is the first one's run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupSpec {
    pub key: String,
    pub window: HumanDuration,
}

/// A limit named once in a namespace (`PUT /api/v1/limits/{name}`), used by jobs with `use`.
/// Changing it changes it for every job that uses it, at their next start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// At most this many runs holding it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// At most this rate of starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
}

impl LimitSpec {
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.description.as_ref().is_some_and(|d| d.len() > 1024) {
            return Err(SpecError::new("description", "must be at most 1024 bytes"));
        }
        if self.concurrency.is_none() && self.rate.is_none() {
            return Err(SpecError::new(
                "concurrency",
                "a limit needs a concurrency, a rate, or both",
            ));
        }
        if let Some(limit) = self.concurrency {
            check_limit("concurrency", limit)?;
        }
        if let Some(rate) = &self.rate {
            rate.validate("rate")?;
        }
        Ok(())
    }
}

fn check_limit(field: &str, limit: u32) -> Result<(), SpecError> {
    if !(1..=MAX_CONCURRENCY).contains(&limit) {
        return Err(SpecError::new(
            field,
            format!("must be 1 to {MAX_CONCURRENCY}"),
        ));
    }
    Ok(())
}

/// What a job's flow control needs checked: the fields of a [`crate::JobSpec`] it reads.
pub struct FlowFields<'a> {
    pub concurrency: &'a [ConcurrencySpec],
    pub rate_limit: &'a [RateLimitSpec],
    pub debounce: Option<&'a DebounceSpec>,
    pub dedup: Option<&'a DedupSpec>,
}

impl FlowFields<'_> {
    /// Checks every key and bound; an error names the field (`concurrency[1].limit`).
    pub fn validate(&self) -> Result<(), SpecError> {
        let gates = self.concurrency.len() + self.rate_limit.len();
        if gates > MAX_GATES {
            let field = if self.concurrency.len() > MAX_GATES {
                "concurrency"
            } else {
                "rate_limit"
            };
            return Err(SpecError::new(
                field,
                format!("a job may have at most {MAX_GATES} concurrency and rate keys together, not {gates}"),
            ));
        }
        for (i, c) in self.concurrency.iter().enumerate() {
            let field = format!("concurrency[{i}]");
            own_or_used(
                &field,
                c.key.as_deref(),
                c.limit.is_some(),
                c.uses.as_deref(),
            )?;
            if let Some(limit) = c.limit {
                check_limit(&format!("{field}.limit"), limit)?;
            }
        }
        for (i, r) in self.rate_limit.iter().enumerate() {
            let field = format!("rate_limit[{i}]");
            let own = r.limit.is_some() || r.per.is_some() || r.burst.is_some();
            own_or_used(&field, r.key.as_deref(), own, r.uses.as_deref())?;
            if r.uses.is_none() {
                own_rate(r)
                    .ok_or_else(|| {
                        SpecError::new(format!("{field}.per"), "limit and per are both required")
                    })?
                    .validate(&field)?;
            }
        }
        if let Some(d) = self.debounce {
            KeyTemplate::parse("debounce.key", &d.key)?;
            if d.period.0.is_zero() || d.period.0 > MAX_PERIOD {
                return Err(SpecError::new(
                    "debounce.period",
                    "must be between 1ms and 1 day",
                ));
            }
            if let Some(max_wait) = d.max_wait {
                if max_wait.0 < d.period.0 {
                    return Err(SpecError::new(
                        "debounce.period",
                        format!("{} is above max_wait {max_wait}: a run would never wait a whole period", d.period),
                    ));
                }
                if max_wait.0 > MAX_WINDOW {
                    return Err(SpecError::new(
                        "debounce.max_wait",
                        "must be at most 7 days",
                    ));
                }
            }
        }
        if let Some(d) = self.dedup {
            KeyTemplate::parse("dedup.key", &d.key)?;
            if d.window.0.is_zero() || d.window.0 > MAX_WINDOW {
                return Err(SpecError::new(
                    "dedup.window",
                    "must be between 1ms and 7 days",
                ));
            }
        }
        Ok(())
    }

    /// The keys one run holds, rendered from `run`.
    pub fn gates(&self, run: &KeyContext<'_>) -> Gates {
        let key_of = |key: Option<&str>, uses: Option<&str>| -> String {
            let rendered = key
                .and_then(|k| KeyTemplate::parse("key", k).ok())
                .map(|t| t.render(run));
            match (uses, rendered) {
                (Some(name), Some(k)) => format!("{name}/{k}"),
                (Some(name), None) => name.to_string(),
                (None, k) => k.unwrap_or_default(),
            }
        };
        Gates {
            concurrency: self
                .concurrency
                .iter()
                .map(|c| ConcurrencyGate {
                    key: key_of(c.key.as_deref(), c.uses.as_deref()),
                    limit: match &c.uses {
                        Some(name) => Bound::Named(name.clone()),
                        None => Bound::Own(c.limit.unwrap_or(1)),
                    },
                })
                .collect(),
            rate: self
                .rate_limit
                .iter()
                .filter_map(|r| {
                    let rate = match &r.uses {
                        Some(name) => Bound::Named(name.clone()),
                        None => Bound::Own(own_rate(r)?),
                    };
                    Some(RateGate {
                        key: key_of(r.key.as_deref(), r.uses.as_deref()),
                        rate,
                    })
                })
                .collect(),
        }
    }

    /// The namespace limits the job uses.
    pub fn used_limits(&self) -> impl Iterator<Item = &str> {
        self.concurrency
            .iter()
            .filter_map(|c| c.uses.as_deref())
            .chain(self.rate_limit.iter().filter_map(|r| r.uses.as_deref()))
    }
}

fn own_rate(r: &RateLimitSpec) -> Option<Rate> {
    Some(Rate {
        limit: r.limit?,
        per: r.per?,
        burst: r.burst,
    })
}

/// A key is the job's own (`key` and its bound) or a named limit's (`use`, `key` optional).
fn own_or_used(
    field: &str,
    key: Option<&str>,
    own: bool,
    uses: Option<&str>,
) -> Result<(), SpecError> {
    match (uses, own) {
        (Some(_), true) => Err(SpecError::new(
            format!("{field}.use"),
            "a key either uses a namespace limit or sets its own, not both",
        )),
        (Some(name), false) => {
            crate::job::validate_name(&format!("{field}.use"), name)?;
            if let Some(key) = key {
                KeyTemplate::parse(&format!("{field}.key"), key)?;
            }
            Ok(())
        }
        (None, true) => {
            let key = key.ok_or_else(|| SpecError::new(format!("{field}.key"), "is required"))?;
            KeyTemplate::parse(&format!("{field}.key"), key)?;
            Ok(())
        }
        (None, false) => Err(SpecError::new(
            format!("{field}.limit"),
            "is required (or `use` a namespace limit)",
        )),
    }
}

/// A bound a job sets itself, or a namespace limit it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound<T> {
    Own(T),
    Named(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrencyGate {
    pub key: String,
    pub limit: Bound<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateGate {
    pub key: String,
    pub rate: Bound<Rate>,
}

/// The keys one run holds while it runs (concurrency) and spends when it starts (rate).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Gates {
    pub concurrency: Vec<ConcurrencyGate>,
    pub rate: Vec<RateGate>,
}

impl Gates {
    pub fn is_empty(&self) -> bool {
        self.concurrency.is_empty() && self.rate.is_empty()
    }

    /// Every key, concurrency keys first.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.concurrency
            .iter()
            .map(|g| g.key.as_str())
            .chain(self.rate.iter().map(|g| g.key.as_str()))
    }

    /// The named limits these gates read.
    pub fn named(&self) -> impl Iterator<Item = &str> {
        self.concurrency
            .iter()
            .filter_map(|g| g.limit.name())
            .chain(self.rate.iter().filter_map(|g| g.rate.name()))
    }
}

impl<T> Bound<T> {
    /// The namespace limit it names.
    pub fn name(&self) -> Option<&str> {
        match self {
            Bound::Named(n) => Some(n.as_str()),
            Bound::Own(_) => None,
        }
    }
}

/// Why a run that a worker could take does not start yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// `holding` runs hold `key`, and its limit is `limit`.
    Concurrency {
        key: String,
        holding: u32,
        limit: u32,
    },
    /// `key`'s rate lets the next run start at `at`.
    Rate { key: String, at: Instant },
    /// The run uses namespace limit `name`, which does not exist (or sets no `what`).
    Undefined {
        key: String,
        name: String,
        what: &'static str,
    },
}

impl Hold {
    pub fn key(&self) -> &str {
        match self {
            Hold::Concurrency { key, .. }
            | Hold::Rate { key, .. }
            | Hold::Undefined { key, .. } => key,
        }
    }

    /// When the run asks again unless a release wakes it first.
    pub fn recheck_at(&self, now: Instant) -> Instant {
        match self {
            Hold::Rate { at, .. } => (*at).max(now),
            _ => now + chrono::Duration::from_std(RECHECK).unwrap_or_default(),
        }
    }

    /// The reason a waiting run shows.
    pub fn describe(&self) -> String {
        match self {
            Hold::Concurrency {
                key,
                holding,
                limit,
            } => {
                format!("waiting for concurrency key {key}: {holding} of {limit} running")
            }
            Hold::Rate { key, at } => format!(
                "waiting for rate limit {key}: may start at {}",
                at.format("%Y-%m-%dT%H:%M:%S%.3fZ")
            ),
            Hold::Undefined { key, name, what } => format!(
                "waiting for key {key}: namespace limit {name:?} is not defined with a {what}"
            ),
        }
    }
}

/// A key of one namespace.
pub type GateKey = (String, String);

/// The state of the keys a batch of starts reads, and the admission rule over it. The store
/// loads it inside the transaction that starts the batch, with the keys locked.
#[derive(Debug, Clone, Default)]
pub struct Book {
    /// Attempts holding each key now (live leases only).
    pub holding: HashMap<GateKey, u32>,
    /// Each rate key's theoretical arrival time, in microseconds since the epoch.
    pub tats: HashMap<GateKey, i64>,
    /// The namespace limits the batch uses, by (namespace, name).
    pub limits: HashMap<GateKey, LimitSpec>,
}

impl Book {
    /// Whether a run of `namespace` with `gates` may start at `now`: every concurrency key
    /// below its limit and every rate key due. If so, the book counts it (it holds its
    /// concurrency keys, its rate keys move on); if not, nothing changes and the first key
    /// that holds it back says why.
    pub fn admit(&mut self, namespace: &str, gates: &Gates, now: Instant) -> Result<(), Hold> {
        let admitted = self.check(namespace, gates, now)?;
        self.count(namespace, gates, admitted);
        Ok(())
    }

    /// [`Book::admit`]'s decision without counting the run: a store that learns only
    /// afterwards whether the run is still queued counts it then ([`Book::count`]), before it
    /// asks about the next run.
    pub fn check(&self, namespace: &str, gates: &Gates, now: Instant) -> Result<Admitted, Hold> {
        let id = |key: &str| (namespace.to_string(), key.to_string());
        for gate in &gates.concurrency {
            let limit = match &gate.limit {
                Bound::Own(n) => *n,
                Bound::Named(name) => {
                    match self.limits.get(&id(name)).and_then(|l| l.concurrency) {
                        Some(n) => n,
                        None => {
                            return Err(Hold::Undefined {
                                key: gate.key.clone(),
                                name: name.clone(),
                                what: "concurrency",
                            })
                        }
                    }
                }
            };
            let holding = self.holding.get(&id(&gate.key)).copied().unwrap_or(0);
            if holding >= limit {
                return Err(Hold::Concurrency {
                    key: gate.key.clone(),
                    holding,
                    limit,
                });
            }
        }
        let now_us = now.timestamp_micros();
        let mut moved = Vec::with_capacity(gates.rate.len());
        for gate in &gates.rate {
            let rate = match &gate.rate {
                Bound::Own(r) => *r,
                Bound::Named(name) => match self.limits.get(&id(name)).and_then(|l| l.rate) {
                    Some(r) => r,
                    None => {
                        return Err(Hold::Undefined {
                            key: gate.key.clone(),
                            name: name.clone(),
                            what: "rate",
                        })
                    }
                },
            };
            let key = id(&gate.key);
            // Two gates of one run on the same key spend it twice, as two runs would.
            let tat = moved
                .iter()
                .rev()
                .find(|(k, _)| *k == key)
                .map(|(_, t)| *t)
                .or_else(|| self.tats.get(&key).copied());
            match rate.admit(tat, now_us) {
                Ok(next) => moved.push((key, next)),
                Err(at_us) => {
                    return Err(Hold::Rate {
                        key: gate.key.clone(),
                        at: chrono::DateTime::from_timestamp_micros(at_us).unwrap_or(now),
                    })
                }
            }
        }
        Ok(Admitted { moved })
    }

    /// Counts a run [`Book::check`] admitted, before any other run is checked: it holds its
    /// concurrency keys, its rate keys move on.
    pub fn count(&mut self, namespace: &str, gates: &Gates, admitted: Admitted) {
        for gate in &gates.concurrency {
            *self
                .holding
                .entry((namespace.to_string(), gate.key.clone()))
                .or_default() += 1;
        }
        self.tats.extend(admitted.moved);
    }
}

/// A run [`Book::check`] admitted: where its rate keys move.
#[must_use = "an admitted run is counted with Book::count"]
#[derive(Debug)]
pub struct Admitted {
    moved: Vec<(GateKey, i64)>,
}

#[cfg(test)]
mod tests;
