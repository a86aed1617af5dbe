//! `/api/v1/cluster`: the server nodes sharing this store, the partitions each holds and which
//! one runs maintenance, as the lease tables say now.

use super::ApiError;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use chrono::Utc;
use serde::Serialize;
use sked_core::cluster::PARTITIONS;
use sked_core::records::NodeRecord;

#[derive(Debug, Serialize)]
pub struct ClusterView {
    /// The node that answers.
    pub node: String,
    pub partitions: u32,
    pub node_lease_ms: u64,
    /// Partitions no node holds an unexpired lease on: their schedules are not fired until a
    /// node takes them (within one renewal).
    pub unowned: u32,
    pub nodes: Vec<NodeView>,
}

#[derive(Debug, Serialize)]
pub struct NodeView {
    #[serde(flatten)]
    pub node: NodeRecord,
    /// Seen within one lease.
    pub alive: bool,
}

pub async fn view(State(state): State<AppState>) -> Result<Json<ClusterView>, ApiError> {
    let now = Utc::now();
    let nodes = state.store.cluster_nodes(now).await?;
    let lease = chrono::Duration::from_std(state.config.node_lease).unwrap_or_default();
    let held: u32 = nodes.iter().map(|n| n.partitions).sum();
    Ok(Json(ClusterView {
        node: state.node.id.clone(),
        partitions: PARTITIONS,
        node_lease_ms: state.config.node_lease.as_millis() as u64,
        unowned: PARTITIONS.saturating_sub(held),
        nodes: nodes
            .into_iter()
            .map(|node| NodeView {
                alive: node.seen_at > now - lease,
                node,
            })
            .collect(),
    }))
}
