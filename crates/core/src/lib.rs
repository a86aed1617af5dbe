//! sked's domain: what a job is, when it is due, what happens to its runs, and which worker gets
//! an attempt.
//!
//! Everything here is plain data and pure functions. This crate does no IO and reads no clock:
//! every function that needs "now" takes it as an argument, and every function that needs
//! randomness takes the random number. The store, the server, the worker and the simulator all
//! decide through these functions, so a rule is written once.

/// `ALL`, `as_str`, `parse`, `one_of` and `Display` for an enum of plain names, as the API spells them.
macro_rules! string_enum {
    ($name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            pub fn parse(s: &str) -> Option<Self> {
                match s { $($text => Some($name::$variant),)+ _ => None }
            }

            /// The names, for a message refusing another: "a, b or c".
            pub fn one_of() -> String {
                let names: Vec<&str> = Self::ALL.iter().map(|v| v.as_str()).collect();
                match names.split_last() {
                    Some((last, [])) => last.to_string(),
                    Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                    None => String::new(),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod auth;
pub mod calendar;
pub mod celery;
pub mod cluster;
pub mod container;
pub mod deadline;
pub mod dependency;
pub mod dispatch;
pub mod duration;
pub mod egress;
pub mod error;
pub mod event;
pub mod flow;
pub mod heartbeat;
pub mod identity;
pub mod job;
pub mod limits;
pub mod namespace;
pub mod notify;
pub mod policy;
pub mod protocol;
pub mod publish;
pub mod records;
pub mod run;
pub mod schedule;
pub mod shard;
pub mod stats;
pub mod target;
pub mod throttle;
pub mod trace;
pub mod web;

pub use duration::HumanDuration;
pub use error::SpecError;
pub use job::{JobSpec, JobState, ValidJob};
pub use run::{AttemptOutcome, AttemptState, RunState, SkipReason, Trigger};
pub use schedule::{Schedule, ScheduleSpec};
pub use target::TargetSpec;

/// Instants are UTC everywhere; local time only exists inside schedule math.
pub type Instant = chrono::DateTime<chrono::Utc>;

/// `t` to the microsecond, the precision the ledger keeps. An instant the server makes up
/// (a manual trigger's, a schedule's epoch) passes through here before anything sees it, so
/// one run has one instant everywhere: in the ledger, the API and what its attempts are told.
pub fn ledger_instant(t: Instant) -> Instant {
    use chrono::SubsecRound;
    t.trunc_subsecs(6)
}
