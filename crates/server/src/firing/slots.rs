//! The schedules the firing loop holds and the timer over them, kept small enough that a node
//! holds a million schedules in a few hundred bytes each.
//!
//! A slot keeps the compiled schedule and its firing state, and nothing else of the job's
//! definition (the loop reads what dispatch needs back from the store, or keeps it for the
//! schedules that fire often: [`Slot::template`]). Slots live in one vector with a free list,
//! found by job id through a map of small entries; the timer holds 16-byte entries naming a
//! slot and the generation it was filed under, so an entry left behind by a reloaded or
//! dropped slot is recognised and skipped. This module does no IO and knows nothing of the
//! store or the ledger.

use sked_core::schedule::Schedule;
use sked_core::Instant;
use sked_store::QueuedRun;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

/// One schedule as the loop holds it.
#[derive(Debug)]
pub struct Slot {
    pub job_id: i64,
    /// Its job's namespace, as an index into the loop's table of names: two bytes, which fit
    /// in the slot's padding, rather than a name.
    pub namespace: u16,
    pub schedule: Schedule,
    /// Instants produced so far by the current schedule.
    pub fired: u64,
    /// The next instant owed.
    pub next: Instant,
    pub paused: bool,
    /// What dispatching a run of this job needs, kept once read for schedules that fire often
    /// (see [`is_frequent`]), so that they are not read back for every run.
    pub template: Option<Arc<QueuedRun>>,
}

/// A schedule whose instants are at most this far apart keeps its dispatch template in memory:
/// memory then grows with the fire rate, not with the number of schedules.
pub const FREQUENT: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// True when a schedule that just fired at `instant` and owes `next` fires often enough to
/// keep its template.
pub fn is_frequent(instant: Instant, next: Instant) -> bool {
    next - instant <= FREQUENT
}

/// A timer entry: when, which slot, and the generation the slot was filed under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Due {
    at_us: i64,
    index: u32,
    generation: u32,
}

#[derive(Debug)]
struct Filed {
    slot: Slot,
    generation: u32,
}

#[derive(Debug, Default)]
pub struct Slots {
    table: Vec<Option<Filed>>,
    free: Vec<u32>,
    index: HashMap<i64, u32>,
    timer: BinaryHeap<Reverse<Due>>,
    generations: u32,
}

impl Slots {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Files `slot` (replacing any slot of the same job) and puts it on the timer at its next
    /// instant.
    pub fn insert(&mut self, slot: Slot) {
        self.remove(slot.job_id);
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.table.push(None);
                // A u32 counts four billion slots, more than memory holds.
                (self.table.len() - 1) as u32
            }
        };
        self.generations = self.generations.wrapping_add(1);
        let generation = self.generations;
        self.timer.push(Reverse(Due {
            at_us: slot.next.timestamp_micros(),
            index,
            generation,
        }));
        self.index.insert(slot.job_id, index);
        self.table[index as usize] = Some(Filed { slot, generation });
    }

    pub fn remove(&mut self, job_id: i64) -> Option<Slot> {
        let index = self.index.remove(&job_id)?;
        self.free.push(index);
        self.table[index as usize].take().map(|f| f.slot)
    }

    pub fn get_mut(&mut self, job_id: i64) -> Option<&mut Slot> {
        let index = *self.index.get(&job_id)?;
        self.table[index as usize].as_mut().map(|f| &mut f.slot)
    }

    /// Changes every slot in place with `change`, which must leave its job and its next
    /// instant as they are (the timer is not told).
    pub fn for_each_mut(&mut self, mut change: impl FnMut(&mut Slot)) {
        for filed in self.table.iter_mut().flatten() {
            change(&mut filed.slot);
        }
    }

    /// The jobs whose slots `pick` says yes to.
    pub fn jobs_where(&self, pick: impl Fn(&Slot) -> bool) -> Vec<i64> {
        self.table
            .iter()
            .flatten()
            .filter(|f| pick(&f.slot))
            .map(|f| f.slot.job_id)
            .collect()
    }

    /// Keeps the slots of the jobs `keep` says yes to.
    pub fn retain(&mut self, keep: impl Fn(i64) -> bool) {
        let gone: Vec<i64> = self.index.keys().copied().filter(|id| !keep(*id)).collect();
        for id in gone {
            self.remove(id);
        }
        self.shrink();
    }

    pub fn clear(&mut self) {
        *self = Slots {
            generations: self.generations,
            ..Slots::default()
        };
    }

    /// When the earliest timer entry falls due (it may turn out stale, and is skipped then).
    pub fn next_due(&self) -> Option<Instant> {
        self.timer
            .peek()
            .and_then(|Reverse(due)| chrono::DateTime::from_timestamp_micros(due.at_us))
    }

    /// Takes out the slot whose instant is the earliest one due by `now`, if any. The caller
    /// advances it and files it again with [`Slots::insert`] while it owes instants.
    pub fn take_due(&mut self, now: Instant) -> Option<Slot> {
        let now_us = now.timestamp_micros();
        while let Some(Reverse(due)) = self.timer.peek().copied() {
            if due.at_us > now_us {
                return None;
            }
            self.timer.pop();
            let current = self.table[due.index as usize]
                .as_ref()
                .is_some_and(|f| f.generation == due.generation);
            if current {
                let filed = self.table[due.index as usize].take()?;
                self.index.remove(&filed.slot.job_id);
                self.free.push(due.index);
                return Some(filed.slot);
            }
        }
        None
    }

    /// Gives memory back after many slots went (partitions given up).
    fn shrink(&mut self) {
        while matches!(self.table.last(), Some(None)) {
            self.table.pop();
        }
        let len = self.table.len() as u32;
        self.free.retain(|i| *i < len);
        self.table.shrink_to_fit();
        self.free.shrink_to_fit();
        self.index.shrink_to_fit();
        let live: Vec<Reverse<Due>> = std::mem::take(&mut self.timer)
            .into_iter()
            .filter(|Reverse(d)| {
                self.table
                    .get(d.index as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|f| f.generation == d.generation)
            })
            .collect();
        self.timer = BinaryHeap::from(live);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn at(s: i64) -> Instant {
        Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap() + chrono::TimeDelta::seconds(s)
    }

    fn slot(job_id: i64, next: i64) -> Slot {
        Slot {
            job_id,
            namespace: 0,
            schedule: Schedule::manual(at(0)),
            fired: 0,
            next: at(next),
            paused: false,
            template: None,
        }
    }

    fn drain(slots: &mut Slots, now: i64) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        while let Some(s) = slots.take_due(at(now)) {
            out.push((s.job_id, (s.next - at(0)).num_seconds()));
        }
        out
    }

    #[test]
    fn slots_come_due_in_order_and_only_when_due() {
        let mut slots = Slots::default();
        for (id, next) in [(1, 5), (2, 3), (3, 9)] {
            slots.insert(slot(id, next));
        }
        assert_eq!(slots.next_due(), Some(at(3)));
        assert_eq!(drain(&mut slots, 5), vec![(2, 3), (1, 5)]);
        assert_eq!(slots.len(), 1);
        assert_eq!(drain(&mut slots, 8), vec![]);
        assert_eq!(drain(&mut slots, 9), vec![(3, 9)]);
        assert_eq!(slots.len(), 0);
    }

    #[test]
    fn a_replaced_or_removed_slot_leaves_no_live_timer_entry() {
        let mut slots = Slots::default();
        slots.insert(slot(1, 5));
        slots.insert(slot(2, 6));
        // Job 1 reloaded with a later instant; its old entry at 5 is stale.
        slots.insert(slot(1, 7));
        slots.remove(2);
        // Job 3 reuses the freed table entries; the stale ones must not fire it early.
        slots.insert(slot(3, 8));
        assert_eq!(drain(&mut slots, 6), vec![]);
        assert_eq!(drain(&mut slots, 8), vec![(1, 7), (3, 8)]);
    }

    /// The memory budget (DESIGN: a million schedules under 256 MB) rests on these sizes.
    #[test]
    fn a_slot_and_a_timer_entry_stay_small() {
        assert!(std::mem::size_of::<Option<Filed>>() <= 104);
        assert!(std::mem::size_of::<Reverse<Due>>() <= 16);
    }

    #[test]
    fn retain_keeps_only_what_it_is_told() {
        let mut slots = Slots::default();
        for id in 1..=100 {
            slots.insert(slot(id, id));
        }
        slots.retain(|id| id % 10 == 0);
        assert_eq!(slots.len(), 10);
        assert!(slots.get_mut(10).is_some() && slots.get_mut(11).is_none());
        let due: Vec<i64> = drain(&mut slots, 1000).iter().map(|d| d.0).collect();
        assert_eq!(due, (1..=10).map(|i| i * 10).collect::<Vec<_>>());
        slots.clear();
        assert_eq!(slots.len(), 0);
        assert_eq!(slots.next_due(), None);
    }
}
