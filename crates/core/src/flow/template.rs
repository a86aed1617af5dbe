//! Key templates: how `{{event.payload.customer}}` in a flow-control key becomes `42` for one
//! run. A template is checked when the job is written (an unknown field is refused, naming it)
//! and rendered when a run is read for dispatch or created by a trigger or an event.

use crate::error::SpecError;
use serde_json::Value;
use std::collections::BTreeMap;

/// The longest template, and the longest key a template renders to (a longer one is cut at a
/// character boundary: two keys that agree on their first bytes then share one limit, the safe
/// side of a limit).
pub const MAX_KEY_BYTES: usize = 256;
/// How deep `{{event.payload.a.b.c}}` may reach.
const MAX_PATH_DEPTH: usize = 8;

/// What a run's key is made of: the fields a template may name.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyContext<'a> {
    pub namespace: &'a str,
    pub job: &'a str,
    /// A sharded run's shard index.
    pub shard: Option<u16>,
    /// The event that started the run.
    pub event: Option<&'a crate::event::RunEvent>,
    /// The parameters a manual trigger gave the run.
    pub params: Option<&'a BTreeMap<String, String>>,
}

/// One `{{...}}` of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    Job,
    Namespace,
    Shard,
    EventKey,
    EventId,
    /// The whole payload (empty path) or one value inside it.
    Payload(Vec<String>),
    Param(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(Field),
}

/// A parsed key template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate(Vec<Part>);

const FIELDS: &str = "job, namespace, shard, event.key, event.id, event.payload, \
     event.payload.<path> and params.<name>";

impl KeyTemplate {
    /// Parses `text`; errors name `field` and the `{{...}}` at fault.
    pub fn parse(field: &str, text: &str) -> Result<KeyTemplate, SpecError> {
        if text.is_empty() || text.len() > MAX_KEY_BYTES {
            return Err(SpecError::new(
                field,
                format!("must be 1 to {MAX_KEY_BYTES} bytes"),
            ));
        }
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 2..];
            let Some(close) = after.find("}}") else {
                return Err(SpecError::new(
                    field,
                    format!("{text:?} opens \"{{{{\" without closing it"),
                ));
            };
            parts.push(Part::Field(parse_field(field, after[..close].trim())?));
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(KeyTemplate(parts))
    }

    /// Whether the template reads the run at all (a constant key is shared by every run).
    pub fn is_constant(&self) -> bool {
        self.0.iter().all(|p| matches!(p, Part::Text(_)))
    }

    /// Whether it reads an event's key, id or payload.
    pub fn reads_event(&self) -> bool {
        self.0.iter().any(|p| {
            matches!(
                p,
                Part::Field(Field::EventKey | Field::EventId | Field::Payload(_))
            )
        })
    }

    /// The key for one run. A field the run does not have (no event, no such payload value,
    /// no such parameter) renders empty.
    pub fn render(&self, run: &KeyContext<'_>) -> String {
        let mut key = String::new();
        for part in &self.0 {
            match part {
                Part::Text(text) => key.push_str(text),
                Part::Field(field) => key.push_str(&value_of(field, run)),
            }
        }
        cut(key)
    }
}

fn parse_field(field: &str, name: &str) -> Result<Field, SpecError> {
    let unknown = || {
        SpecError::new(
            field,
            format!("{{{{{name}}}}} is not a field a key may read: use {FIELDS}"),
        )
    };
    let path_ok = |segment: &str| {
        !segment.is_empty()
            && segment
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
    };
    Ok(match name {
        "job" => Field::Job,
        "namespace" => Field::Namespace,
        "shard" => Field::Shard,
        "event.key" => Field::EventKey,
        "event.id" => Field::EventId,
        "event.payload" => Field::Payload(Vec::new()),
        _ => {
            if let Some(path) = name.strip_prefix("event.payload.") {
                let segments: Vec<String> = path.split('.').map(str::to_string).collect();
                if segments.len() > MAX_PATH_DEPTH || !segments.iter().all(|s| path_ok(s)) {
                    return Err(unknown());
                }
                Field::Payload(segments)
            } else if let Some(param) = name.strip_prefix("params.") {
                if !path_ok(param) {
                    return Err(unknown());
                }
                Field::Param(param.to_string())
            } else {
                return Err(unknown());
            }
        }
    })
}

fn value_of(field: &Field, run: &KeyContext<'_>) -> String {
    match field {
        Field::Job => run.job.to_string(),
        Field::Namespace => run.namespace.to_string(),
        Field::Shard => run.shard.map(|s| s.to_string()).unwrap_or_default(),
        Field::EventKey => run.event.map(|e| e.key.clone()).unwrap_or_default(),
        Field::EventId => run.event.map(|e| e.id.clone()).unwrap_or_default(),
        Field::Payload(path) => {
            let Some(event) = run.event else {
                return String::new();
            };
            let mut value = &event.payload;
            for segment in path {
                value = match value {
                    Value::Object(map) => match map.get(segment) {
                        Some(v) => v,
                        None => return String::new(),
                    },
                    Value::Array(items) => {
                        match segment.parse::<usize>().ok().and_then(|i| items.get(i)) {
                            Some(v) => v,
                            None => return String::new(),
                        }
                    }
                    _ => return String::new(),
                };
            }
            match value {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            }
        }
        Field::Param(name) => run
            .params
            .and_then(|p| p.get(name))
            .cloned()
            .unwrap_or_default(),
    }
}

/// Cuts a rendered key to [`MAX_KEY_BYTES`] at a character boundary.
fn cut(mut key: String) -> String {
    if key.len() > MAX_KEY_BYTES {
        let mut end = MAX_KEY_BYTES;
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        key.truncate(end);
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::RunEvent;

    fn event(payload: Value) -> RunEvent {
        RunEvent {
            key: "orders.placed".into(),
            id: "e-1".into(),
            payload,
        }
    }

    #[test]
    fn fields_render_from_the_run_and_missing_ones_render_empty() {
        let e =
            event(serde_json::json!({"customer": 42, "tags": ["a", "b"], "who": {"name": "ann"}}));
        let params = BTreeMap::from([("region".to_string(), "eu".to_string())]);
        let run = KeyContext {
            namespace: "shop",
            job: "invoice",
            shard: Some(3),
            event: Some(&e),
            params: Some(&params),
        };
        let render = |t: &str| KeyTemplate::parse("key", t).unwrap().render(&run);
        assert_eq!(
            render("customer={{ event.payload.customer }}"),
            "customer=42"
        );
        assert_eq!(
            render("{{event.payload.who.name}}/{{event.payload.tags.1}}"),
            "ann/b"
        );
        assert_eq!(render("{{namespace}}.{{job}}#{{shard}}"), "shop.invoice#3");
        assert_eq!(render("{{event.key}}:{{event.id}}"), "orders.placed:e-1");
        assert_eq!(render("{{params.region}}-{{params.zone}}"), "eu-");
        assert_eq!(render("partner-api"), "partner-api");
        let bare = KeyContext {
            namespace: "shop",
            job: "invoice",
            ..KeyContext::default()
        };
        let t = KeyTemplate::parse("key", "c={{event.payload.customer}}").unwrap();
        assert_eq!(t.render(&bare), "c=");
    }

    #[test]
    fn an_unknown_field_or_an_open_brace_is_refused_naming_the_field() {
        for bad in [
            "{{customer}}",
            "{{event.payload.}}",
            "{{params.a.b}}",
            "x{{job",
            "{{event.body}}",
        ] {
            let e = KeyTemplate::parse("concurrency[0].key", bad).unwrap_err();
            assert_eq!(e.field, "concurrency[0].key", "{bad}");
        }
        assert!(KeyTemplate::parse("k", "").is_err());
        assert!(KeyTemplate::parse("k", &"x".repeat(MAX_KEY_BYTES + 1)).is_err());
    }

    #[test]
    fn a_long_key_is_cut_at_a_character_boundary() {
        let e = event(serde_json::json!({"c": "é".repeat(300)}));
        let run = KeyContext {
            event: Some(&e),
            ..KeyContext::default()
        };
        let key = KeyTemplate::parse("k", "{{event.payload.c}}")
            .unwrap()
            .render(&run);
        assert!(key.len() <= MAX_KEY_BYTES && key.len() >= MAX_KEY_BYTES - 1);
    }
}
