//! Membership of the cluster: the nodes' liveness rows, the partition leases and the maintenance
//! lease. Each round runs in one transaction that touches only these tables, so it never waits
//! on the ledger's locks; the split itself is `sked_core::cluster::fair_share`.

use super::{PgResult, Tx};
use crate::shared::{instant, micros};
use crate::{Membership, NodeInfo};
use sked_core::cluster::{fair_share, PARTITIONS};
use sked_core::records::NodeRecord;
use sked_core::Instant;
use std::time::Duration;

/// The one duty elected by a lease row today.
const MAINTENANCE: &str = "maintenance";

/// Nodes silent this many leases are dropped from the list.
const FORGET_AFTER_LEASES: i64 = 100;

pub async fn renew(
    tx: &Tx<'_>,
    node: &NodeInfo,
    now: Instant,
    lease: Duration,
) -> PgResult<Membership> {
    let now_us = micros(now);
    let lease_us = i64::try_from(lease.as_micros()).unwrap_or(i64::MAX / 4);
    let until = now_us.saturating_add(lease_us);
    tx.execute(
        "INSERT INTO cluster_nodes (id, address, started_at, seen_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (id) DO UPDATE SET seen_at = EXCLUDED.seen_at",
        &[&node.id, &node.address, &micros(node.started_at), &now_us],
    )
    .await?;
    tx.execute(
        "DELETE FROM cluster_nodes WHERE seen_at < $1",
        &[&now_us.saturating_sub(lease_us.saturating_mul(FORGET_AFTER_LEASES))],
    )
    .await?;
    let live: Vec<String> = tx
        .query(
            "SELECT id FROM cluster_nodes WHERE seen_at > $1",
            &[&now_us.saturating_sub(lease_us)],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let share = fair_share(&live, &node.id, PARTITIONS) as usize;

    let mut held: Vec<i32> = tx
        .query(
            "UPDATE partition_leases SET expires_at = $2 WHERE node = $1 RETURNING partition",
            &[&node.id, &until],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    held.sort_unstable();
    if held.len() > share {
        // Give back the highest ones; the nodes below their share take them next round.
        let excess = held.split_off(share);
        tx.execute(
            "UPDATE partition_leases SET node = NULL, expires_at = 0 \
             WHERE partition = ANY($1) AND node = $2",
            &[&excess, &node.id],
        )
        .await?;
    } else if held.len() < share {
        let wanted = (share - held.len()) as i64;
        let taken = tx
            .query(
                "UPDATE partition_leases SET node = $1, expires_at = $2 WHERE partition IN ( \
                     SELECT partition FROM partition_leases \
                     WHERE node IS NULL OR expires_at < $3 \
                     ORDER BY partition LIMIT $4 FOR UPDATE SKIP LOCKED) \
                 RETURNING partition",
                &[&node.id, &until, &now_us, &wanted],
            )
            .await?;
        held.extend(taken.iter().map(|row| row.get::<_, i32>(0)));
        held.sort_unstable();
    }

    let maintenance = tx
        .query_opt(
            "INSERT INTO duty_leases (duty, node, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (duty) DO UPDATE SET node = EXCLUDED.node, expires_at = EXCLUDED.expires_at \
             WHERE duty_leases.node = EXCLUDED.node OR duty_leases.expires_at < $4 \
             RETURNING node",
            &[&MAINTENANCE, &node.id, &until, &now_us],
        )
        .await?
        .is_some();
    Ok(Membership {
        partitions: held.into_iter().map(|p| p as u32).collect(),
        maintenance,
    })
}

pub async fn leave(tx: &Tx<'_>, node: &str) -> PgResult<()> {
    tx.execute(
        "UPDATE partition_leases SET node = NULL, expires_at = 0 WHERE node = $1",
        &[&node],
    )
    .await?;
    tx.execute("DELETE FROM duty_leases WHERE node = $1", &[&node])
        .await?;
    tx.execute("DELETE FROM cluster_nodes WHERE id = $1", &[&node])
        .await?;
    Ok(())
}

pub async fn nodes(tx: &Tx<'_>, now: Instant) -> PgResult<Vec<NodeRecord>> {
    let rows = tx
        .query(
            "SELECT n.id, n.address, n.started_at, n.seen_at, \
                 (SELECT count(*) FROM partition_leases p \
                  WHERE p.node = n.id AND p.expires_at > $1), \
                 EXISTS (SELECT 1 FROM duty_leases d WHERE d.node = n.id AND d.expires_at > $1) \
             FROM cluster_nodes n ORDER BY n.id",
            &[&micros(now)],
        )
        .await?;
    let mut nodes = Vec::with_capacity(rows.len());
    for row in rows {
        nodes.push(NodeRecord {
            id: row.get(0),
            address: row.get(1),
            started_at: instant(row.get(2))?,
            seen_at: instant(row.get(3))?,
            partitions: row.get::<_, i64>(4) as u32,
            maintenance: row.get(5),
        });
    }
    Ok(nodes)
}
