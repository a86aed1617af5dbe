//! The dependency-graph capability of a store: a namespace's dependency edges read whole (up
//! to a bound), for drawing the namespace's pipelines. The edges themselves are written with
//! the definitions that name them (`put_job`); this capability only reads them and must not
//! change them. Laying the graph out is the reader's.

use crate::{DependencyEdge, Result};
use async_trait::async_trait;

/// Edges one call returns, at most.
pub const MAX_NAMESPACE_EDGES: u32 = 10_000;

#[async_trait]
pub trait GraphStore: Send + Sync {
    /// The dependency edges of namespace `namespace`, by upstream then dependant, at most
    /// `limit` of them (capped at [`MAX_NAMESPACE_EDGES`]): one range of the edges' primary
    /// key. An edge may name a job deleted with `force`.
    async fn namespace_edges(&self, namespace: &str, limit: u32) -> Result<Vec<DependencyEdge>>;
}
