//! The calendars capability of a store: a namespace's named calendars (`sked_core::calendar`),
//! kept whole as their definitions, versioned, with the audit entries of each change in its
//! transaction. Resolving a calendar with those it names, and what schedules do with it, are the
//! server's and the core's; the store only keeps them and says who uses one.

use crate::{Audit, PutOutcome, Result};
use async_trait::async_trait;
use sked_core::calendar::{CalendarRecord, CalendarSpec, CalendarUsers};
use sked_core::Instant;

/// What a delete did.
// One is made per delete and matched at once: boxing the record would save nothing that
// matters and cost every reader a dereference.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum CalendarDeletion {
    /// There was no such calendar.
    Missing,
    /// Still named by jobs or calendars, and not forced: nothing was deleted.
    InUse(CalendarUsers),
    /// Deleted; with `force`, the users that still name it.
    Deleted(CalendarRecord, CalendarUsers),
}

#[async_trait]
pub trait CalendarStore: Send + Sync {
    /// Creates or replaces calendar `name` of `namespace`. An unchanged definition writes
    /// nothing (`Unchanged`, same version); a change raises the version by one. Refused
    /// ([`crate::StoreError::Refused`]) past
    /// [`sked_core::calendar::MAX_CALENDARS_PER_NAMESPACE`] calendars in the namespace.
    async fn put_calendar(
        &self,
        namespace: &str,
        name: &str,
        spec: &CalendarSpec,
        now: Instant,
        audit: Audit<(PutOutcome, CalendarRecord)>,
    ) -> Result<(PutOutcome, CalendarRecord)>;
    async fn get_calendar(&self, namespace: &str, name: &str) -> Result<Option<CalendarRecord>>;
    /// The calendars of a namespace, by name.
    async fn list_calendars(&self, namespace: &str) -> Result<Vec<CalendarRecord>>;
    /// The jobs of the namespace whose schedule names calendar `name`, and the calendars that
    /// include or except it, each by name, in order.
    async fn calendar_users(&self, namespace: &str, name: &str) -> Result<CalendarUsers>;
    /// Deletes a calendar nothing names; with `force`, also one that is named (its users then
    /// name a calendar that does not exist). The check and the delete are one transaction.
    async fn delete_calendar(
        &self,
        namespace: &str,
        name: &str,
        force: bool,
        audit: Audit<CalendarDeletion>,
    ) -> Result<CalendarDeletion>;
}
