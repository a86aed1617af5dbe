//! Events: facts that other systems (or jobs) tell sked about — "the dataset landed", "the
//! Hadoop job finished" — and what a job does with them: run once per event
//! (`schedule: {event}`), wait for one in a window (`depends_on: [{event}]`), or send one
//! when its run succeeds (`on_success: {emit}`).
//!
//! An event is `(namespace, key, id)`: posting the same one twice records it once. Its instant
//! is when sked recorded it; within a namespace no two events share an instant, so the run an
//! event starts keeps the ledger's one-run-per-instant key. Everything here is pure; the store
//! records events and settles what they start or release in one transaction.

use crate::error::SpecError;
use crate::Instant;
use serde::{Deserialize, Serialize};

/// The longest event key.
pub const MAX_KEY_LEN: usize = 200;
/// The longest event id.
pub const MAX_ID_LEN: usize = 200;
/// The largest payload, as JSON text: it reaches shell targets as one environment variable.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

/// An event as a client posts it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    /// What happened, `sales.dataset.ready`: the name jobs listen for.
    pub key: String,
    /// Which occurrence of it, `2026-11-24`: a second post with the same key and id is the
    /// same event.
    pub id: String,
    /// Handed to the runs it starts; `null` when absent.
    #[serde(default)]
    pub payload: serde_json::Value,
    /// The trace the post was part of (`crate::trace::Joined`, as text), from its
    /// `traceparent` header, never from the body: the runs it starts join it.
    #[serde(skip)]
    pub trace_parent: Option<String>,
}

impl EventSpec {
    /// Checks key, id and the payload's size (fields named as the API reports them).
    pub fn validate(&self) -> Result<(), SpecError> {
        validate_key("key", &self.key)?;
        if self.id.is_empty() || self.id.len() > MAX_ID_LEN || self.id.chars().any(char::is_control)
        {
            return Err(SpecError::new(
                "id",
                format!("must be 1 to {MAX_ID_LEN} bytes without control characters"),
            ));
        }
        let size = serde_json::to_string(&self.payload).map_or(usize::MAX, |s| s.len());
        if size > MAX_PAYLOAD_BYTES {
            return Err(SpecError::new(
                "payload",
                format!("must be at most {MAX_PAYLOAD_BYTES} bytes as JSON (it is {size})"),
            ));
        }
        Ok(())
    }
}

/// An event key: 1 to [`MAX_KEY_LEN`] letters, digits, `.`, `_`, `-`, `:` or `/`.
pub fn validate_key(field: &str, key: &str) -> Result<(), SpecError> {
    let ok_chars = key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/'));
    if key.is_empty() || key.len() > MAX_KEY_LEN || !ok_chars {
        return Err(SpecError::new(
            field,
            format!(
                "{key:?} is not a valid event key: use 1 to {MAX_KEY_LEN} letters, digits, '.', \
                 '_', '-', ':' or '/'"
            ),
        ));
    }
    Ok(())
}

/// What a job does when one of its runs succeeds: `on_success: {emit: "key"}` posts an event
/// of that key in the job's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnSuccess {
    pub emit: String,
}

/// The id of the event a run emits: one per run (`job@instant`), so a run reported twice, or
/// recorded by two nodes, emits it once.
pub fn emitted_id(job: &str, scheduled_for: Instant) -> String {
    format!(
        "{job}@{}",
        scheduled_for.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    )
}

/// The payload of the event a run emits: which run it was.
pub fn emitted_payload(job: &str, run_id: i64, scheduled_for: Instant) -> serde_json::Value {
    serde_json::json!({
        "job": job,
        "run_id": run_id,
        "scheduled_for": scheduled_for.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    })
}

/// The instant of a new event of a namespace whose latest event is at `latest` (ledger
/// microseconds): now, or just after the latest when the clock has not moved past it — two
/// events never share an instant, so each starts its own run.
pub fn next_instant(now: i64, latest: Option<i64>) -> i64 {
    latest.map_or(now, |latest| now.max(latest.saturating_add(1)))
}

/// How many instants [`run_instants`] offers.
pub const RUN_INSTANT_TRIES: i64 = 1000;

/// The instants the run an event starts may take, in order: the event's own, then each next
/// microsecond. A job may already have a run at the event's instant (a manual trigger in the
/// same microsecond); the event's run then takes the next free one rather than being lost to
/// the ledger's one-run-per-instant key. It still names its event.
pub fn run_instants(occurred_at: Instant) -> impl Iterator<Item = Instant> {
    (0..RUN_INSTANT_TRIES).map(move |us| occurred_at + chrono::Duration::microseconds(us))
}

/// The event a run was started by, as its attempts see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEvent {
    pub key: String,
    pub id: String,
    #[serde(default)]
    pub payload: serde_json::Value,
}

impl RunEvent {
    /// The payload as a run receives it (`SKED_EVENT_PAYLOAD`, an HTTP body, a message): a
    /// string as it is, anything else as JSON text.
    pub fn payload_text(&self) -> String {
        match &self.payload {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        }
    }

    /// Whether [`Self::payload_text`] is JSON (for a `content-type`).
    pub fn payload_is_json(&self) -> bool {
        !self.payload.is_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(key: &str, id: &str, payload: serde_json::Value) -> EventSpec {
        EventSpec {
            key: key.into(),
            id: id.into(),
            payload,
            trace_parent: None,
        }
    }

    #[test]
    fn keys_ids_and_payloads_are_bounded() {
        assert!(event(
            "sales.dataset.ready",
            "2026-11-24",
            serde_json::json!({"rows": 3})
        )
        .validate()
        .is_ok());
        assert!(event("hadoop:job/42_done-x", "x", serde_json::Value::Null)
            .validate()
            .is_ok());
        let field = |e: EventSpec| e.validate().unwrap_err().field;
        assert_eq!(field(event("", "1", serde_json::Value::Null)), "key");
        assert_eq!(field(event("a b", "1", serde_json::Value::Null)), "key");
        assert_eq!(
            field(event(&"k".repeat(201), "1", serde_json::Value::Null)),
            "key"
        );
        assert_eq!(field(event("k", "", serde_json::Value::Null)), "id");
        assert_eq!(field(event("k", "a\nb", serde_json::Value::Null)), "id");
        assert_eq!(
            field(event("k", &"i".repeat(201), serde_json::Value::Null)),
            "id"
        );
        let big = serde_json::Value::String("x".repeat(MAX_PAYLOAD_BYTES));
        assert_eq!(field(event("k", "1", big)), "payload");
        let fits = serde_json::Value::String("x".repeat(MAX_PAYLOAD_BYTES - 2));
        assert!(event("k", "1", fits).validate().is_ok());
        assert!(serde_json::from_value::<EventSpec>(
            serde_json::json!({"key": "k", "id": "1", "colour": 1})
        )
        .is_err());
    }

    #[test]
    fn instants_never_repeat_within_a_namespace() {
        assert_eq!(next_instant(100, None), 100);
        assert_eq!(next_instant(100, Some(50)), 100);
        assert_eq!(next_instant(100, Some(100)), 101);
        // A clock that went back still moves forward.
        assert_eq!(next_instant(100, Some(500)), 501);
    }

    #[test]
    fn an_events_run_looks_for_a_free_instant_from_the_events_own() {
        let at: Instant = "2026-11-24T02:30:00Z".parse().unwrap();
        let mut tries = run_instants(at);
        assert_eq!(tries.next(), Some(at));
        assert_eq!(tries.next(), Some(at + chrono::Duration::microseconds(1)));
        assert_eq!(run_instants(at).count() as i64, RUN_INSTANT_TRIES);
    }

    #[test]
    fn payloads_reach_runs_as_text() {
        let run = |payload| RunEvent {
            key: "k".into(),
            id: "1".into(),
            payload,
        };
        assert_eq!(run(serde_json::json!("plain")).payload_text(), "plain");
        assert!(!run(serde_json::json!("plain")).payload_is_json());
        assert_eq!(
            run(serde_json::json!({"a": 1})).payload_text(),
            r#"{"a":1}"#
        );
        assert_eq!(run(serde_json::Value::Null).payload_text(), "null");
    }

    #[test]
    fn an_emitted_event_is_one_per_run() {
        let at: Instant = "2026-11-24T02:30:00Z".parse().unwrap();
        assert_eq!(
            emitted_id("extract", at),
            "extract@2026-11-24T02:30:00.000000Z"
        );
        assert_eq!(emitted_payload("extract", 7, at)["run_id"], 7);
    }
}
