//! The membership duty: every third of the node lease, renews this node's place in the cluster
//! through the store (`Store::renew_membership`), which also balances the partitions between
//! the live nodes and elects the maintenance node. It tells the firing loop which partitions
//! to fire and the maintenance duties whether they are on.
//!
//! A node that cannot renew for a whole lease stops firing and maintaining on its own: by then
//! other nodes may have taken its leases over. On a clean shutdown it gives its leases back so
//! the others take over at once.

use crate::firing::FiringHandle;
use crate::metrics::Metrics;
use chrono::Utc;
use sked_store::{Membership, NodeInfo, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub async fn run(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    node: Arc<NodeInfo>,
    lease: Duration,
    firing: FiringHandle,
    maintenance: watch::Sender<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let every = lease / 3;
    let mut held: Option<Membership> = None;
    let mut last_renewed = std::time::Instant::now();
    loop {
        let renewed = metrics
            .store_call(
                "renew_membership",
                store.renew_membership(&node, Utc::now(), lease),
            )
            .await;
        match renewed {
            Ok(membership) => {
                last_renewed = std::time::Instant::now();
                count_leases(&metrics, held.as_ref(), &membership);
                apply(&mut held, membership, &firing, &maintenance);
            }
            Err(e) => {
                tracing::error!("membership: cannot renew this node's leases: {e}");
                if held.is_some() && last_renewed.elapsed() >= lease {
                    tracing::warn!(
                        "membership: leases lapsed; firing and maintenance stop until renewed"
                    );
                    count_leases(&metrics, held.as_ref(), &Membership::default());
                    apply(&mut held, Membership::default(), &firing, &maintenance);
                }
            }
        }
        tokio::select! {
            _ = crate::stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Counts the partitions gained and lost between two rounds.
fn count_leases(metrics: &Metrics, before: Option<&Membership>, now: &Membership) {
    let before: &[u32] = before.map_or(&[], |m| &m.partitions);
    let gained = now
        .partitions
        .iter()
        .filter(|p| !before.contains(p))
        .count();
    let lost = before
        .iter()
        .filter(|p| !now.partitions.contains(p))
        .count();
    metrics.leases_changed(gained, lost);
}

/// Passes on what changed since the last round.
fn apply(
    held: &mut Option<Membership>,
    now: Membership,
    firing: &FiringHandle,
    maintenance: &watch::Sender<bool>,
) {
    let before = held.as_ref();
    if before.map(|m| &m.partitions) != Some(&now.partitions) {
        firing.hold(now.partitions.clone());
    }
    if before.map(|m| m.maintenance) != Some(now.maintenance) {
        if now.maintenance {
            tracing::info!("membership: this node runs the maintenance duties");
        }
        let _ = maintenance.send(now.maintenance);
    }
    *held = Some(now);
}
