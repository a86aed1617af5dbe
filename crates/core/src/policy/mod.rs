//! The per-job policies: what to do on overlap, on misfire, and after a failed attempt.
//! Each is a plain function of plain inputs so the store, the server and tests share one rule.

pub mod admission;
pub mod misfire;
pub mod overlap;
pub mod retry;

pub use admission::BacklogLimits;
pub use misfire::{MisfireKind, MisfirePolicy};
pub use overlap::{OverlapDecision, OverlapPolicy};
pub use retry::{Backoff, RetryPolicy};
