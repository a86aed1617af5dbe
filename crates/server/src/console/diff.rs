//! What a change did to a definition, line by line: the audit page shows an entry's `before`
//! and `after` as the fields added, removed and changed, never as two whole documents. Both
//! sides are redacted again here (`crate::audit::redacted`), so a secret recorded by an older
//! version that did not redact it still never reaches a page.
//!
//! Plain functions of two JSON values; no IO.

use serde_json::Value;
use std::collections::BTreeMap;

/// Lines a diff shows; the rest are counted.
pub const MAX_LINES: usize = 200;
/// Characters of a value shown; longer values end with `…`.
const MAX_VALUE: usize = 160;

/// One field a change touched, by its path (`target.http.url`, `depends_on[0].job`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Added {
        path: String,
        value: String,
    },
    Removed {
        path: String,
        value: String,
    },
    Changed {
        path: String,
        from: String,
        to: String,
    },
}

/// A change's lines, in path order, at most [`MAX_LINES`], with how many were left out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Diff {
    pub lines: Vec<Line>,
    pub left_out: usize,
}

/// The fields `after` adds to, removes from and changes in `before`. A side that is absent
/// (a creation, a deletion) counts as empty.
pub fn diff(before: Option<&Value>, after: Option<&Value>) -> Diff {
    let flat = |value: Option<&Value>| {
        let mut fields = BTreeMap::new();
        if let Some(value) = value {
            flatten(
                &crate::audit::redacted(value.clone()),
                String::new(),
                &mut fields,
            );
        }
        fields
    };
    let (before, after) = (flat(before), flat(after));
    let mut lines = Vec::new();
    let mut paths: Vec<&String> = before.keys().chain(after.keys()).collect();
    paths.sort();
    paths.dedup();
    for path in paths {
        let line = match (before.get(path), after.get(path)) {
            (Some(from), Some(to)) if from == to => continue,
            (Some(from), Some(to)) => Line::Changed {
                path: path.clone(),
                from: shown(from),
                to: shown(to),
            },
            (Some(value), None) => Line::Removed {
                path: path.clone(),
                value: shown(value),
            },
            (None, Some(value)) => Line::Added {
                path: path.clone(),
                value: shown(value),
            },
            (None, None) => continue,
        };
        lines.push(line);
    }
    let left_out = lines.len().saturating_sub(MAX_LINES);
    lines.truncate(MAX_LINES);
    Diff { lines, left_out }
}

/// Every scalar of `value` under its path; an empty object or array is a value of its own, so
/// that emptying one shows.
fn flatten(value: &Value, path: String, into: &mut BTreeMap<String, String>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, inner) in map {
                let path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                flatten(inner, path, into);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, inner) in items.iter().enumerate() {
                flatten(inner, format!("{path}[{i}]"), into);
            }
        }
        other => {
            into.insert(path, other.to_string());
        }
    }
}

/// A value as a line shows it: cut to [`MAX_VALUE`] characters.
fn shown(value: &str) -> String {
    if value.chars().count() <= MAX_VALUE {
        value.to_string()
    } else {
        let cut: String = value.chars().take(MAX_VALUE).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_change_shows_the_fields_it_touched_in_path_order() {
        let before = json!({"name": "etl", "schedule": {"cron": "0 * * * *"}, "priority": 1,
                            "labels": {"team": "data"}, "depends_on": [{"job": "extract"}]});
        let after = json!({"name": "etl", "schedule": {"cron": "30 * * * *"},
                           "labels": {"team": "data", "tier": "gold"}, "depends_on": []});
        let d = diff(Some(&before), Some(&after));
        assert_eq!(
            d.lines,
            vec![
                Line::Added {
                    path: "depends_on".into(),
                    value: "[]".into()
                },
                Line::Removed {
                    path: "depends_on[0].job".into(),
                    value: "\"extract\"".into()
                },
                Line::Added {
                    path: "labels.tier".into(),
                    value: "\"gold\"".into()
                },
                Line::Removed {
                    path: "priority".into(),
                    value: "1".into()
                },
                Line::Changed {
                    path: "schedule.cron".into(),
                    from: "\"0 * * * *\"".into(),
                    to: "\"30 * * * *\"".into()
                },
            ]
        );
        assert_eq!(d.left_out, 0);
    }

    #[test]
    fn a_creation_adds_every_field_and_a_deletion_removes_them() {
        let job = json!({"name": "a", "target": {"shell": {"command": "true"}}});
        let created = diff(None, Some(&job));
        assert!(created
            .lines
            .iter()
            .all(|l| matches!(l, Line::Added { .. })));
        assert_eq!(created.lines.len(), 2);
        let deleted = diff(Some(&job), None);
        assert!(deleted
            .lines
            .iter()
            .all(|l| matches!(l, Line::Removed { .. })));
        assert_eq!(diff(Some(&job), Some(&job)), Diff::default());
    }

    #[test]
    fn secrets_never_reach_a_diff_and_long_ones_are_bounded() {
        let before = json!({"env": {"DB_PASSWORD": "hunter2"}});
        let after =
            json!({"env": {"DB_PASSWORD": "correct horse"}, "description": "x".repeat(5000)});
        let d = diff(Some(&before), Some(&after));
        let text = format!("{:?}", d.lines);
        assert!(
            !text.contains("hunter2") && !text.contains("correct horse"),
            "{text}"
        );
        assert!(text.len() < 1000, "values are cut: {}", text.len());
        let many: serde_json::Map<String, Value> =
            (0..500).map(|i| (format!("k{i:03}"), json!(i))).collect();
        let d = diff(None, Some(&Value::Object(many)));
        assert_eq!((d.lines.len(), d.left_out), (MAX_LINES, 300));
    }
}
