//! How the publisher shares its awaiting slots between namespaces. Runs that await their
//! consumers' reports hold a slot each, out of `MAX_AWAITING`, for as long as their consumers
//! take; one namespace whose consumers never report would otherwise hold them all, and every
//! other namespace's such runs would stay queued. A namespace may take slots while it holds
//! fewer than its fair part (`sked_core::policy::admission::fair_part`), so a namespace that
//! holds none always finds room; past it, the publisher's polls leave that namespace's runs in
//! the queue until some of its runs end.

use sked_core::policy::admission::fair_part;
use std::collections::HashMap;

/// The attempts that hold (or will hold, once published) an awaiting slot, by namespace.
#[derive(Debug, Default)]
pub struct Shares {
    total: usize,
    by_attempt: HashMap<i64, String>,
    by_namespace: HashMap<String, usize>,
}

/// The least room a namespace must have left to be handed runs: a handout is cut to the least
/// room of any namespace it may hold runs of, so a namespace with little left is passed over
/// rather than make every handout small.
pub const LEAST_ROOM: usize = 256;

impl Shares {
    pub fn new(total: usize) -> Shares {
        Shares {
            total,
            ..Shares::default()
        }
    }

    /// Attempt `attempt_id` of `namespace` awaits its consumer (or will).
    pub fn hold(&mut self, attempt_id: i64, namespace: &str) {
        if self
            .by_attempt
            .insert(attempt_id, namespace.to_string())
            .is_none()
        {
            *self.by_namespace.entry(namespace.to_string()).or_default() += 1;
        }
    }

    /// Attempt `attempt_id` no longer holds a slot (reported, timed out, taken back).
    pub fn release(&mut self, attempt_id: i64) {
        let Some(namespace) = self.by_attempt.remove(&attempt_id) else {
            return;
        };
        if let Some(n) = self.by_namespace.get_mut(&namespace) {
            *n -= 1;
            if *n == 0 {
                self.by_namespace.remove(&namespace);
            }
        }
    }

    pub fn clear(&mut self) {
        self.by_attempt.clear();
        self.by_namespace.clear();
    }

    /// Slots held in all.
    pub fn held(&self) -> usize {
        self.by_attempt.len()
    }

    /// The namespaces whose runs the publisher leaves in the queue now, and the most runs one
    /// handout may bring: the least room of the namespaces it may take, a namespace holding
    /// none included.
    pub fn limits(&self) -> (Vec<String>, usize) {
        let holders = self.by_namespace.len();
        let free = self.total.saturating_sub(self.held());
        // A namespace that holds none yet: its part, as one more holder.
        let mut cap = fair_part(self.total, holders + 1).min(free);
        let mut full = Vec::new();
        for (namespace, &held) in &self.by_namespace {
            let room = fair_part(self.total, holders).saturating_sub(held);
            if room < LEAST_ROOM.min(fair_part(self.total, holders)) {
                full.push(namespace.clone());
            } else {
                cap = cap.min(room);
            }
        }
        full.sort();
        (full, cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_namespace_never_takes_every_slot() {
        let mut shares = Shares::new(10_000);
        assert_eq!(shares.limits(), (vec![], 5_000));
        for id in 0..4_800 {
            shares.hold(id, "flood");
        }
        // Alone it may hold half; 200 left is less than a handout's least room.
        assert_eq!(shares.limits().0, vec!["flood".to_string()]);
        // Another namespace still gets room: a third of the pool with two holding.
        let (_, cap) = shares.limits();
        assert_eq!(cap, 3_333);
        shares.hold(10_000, "quiet");
        let (full, cap) = shares.limits();
        assert_eq!(full, vec!["flood".to_string()]);
        // The newcomer's part (a quarter) is less than "quiet"'s room (a third, less one).
        assert_eq!(cap, 2_500);
        for id in 0..4_800 {
            shares.release(id);
        }
        shares.release(10_000);
        assert_eq!(shares.held(), 0);
        assert_eq!(shares.limits(), (vec![], 5_000));
    }

    #[test]
    fn a_handout_never_passes_a_namespace_its_part() {
        let mut shares = Shares::new(10_000);
        for id in 0..1_000 {
            shares.hold(id, "a");
        }
        let (full, cap) = shares.limits();
        assert!(full.is_empty());
        // "a" may take 5,000 - 1,000 more; a newcomer a third.
        assert_eq!(cap, 3_333);
        assert!(1_000 + cap <= fair_part(10_000, 1));
    }
}
