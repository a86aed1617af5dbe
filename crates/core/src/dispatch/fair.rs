//! Fair share between namespaces: the order in which the runs of several namespaces are
//! offered to the free slots of a worker pool.
//!
//! The rule: a namespace's *attained share* is the attempts it holds, divided by its weight.
//! Each free slot is offered first to the namespace with the lowest attained share that still
//! has a run waiting (its runs in their own queue order), and the share it would attain with
//! that run is counted before the next slot is offered. So namespaces that all wait end up
//! holding slots in proportion to their weights (max-min fairness, as water fills vessels),
//! whatever their runs' priorities; a namespace alone takes every slot (nothing is kept idle
//! for a namespace that is not waiting); and a namespace that already holds more than its
//! share gets new slots only once the others have none to use. Priorities order the runs
//! within a namespace, and decide between namespaces only when their shares are equal.
//!
//! Plain arithmetic over counts: no IO, no clock. The dispatcher calls it with the candidates
//! of one match; the simulator could call it the same way.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// The weight of a namespace that sets none.
pub const DEFAULT_WEIGHT: u32 = 1;
/// The largest weight a namespace may set.
pub const MAX_WEIGHT: u32 = 1_000;

/// One namespace's candidates for a match: its runs waiting (in its own queue order, each
/// given by its queue position `K`), the attempts it holds now, and its weight.
#[derive(Debug, Clone)]
pub struct Tenant<'a, K> {
    pub queue: &'a [K],
    pub holding: u32,
    pub weight: u32,
}

/// The order in which to offer the tenants' runs to free slots: `(tenant index, index in its
/// queue)`, every run exactly once, each tenant's runs in their own order. Ties between equal
/// attained shares go to the run earlier in queue position, then to the lower tenant index.
pub fn fair_order<K: Ord>(tenants: &[Tenant<'_, K>]) -> Vec<(usize, usize)> {
    let total: usize = tenants.iter().map(|t| t.queue.len()).sum();
    let mut out = Vec::with_capacity(total);
    let mut heap: BinaryHeap<Turn<'_, K>> = tenants
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.queue.is_empty())
        .map(|(tenant, t)| Turn {
            holding: u64::from(t.holding),
            weight: u64::from(t.weight.max(1)),
            head: &t.queue[0],
            tenant,
            next: 0,
        })
        .collect();
    while let Some(mut turn) = heap.pop() {
        out.push((turn.tenant, turn.next));
        turn.next += 1;
        turn.holding += 1;
        if let Some(head) = tenants[turn.tenant].queue.get(turn.next) {
            turn.head = head;
            heap.push(turn);
        }
    }
    out
}

/// A tenant's place in line for the next slot.
struct Turn<'a, K> {
    holding: u64,
    weight: u64,
    head: &'a K,
    tenant: usize,
    next: usize,
}

impl<K: Ord> Turn<'_, K> {
    /// Lower attained share first (`holding / weight`, compared without division), then the
    /// earlier head, then the lower tenant index.
    fn precedence(&self, other: &Self) -> Ordering {
        (self.holding * other.weight)
            .cmp(&(other.holding * self.weight))
            .then_with(|| self.head.cmp(other.head))
            .then_with(|| self.tenant.cmp(&other.tenant))
    }
}

impl<K: Ord> PartialEq for Turn<'_, K> {
    fn eq(&self, other: &Self) -> bool {
        self.precedence(other) == Ordering::Equal
    }
}

impl<K: Ord> Eq for Turn<'_, K> {}

impl<K: Ord> PartialOrd for Turn<'_, K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K: Ord> Ord for Turn<'_, K> {
    /// `BinaryHeap` pops the greatest: the turn with precedence is the greatest.
    fn cmp(&self, other: &Self) -> Ordering {
        other.precedence(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tenant(queue: &[u32], holding: u32, weight: u32) -> Tenant<'_, u32> {
        Tenant {
            queue,
            holding,
            weight,
        }
    }

    #[test]
    fn equal_namespaces_alternate_whatever_their_queue_positions() {
        // Namespace 0's runs all come first in queue position (say priority 100).
        let high = [0, 1, 2, 3];
        let low = [10, 11, 12, 13];
        let order = fair_order(&[tenant(&high, 0, 1), tenant(&low, 0, 1)]);
        let tenants: Vec<usize> = order.iter().map(|&(t, _)| t).collect();
        assert_eq!(tenants, vec![0, 1, 0, 1, 0, 1, 0, 1]);
    }

    #[test]
    fn a_namespace_over_its_share_waits_for_the_others() {
        // Namespace 0 holds 6 slots already; 1 holds none.
        let order = fair_order(&[tenant(&[0, 1, 2], 6, 1), tenant(&[10, 11, 12], 0, 1)]);
        let tenants: Vec<usize> = order.iter().map(|&(t, _)| t).collect();
        assert_eq!(tenants, vec![1, 1, 1, 0, 0, 0]);
    }

    #[test]
    fn weights_divide_the_slots() {
        let a: Vec<u32> = (0..30).collect();
        let b: Vec<u32> = (100..130).collect();
        let order = fair_order(&[tenant(&a, 0, 2), tenant(&b, 0, 1)]);
        let first_nine = order[..9].iter().filter(|&&(t, _)| t == 0).count();
        assert_eq!(first_nine, 6, "weight 2 gets two slots of three");
    }

    #[test]
    fn a_namespace_alone_takes_every_slot_in_its_own_order() {
        let order = fair_order(&[tenant(&[], 0, 1), tenant(&[5, 6, 7], 40, 1)]);
        assert_eq!(order, vec![(1, 0), (1, 1), (1, 2)]);
    }

    proptest! {
        /// Every run once, each namespace's in its own order; and at every prefix of the
        /// order, a namespace that still had runs waiting is never more than one run behind
        /// its weighted share of any namespace that was offered a slot since.
        #[test]
        fn the_order_is_a_fair_interleaving(
            given in proptest::collection::vec((0usize..12, 0u32..8, 1u32..4), 1..6),
        ) {
            let queues: Vec<Vec<u32>> = given.iter().enumerate()
                .map(|(i, &(len, _, _))| (0..len as u32).map(|k| k * 7 + i as u32).collect())
                .collect();
            let tenants: Vec<Tenant<'_, u32>> = given.iter().zip(&queues)
                .map(|(&(_, holding, weight), queue)| tenant(queue, holding, weight))
                .collect();
            let order = fair_order(&tenants);
            prop_assert_eq!(order.len(), queues.iter().map(Vec::len).sum::<usize>());
            let mut taken = vec![0usize; tenants.len()];
            for &(t, i) in &order {
                prop_assert_eq!(i, taken[t], "a namespace's runs keep their order");
                // The slot went to the lowest attained share among those still waiting.
                let share = |u: usize| (u64::from(tenants[u].holding) + taken[u] as u64, u64::from(tenants[u].weight));
                let (h, w) = share(t);
                for u in 0..tenants.len() {
                    if taken[u] < queues[u].len() {
                        let (hu, wu) = share(u);
                        prop_assert!(h * wu <= hu * w, "tenant {} went before {} with a higher share", t, u);
                    }
                }
                taken[t] += 1;
            }
        }
    }
}
