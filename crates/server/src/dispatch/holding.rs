//! The attempts this node handed to the workers it knows, by namespace: what fair share
//! between namespaces weighs (`sked_core::dispatch::fair_order`).
//!
//! An attempt counts from its start until its worker reports it done, a heartbeat of its
//! worker no longer lists it (past a grace for heartbeats that crossed the lease answer), or
//! the worker is forgotten. So the counts follow the workers' own reports and cannot drift for
//! long. Attempts other nodes handed out are not counted here: in a cluster each node shares
//! out the slots it hands, and the workers spread their polls over the nodes.

use sked_core::Instant;
use std::collections::{HashMap, HashSet};

struct HeldAttempt {
    worker: String,
    namespace: String,
    started: Instant,
}

#[derive(Default)]
pub struct Holding {
    attempts: HashMap<i64, HeldAttempt>,
    by_worker: HashMap<String, HashSet<i64>>,
    per_namespace: HashMap<String, u32>,
}

impl Holding {
    /// Attempts of `namespace` held now.
    pub fn of(&self, namespace: &str) -> u32 {
        self.per_namespace.get(namespace).copied().unwrap_or(0)
    }

    pub fn started(&mut self, worker: &str, attempt_id: i64, namespace: &str, now: Instant) {
        let attempt = HeldAttempt {
            worker: worker.to_string(),
            namespace: namespace.to_string(),
            started: now,
        };
        if self.attempts.contains_key(&attempt_id) {
            return;
        }
        self.attempts.insert(attempt_id, attempt);
        self.by_worker
            .entry(worker.to_string())
            .or_default()
            .insert(attempt_id);
        *self.per_namespace.entry(namespace.to_string()).or_default() += 1;
    }

    /// Attempts that ended (reported, or taken away).
    pub fn ended(&mut self, attempt_ids: &[i64]) {
        for id in attempt_ids {
            self.end(*id);
        }
    }

    fn end(&mut self, attempt_id: i64) {
        let Some(attempt) = self.attempts.remove(&attempt_id) else {
            return;
        };
        if let Some(ids) = self.by_worker.get_mut(&attempt.worker) {
            ids.remove(&attempt_id);
            if ids.is_empty() {
                self.by_worker.remove(&attempt.worker);
            }
        }
        if let Some(n) = self.per_namespace.get_mut(&attempt.namespace) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_namespace.remove(&attempt.namespace);
            }
        }
    }

    /// Worker `worker` says it holds `listed`: its other attempts started before
    /// `started_before` have ended (a later one may have crossed the heartbeat).
    pub fn listed(&mut self, worker: &str, listed: &[i64], started_before: Instant) {
        let Some(held) = self.by_worker.get(worker) else {
            return;
        };
        let listed: HashSet<i64> = listed.iter().copied().collect();
        let gone: Vec<i64> = held
            .iter()
            .filter(|id| {
                !listed.contains(id)
                    && self
                        .attempts
                        .get(id)
                        .is_some_and(|a| a.started < started_before)
            })
            .copied()
            .collect();
        self.ended(&gone);
    }

    /// Worker `worker` is gone, and its attempts with it.
    pub fn forget_worker(&mut self, worker: &str) {
        if let Some(gone) = self.by_worker.remove(worker) {
            let gone: Vec<i64> = gone.into_iter().collect();
            self.ended(&gone);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_count_until_reported_unlisted_or_their_worker_is_forgotten() {
        let t: Instant = "2026-03-01T12:00:00Z".parse().unwrap();
        let later = t + chrono::Duration::seconds(10);
        let mut holding = Holding::default();
        holding.started("w1", 1, "a", t);
        holding.started("w1", 2, "a", t);
        holding.started("w1", 2, "a", t);
        holding.started("w2", 3, "b", t);
        holding.started("w1", 4, "b", later);
        assert_eq!((holding.of("a"), holding.of("b")), (2, 2));
        holding.ended(&[1, 99]);
        assert_eq!(holding.of("a"), 1);
        // A heartbeat that lists nothing: the attempt started after its cut-off stays.
        holding.listed("w1", &[], t + chrono::Duration::seconds(5));
        assert_eq!((holding.of("a"), holding.of("b")), (0, 2));
        holding.forget_worker("w2");
        assert_eq!(holding.of("b"), 1);
        holding.forget_worker("w1");
        assert_eq!(holding.of("b"), 0);
        assert!(holding.per_namespace.is_empty() && holding.attempts.is_empty());
        assert!(holding.by_worker.is_empty());
    }
}
