//! The runs a flow-control key holds back, as this node knows them.
//!
//! The store decides whether a run may start (`sked_store::FlowStore`): a run it holds back
//! comes back here with the key and the reason, and waits in the queue's delayed set until the
//! key may have room — the moment its rate allows, or a release this node sees (an attempt that
//! held the key ended here), or [`sked_core::flow::RECHECK`] later for a release elsewhere (on
//! another node, by the reaper). A run queued later whose key has runs waiting joins them
//! rather than overtaking them, so a key's runs start in queue order. Memory only: what it
//! forgets costs a recheck, never a run.

use sked_core::flow::{GateKey, Hold};
use sked_core::Instant;
use sked_store::QueuedRun;
use std::collections::{BTreeSet, HashMap};

/// One key's waiting runs.
#[derive(Debug)]
struct KeyWait {
    /// When its runs ask again.
    until: Instant,
    /// Why, as the store said last.
    hold: Hold,
    runs: BTreeSet<i64>,
}

/// Attempts whose keys this node remembers, at most.
const MAX_ATTEMPTS_KNOWN: usize = 100_000;

#[derive(Debug, Default)]
pub struct Gates {
    waits: HashMap<GateKey, KeyWait>,
    /// The key each held run waits for.
    run_key: HashMap<i64, GateKey>,
    /// The concurrency keys held by the attempts this node started, by attempt.
    held_by_attempt: HashMap<i64, Vec<GateKey>>,
}

impl Gates {
    /// Holds `run` back for `hold`; returns when it asks again.
    pub fn hold(&mut self, run: &QueuedRun, hold: Hold, now: Instant) -> Instant {
        let key = (run.namespace.clone(), hold.key().to_string());
        let until = hold.recheck_at(now);
        let wait = self.waits.entry(key.clone()).or_insert_with(|| KeyWait {
            until,
            hold: hold.clone(),
            runs: BTreeSet::new(),
        });
        wait.until = until;
        wait.hold = hold;
        wait.runs.insert(run.run_id);
        self.run_key.insert(run.run_id, key);
        until
    }

    /// If a key of `run` has runs waiting, the run joins them: returns when they ask again.
    pub fn join(&mut self, run: &QueuedRun, now: Instant) -> Option<Instant> {
        if run.gates.is_empty() || self.waits.is_empty() {
            return None;
        }
        let key = run.gates.keys().find_map(|k| {
            let key = (run.namespace.clone(), k.to_string());
            self.waits
                .get(&key)
                .is_some_and(|w| w.until > now)
                .then_some(key)
        })?;
        let wait = self.waits.get_mut(&key)?;
        wait.runs.insert(run.run_id);
        let until = wait.until;
        self.run_key.insert(run.run_id, key);
        Some(until)
    }

    /// Why run `run_id` waits, if a key holds it back.
    pub fn reason(&self, run_id: i64) -> Option<String> {
        let key = self.run_key.get(&run_id)?;
        Some(self.waits.get(key)?.hold.describe())
    }

    /// Remembers the concurrency keys attempt `attempt_id` of a run of `namespace` holds.
    pub fn started(&mut self, attempt_id: i64, namespace: &str, gates: &sked_core::flow::Gates) {
        if gates.concurrency.is_empty() {
            return;
        }
        if self.held_by_attempt.len() >= MAX_ATTEMPTS_KNOWN {
            // Attempts whose end this node never hears of (the reaper took them) would pile
            // up; forgetting costs at most a recheck's wait.
            self.held_by_attempt.clear();
        }
        let keys = gates
            .concurrency
            .iter()
            .map(|g| (namespace.to_string(), g.key.clone()))
            .collect();
        self.held_by_attempt.insert(attempt_id, keys);
    }

    /// These attempts ended: the runs waiting for the keys they held may start now. Returns
    /// those runs.
    pub fn released(&mut self, attempt_ids: &[i64]) -> Vec<i64> {
        let mut woken = Vec::new();
        for id in attempt_ids {
            for key in self.held_by_attempt.remove(id).unwrap_or_default() {
                if let Some(wait) = self.waits.remove(&key) {
                    self.forget(&wait);
                    woken.extend(wait.runs);
                }
            }
        }
        woken
    }

    /// Forgets the waits that are over (their runs were promoted when their time came).
    pub fn expire(&mut self, now: Instant) {
        let over: Vec<GateKey> = self
            .waits
            .iter()
            .filter(|(_, w)| w.until <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in over {
            if let Some(wait) = self.waits.remove(&key) {
                self.forget(&wait);
            }
        }
    }

    fn forget(&mut self, wait: &KeyWait) {
        for run in &wait.runs {
            self.run_key.remove(run);
        }
    }

    /// The keys with the most runs waiting here, at most `n`, with how many: what the metrics
    /// show (a bounded number of series, whatever the number of keys).
    pub fn top_waiting(&self, n: usize) -> Vec<(&GateKey, usize)> {
        let mut keys: Vec<(&GateKey, usize)> =
            self.waits.iter().map(|(k, w)| (k, w.runs.len())).collect();
        keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        keys.truncate(n);
        keys
    }

    /// Every key with runs waiting here: the key, why, until when, and the runs.
    pub fn waiting(&self) -> impl Iterator<Item = (&GateKey, &Hold, Instant, &BTreeSet<i64>)> {
        self.waits
            .iter()
            .map(|(k, w)| (k, &w.hold, w.until, &w.runs))
    }
}
