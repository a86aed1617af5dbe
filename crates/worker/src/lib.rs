//! sked's worker agent: registers with a sked server, leases attempts, executes their targets
//! (shell processes, HTTP requests, broker messages of jobs routed to it), streams their
//! output and reports how they ended, failing over between the servers it is given.
//!
//! This file only wires the modules together and exports the public API: [`WorkerConfig`],
//! [`WorkerError`], [`run`], and the [`executor`] module (usable on its own, e.g. in tests).
//! The worker speaks nothing but the HTTP protocol of `sked_core::protocol` to its servers;
//! `sked_egress` keeps HTTP targets to what the server's policy allows.

mod agent;
mod client;
mod config;
mod error;
pub mod executor;
pub mod output;

pub use agent::run;
pub use config::WorkerConfig;
pub use error::WorkerError;

/// The client HTTP targets go through, under the server's policy (`sked_egress`).
pub use sked_egress as egress;

/// An error and its sources on one line: reqwest's own message alone rarely says what failed.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
