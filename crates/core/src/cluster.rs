//! Cluster arithmetic: which partition a job belongs to, and how many partitions each live
//! server node should hold. Plain functions; the store applies them to its lease rows and the
//! server to its firing loop.
//!
//! A job's partition is fixed by its id, so every node agrees on it without asking. Shares are
//! decided from the sorted list of live nodes alone, so every node computes the same split and
//! the shares add up to exactly [`PARTITIONS`]: nobody needs to coordinate, nodes only take
//! free partitions up to their share and give back what exceeds it.

/// How many partitions the schedules are spread over. Fixed: a partition's number is part of
/// the lease rows every node reads.
pub const PARTITIONS: u32 = 256;

/// The partition job `job_id` is fired from: a multiplicative hash of the id, so that jobs
/// created together spread over all nodes rather than filling neighbouring partitions of one.
/// The store computes the same in SQL ([`PARTITION_SQL`]).
pub fn partition_of(job_id: i64) -> u32 {
    (((job_id as u64).wrapping_mul(40503) & 0xFFFF) >> 8) as u32
}

/// [`partition_of`] as a SQL expression over a column `id` (exact for ids below 2^47, which a
/// database will not reach).
pub const PARTITION_SQL: &str = "(((id * 40503) & 65535) >> 8)";

/// How many of `partitions` the node `me` should hold when `live` (every live node, `me`
/// included, in any order) share them. The first `partitions % n` nodes in sorted order hold
/// one more than the others. A node missing from `live` gets nothing.
pub fn fair_share(live: &[String], me: &str, partitions: u32) -> u32 {
    let mut sorted: Vec<&str> = live.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let Some(rank) = sorted.iter().position(|id| *id == me) else {
        return 0;
    };
    let n = sorted.len() as u32;
    let base = partitions / n;
    if (rank as u32) < partitions % n {
        base + 1
    } else {
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i:03}")).collect()
    }

    #[test]
    fn one_node_holds_everything() {
        assert_eq!(fair_share(&names(1), "node-000", PARTITIONS), PARTITIONS);
    }

    #[test]
    fn a_stranger_holds_nothing() {
        assert_eq!(fair_share(&names(3), "node-999", PARTITIONS), 0);
    }

    #[test]
    fn three_nodes_split_256_as_86_85_85() {
        let live = names(3);
        let shares: Vec<u32> = live
            .iter()
            .map(|me| fair_share(&live, me, PARTITIONS))
            .collect();
        assert_eq!(shares, vec![86, 85, 85]);
    }

    #[test]
    fn partitions_of_consecutive_ids_spread_evenly() {
        let mut counts = vec![0u32; PARTITIONS as usize];
        for id in 1..=25_600 {
            counts[partition_of(id) as usize] += 1;
        }
        let (min, max) = (counts.iter().min(), counts.iter().max());
        assert!(min >= Some(&60) && max <= Some(&140), "{min:?} {max:?}");
    }

    proptest! {
        #[test]
        fn shares_add_up_and_differ_by_at_most_one(n in 1usize..40, partitions in 1u32..1024) {
            let mut live = names(n);
            live.reverse();
            let shares: Vec<u32> = live.iter().map(|me| fair_share(&live, me, partitions)).collect();
            prop_assert_eq!(shares.iter().sum::<u32>(), partitions);
            let (min, max) = (shares.iter().min().copied(), shares.iter().max().copied());
            prop_assert!(max.unwrap_or(0) - min.unwrap_or(0) <= 1);
        }

        #[test]
        fn every_job_has_a_partition_in_range(id in any::<i64>()) {
            prop_assert!(partition_of(id) < PARTITIONS);
        }
    }
}
