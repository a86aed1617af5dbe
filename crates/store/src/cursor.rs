//! Page cursors: where the next page of a listing starts, as an opaque string.
//!
//! A cursor is the sort key of the last item handed out plus its id, so a page starts strictly
//! after it and rows inserted meanwhile neither repeat nor vanish. Every store encodes them
//! here, so a cursor means the same thing on SQLite and on PostgreSQL; page sizes too.

use crate::shared::micros;
use crate::{JobSort, Page, StoreError};
use sked_core::records::{JobRecord, RunRecord};

pub const DEFAULT_PAGE: u32 = 100;
pub const MAX_PAGE: u32 = 1000;

/// A page size within bounds: 0 means the default.
pub fn page_size(limit: u32) -> u32 {
    match limit {
        0 => DEFAULT_PAGE,
        n => n.min(MAX_PAGE),
    }
}

/// The position after which the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The sort key of the last item: a name, or an instant in microseconds.
    pub key: CursorKey,
    /// The last item's id, which breaks ties between equal keys.
    pub id: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CursorKey {
    Text(String),
    Micros(i64),
}

impl Cursor {
    pub fn encode(&self) -> String {
        match &self.key {
            CursorKey::Text(text) => format!("t.{}.{}", self.id, hex::encode(text)),
            CursorKey::Micros(micros) => format!("m.{}.{micros}", self.id),
        }
    }

    pub fn decode(raw: &str) -> Result<Cursor, StoreError> {
        let bad = || StoreError::InvalidCursor(raw.to_string());
        let mut parts = raw.splitn(3, '.');
        let (kind, id, key) = match (parts.next(), parts.next(), parts.next()) {
            (Some(kind), Some(id), Some(key)) => (kind, id, key),
            _ => return Err(bad()),
        };
        let id: i64 = id.parse().map_err(|_| bad())?;
        let key = match kind {
            "t" => {
                let bytes = hex::decode(key).map_err(|_| bad())?;
                CursorKey::Text(String::from_utf8(bytes).map_err(|_| bad())?)
            }
            "m" => CursorKey::Micros(key.parse().map_err(|_| bad())?),
            _ => return Err(bad()),
        };
        Ok(Cursor { key, id })
    }

    /// The text key, or an error naming the cursor when it belongs to another sort order.
    pub fn text(&self, raw: &str) -> Result<&str, StoreError> {
        match &self.key {
            CursorKey::Text(t) => Ok(t),
            CursorKey::Micros(_) => Err(StoreError::InvalidCursor(raw.to_string())),
        }
    }

    /// The instant key, or an error naming the cursor when it belongs to another sort order.
    pub fn micros(&self, raw: &str) -> Result<i64, StoreError> {
        match self.key {
            CursorKey::Micros(m) => Ok(m),
            CursorKey::Text(_) => Err(StoreError::InvalidCursor(raw.to_string())),
        }
    }
}

/// A page from the up to `limit + 1` items a query fetched: the extra one only says that more
/// follow, and the last item kept is where the next page starts.
pub fn page<T>(mut items: Vec<T>, limit: u32, cursor_of: impl Fn(&T) -> Cursor) -> Page<T> {
    let next_cursor = if items.len() > limit as usize {
        items.truncate(limit as usize);
        items.last().map(|last| cursor_of(last).encode())
    } else {
        None
    };
    Page { items, next_cursor }
}

/// Where the next page of jobs starts after `job`, in `sort` order.
pub fn after_job(job: &JobRecord, sort: JobSort) -> Cursor {
    let key = match sort {
        JobSort::Name => CursorKey::Text(job.name.clone()),
        JobSort::CreatedAt => CursorKey::Micros(micros(job.created_at)),
        JobSort::UpdatedAt => CursorKey::Micros(micros(job.updated_at)),
    };
    Cursor { key, id: job.id }
}

/// Where the next page of workers (in id order) starts after `worker`.
pub fn after_worker(worker: &sked_core::records::WorkerRecord) -> Cursor {
    Cursor {
        key: CursorKey::Text(worker.id.clone()),
        id: 0,
    }
}

/// Where the next page of runs (newest instant first) starts after `run`.
pub fn after_run(run: &RunRecord) -> Cursor {
    Cursor {
        key: CursorKey::Micros(micros(run.scheduled_for)),
        id: run.id,
    }
}

/// Where the next page of the audit trail (newest first, by id) starts after `record`. The
/// position is the id alone; the entry's instant rides along as the key only so that an audit
/// cursor has the shape of the other instant-keyed cursors.
pub fn after_audit(record: &sked_core::records::AuditRecord) -> Cursor {
    Cursor {
        key: CursorKey::Micros(micros(record.entry.at)),
        id: record.id,
    }
}

/// Notifications page by id alone, newest first (the key repeats when they were recorded).
pub fn after_notification(record: &sked_core::notify::NotificationRecord) -> Cursor {
    Cursor {
        key: CursorKey::Micros(micros(record.created_at)),
        id: record.id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip() {
        for cursor in [
            Cursor {
                key: CursorKey::Text("nightly-report.v2".into()),
                id: 7,
            },
            Cursor {
                key: CursorKey::Micros(-1_700_000_000_000_000),
                id: 0,
            },
        ] {
            assert_eq!(Cursor::decode(&cursor.encode()).unwrap(), cursor);
        }
    }

    #[test]
    fn foreign_cursors_are_rejected() {
        for raw in [
            "", "x", "t.1", "t.a.00", "t.1.0", "t.1.zz", "m.1.abc", "q.1.2",
        ] {
            assert!(
                matches!(Cursor::decode(raw), Err(StoreError::InvalidCursor(_))),
                "{raw}"
            );
        }
    }
}
