//! The membership duty: every third of the node lease, renews this node's place in the cluster
//! through the store (`Store::renew_membership`), which also balances the partitions between
//! the live nodes and elects the maintenance node. It tells the firing loop which partitions
//! to fire and the maintenance duties whether they are on.
//!
//! A node that cannot renew for a whole lease stops firing and maintaining on its own: by then
//! other nodes may have taken its leases over. "Cannot renew" includes a store that does not
//! answer at all (a frozen or half-open connection): the renewal is abandoned when the leases
//! it would extend run out. On a clean shutdown it gives its leases back so the others take
//! over at once.

use crate::firing::FiringHandle;
use crate::metrics::Metrics;
use chrono::Utc;
use sked_store::{Membership, NodeInfo, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};
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
    // When the leases now held were asked for: they lapse one lease after that.
    let mut asked_at: Option<Instant> = None;
    loop {
        let asked = Instant::now();
        // A renewal still unanswered when the leases lapse is as good as failed: over a frozen
        // connection it may never answer, and the node must stop firing when its leases end,
        // not when the connection gives up. One answered after `asked + lease` is no use
        // either: the rows it wrote had expired by then.
        let deadline = asked_at.unwrap_or(asked) + lease;
        let call = metrics.store_call(
            "renew_membership",
            store.renew_membership(&node, Utc::now(), lease),
        );
        match tokio::time::timeout_at(deadline.into(), call).await {
            Ok(Ok(membership)) => {
                asked_at = Some(asked);
                count_leases(&metrics, held.as_ref(), &membership);
                apply(&mut held, membership, &firing, &maintenance);
            }
            Ok(Err(e)) => {
                tracing::error!("membership: cannot renew this node's leases: {e}");
                if asked_at.is_some_and(|at| at.elapsed() >= lease) {
                    lapse(&mut held, &mut asked_at, &metrics, &firing, &maintenance);
                }
            }
            Err(_) => {
                tracing::error!(
                    "membership: the store did not answer the renewal of this node's leases \
                     before they ran out"
                );
                lapse(&mut held, &mut asked_at, &metrics, &firing, &maintenance);
            }
        }
        // Rounds start every third of the lease, or at once after a slow one. The leases may
        // still run out before the next round (a failure that took long to say so): firing
        // stops then, not a round later.
        let next_round = (asked + every).max(Instant::now());
        let lapses_first = asked_at.map(|at| at + lease).filter(|at| *at < next_round);
        tokio::select! {
            _ = crate::stopped(&mut shutdown) => return,
            _ = tokio::time::sleep_until(next_round.into()) => {}
            _ = tokio::time::sleep_until(lapses_first.unwrap_or(next_round).into()),
                if lapses_first.is_some() =>
            {
                lapse(&mut held, &mut asked_at, &metrics, &firing, &maintenance);
            }
        }
    }
}

/// The leases ran out unrenewed: other nodes may hold them now, so firing and maintenance
/// stop until a renewal succeeds.
fn lapse(
    held: &mut Option<Membership>,
    asked_at: &mut Option<Instant>,
    metrics: &Metrics,
    firing: &FiringHandle,
    maintenance: &watch::Sender<bool>,
) {
    if asked_at.take().is_none() {
        return;
    }
    tracing::warn!("membership: leases lapsed; firing and maintenance stop until renewed");
    count_leases(metrics, held.as_ref(), &Membership::default());
    apply(held, Membership::default(), firing, maintenance);
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
